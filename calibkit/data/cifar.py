"""CIFAR-10 and CIFAR-100 from the "python version" batch directories.

Each batch file is a pickled dict: ``b"data"`` a uint8 array (N, 3072) -- per image 1024 red,
then 1024 green, then 1024 blue values, each a row-major 32x32 plane -- and ``b"labels"``
(CIFAR-10) or ``b"fine_labels"`` (CIFAR-100), lists of ints.

Pickles can run arbitrary code when loaded, so they are read with a restricted unpickler that
resolves only the few globals these files need (numpy's array reconstruction and ``_codecs.encode``,
which Python 3 pickles of ``bytes`` refer to); any other global raises ``ValueError``.
"""

from __future__ import annotations

import _codecs
import os
import pickle

import numpy as np
import torch

from calibkit.errors import UserError

from .bundle import RawData, Split

try:  # numpy >= 2 moved the implementation module; old pickles still name numpy.core
    from numpy._core import multiarray
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core import multiarray  # type: ignore[no-redef]

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _numpy_globals() -> dict:
    allowed = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype, ("_codecs", "encode"): _codecs.encode}
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "_reconstruct")] = multiarray._reconstruct
        allowed[(module, "scalar")] = multiarray.scalar
    return allowed


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module, name):  # a file names a handful of globals: the table is built per call
        try:
            return _numpy_globals()[(module, name)]
        except KeyError:
            raise UserError(
                f"refusing to unpickle global {module}.{name}: a CIFAR batch holds only arrays, bytes and lists"
            ) from None


def read_cifar_batch(path: str, label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    """One batch file -> (uint8 images (N, 3, 32, 32), int64 labels (N,)), validated."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"CIFAR batch file not found: {path}")
    try:
        with open(path, "rb") as f:
            obj = _SafeUnpickler(f, encoding="bytes").load()
    except ValueError:
        raise
    except Exception as exc:  # truncated/garbled pickles raise many different errors
        raise UserError(f"{path}: not a readable CIFAR pickle ({type(exc).__name__}: {exc})") from exc
    if not isinstance(obj, dict) or b"data" not in obj or label_key not in obj:
        keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise UserError(f"{path}: expected a dict with b'data' and {label_key!r}, found {keys}")
    data = np.asarray(obj[b"data"])
    labels = np.asarray(obj[label_key], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise UserError(f"{path}: b'data' must be uint8 (N, 3072), got {data.dtype} {data.shape}")
    if labels.shape != (data.shape[0],):
        raise UserError(f"{path}: {data.shape[0]} images but {labels.shape[0]} labels")
    return data.reshape(-1, 3, 32, 32), labels


def _names_from_meta(path: str, key: bytes, fallback: list[str] | None) -> list[str] | None:
    if not os.path.isfile(path):
        return fallback
    with open(path, "rb") as f:
        try:
            meta = _SafeUnpickler(f, encoding="bytes").load()
        except Exception as exc:
            raise UserError(f"{path}: not a readable CIFAR meta pickle ({exc})") from exc
    return [n.decode() if isinstance(n, bytes) else str(n) for n in meta[key]]


def _resolve(data_dir: str, subdir: str, marker: str) -> str:
    # accept the batch folder itself or its parent (where the archive was extracted)
    for d in (data_dir, os.path.join(data_dir, subdir)):
        if os.path.isfile(os.path.join(d, marker)):
            return d
    raise FileNotFoundError(
        f"no {marker} in {data_dir} or {os.path.join(data_dir, subdir)}: point data_dir at the extracted "
        f"'{subdir}' folder of the python version of the data set"
    )


def _split(data: list[np.ndarray], labels: list[np.ndarray]) -> Split:
    return Split(torch.from_numpy(np.concatenate(data)), torch.from_numpy(np.concatenate(labels)))


def _check_range(labels: np.ndarray, k: int, where: str) -> None:
    if labels.size and (labels.min() < 0 or labels.max() >= k):
        raise UserError(f"{where}: labels must lie in [0, {k - 1}], found {labels.min()}..{labels.max()}")


def read_cifar10(data_dir: str) -> RawData:
    """CIFAR-10: data_batch_1..5 (50k) and test_batch (10k), 3x32x32, 10 classes."""
    root = _resolve(data_dir, "cifar-10-batches-py", "test_batch")
    parts = [read_cifar_batch(os.path.join(root, f"data_batch_{i}"), b"labels") for i in range(1, 6)]
    test = read_cifar_batch(os.path.join(root, "test_batch"), b"labels")
    names = _names_from_meta(os.path.join(root, "batches.meta"), b"label_names", CIFAR10_CLASSES) or []
    for lab in [p[1] for p in parts] + [test[1]]:
        _check_range(lab, len(names), root)
    return RawData(
        train=_split([p[0] for p in parts], [p[1] for p in parts]),
        test=_split([test[0]], [test[1]]),
        class_names=names,
    )


def read_cifar100(data_dir: str) -> RawData:
    """CIFAR-100: ``train`` (50k) and ``test`` (10k) files, fine labels (100 classes)."""
    root = _resolve(data_dir, "cifar-100-python", "test")
    train = read_cifar_batch(os.path.join(root, "train"), b"fine_labels")
    test = read_cifar_batch(os.path.join(root, "test"), b"fine_labels")
    names = _names_from_meta(os.path.join(root, "meta"), b"fine_label_names", None) or [str(k) for k in range(100)]
    if len(names) != 100:
        raise UserError(f"{root}/meta lists {len(names)} fine label names, expected 100")
    for lab in (train[1], test[1]):
        _check_range(lab, 100, root)
    return RawData(train=_split([train[0]], [train[1]]), test=_split([test[0]], [test[1]]), class_names=names)
