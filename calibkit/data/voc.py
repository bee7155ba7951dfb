"""PASCAL VOC 2012 semantic segmentation from its standard ``VOCdevkit/VOC2012`` layout.

Files read (under ``data_dir``, which may be ``VOC2012`` itself, ``VOCdevkit`` or their parent):

* ``ImageSets/Segmentation/train.txt`` and ``val.txt``: one image id per line;
* ``JPEGImages/<id>.jpg``: the RGB image;
* ``SegmentationClass/<id>.png``: a palette ("P" mode) PNG whose pixel values are the class
  indices 0 (background) .. 20 and 255 (void: object borders and unlabelled regions). A mask
  saved as RGB colours is mapped back through the VOC colour map; greyscale ("L") index masks are
  accepted too. Any other value is an error naming the file.

Every image is resized so that its longer side is ``size`` (480: the evaluation size of the MbLS
code) -- bilinear for the image, nearest for the mask -- and padded at the bottom/right to
``size x size`` with black pixels and void labels, so a split is one uint8 tensor. The official
``train`` list (1,464 images) is the training pool and the official ``val`` list (1,449) the test
split; calibkit's validation split is drawn from ``train`` (the MbLS code selects the checkpoint
on ``val`` itself, which is the test set; calibkit never selects on test).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from calibkit.errors import UserError

from .bundle import RawData, Split

VOC_CLASSES = [
    "background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor",
]  # fmt: skip
VOID = 255
VOC_SIZE = 480


def voc_colormap(n: int = 256) -> np.ndarray:
    """The VOC palette: class ``c``'s colour takes bits 0/1/2 of ``c``, ``c >> 3``, ... as the
    high bits of R/G/B (so 1 = (128, 0, 0), 15 = (192, 128, 128), 255 = (224, 224, 192)). (n, 3) uint8."""
    cmap = np.zeros((n, 3), dtype=np.uint8)
    for c in range(n):
        r = g = b = 0
        v = c
        for shift in range(7, -1, -1):
            r |= (v & 1) << shift
            g |= ((v >> 1) & 1) << shift
            b |= ((v >> 2) & 1) << shift
            v >>= 3
        cmap[c] = (r, g, b)
    return cmap


def find_voc_root(data_dir: str) -> str:
    """The folder holding ``JPEGImages`` among ``data_dir``, ``data_dir/VOC2012``, ``data_dir/VOCdevkit/VOC2012``."""
    for cand in (data_dir, os.path.join(data_dir, "VOC2012"), os.path.join(data_dir, "VOCdevkit", "VOC2012")):
        if os.path.isdir(os.path.join(cand, "JPEGImages")) and os.path.isdir(os.path.join(cand, "SegmentationClass")):
            return cand
    raise FileNotFoundError(
        f"PASCAL VOC 2012 not found under {data_dir}: expected VOCdevkit/VOC2012 with JPEGImages/, "
        "SegmentationClass/ and ImageSets/Segmentation/{train,val}.txt (the VOCtrainval_11-May-2012 archive)"
    )


def _ids(root: str, split: str) -> list[str]:
    path = os.path.join(root, "ImageSets", "Segmentation", f"{split}.txt")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"VOC split list not found: {path}")
    with open(path) as f:
        ids = [line.strip() for line in f if line.strip()]
    if not ids:
        raise UserError(f"{path} lists no images")
    return ids


def _read_mask(path: str, num_classes: int) -> np.ndarray:
    from PIL import Image  # noqa: PLC0415 (optional extra data: check_dataset requires it before a read)

    try:
        with Image.open(path) as im:
            mode = im.mode
            arr = np.array(im)
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read the mask ({exc})") from exc
    if mode == "RGB":  # colours -> indices through the VOC colour map
        cmap = voc_colormap().astype(np.int64)
        key = (arr[..., 0].astype(np.int64) << 16) | (arr[..., 1].astype(np.int64) << 8) | arr[..., 2]
        lut = {int((r << 16) | (g << 8) | b): i for i, (r, g, b) in enumerate(cmap) if i < num_classes or i == VOID}
        flat = np.array([lut.get(int(k), -1) for k in np.unique(key)])
        if (flat < 0).any():
            raise UserError(f"{path}: RGB mask has colours outside the VOC colour map")
        arr = flat[np.searchsorted(np.unique(key), key)].astype(np.uint8)
    elif mode not in ("P", "L"):
        raise UserError(f"{path}: mask mode {mode!r}; expected a palette ('P') PNG of class indices")
    bad = (arr >= num_classes) & (arr != VOID)
    if bad.any():
        raise UserError(f"{path}: label {int(arr[bad][0])} is neither a class in 0..{num_classes - 1} nor void (255)")
    return arr.astype(np.uint8)


def _fit(image, mask: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Longer side -> ``size`` (image bilinear, mask nearest); pad bottom/right to size x size."""
    from PIL import Image  # noqa: PLC0415 (optional extra data: check_dataset requires it before a read)

    w, h = image.size
    if mask.shape != (h, w):
        raise UserError(f"mask {mask.shape[::-1]} and image {(w, h)} differ in size")
    s = size / max(w, h)
    nw, nh = max(1, round(w * s)), max(1, round(h * s))
    img = np.asarray(image.convert("RGB").resize((nw, nh), Image.Resampling.BILINEAR))
    msk = np.asarray(Image.fromarray(mask).resize((nw, nh), Image.Resampling.NEAREST))
    out_img = np.zeros((size, size, 3), dtype=np.uint8)
    out_msk = np.full((size, size), VOID, dtype=np.uint8)
    out_img[:nh, :nw], out_msk[:nh, :nw] = img, msk
    return out_img, out_msk


def read_voc_split(root: str, split: str, size: int = VOC_SIZE) -> Split:
    """One official list (``train`` or ``val``) as a :class:`Split` of (N, 3, size, size) images and masks."""
    from PIL import Image  # noqa: PLC0415 (optional extra data: check_dataset requires it before a read)

    ids = _ids(root, split)
    images = np.zeros((len(ids), size, size, 3), dtype=np.uint8)
    masks = np.zeros((len(ids), size, size), dtype=np.uint8)
    for i, name in enumerate(ids):
        img_path = os.path.join(root, "JPEGImages", f"{name}.jpg")
        mask_path = os.path.join(root, "SegmentationClass", f"{name}.png")
        for p in (img_path, mask_path):
            if not os.path.isfile(p):
                raise FileNotFoundError(f"VOC {split}: {p} listed in {split}.txt is missing")
        try:
            with Image.open(img_path) as im:
                im.load()
                image = im.copy()
        except (OSError, ValueError) as exc:
            raise UserError(f"{img_path}: cannot read the image ({exc})") from exc
        try:
            images[i], masks[i] = _fit(image, _read_mask(mask_path, len(VOC_CLASSES)), size)
        except ValueError as exc:
            raise UserError(f"VOC {split} {name}: {exc}") from exc
    return Split(torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(masks))


def read_voc(data_dir: str, size: int = VOC_SIZE) -> RawData:
    """PASCAL VOC 2012: official ``train`` as the training pool, official ``val`` as the test split."""
    root = find_voc_root(data_dir)
    return RawData(train=read_voc_split(root, "train", size), test=read_voc_split(root, "val", size),
                   class_names=list(VOC_CLASSES))
