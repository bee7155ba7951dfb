"""Containers for a loaded data set and the seeded train/validation split.

A loader in this package returns :class:`RawData` (the arrays as found on disk); ``load`` then
splits off the validation set, optionally keeps a training subset, and computes the per-channel
statistics. Everything is held as uint8 tensors ``(N, C, H, W)`` so that a whole data set fits in
memory and augmentation can run batched on the device.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from calibkit.errors import UserError

if TYPE_CHECKING:
    from calibkit.data.tokenizer import Vocabulary
    from calibkit.data.wordpiece import WordPieceTokenizer


@dataclass
class Split:
    """One split of a data set.

    Attributes:
        images: the inputs. Images: a uint8 tensor (N, C, H, W), values 0..255. Text: an int64
            tensor (N, L) of token ids; features (the ``tensors`` data set): float32 (N, ...) (the
            attribute keeps its name for every modality; ``inputs`` is an alias).
        labels: class indices in [0, num_classes): int64 (N,) for classification; per pixel for
            segmentation, (N, H, W) int64 or uint8 (uint8 masks take 1/8 of the memory: a PASCAL
            VOC training set is 0.3 GB instead of 2.7 GB); 255 or the data set's ignore index marks
            unlabelled pixels.
    """

    images: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self):
        image_like = self.images.dtype == torch.uint8 and self.images.dim() == 4
        tokens = self.images.dtype == torch.int64 and self.images.dim() == 2
        features = self.images.dtype == torch.float32 and self.images.dim() >= 2
        if not (image_like or tokens or features):
            raise UserError(
                "images must be a uint8 tensor (N, C, H, W) (or int64 token ids (N, L), or float32 inputs "
                "(N, ...) of the features modality), "
                f"got {self.images.dtype} {tuple(self.images.shape)}"
            )
        masks_u8 = self.labels.dtype == torch.uint8 and self.labels.dim() == 3
        if not masks_u8 and (self.labels.dtype != torch.int64 or self.labels.dim() not in (1, 3)):
            raise UserError(
                f"labels must be an int64 tensor (N,) (or (N, H, W) per pixel, int64 or uint8), got "
                f"{self.labels.dtype} {tuple(self.labels.shape)}"
            )
        masks = self.labels.dim() == 3 and self.images.dim() == 4
        if masks and self.labels.shape[1:] != self.images.shape[2:]:
            raise UserError(f"masks {tuple(self.labels.shape)} do not match images {tuple(self.images.shape)}")
        if self.images.shape[0] != self.labels.shape[0]:
            raise UserError(f"{self.images.shape[0]} images but {self.labels.shape[0]} labels")

    @property
    def inputs(self) -> torch.Tensor:
        """The inputs whatever the modality (images or token ids)."""
        return self.images

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, index) -> Split:
        """The images and labels at ``index`` (a 1-D index tensor or array)."""
        index = torch.as_tensor(index, dtype=torch.long)
        return Split(self.images[index], self.labels[index])


@dataclass
class RawData:
    """What a format reader returns: the official splits as found on disk.

    ``val`` is set only for data sets whose validation split is fixed by the protocol rather than
    drawn at random (Tiny-ImageNet: the last 50 training images of each class; the text sets).
    Text readers also set ``modality="text"``, ``in_channels`` (the vocabulary size), ``vocab``
    (the :class:`~calibkit.data.tokenizer.Vocabulary` of the token ids) and ``record`` (entries
    added to the bundle's split record, e.g. the snapshot of the files read).
    """

    train: Split
    test: Split
    class_names: list[str]
    val: Split | None = None
    modality: str = "image"
    in_channels: int | None = None
    vocab: Vocabulary | WordPieceTokenizer | None = None
    record: dict = field(default_factory=dict)


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
        modality: ``"image"`` (uint8 images, (N,) labels); other modalities register their own
            input pipeline (``calibkit.data.inputs.INPUTS``): ``"text"`` (int64 token ids (N, L)),
            ``"segmentation"`` (per-pixel labels, see :mod:`calibkit.data.segmentation`).
        vocab: text data: the :class:`~calibkit.data.tokenizer.Vocabulary` that produced the
            token ids (its size is ``in_channels``); None for images.
        ignore_index: the label of unlabelled pixels (255) for segmentation, else None.
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
    vocab: Vocabulary | WordPieceTokenizer | None = None
    ignore_index: int | None = None

    @property
    def image_size(self) -> tuple[int, int]:
        """(H, W) of every image."""
        h, w = self.train.images.shape[-2:]
        return int(h), int(w)


def index_checksum(index) -> str:
    """Short SHA-256 of an index set, so two runs can tell whether they used the same split."""
    arr = np.ascontiguousarray(np.asarray(index, dtype="<i8"))
    return hashlib.sha256(arr.tobytes()).hexdigest()[:16]


def stratified_quotas(counts, size: int) -> np.ndarray:
    """Per-class counts summing to ``size``, proportional to ``counts`` (largest remainder).

    Class ``c`` gets ``floor(size * n_c / n)``; the images still missing go one each to the classes
    with the largest fractional parts (ties: the lower class index). No class gets more than it has.

    >>> stratified_quotas([6, 3, 1], 5).tolist()
    [3, 2, 0]
    """
    counts = np.asarray(counts, dtype=np.int64)
    n = int(counts.sum())
    if not 0 <= size <= n:
        raise UserError(f"cannot draw {size} of {n} items")
    if n == 0:
        return counts.copy()
    exact = counts * size / n
    quota = np.floor(exact).astype(np.int64)
    order = np.lexsort((np.arange(len(counts)), -(exact - quota)))  # largest remainder first
    quota[order[: size - int(quota.sum())]] += 1
    return quota


def stratified_split(labels, size: int, seed: int, stream: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``size`` of the indices of ``labels``, class-stratified and seeded.

    Each class keeps its share (:func:`stratified_quotas`); within a class, the images drawn are
    the first of a seeded random permutation of that class's indices. The generator is seeded by
    ``SeedSequence([seed, stream])``, so the validation split (stream 0) and the training subset
    (stream 1) are independent draws of the same seed. Both returned arrays are sorted.

    Args:
        labels: (n,) integer class labels.
        size: how many indices to draw, in [0, n).
        seed, stream: the seed of the draw and which draw of that seed it is.

    Returns:
        (rest, drawn): int64 index arrays of lengths n - size and size, disjoint, covering 0..n-1.
    """
    labels = np.asarray(labels, dtype=np.int64)
    n = len(labels)
    if not 0 <= size < n:
        raise UserError(f"val_size must be in [0, {n - 1}] for a training set of {n} images, got {size}")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(stream)]))
    classes, counts = np.unique(labels, return_counts=True)
    quotas = stratified_quotas(counts, size)
    per_class = [rng.permutation(np.flatnonzero(labels == c))[:q] for c, q in zip(classes, quotas)]
    drawn = np.sort(np.concatenate(per_class)).astype(np.int64)  # n >= 1, so there is at least one class
    rest = np.setdiff1d(np.arange(n, dtype=np.int64), drawn, assume_unique=True)
    return rest, drawn


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
