"""The UCI optical-recognition handwritten digits as a tiny built-in data set (no files needed).

The 1,797 images (the test part of the UCI "Optical Recognition of Handwritten Digits" data,
E. Alpaydin and C. Kaynak, 1998; the same arrays as scikit-learn's ``load_digits``) ship inside
calibkit as ``calibkit/assets/digits/optdigits_test.npz`` (45 kB), so neither this data set nor
the default OOD set needs an extra package. They are 8x8 with 17 grey levels (0..16). calibkit
scales them to 0..255 and upsamples them bilinearly to 1x28x28, so "digits" has the shape of Fashion-MNIST: every model
and preset for 28x28 inputs runs on it unchanged, which makes it the data set of the fast tests,
and the same images serve as the out-of-distribution set for Fashion-MNIST.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from calibkit.errors import UserError

from .bundle import RawData, Split
from .transforms import resize

DIGITS_SIZE = 28
DIGITS_FILE = Path(__file__).resolve().parent.parent / "assets" / "digits" / "optdigits_test.npz"
DIGITS_TEST = 360  # the last 360 images (20%) are the fixed test split; validation is drawn from the rest


def digits_images(size: int = DIGITS_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """All 1,797 digits as uint8 (N, 1, size, size) and int64 labels (N,)."""
    images, labels = read_digits_file()
    # 0..16 -> 0..255, then upsample in float so the grey levels stay smooth
    small = torch.from_numpy(np.round(images * (255.0 / 16.0)).astype(np.uint8)).unsqueeze(1)
    return resize(small, (size, size), 1), torch.from_numpy(labels.astype(np.int64))


def read_digits_file(path=DIGITS_FILE) -> tuple[np.ndarray, np.ndarray]:
    """The shipped arrays: images uint8 (1797, 8, 8) with values 0..16, labels uint8 (1797,)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            images, labels = f["images"], f["labels"]
    except (OSError, KeyError, ValueError) as exc:
        raise UserError(f"{path}: unreadable digits file ({exc}); reinstall calibkit") from exc
    if images.shape != (1797, 8, 8) or labels.shape != (1797,) or images.max() > 16 or labels.max() > 9:
        raise UserError(f"{path}: unexpected arrays {images.shape} / {labels.shape}; reinstall calibkit")
    return images, labels


def read_digits(data_dir: str | None = None) -> RawData:
    """Digits 0-9, 1x28x28: 1,437 training and 360 test images (``data_dir`` is ignored)."""
    images, labels = digits_images()
    n_train = images.shape[0] - DIGITS_TEST
    return RawData(
        train=Split(images[:n_train].clone(), labels[:n_train].clone()),
        test=Split(images[n_train:].clone(), labels[n_train:].clone()),
        class_names=[str(k) for k in range(10)],
    )
