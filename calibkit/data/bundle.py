"""Containers for a loaded data set and the seeded train/validation split.

A loader in this package returns :class:`RawData` (the arrays as found on disk); ``load`` then
splits off the validation set, optionally keeps a training subset, and computes the per-channel
statistics. Everything is held as uint8 tensors ``(N, C, H, W)`` so that a whole data set fits in
memory and augmentation can run batched on the device.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class Split:
    """One split of a data set.

    Attributes:
        images: uint8 tensor (N, C, H, W), values 0..255.
        labels: int64 tensor (N,), values in [0, num_classes); for segmentation, uint8 masks
            (N, H, W) of per-pixel classes, 255 marking unlabelled ("void") pixels.
    """

    images: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self):
        if self.images.dtype != torch.uint8 or self.images.dim() != 4:
            raise ValueError(
                f"images must be a uint8 tensor (N, C, H, W), got {self.images.dtype} {tuple(self.images.shape)}"
            )
        masks = self.labels.dtype == torch.uint8 and self.labels.dim() == 3
        if masks and self.labels.shape[1:] != self.images.shape[2:]:
            raise ValueError(f"masks {tuple(self.labels.shape)} do not match images {tuple(self.images.shape)}")
        if not masks and (self.labels.dtype != torch.int64 or self.labels.dim() != 1):
            raise ValueError("labels must be an int64 tensor (N,) or uint8 masks (N, H, W), "
                             f"got {self.labels.dtype} {tuple(self.labels.shape)}")
        if self.images.shape[0] != self.labels.shape[0]:
            raise ValueError(f"{self.images.shape[0]} images but {self.labels.shape[0]} labels")

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, index) -> "Split":
        """The images and labels at ``index`` (a 1-D index tensor or array)."""
        index = torch.as_tensor(index, dtype=torch.long)
        return Split(self.images[index], self.labels[index])


@dataclass
class RawData:
    """What a format reader returns: the official splits as found on disk.

    ``val`` is set only for data sets whose validation split is fixed by the protocol rather than
    drawn at random (Tiny-ImageNet: the last 50 training images of each class).
    """

    train: Split
    test: Split
    class_names: list[str]
    val: Split | None = None


@dataclass
class DataBundle:
    """A data set ready for training: splits, statistics and augmentation settings.

    Attributes:
        name: registry name (``DATASETS`` key).
        train, val, test: the three splits (uint8 images (N, C, H, W), int64 labels (N,)).
        num_classes: K.
        in_channels: C.
        mean, std: per-channel statistics of the training split, in [0, 1] pixel units
            (the arguments of :func:`calibkit.data.normalize`).
        hflip: whether horizontal flips are a label-preserving augmentation for this data.
        crop_pad: zero padding (pixels) for the random-crop augmentation; 0 disables it.
        class_names: K human-readable names.
        split: how the validation split was drawn (seed, sizes, checksum of the validation
            indices); recorded with every run so a result can be traced to its exact split.
        data_dir: the directory the files were read from (None for built-in data).
        modality: ``"image"`` (classification) or ``"segmentation"`` (labels are uint8 masks
            (N, H, W); see :mod:`calibkit.data.segmentation`).
        ignore_index: the mask value of unlabelled pixels (255) for segmentation, else None.
    """

    name: str
    train: Split
    val: Split
    test: Split
    num_classes: int
    in_channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    hflip: bool
    crop_pad: int
    class_names: list[str]
    split: dict = field(default_factory=dict)
    data_dir: str | None = None
    modality: str = "image"
    ignore_index: int | None = None

    @property
    def image_size(self) -> tuple[int, int]:
        """(H, W) of every image."""
        return tuple(self.train.images.shape[-2:])


def index_checksum(index) -> str:
    """Short SHA-256 of an index set, so two runs can tell whether they used the same split."""
    arr = np.ascontiguousarray(np.asarray(index, dtype="<i8"))
    return hashlib.sha256(arr.tobytes()).hexdigest()[:16]


def seeded_split(n: int, val_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``val_size`` of ``n`` indices for validation with a seeded permutation.

    Both index arrays are returned sorted, so the training split keeps the on-disk order and
    "the first n training images" is a stable, nested subset across sizes.

    Returns:
        (train_index, val_index), int64 arrays of lengths n - val_size and val_size.
    """
    if not 0 <= val_size < n:
        raise ValueError(f"val_size must be in [0, {n - 1}] for a training set of {n} images, got {val_size}")
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[val_size:]).astype(np.int64), np.sort(perm[:val_size]).astype(np.int64)


def channel_stats(images: torch.Tensor, chunk: int = 4096) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and standard deviation of uint8 images, in [0, 1] units.

    Computed exactly from a 256-bin histogram per channel, in chunks, so even 50k CIFAR images
    never need a float copy of the whole data set.

    Args:
        images: uint8 (N, C, H, W).

    Returns:
        (mean, std): two tuples of C floats.
    """
    c = images.shape[1]
    hist = torch.zeros(c, 256, dtype=torch.float64)
    for start in range(0, images.shape[0], chunk):
        block = images[start : start + chunk]
        for ch in range(c):
            hist[ch] += torch.bincount(block[:, ch].reshape(-1).long(), minlength=256).double()
    values = torch.arange(256, dtype=torch.float64) / 255.0
    count = hist.sum(dim=1)
    mean = (hist * values).sum(dim=1) / count
    var = (hist * (values - mean[:, None]) ** 2).sum(dim=1) / count
    std = var.sqrt().clamp_min(1e-6)  # a constant channel would otherwise divide by zero
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)
