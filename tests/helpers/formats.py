"""Data files written in the exact on-disk formats the loaders read (shared by the data,
segmentation and bench tests)."""

import gzip
import os
import pickle

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


def cifar_rows(n, offset):
    """(N, 3072) rows whose R/G/B planes are distinguishable: value = 10*channel + image + offset."""
    data = np.zeros((n, 3, 32, 32), np.uint8)
    for i in range(n):
        for c in range(3):
            data[i, c] = 10 * c + i + offset
        data[i, 0, 1, 2] = 200  # one marked pixel: row 1, column 2 of the red plane
    return data.reshape(n, 3072)


def write_pickle(path, obj):
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)  # protocol 2 as in the distributed files


def fake_cifar10(folder, per_batch=4, n_test=6):
    for b in range(1, 6):
        labels = [(b + i) % 10 for i in range(per_batch)]
        write_pickle(os.path.join(folder, f"data_batch_{b}"),
                     {b"batch_label": b"x", b"data": cifar_rows(per_batch, b), b"labels": labels})  # fmt: skip
    write_pickle(os.path.join(folder, "test_batch"), {b"data": cifar_rows(n_test, 100), b"labels": list(range(n_test))})
    write_pickle(os.path.join(folder, "batches.meta"), {b"label_names": [f"c{k}".encode() for k in range(10)]})
