"""Data sets as uint8 tensors, seeded splits, batched augmentations, corruptions and OOD sets.

    >>> from calibkit.data import load, augment, normalize
    >>> bundle = load("digits")
    >>> bundle.train.images.shape[1:], bundle.num_classes
    (torch.Size([1, 28, 28]), 10)
"""

from .bundle import DataBundle, RawData, Split
from .corruptions import CORRUPTIONS, SEVERITIES, corrupt, corrupt_split
from .datasets import DATASETS, DatasetSpec, check_dataset, load
from .ood import OOD_SETS, load_ood
from .segmentation import augment_pair
from .transforms import augment, mixup, normalize, regmixup, resize

__all__ = [
    "CORRUPTIONS", "DATASETS", "OOD_SETS", "SEVERITIES", "DataBundle", "DatasetSpec", "RawData", "Split",
    "augment", "augment_pair", "check_dataset", "corrupt", "corrupt_split", "load", "load_ood", "mixup", "normalize",
    "regmixup", "resize",
]  # fmt: skip
