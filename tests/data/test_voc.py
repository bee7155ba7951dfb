"""The PASCAL VOC reader: where the files may be, the mask forms it accepts, resizing, every message."""

import os

import numpy as np
import pytest
import torch
from PIL import Image

from calibkit.data.voc import find_voc_root, read_voc, read_voc_split, voc_colormap

MISSING = ("PASCAL VOC 2012 not found under {}: expected VOCdevkit/VOC2012 with JPEGImages/, SegmentationClass/ and "
           "ImageSets/Segmentation/{{train,val}}.txt (the VOCtrainval_11-May-2012 archive)")


def _voc(root, items, split="train", mask_form="P"):
    """``items``: {id: (image array or PIL image, mask array)}; masks saved in ``mask_form``."""
    for sub in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    for name, (image, mask) in items.items():
        image = image if isinstance(image, Image.Image) else Image.fromarray(image)
        image.save(os.path.join(root, "JPEGImages", f"{name}.jpg"), quality=95)
        path = os.path.join(root, "SegmentationClass", f"{name}.png")
        if mask_form == "P":
            p = Image.fromarray(mask, mode="P")
            p.putpalette(voc_colormap().reshape(-1).tolist())
            p.save(path)
        elif mask_form == "RGB":
            Image.fromarray(voc_colormap()[mask]).save(path)
        else:  # "L": grey index masks
            Image.fromarray(mask, mode="L").save(path)
    with open(os.path.join(root, "ImageSets", "Segmentation", f"{split}.txt"), "w") as f:
        f.write("\n".join(items) + "\n")
    return str(root)


def _flat(h, w, value=90):
    return np.full((h, w, 3), value, np.uint8)


def test_the_root_may_be_voc2012_vocdevkit_or_their_parent_and_needs_both_folders(tmp_path):
    root = _voc(tmp_path / "VOCdevkit" / "VOC2012", {"a": (_flat(4, 4), np.zeros((4, 4), np.uint8))})
    for given in (root, tmp_path / "VOCdevkit", tmp_path):
        assert find_voc_root(str(given)) == root
    (tmp_path / "JPEGImages").mkdir()  # images alone (another data set's folder) are not a VOC root
    assert find_voc_root(str(tmp_path)) == root
    (tmp_path / "JPEGImages").rmdir()
    (tmp_path / "SegmentationClass").mkdir()
    assert find_voc_root(str(tmp_path)) == root
    with pytest.raises(FileNotFoundError) as err:
        find_voc_root(str(tmp_path / "elsewhere"))
    assert str(err.value) == MISSING.format(tmp_path / "elsewhere")


def test_split_lists_missing_or_empty(tmp_path):
    root = _voc(tmp_path, {"a": (_flat(4, 4), np.zeros((4, 4), np.uint8))})
    with pytest.raises(FileNotFoundError, match=rf"^VOC split list not found: {root}/ImageSets/Segmentation/val.txt$"):
        read_voc_split(root, "val")
    (tmp_path / "ImageSets" / "Segmentation" / "train.txt").write_text("\n  \n")
    with pytest.raises(ValueError, match=rf"^{root}/ImageSets/Segmentation/train.txt lists no images$"):
        read_voc_split(root, "train")


def _error(tmp_path, mask, form="P", image=None):
    root = _voc(tmp_path / form, {"m": (_flat(*mask.shape) if image is None else image, mask)}, mask_form=form)
    with pytest.raises(ValueError) as err:
        read_voc_split(root, "train", size=8)
    return str(err.value), os.path.join(root, "SegmentationClass", "m.png")


def test_mask_values_and_colours_outside_the_classes_are_named(tmp_path):
    mask = np.zeros((4, 6), np.uint8)
    mask[1, 2], mask[3, 5] = 21, 30  # the first bad value in reading order is named
    msg, path = _error(tmp_path, mask)
    assert msg == f"VOC train m: {path}: label 21 is neither a class in 0..20 nor void (255)"
    msg, path = _error(tmp_path, np.where(mask == 30, 0, mask).astype(np.uint8), form="RGB")  # class 21's colour
    assert msg == f"VOC train m: {path}: RGB mask has colours outside the VOC colour map"
    odd = tmp_path / "odd"
    root = _voc(odd, {"m": (_flat(4, 6), np.zeros((4, 6), np.uint8))})
    Image.fromarray(np.full((4, 6, 3), [1, 2, 3], np.uint8)).save(os.path.join(root, "SegmentationClass", "m.png"))
    with pytest.raises(ValueError, match=r"RGB mask has colours outside the VOC colour map$"):
        read_voc_split(root, "train", size=8)


def test_grey_index_masks_are_read_and_other_modes_refused(tmp_path):
    mask = np.array([[0, 20, 255], [3, 3, 1]], np.uint8)
    root = _voc(tmp_path / "grey", {"m": (_flat(2, 3), mask)}, mask_form="L")
    assert torch.equal(read_voc_split(root, "train", size=3).labels[0, :2], torch.from_numpy(mask))
    Image.fromarray(np.zeros((2, 3, 2), np.uint8), mode="LA").save(os.path.join(root, "SegmentationClass", "m.png"))
    path = os.path.join(root, "SegmentationClass", "m.png")
    with pytest.raises(ValueError) as err:
        read_voc_split(root, "train", size=3)
    assert str(err.value) == f"VOC train m: {path}: mask mode 'LA'; expected a palette ('P') PNG of class indices"


def test_unreadable_files_and_sizes_that_differ_are_named(tmp_path):
    root = _voc(tmp_path, {"m": (_flat(4, 6), np.zeros((4, 6), np.uint8))})
    mask_path = os.path.join(root, "SegmentationClass", "m.png")
    img_path = os.path.join(root, "JPEGImages", "m.jpg")
    Image.fromarray(np.zeros((5, 6), np.uint8), mode="P").save(mask_path)
    with pytest.raises(ValueError, match=r"^VOC train m: mask \(6, 5\) and image \(6, 4\) differ in size$"):
        read_voc_split(root, "train", size=8)
    with open(mask_path, "wb") as f:
        f.write(b"not a png")
    with pytest.raises(ValueError, match=rf"^VOC train m: {mask_path}: cannot read the mask \("):
        read_voc_split(root, "train", size=8)
    with open(img_path, "wb") as f:
        f.write(b"not a jpeg")
    with pytest.raises(ValueError, match=rf"^{img_path}: cannot read the image \("):
        read_voc_split(root, "train", size=8)


def test_images_are_resized_bilinearly_in_rgb_and_thin_ones_keep_one_pixel(tmp_path):
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (10, 16, 4), dtype=np.uint8)
    cmyk = Image.fromarray(rgb, mode="CMYK")  # a CMYK JPEG is read in RGB
    thin = Image.fromarray(np.full((16, 1, 3), 77, np.uint8))  # 1 x 16: 0.5 pixel wide at size 8
    flat = Image.fromarray(np.full((1, 16, 3), 77, np.uint8))  # 16 x 1: 0.5 pixel high
    root = _voc(tmp_path, {"c": (cmyk, np.zeros((10, 16), np.uint8)), "t": (thin, np.ones((16, 1), np.uint8)),
                           "f": (flat, np.ones((1, 16), np.uint8))})
    split = read_voc_split(root, "train", size=8)
    with Image.open(os.path.join(root, "JPEGImages", "c.jpg")) as im:
        want = np.asarray(im.convert("RGB").resize((8, 5), Image.BILINEAR))
    assert torch.equal(split.images[0, :, :5].permute(1, 2, 0), torch.tensor(want))
    assert (split.labels[1, :, 0] == 1).all() and (split.labels[1, :, 1:] == 255).all()
    assert (split.images[1, :, :, 1:] == 0).all() and (split.images[1, :, :, 0] > 0).all()
    assert (split.labels[2, 0] == 1).all() and (split.labels[2, 1:] == 255).all()


def test_read_voc_gives_both_splits_the_size_asked_for(tmp_path):
    items = {"a": (_flat(6, 4), np.zeros((6, 4), np.uint8))}
    _voc(tmp_path, items, "train")
    _voc(tmp_path, items, "val")
    raw = read_voc(str(tmp_path), size=12)
    assert raw.train.images.shape == raw.test.images.shape == (1, 3, 12, 12)
    assert raw.class_names[15] == "person" and len(raw.class_names) == 21
