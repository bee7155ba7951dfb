"""Fashion-MNIST from its four idx files (the MNIST file format).

An idx file starts with a 4-byte magic number ``0x00 0x00 <type> <ndim>`` (type 0x08 = uint8),
then ``ndim`` big-endian int32 sizes, then the data. Images are ``(N, 28, 28)`` (magic 2051),
labels ``(N,)`` (magic 2049). The files may be gzip-compressed (``*.gz``, as distributed, and as
installed by the Debian package ``dataset-fashion-mnist``) or plain.
"""

from __future__ import annotations

import gzip
import os
import zlib

import numpy as np
import torch

from calibkit.errors import UserError

from .bundle import RawData, Split

FMNIST_DIR = "/usr/share/datasets/fashion-mnist"
FMNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
FMNIST_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]  # fmt: skip

_IMAGES_MAGIC = 2051  # 0x00000803: uint8, 3 dimensions
_LABELS_MAGIC = 2049  # 0x00000801: uint8, 1 dimension


def read_idx(path: str, expect_magic: int) -> np.ndarray:
    """Read one idx file (gzip or plain) into a uint8 array, validating its header and size.

    Args:
        path: file name.
        expect_magic: 2051 for an image file, 2049 for a label file.

    Returns:
        uint8 array of shape (N, rows, cols) for images or (N,) for labels.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: wrong magic number, or the data are shorter/longer than the header says.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"idx file not found: {path}")
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                raw = f.read()
        else:
            with open(path, "rb") as f:
                raw = f.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise UserError(f"{path}: cannot decompress ({exc}); the file is corrupt or truncated") from exc
    if len(raw) < 8:
        raise UserError(f"{path}: only {len(raw)} bytes, too short for an idx header")
    magic = int.from_bytes(raw[:4], "big")
    if magic != expect_magic:
        kind = "image" if expect_magic == _IMAGES_MAGIC else "label"
        raise UserError(f"{path}: magic number {magic}, expected {expect_magic} for an idx {kind} file")
    ndim = raw[3]
    header = 4 + 4 * ndim
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    expected = header + int(np.prod(dims))
    if len(raw) != expected:
        raise UserError(
            f"{path}: {len(raw)} bytes but the header {dims} needs {expected}; the file is truncated or corrupt"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def _find(data_dir: str, stem: str) -> str:
    for name in (stem + ".gz", stem):
        path = os.path.join(data_dir, name)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"Fashion-MNIST file {stem}.gz not found in {data_dir}. Install the Debian package "
        f"(apt-get install dataset-fashion-mnist, which puts the files in {FMNIST_DIR}) or pass "
        "--data-dir / data_dir= pointing to a folder with the four idx .gz files"
    )


def _pair(data_dir: str, which: str) -> Split:
    images = read_idx(_find(data_dir, FMNIST_FILES[which + "_images"]), _IMAGES_MAGIC)
    labels = read_idx(_find(data_dir, FMNIST_FILES[which + "_labels"]), _LABELS_MAGIC)
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise UserError(
            f"Fashion-MNIST {which}: {images.shape} images do not match {labels.shape} labels in {data_dir}"
        )
    if labels.size and labels.max() >= len(FMNIST_CLASSES):
        raise UserError(f"Fashion-MNIST {which}: label {labels.max()} out of range 0..9 in {data_dir}")
    return Split(torch.from_numpy(images.copy()).unsqueeze(1), torch.from_numpy(labels.astype(np.int64)))


def read_fmnist(data_dir: str) -> RawData:
    """Fashion-MNIST: 60k training and 10k test images, 1x28x28, 10 classes."""
    return RawData(train=_pair(data_dir, "train"), test=_pair(data_dir, "test"), class_names=list(FMNIST_CLASSES))
