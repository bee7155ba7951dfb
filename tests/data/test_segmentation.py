"""Segmentation data: Fashion-MNIST scenes (determinism, disjoint sources), the VOC reader, joint augmentation."""

import os

import numpy as np
import pytest
import torch

from calibkit.data import augment, augment_pair, load
from calibkit.data.bundle import Split
from calibkit.data.idx import FMNIST_FILES
from calibkit.data.scenes import compose_scenes, make_scene_splits, void_borders
from calibkit.data.voc import VOC_CLASSES, read_voc_split, voc_colormap
from tests.helpers.formats import fake_fmnist, write_idx

TRAIN_VALUE, TEST_VALUE = 120, 230


def _coded_fmnist(folder, n_train=60, n_test=12):
    """Solid rectangles: every training item has intensity 120, every test item 230 (background 0)."""
    imgs = {}
    for split, n, v in (("train", n_train, TRAIN_VALUE), ("test", n_test, TEST_VALUE)):
        arr = np.zeros((n, 28, 28), np.uint8)
        arr[:, 6:22, 8:20] = v
        imgs[split] = arr
        write_idx(os.path.join(folder, FMNIST_FILES[f"{split}_images"] + ".gz"), arr, 2051)
        write_idx(os.path.join(folder, FMNIST_FILES[f"{split}_labels"] + ".gz"), np.arange(n) % 10, 2049)
    return imgs


QUIET = dict(noise=0.0, background=0)  # no noise, black background: pixel values name their source


def test_scenes_are_deterministic_per_seed(tmp_path):
    fake_fmnist(str(tmp_path), n_train=60, n_test=12)
    a = make_scene_splits(str(tmp_path), seed=3, n_train=20, n_val=6, n_test=8)
    b = make_scene_splits(str(tmp_path), seed=3, n_train=20, n_val=6, n_test=8)
    c = make_scene_splits(str(tmp_path), seed=4, n_train=20, n_val=6, n_test=8)
    for split in ("train", "val", "test"):
        assert all(torch.equal(torch.as_tensor(x), torch.as_tensor(y)) for x, y in zip(a[split], b[split]))
    assert not torch.equal(a["train"][0], c["train"][0]) and not torch.equal(a["val"][1], c["val"][1])
    assert torch.equal(a["test"][0], c["test"][0]), "the test scenes do not depend on the run's seed"


def test_test_scenes_use_test_images_only(tmp_path):
    _coded_fmnist(str(tmp_path))
    # scale 1: items are pasted unresampled, so every pixel is 0 or its source item's intensity
    parts = make_scene_splits(str(tmp_path), seed=0, n_train=30, n_val=10, n_test=30, scale=(1.0, 1.0), **QUIET)
    for split, own in (("train", TRAIN_VALUE), ("val", TRAIN_VALUE), ("test", TEST_VALUE)):
        img, mask, _ = parts[split]
        assert set(torch.unique(img).tolist()) == {0, own}, split
        assert (img[:, 0][mask == 0] == 0).all() and (img[:, 0][mask > 0] == own).all()
    # train and validation scenes draw from disjoint sets of training images
    src_train, src_val = parts["train"][2], parts["val"][2]
    used_t, used_v = set(src_train[src_train >= 0].tolist()), set(src_val[src_val >= 0].tolist())
    assert used_t and used_v and not used_t & used_v and max(used_t | used_v) < 60


def test_scene_labels_follow_the_item_masks():
    # One item, a solid 16x12 rectangle of class 4, pasted at scale 1 (28 -> 28 pixels).
    item = np.zeros((1, 28, 28), np.uint8)
    item[0, 6:22, 8:20] = 200
    img, mask, src = compose_scenes(item, [4], n=5, seed=1, size=40, max_items=1, scale=(1.0, 1.0), **QUIET)
    for i in range(5):
        region = (mask[i] == 5) | (mask[i] == 255)  # class 4 -> label 5; its border is void
        rows, cols = torch.nonzero(region, as_tuple=True)
        assert rows.max() - rows.min() + 1 == 16 and cols.max() - cols.min() + 1 == 12
        assert region.sum() == 16 * 12 and (img[i, 0][region] == 200).all()
        assert (mask[i] == 255).sum() == 2 * 16 + 2 * 12 - 4  # the 1-pixel inner border is void
        assert (img[i, 0][~region] == 0).all() and (mask[i][~region] == 0).all()
    assert (src[:, 0] == 0).all()


def test_later_items_occlude_earlier_ones():
    items = np.zeros((2, 28, 28), np.uint8)
    items[:, 2:26, 2:26] = [[[90]], [[180]]]
    # many scenes of up to 4 full squares on a small canvas: overlaps are certain
    img, mask, src = compose_scenes(items, [0, 1], n=30, seed=0, size=32, max_items=4, scale=(1.0, 1.0), **QUIET)
    # the topmost item decides both the pixel value and its label
    inner = (mask > 0) & (mask != 255)
    assert ((img[:, 0] == 90) == (mask == 1))[inner].all() and ((img[:, 0] == 180) == (mask == 2))[inner].all()
    both = [(src[i][src[i] >= 0] == 0).any() and (src[i][src[i] >= 0] == 1).any() for i in range(30)]
    assert sum(both) >= 10  # items of both kinds overlap in many scenes
    assert (mask == 1).any() and (mask == 2).any()


def test_void_borders_by_hand():
    lab = np.zeros((1, 7, 8), np.uint8)
    lab[0, 1:6, 1:7] = 3
    lab[0, 3, 4] = 7  # a one-pixel region inside: it and its 4 neighbours become void
    V = 255
    want = np.array([[0, 0, 0, 0, 0, 0, 0, 0],
                     [0, V, V, V, V, V, V, 0],
                     [0, V, 3, 3, V, 3, V, 0],
                     [0, V, 3, V, V, V, V, 0],
                     [0, V, 3, 3, V, 3, V, 0],
                     [0, V, V, V, V, V, V, 0],
                     [0, 0, 0, 0, 0, 0, 0, 0]])
    assert (void_borders(lab)[0] == want).all()


def test_load_scenes_bundle(tmp_path):
    fake_fmnist(str(tmp_path), n_train=60, n_test=12)
    b = load("scenes", data_dir=str(tmp_path), seed=0, val_size=7, train_subset=50)
    assert b.name == "scenes" and b.modality == "segmentation" and b.ignore_index == 255 and b.num_classes == 11
    assert b.train.images.shape == (50, 1, 64, 64) and b.train.labels.shape == (50, 64, 64)
    assert len(b.val) == 7 and len(b.test) == 500 and b.class_names[0] == "background"
    assert b.train.labels.dtype == torch.uint8
    again = load("scenes", data_dir=str(tmp_path), seed=0, val_size=7, train_subset=50)
    assert again.split["val_checksum"] == b.split["val_checksum"]
    assert load("scenes", data_dir=str(tmp_path), seed=1, val_size=7).split["val_checksum"] != b.split["val_checksum"]
    with pytest.raises(ValueError, match="number of scenes"):
        load("scenes", data_dir=str(tmp_path), val_size=0.5)


def test_split_accepts_masks_and_rejects_mismatches():
    x = torch.zeros(2, 1, 4, 5, dtype=torch.uint8)
    Split(x, torch.zeros(2, 4, 5, dtype=torch.uint8))
    with pytest.raises(ValueError, match="do not match"):
        Split(x, torch.zeros(2, 5, 4, dtype=torch.uint8))
    Split(x, torch.zeros(2, 4, 5, dtype=torch.int64))
    with pytest.raises(ValueError, match="labels must be"):
        Split(x, torch.zeros(2, 4, 5, dtype=torch.int32))


# -------------------------------------------------------------------------------- PASCAL VOC
def test_voc_colormap_known_entries():
    cmap = voc_colormap()
    assert cmap[0].tolist() == [0, 0, 0] and cmap[1].tolist() == [128, 0, 0] and cmap[2].tolist() == [0, 128, 0]
    assert cmap[15].tolist() == [192, 128, 128]  # person
    assert cmap[255].tolist() == [224, 224, 192]  # void (object borders)
    assert len(set(map(tuple, cmap[:21].tolist()))) == 21


def _write_voc(root, ids_sizes, split, rgb_mask=False, seed=0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    voc = os.path.join(root, "VOCdevkit", "VOC2012")
    for sub in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        os.makedirs(os.path.join(voc, sub), exist_ok=True)
    masks = {}
    for name, (h, w) in ids_sizes.items():
        img = (rng.integers(0, 256, (h, w, 3))).astype(np.uint8)
        Image.fromarray(img).save(os.path.join(voc, "JPEGImages", f"{name}.jpg"), quality=95)
        m = rng.integers(0, 21, (h, w)).astype(np.uint8)
        m[0, :] = 255  # a void band, as VOC marks borders
        masks[name] = m
        if rgb_mask:
            Image.fromarray(voc_colormap()[m]).save(os.path.join(voc, "SegmentationClass", f"{name}.png"))
        else:
            p = Image.fromarray(m, mode="P")
            p.putpalette(voc_colormap().reshape(-1).tolist())
            p.save(os.path.join(voc, "SegmentationClass", f"{name}.png"))
    with open(os.path.join(voc, "ImageSets", "Segmentation", f"{split}.txt"), "w") as f:
        f.write("\n".join(ids_sizes) + "\n")
    return voc, masks


@pytest.mark.parametrize("rgb_mask", [False, True])
def test_voc_reads_the_real_format(tmp_path, rgb_mask):
    from PIL import Image

    voc, masks = _write_voc(str(tmp_path), {"2007_000032": (30, 40), "2007_000039": (40, 25)}, "train", rgb_mask)
    split = read_voc_split(voc, "train", size=40)
    assert split.images.shape == (2, 3, 40, 40) and split.labels.shape == (2, 40, 40)
    # 40 x 30 (w x h): longer side already 40, so no resampling; rows 30.. are padding (void, black)
    assert torch.equal(split.labels[0, :30], torch.from_numpy(masks["2007_000032"]))
    assert (split.labels[0, 30:] == 255).all() and (split.images[0, :, 30:] == 0).all()
    decoded = np.array(Image.open(os.path.join(voc, "JPEGImages", "2007_000032.jpg")).convert("RGB"))
    assert torch.equal(split.images[0, :, :30].permute(1, 2, 0), torch.from_numpy(decoded))
    # 25 x 40 image: the longer side (height 40) fits; columns 25.. are padding
    assert torch.equal(split.labels[1, :, :25], torch.from_numpy(masks["2007_000039"]))
    assert (split.labels[1, :, 25:] == 255).all()
    # shrinking: labels stay classes or void (nearest neighbour, never an average of labels)
    small = read_voc_split(voc, "train", size=20)
    assert small.labels.shape == (2, 20, 20)
    assert set(torch.unique(small.labels).tolist()) <= set(range(21)) | {255}
    assert (small.labels[0, 15:] == 255).all()  # 40x30 -> 20x15, rows 15.. padded


def test_voc_bundle_and_errors(tmp_path):
    from PIL import Image

    voc, _ = _write_voc(str(tmp_path), {f"a{i}": (12, 16) for i in range(10)}, "train")
    _write_voc(str(tmp_path), {f"b{i}": (16, 12) for i in range(3)}, "val", seed=1)
    b = load("voc", data_dir=str(tmp_path), seed=0)
    assert b.modality == "segmentation" and b.num_classes == 21 and b.class_names == VOC_CLASSES
    assert (len(b.train), len(b.val), len(b.test)) == (9, 1, 3)  # val: 10% of the train list
    assert b.train.images.shape[1:] == (3, 480, 480)
    # a label that is neither a class nor void names the file
    bad = np.full((12, 16), 30, np.uint8)
    p = Image.fromarray(bad, mode="P")
    p.putpalette(voc_colormap().reshape(-1).tolist())
    p.save(os.path.join(voc, "SegmentationClass", "a3.png"))
    with pytest.raises(ValueError, match="a3.*label 30"):
        read_voc_split(voc, "train", size=16)
    os.remove(os.path.join(voc, "JPEGImages", "a1.jpg"))
    with pytest.raises(FileNotFoundError, match="a1.jpg"):
        read_voc_split(voc, "train", size=16)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="VOCdevkit/VOC2012"):
        load("voc", data_dir=str(empty), seed=0)


# -------------------------------------------------------------------------------- augmentation
def test_augment_pair_moves_masks_with_images(gen):
    x = torch.randint(0, 256, (6, 2, 9, 11), dtype=torch.uint8, generator=gen)
    m = torch.randint(0, 5, (6, 9, 11), dtype=torch.uint8, generator=gen)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    xa, ma = augment_pair(x, m, crop_pad=3, hflip=True, generator=g1)
    assert torch.equal(xa, augment(x, 3, True, g2)), "images get exactly the image augmentation"
    # the mask, encoded in the image values, must follow: build images whose values are the mask
    code = (m + 1)[:, None].expand(-1, 2, -1, -1).contiguous()  # 1..5, padding -> 0
    ca, cm = augment_pair(code, m, crop_pad=3, hflip=True, generator=torch.Generator().manual_seed(5))
    pad = ca[:, 0] == 0
    assert torch.equal(cm[~pad], (ca[:, 0][~pad] - 1)) and (cm[pad] == 255).all() and pad.any()
    with pytest.raises(ValueError, match="masks"):
        augment_pair(x, m[:, :3], 1, True)
    with pytest.raises(ValueError, match=r"^masks \(5, 9, 11\) do not match images \(6, 2, 9, 11\)$"):
        augment_pair(x, m[:5], 1, True)  # one mask short, each of the right size
    with pytest.raises(ValueError,
                       match=r"^augment_pair expects uint8 images and masks, got torch.uint8, torch.int64$"):
        augment_pair(x, m.long(), 1, True)


# ------------------------------------------------------------------ load_segmentation (any reader)
def _toy_reader(n_train=10, n_test=3, bad=None):
    """A registered reader's RawData: image i of the training list has the value 10 + i everywhere;
    ``bad = (part, index)`` gives that image's mask the value 4 (the classes are 0..3)."""
    from calibkit.data.bundle import RawData

    def part(n, offset, name):
        images = (torch.arange(n, dtype=torch.uint8) + offset).view(n, 1, 1, 1).expand(n, 3, 5, 6).contiguous()
        masks = (torch.arange(n * 30) % 4).to(torch.uint8).view(n, 5, 6)
        masks[:, 0, 0] = 255
        if bad is not None and bad[0] == name:
            masks[bad[1], 2, 3] = 4
            masks[bad[1], 4, 5] = 9  # a second bad value, later in the mask
        return Split(images, masks)

    return lambda folder: RawData(train=part(n_train, 10, "train"), test=part(n_test, 100, "test"),
                                  class_names=["bg", "a", "b", "c"])


def _spec(reader, val_size=0.1):
    from types import SimpleNamespace

    return SimpleNamespace(read=reader, val_size=val_size, hflip=True, crop_pad=7)


def _drawn(n, size, seed, stream):
    """The documented draw: the first ``size`` of a permutation seeded by SeedSequence([seed, stream])."""
    perm = np.random.default_rng(np.random.SeedSequence([seed, stream])).permutation(n)
    return sorted(perm[:size].tolist())


def test_a_registered_segmentation_reader_becomes_a_bundle(tmp_path, monkeypatch):
    from calibkit.data.bundle import index_checksum
    from calibkit.data.segmentation import load_segmentation

    monkeypatch.chdir(tmp_path)
    b = load_segmentation("toy", _spec(_toy_reader()), "files", seed=3, val_size=None, train_subset=None)
    val = _drawn(10, 1, 3, 0)  # the spec's 10% of 10
    assert (b.name, b.num_classes, b.in_channels, b.hflip, b.crop_pad) == ("toy", 4, 3, True, 7)
    assert (b.modality, b.ignore_index, b.data_dir) == ("segmentation", 255, str(tmp_path / "files"))
    assert (b.val.images[:, 0, 0, 0] - 10).tolist() == val
    assert (b.train.images[:, 0, 0, 0] - 10).tolist() == [i for i in range(10) if i not in val]
    values = np.array([10 + i for i in range(10) if i not in val]) / 255  # every pixel of image i is 10 + i
    assert b.mean == pytest.approx((values.mean(),) * 3) and b.std == pytest.approx((values.std(),) * 3)
    assert b.split == {"seed": 3, "rule": "seeded random draw from the official training list", "train": 9, "val": 1,
                       "test": 3, "train_subset": None, "val_checksum": index_checksum(val), "train_checksum": None}
    assert load_segmentation("toy", _spec(_toy_reader()), None, 3, None, None).data_dir is None


def test_the_validation_size_of_a_segmentation_reader(tmp_path):
    from calibkit.data.segmentation import load_segmentation

    spec = _spec(_toy_reader())
    assert len(load_segmentation("toy", spec, None, 0, 3, None).val) == 3  # a count given overrides the spec's
    assert len(load_segmentation("toy", spec, None, 0, 2.0, None).val) == 2  # a whole float is a count
    assert len(load_segmentation("toy", spec, None, 0, 0.25, None).val) == 2  # a fraction: round(2.5) = 2
    none = load_segmentation("toy", spec, None, 0, 0, None)
    assert (len(none.train), len(none.val)) == (10, 0)
    with pytest.raises(ValueError, match=r"^val_size must be an image count or a fraction in \(0, 1\), got 1.5$"):
        load_segmentation("toy", spec, None, 0, 1.5, None)
    with pytest.raises(ValueError, match=r"^val_size must be in \[0, 9\] for a training set of 10 images, got 10$"):
        load_segmentation("toy", spec, None, 0, 10, None)


def test_the_training_subset_of_a_segmentation_reader():
    from calibkit.data.bundle import index_checksum
    from calibkit.data.segmentation import load_segmentation

    spec = _spec(_toy_reader())
    b = load_segmentation("toy", spec, None, 2, 1, 4)
    pool = [i for i in range(10) if i not in _drawn(10, 1, 2, 0)]
    keep = _drawn(9, 4, 2, 1)  # stream 1, among the 9 training images
    assert (b.train.images[:, 0, 0, 0] - 10).tolist() == [pool[i] for i in keep]
    assert b.split["train_subset"] == 4 and b.split["train_checksum"] == index_checksum(keep)
    assert len(load_segmentation("toy", spec, None, 2, 1, 1).train) == 1
    whole = load_segmentation("toy", spec, None, 2, 1, 9)  # all of them: no draw
    assert (whole.train.images[:, 0, 0, 0] - 10).tolist() == pool and whole.split["train_checksum"] is None
    for n in (0, 10):
        with pytest.raises(ValueError, match=rf"^train_subset must be in \[1, 9\] for toy, got {n}$"):
            load_segmentation("toy", spec, None, 2, 1, n)


@pytest.mark.parametrize("where", ["train", "val", "test"])
def test_a_mask_value_beyond_the_classes_names_its_split(where):
    from calibkit.data.segmentation import load_segmentation

    val = _drawn(2, 1, 0, 0)[0]  # of two training images, the one drawn for validation
    bad = ("test", 0) if where == "test" else ("train", val if where == "val" else 1 - val)
    spec = _spec(_toy_reader(n_train=2, n_test=1, bad=bad))  # splits of one image are checked too
    with pytest.raises(ValueError, match=rf"^toy {where}: mask value 4 is neither a class < 4 nor 255$"):
        load_segmentation("toy", spec, None, 0, 1, None)


def test_scenes_take_one_validation_scene_and_one_training_scene(tmp_path):
    import hashlib

    fake_fmnist(str(tmp_path), n_train=60, n_test=12)
    b = load("scenes", data_dir=str(tmp_path), seed=1, val_size=1, train_subset=1)
    assert (len(b.train), len(b.val), len(b.test)) == (1, 1, 500)
    digest = hashlib.sha256(b.val.images.numpy().tobytes() + b.val.labels.numpy().tobytes()).hexdigest()
    assert b.split == {"seed": 1, "rule": "scenes composed from a seeded held-out part of the Fashion-MNIST training "
                       "images", "train": 1, "val": 1, "test": 500, "train_subset": 1, "val_checksum": digest[:16],
                       "train_checksum": None}
    with pytest.raises(ValueError, match=r"^val_size for scenes is a number of scenes >= 1, got 0$"):
        load("scenes", data_dir=str(tmp_path), val_size=0)
    with pytest.raises(ValueError, match=r"^train_subset must be in \[1, 4000\] for scenes, got 0$"):
        load("scenes", data_dir=str(tmp_path), val_size=1, train_subset=0)
