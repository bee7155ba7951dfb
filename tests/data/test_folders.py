"""Image-file data sets (calibkit.data.folders): decoding, grey/RGB modes, the Tiny-ImageNet layout and
image folders, with every refusal's message."""

import re

import numpy as np
import pytest
import torch

import calibkit.data.folders as folders
from calibkit.data.folders import IMAGE_EXTENSIONS, read_imagefolder, read_images, read_tinyimagenet

Image = pytest.importorskip("PIL.Image")


def save(path, array, mode=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array, mode).save(str(path))
    return str(path)


def grey(value, h=6, w=5):
    return np.full((h, w), value, np.uint8)


def test_read_images_modes_sizes_and_refusals(tmp_path):
    g = save(tmp_path / "g.png", grey(90))
    rgb = np.zeros((6, 5, 3), np.uint8)
    rgb[..., 0], rgb[..., 1], rgb[..., 2] = 10, 20, 30
    c = save(tmp_path / "c.png", rgb)
    as_rgb = read_images([g, c], "RGB")
    assert as_rgb.shape == (2, 3, 6, 5) and as_rgb.dtype == torch.uint8
    assert (as_rgb[0] == 90).all() and as_rgb[1, :, 0, 0].tolist() == [10, 20, 30]  # grey -> RGB repeats
    as_grey = read_images([c, g], "L")
    assert as_grey.shape == (2, 1, 6, 5) and (as_grey[0] == 18).all() and (as_grey[1] == 90).all()  # luma
    odd = save(tmp_path / "odd.png", grey(0, h=3, w=7))
    with pytest.raises(ValueError, match="^" + re.escape(f"{odd}: image is 7x3 but earlier images are 5x6; "
                                                         "resize the data set to one size first") + "$"):
        read_images([g, odd], "L")
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    for reader in (lambda: read_images([g, str(bad)], "L"), lambda: folders._image_mode([g, str(bad)])):
        with pytest.raises(ValueError, match="^" + re.escape(f"{bad}: cannot decode image (UnidentifiedImageError: ")):
            reader()
    with pytest.raises(ValueError, match="^no images to read$"):
        read_images([], "L")


def test_pillow_is_named_with_what_needs_it(monkeypatch, tmp_path):
    import calibkit.extras

    monkeypatch.setattr(calibkit.extras, "available", lambda module: module != "PIL")
    with pytest.raises(calibkit.extras.MissingExtra, match=r"^reading image files needs "):
        read_images([save(tmp_path / "g.png", grey(1))], "L")


def test_grey_modes_stay_one_channel(tmp_path):
    files = {
        "1": save(tmp_path / "one.png", np.eye(4, dtype=bool)),
        "L": save(tmp_path / "l.png", grey(3)),
        "I": save(tmp_path / "i.tif", np.arange(16, dtype=np.int32).reshape(4, 4)),
        "I;16": save(tmp_path / "i16.png", np.arange(16, dtype=np.uint16).reshape(4, 4)),
        "F": save(tmp_path / "f.tif", np.arange(16, dtype=np.float32).reshape(4, 4)),
        "LA": save(tmp_path / "la.png", np.zeros((4, 4, 2), np.uint8), "LA"),
    }
    for mode, path in files.items():
        with Image.open(path) as im:
            assert im.mode == mode, "the file is stored in the mode under test"
        assert folders._image_mode([path]) == "L", mode
    palette = tmp_path / "p.png"
    Image.fromarray(grey(3)).convert("P").save(str(palette))
    assert folders._image_mode([files["L"], str(palette)]) == "RGB"  # one colour-capable image: the set is RGB


def tiny(root, wnids, per_class=4, words=None, val_lines=None, grey_class=None):
    """A Tiny-ImageNet layout: class k's image i is the flat colour 40 k + 10 i (PNG-coded, so exact)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "wnids.txt").write_text("\n".join(wnids) + "\n")
    if words is not None:
        (root / "words.txt").write_text(words)
    for k, w in enumerate(wnids):
        folder = root / "train" / w / "images"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):  # named .JPEG as in the archive, stored as PNG so the values stay exact
            value = 40 * k + 10 * i
            array = grey(value, 4, 4) if k == grey_class else np.full((4, 4, 3), value, np.uint8)
            Image.fromarray(array).save(str(folder / f"{w}_{i}.JPEG"), format="PNG")
    (root / "val" / "images").mkdir(parents=True, exist_ok=True)
    lines = val_lines if val_lines is not None else [f"val_{j}.JPEG\t{wnids[j % len(wnids)]}\t0\t0\t4\t4"
                                                     for j in range(len(wnids))]
    for line in lines:
        name = line.split("\t")[0]
        if name.strip():
            Image.fromarray(np.full((4, 4, 3), 200, np.uint8)).save(str(root / "val" / "images" / name), format="PNG")
    (root / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture
def two_held_out(monkeypatch):
    monkeypatch.setattr(folders, "TINY_VAL_PER_CLASS", 2)


def test_tinyimagenet_names_lines_and_nesting(tmp_path, two_held_out):
    lines = ["a b.JPEG\tn02", "", "c.JPEG\tn01\t0\t0\t4\t4", "d.JPEG\tn03"]  # a space in a name; a blank line
    words = "n01\tgold\tfish\nn02\tREX\n"  # the name is everything after the first tab
    root = tiny(tmp_path / "tiny-imagenet-200", ["n01", "n02", "n03"], words=words, val_lines=lines, grey_class=1)
    raw = read_tinyimagenet(str(root))
    assert raw.class_names == ["gold\tfish", "REX", "n03"]
    assert raw.test.labels.tolist() == [1, 0, 2] and raw.test.labels.dtype == torch.int64
    assert raw.train.images.shape == (6, 3, 4, 4)  # the grey class is read as RGB
    assert raw.val.labels.tolist() == [0, 0, 1, 1, 2, 2]
    assert raw.val.images[:, 0, 0, 0].tolist() == [20, 30, 60, 70, 100, 110]  # the last two of each class
    assert raw.train.images[:, 0, 0, 0].tolist() == [0, 10, 40, 50, 80, 90]
    parent = read_tinyimagenet(str(tmp_path))  # the folder holding tiny-imagenet-200 is accepted
    assert parent.class_names == raw.class_names and torch.equal(parent.test.images, raw.test.images)
    tiny(tmp_path, ["n01", "n02"])  # the parent is a data set itself: it wins over the nested one
    assert read_tinyimagenet(str(tmp_path)).class_names == ["n01", "n02"]


def test_tinyimagenet_refusals(tmp_path, two_held_out):
    with pytest.raises(FileNotFoundError, match="^" + re.escape(
            f"Tiny-ImageNet: {tmp_path / 'wnids.txt'} not found; data_dir must be the tiny-imagenet-200 folder") + "$"):
        read_tinyimagenet(str(tmp_path))
    root = tiny(tmp_path / "a", ["n01", "n02"])
    (root / "wnids.txt").write_text("n01\nn02\nn09\n")
    missing = root / "train" / "n09" / "images"
    with pytest.raises(FileNotFoundError, match="^"
                       + re.escape(f"Tiny-ImageNet: training folder {missing} missing for class n09") + "$"):
        read_tinyimagenet(str(root))
    few = tiny(tmp_path / "b", ["n01", "n02"], per_class=2)  # exactly the held-out count: none left to train
    with pytest.raises(ValueError, match=r"^Tiny-ImageNet class n01 has 2 training images, need > 2$"):
        read_tinyimagenet(str(few))
    no_ann = tiny(tmp_path / "c", ["n01"])
    (no_ann / "val" / "val_annotations.txt").unlink()
    ann = no_ann / "val" / "val_annotations.txt"
    with pytest.raises(FileNotFoundError, match="^"
                       + re.escape(f"Tiny-ImageNet: {ann} not found (needed for the test split)") + "$"):
        read_tinyimagenet(str(no_ann))
    for k, bad in enumerate(["x.JPEG\tn77\t0", "lonely.JPEG"]):  # an unknown wnid; no wnid at all
        root = tiny(tmp_path / f"d{k}", ["n01"], val_lines=["v.JPEG\tn01", bad])
        ann = root / "val" / "val_annotations.txt"
        expected = f"{ann}:2: expected '<file>\\t<wnid>...' with a wnid from wnids.txt, got {bad + chr(10)!r}"
        with pytest.raises(ValueError, match="^" + re.escape(expected) + "$"):
            read_tinyimagenet(str(root))


def flat(root, classes, n, value=lambda k, i: 20 * k + i):
    for k, c in enumerate(classes):
        for i in range(n):
            save(root / c / f"{i}.png", grey(value(k, i), 4, 4))
    return root


def test_flat_folder_test_split_is_fixed(tmp_path):
    root = flat(tmp_path / "f", ["a", "b"], 10)
    (root / "notes.txt").write_text("not a class")  # a stray file is neither a class nor an image
    raw = read_imagefolder(str(root))
    assert raw.class_names == ["a", "b"] and raw.train.labels.dtype == torch.int64
    values = [20 * k + i for k in range(2) for i in range(10)]  # the files in class, then natural, order
    perm = np.random.default_rng(0).permutation(20)  # the documented rule: seed 0, 20% held out
    assert raw.test.images[:, 0, 0, 0].tolist() == [values[j] for j in np.sort(perm[:4])]
    assert raw.train.images[:, 0, 0, 0].tolist() == [values[j] for j in np.sort(perm[4:])]
    assert torch.equal(raw.test.labels, (raw.test.images[:, 0, 0, 0] >= 20).long())
    five = read_imagefolder(str(flat(tmp_path / "five", ["a"], 5)))  # one test image is enough
    assert (len(five.train), len(five.test)) == (4, 1)
    two = flat(tmp_path / "two", ["a", "b"], 1)
    with pytest.raises(ValueError, match="^" + re.escape(f"{two}: 2 images are too few to hold out a test split")
                       + "$"):
        read_imagefolder(str(two))


@pytest.mark.parametrize("name", ["train", "test"])
def test_a_class_named_train_or_test_alone_is_a_flat_folder(tmp_path, name):
    raw = read_imagefolder(str(flat(tmp_path, [name, "zebra"], 4)))
    assert raw.class_names == [name, "zebra"] and len(raw.train) + len(raw.test) == 8


def test_mixed_grey_and_colour_folder_is_rgb(tmp_path):
    root = flat(tmp_path, ["a", "b"], 4)
    save(root / "b" / "4.png", np.full((4, 4, 3), (200, 0, 0), np.uint8))
    raw = read_imagefolder(str(root))
    images = torch.cat([raw.train.images, raw.test.images])
    assert images.shape == (9, 3, 4, 4)
    assert (sorted(images[:, :, 0, 0].tolist())
            == sorted([[v] * 3 for v in (0, 1, 2, 3, 20, 21, 22, 23)] + [[200, 0, 0]]))


def test_train_test_folders_share_the_training_classes(tmp_path):
    for c in ("a", "b", "c"):
        flat(tmp_path / "train", [c], 3, value=lambda k, i, c=c: 50 * "abc".index(c) + i)
    for c in ("a", "c"):  # no test image of class b: c keeps its training label 2
        flat(tmp_path / "test", [c], 2, value=lambda k, i, c=c: 50 * "abc".index(c) + i)
    raw = read_imagefolder(str(tmp_path))
    assert raw.class_names == ["a", "b", "c"] and raw.test.labels.tolist() == [0, 0, 2, 2]
    flat(tmp_path / "test", ["d"], 1)
    test_dir = tmp_path / "test"
    with pytest.raises(ValueError, match="^" + re.escape(
            f"{test_dir}: class folders ['d'] are not among the training classes ['a', 'b', 'c']") + "$"):
        read_imagefolder(str(tmp_path))



def test_a_training_class_folder_without_images_is_refused(tmp_path):
    for c in ("a", "b"):
        flat(tmp_path / "tt" / "train", [c], 3)
        flat(tmp_path / "tt" / "test", [c], 1)
    (tmp_path / "tt" / "test" / "b" / "0.png").unlink()  # a test class without images is fine
    assert read_imagefolder(str(tmp_path / "tt")).class_names == ["a", "b"]
    (tmp_path / "tt" / "train" / "c").mkdir()
    (tmp_path / "tt" / "train" / "d").mkdir()
    train = tmp_path / "tt" / "train"
    message = (f"{train}: class folder(s) c, d hold no images ({', '.join(IMAGE_EXTENSIONS)}); every sub-folder is "
               "a class: add their images or remove them")
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        read_imagefolder(str(tmp_path / "tt"))
    root = flat(tmp_path / "flat", ["a", "b"], 5)
    (root / "empty").mkdir()  # a flat folder: the same rule
    with pytest.raises(ValueError, match="^" + re.escape(f"{root}: class folder(s) empty hold no images")):
        read_imagefolder(str(root))


def test_folder_refusals(tmp_path):
    empty = tmp_path / "empty"
    (empty / "a").mkdir(parents=True)  # a class folder without images
    message = f"{empty}: no class folders with images ({', '.join(IMAGE_EXTENSIONS)}) found"
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        read_imagefolder(str(empty))
    sizes = tmp_path / "sizes"
    flat(sizes / "train", ["a"], 2)
    save(sizes / "test" / "a" / "0.png", grey(1, 5, 5))
    with pytest.raises(ValueError, match="^"
                       + re.escape(f"{sizes}: training images are (1, 4, 4), test images (1, 5, 5)") + "$"):
        read_imagefolder(str(sizes))
