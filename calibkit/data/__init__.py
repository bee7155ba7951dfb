"""Data sets as uint8 tensors, seeded splits, batched augmentations, corruptions and OOD sets.

    >>> from calibkit.data import load, augment, normalize
    >>> bundle = load("digits")
    >>> bundle.train.images.shape[1:], bundle.num_classes
    (torch.Size([1, 28, 28]), 10)
"""

from .bundle import DataBundle, RawData, Split
from .datasets import DATASETS, DatasetSpec, load
from .transforms import augment, mixup, normalize, regmixup, resize

__all__ = [
    "DATASETS", "DataBundle", "DatasetSpec", "RawData", "Split",
    "augment", "load", "mixup", "normalize", "regmixup", "resize",
]  # fmt: skip
