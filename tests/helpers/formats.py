"""Data files written in the exact on-disk formats the loaders read (shared by the data,
segmentation and bench tests)."""

import gzip
import os

import numpy as np

from calibkit.data.idx import FMNIST_FILES


def write_idx(path, array, magic):
    header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def fake_fmnist(folder, n_train=40, n_test=12, seed=0):
    rng = np.random.default_rng(seed)
    arrays = {
        "train_images": rng.integers(0, 256, (n_train, 28, 28)),
        "train_labels": np.arange(n_train) % 10,
        "test_images": rng.integers(0, 256, (n_test, 28, 28)),
        "test_labels": (np.arange(n_test) * 3) % 10,
    }
    for key, arr in arrays.items():
        write_idx(os.path.join(folder, FMNIST_FILES[key] + ".gz"), arr, 2051 if "images" in key else 2049)
    return arrays
