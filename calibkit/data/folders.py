"""Data sets stored as image files: Tiny-ImageNet and any ``root/<class>/*.png|jpg`` folder.

Images are decoded with Pillow; all images of a data set must have the same size (they are held
as one uint8 tensor), and an image of another size raises ``ValueError`` naming the file.
"""

from __future__ import annotations

import os
import re

import numpy as np
import torch

import calibkit.extras
from calibkit.errors import UserError

from .bundle import RawData, Split

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
TINY_VAL_PER_CLASS = 50  # protocol: the last 50 training images of each class are the validation split
IMAGEFOLDER_TEST_FRACTION = 0.2  # held-out test share when a folder has no train/test sub-folders
IMAGEFOLDER_TEST_SEED = 0  # the test split of a flat folder is fixed, independent of the run seed


def _pil():
    calibkit.extras.require("PIL", "reading image files")
    from PIL import Image  # noqa: PLC0415 (optional extra data, required above)

    return Image


def read_images(paths: list[str], mode: str) -> torch.Tensor:
    """Decode image files to one uint8 tensor (N, C, H, W); ``mode`` is "L" (C=1) or "RGB" (C=3)."""
    image_mod = _pil()
    arrays, size = [], None
    for p in paths:
        try:
            with image_mod.open(p) as im:
                arr = np.asarray(im.convert(mode), dtype=np.uint8)
        except Exception as exc:  # PIL raises UnidentifiedImageError, OSError, SyntaxError...
            raise UserError(f"{p}: cannot decode image ({type(exc).__name__}: {exc})") from exc
        if size is None:
            size = arr.shape[:2]
        elif arr.shape[:2] != size:
            raise UserError(f"{p}: image is {arr.shape[1]}x{arr.shape[0]} but earlier images are {size[1]}x{size[0]}; "
                             "resize the data set to one size first")  # fmt: skip
        arrays.append(arr if arr.ndim == 3 else arr[:, :, None])
    if not arrays:
        raise UserError("no images to read")
    return torch.from_numpy(np.stack(arrays).transpose(0, 3, 1, 2).copy())


def _natural_key(path: str) -> list:
    # "img_10" after "img_9": numbered files keep their numeric order
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", os.path.basename(path))]


def _list_images(folder: str) -> list[str]:
    """Image files of a folder in natural order (numbers compared as numbers)."""
    names = [f for f in os.listdir(folder) if f.lower().endswith(IMAGE_EXTENSIONS)]
    return sorted((os.path.join(folder, f) for f in names), key=_natural_key)


def _image_mode(paths: list[str]) -> str:
    # grey data sets stay 1-channel; a single colour image makes the whole set RGB
    image_mod = _pil()
    for p in paths:
        try:
            with image_mod.open(p) as im:
                if im.mode not in ("1", "L", "I", "I;16", "F", "LA"):
                    return "RGB"
        except Exception as exc:
            raise UserError(f"{p}: cannot decode image ({type(exc).__name__}: {exc})") from exc
    return "L"


# ---------------------------------------------------------------------------- Tiny-ImageNet


def read_tinyimagenet(data_dir: str) -> RawData:
    """Tiny-ImageNet-200: ``wnids.txt``, ``train/<wnid>/images/*.JPEG``, ``val/images`` with
    ``val/val_annotations.txt`` (file name, wnid, box). Class order = ``wnids.txt`` order.

    Splits (the calibration literature's protocol): the last 50 training images of each class,
    in natural file-name order (``n01443537_450`` .. ``_499``), are the validation split; the
    official validation set is the test split.
    """
    root = data_dir
    if not os.path.isfile(os.path.join(root, "wnids.txt")) and os.path.isfile(
        os.path.join(root, "tiny-imagenet-200", "wnids.txt")
    ):
        root = os.path.join(root, "tiny-imagenet-200")
    wnids_path = os.path.join(root, "wnids.txt")
    if not os.path.isfile(wnids_path):
        raise FileNotFoundError(f"Tiny-ImageNet: {wnids_path} not found; data_dir must be the tiny-imagenet-200 folder")
    with open(wnids_path) as f:
        wnids = [w.strip() for w in f if w.strip()]
    index = {w: k for k, w in enumerate(wnids)}

    train_paths, train_labels, val_paths, val_labels = [], [], [], []
    for k, w in enumerate(wnids):
        folder = os.path.join(root, "train", w, "images")
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"Tiny-ImageNet: training folder {folder} missing for class {w}")
        files = _list_images(folder)
        if len(files) <= TINY_VAL_PER_CLASS:
            raise UserError(f"Tiny-ImageNet class {w} has {len(files)} training images, need > {TINY_VAL_PER_CLASS}")
        train_paths += files[:-TINY_VAL_PER_CLASS]
        train_labels += [k] * (len(files) - TINY_VAL_PER_CLASS)
        val_paths += files[-TINY_VAL_PER_CLASS:]
        val_labels += [k] * TINY_VAL_PER_CLASS

    ann = os.path.join(root, "val", "val_annotations.txt")
    if not os.path.isfile(ann):
        raise FileNotFoundError(f"Tiny-ImageNet: {ann} not found (needed for the test split)")
    test_paths, test_labels = [], []
    with open(ann) as f:
        for line_no, line in enumerate(f, 1):
            parts = line.strip().split("\t")
            if not parts or not parts[0]:
                continue
            if len(parts) < 2 or parts[1] not in index:
                raise UserError(f"{ann}:{line_no}: expected '<file>\\t<wnid>...' with a wnid from wnids.txt, "
                                f"got {line!r}")
            test_paths.append(os.path.join(root, "val", "images", parts[0]))
            test_labels.append(index[parts[1]])

    names = list(wnids)
    words = os.path.join(root, "words.txt")
    if os.path.isfile(words):  # optional human-readable names
        with open(words) as f:
            lookup = dict(line.rstrip("\n").split("\t", 1) for line in f if "\t" in line)
        names = [lookup.get(w, w) for w in wnids]

    def split(paths, labels):
        return Split(read_images(paths, "RGB"), torch.tensor(labels, dtype=torch.int64))

    return RawData(train=split(train_paths, train_labels), test=split(test_paths, test_labels),
                   class_names=names, val=split(val_paths, val_labels))  # fmt: skip


# ----------------------------------------------------------------------------- image folder


def _scan_classes(folder: str, classes: list[str] | None = None) -> tuple[list[str], list[str], list[int]]:
    found = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))
    training = classes is None  # its sub-folders define the classes
    classes = classes if classes is not None else found
    unknown = sorted(set(found) - set(classes))
    if unknown:
        raise UserError(f"{folder}: class folders {unknown} are not among the training classes {classes}")
    paths, labels, empty = [], [], []
    for k, c in enumerate(classes):
        sub = os.path.join(folder, c)
        files = _list_images(sub) if os.path.isdir(sub) else []
        paths += files
        labels += [k] * len(files)
        empty += [] if files else [c]
    if not classes or not paths:
        raise UserError(f"{folder}: no class folders with images ({', '.join(IMAGE_EXTENSIONS)}) found")
    if empty and training:  # a class without a training image could never be learnt, yet would count
        raise UserError(f"{folder}: class folder(s) {', '.join(empty)} hold no images ({', '.join(IMAGE_EXTENSIONS)}); "
                         "every sub-folder is a class: add their images or remove them")
    return classes, paths, labels


def read_imagefolder(data_dir: str) -> RawData:
    """Any classification folder: ``root/<class>/*.png|jpg`` (classes in sorted folder-name order).

    If ``root`` holds ``train/`` and ``test/`` sub-folders (each ``<class>/*``), they are the
    official splits; otherwise a fixed 20% of the images (seeded permutation with seed 0,
    independent of the run seed) is the test split. Images are 1-channel when every file is
    greyscale, RGB otherwise. A class folder without images among the training classes is refused
    (it would count as a class no image teaches); in ``test/`` a class may have none.
    """
    if os.path.isdir(os.path.join(data_dir, "train")) and os.path.isdir(os.path.join(data_dir, "test")):
        classes, tr_paths, tr_labels = _scan_classes(os.path.join(data_dir, "train"))
        _, te_paths, te_labels = _scan_classes(os.path.join(data_dir, "test"), classes)
    else:
        classes, paths, labels = _scan_classes(data_dir)
        perm = np.random.default_rng(IMAGEFOLDER_TEST_SEED).permutation(len(paths))
        n_test = int(round(IMAGEFOLDER_TEST_FRACTION * len(paths)))
        if n_test == 0 or n_test == len(paths):
            raise UserError(f"{data_dir}: {len(paths)} images are too few to hold out a test split")
        test_idx, train_idx = np.sort(perm[:n_test]), np.sort(perm[n_test:])
        tr_paths, tr_labels = [paths[i] for i in train_idx], [labels[i] for i in train_idx]
        te_paths, te_labels = [paths[i] for i in test_idx], [labels[i] for i in test_idx]
    mode = _image_mode(tr_paths + te_paths)
    train_images = read_images(tr_paths, mode)
    test_images = read_images(te_paths, mode)
    if train_images.shape[1:] != test_images.shape[1:]:
        raise UserError(f"{data_dir}: training images are {tuple(train_images.shape[1:])}, "
                         f"test images {tuple(test_images.shape[1:])}")  # fmt: skip
    return RawData(
        train=Split(train_images, torch.tensor(tr_labels, dtype=torch.int64)),
        test=Split(test_images, torch.tensor(te_labels, dtype=torch.int64)),
        class_names=list(classes),
    )
