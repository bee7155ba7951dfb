"""SVHN (cropped digits) from ``train_32x32.mat`` and ``test_32x32.mat``.

Each MATLAB file holds ``X`` uint8 (32, 32, 3, N) and ``y`` (N, 1) with labels 1..10, where 10
stands for the digit 0; calibkit maps 10 -> 0 so label k is digit k. The ``extra`` file is not used.
"""

from __future__ import annotations

import os

import numpy as np
import torch

import calibkit.extras
from calibkit.errors import UserError

from .bundle import RawData, Split


def read_svhn_mat(path: str) -> Split:
    """One ``*_32x32.mat`` file -> Split (uint8 (N, 3, 32, 32), int64 labels 0..9)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"SVHN file not found: {path}; data_dir must contain train_32x32.mat and test_32x32.mat"
        )

    calibkit.extras.require("scipy", "reading SVHN")
    from scipy.io import loadmat  # noqa: PLC0415 (optional extra data, required above)

    try:
        mat = loadmat(path)
    except Exception as exc:  # scipy raises several types for garbled or truncated files
        raise UserError(f"{path}: not a readable MATLAB file ({type(exc).__name__}: {exc})") from exc
    if "X" not in mat or "y" not in mat:
        raise UserError(f"{path}: expected variables X and y, found {sorted(k for k in mat if not k.startswith('__'))}")
    x, y = np.asarray(mat["X"]), np.asarray(mat["y"]).reshape(-1).astype(np.int64)
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[2] != 3:
        raise UserError(f"{path}: X must be uint8 (H, W, 3, N), got {x.dtype} {x.shape}")
    if x.shape[3] != y.shape[0]:
        raise UserError(f"{path}: {x.shape[3]} images but {y.shape[0]} labels")
    if y.size and (y.min() < 1 or y.max() > 10):
        raise UserError(f"{path}: SVHN labels must lie in 1..10, found {y.min()}..{y.max()}")
    images = torch.from_numpy(np.ascontiguousarray(x.transpose(3, 2, 0, 1)))  # (H,W,C,N) -> (N,C,H,W)
    return Split(images, torch.from_numpy(y % 10))


def read_svhn(data_dir: str) -> RawData:
    """SVHN: 73,257 training and 26,032 test images, 3x32x32, digits 0-9."""
    return RawData(
        train=read_svhn_mat(os.path.join(data_dir, "train_32x32.mat")),
        test=read_svhn_mat(os.path.join(data_dir, "test_32x32.mat")),
        class_names=[str(k) for k in range(10)],
    )
