"""The ``tensors`` data set: any modality from one ``.npz`` or ``.safetensors`` file.

The file holds ``x_train``, ``y_train``, ``x_test``, ``y_test`` and optionally ``x_val``,
``y_val`` (a fixed validation split; without them the bench draws one from the training split)
and, in an ``.npz``, ``class_names`` (K strings). Pass it as ``data_dir`` (``--data-dir``) of the
data set ``tensors``. What the inputs are is read from their dtype and shape (decisions where the
spec is silent):

* ``uint8`` ``(N, C, H, W)`` or ``(N, H, W)``: images (modality ``image``: normalised with the
  training split's channel statistics, augmented when the preset says so, corrupted test sets);
* any other integer dtype, ``(N, L)``: token ids (modality ``text``; the vocabulary size, the
  models' ``in_channels``, is the largest id + 1);
* floating point ``(N, ...)``: features or any other real-valued input (modality ``features``:
  float32, used as stored -- no normalisation, no augmentation; ``in_channels`` is ``shape[1]``).

Labels are integers ``(N,)`` in ``[0, K)`` with K = the largest label + 1, and every class must
occur in ``y_train``. Every violation (a missing or unknown key, NaN or infinite inputs, labels
that are not integers, out of range or of another length, splits of different shapes or dtypes)
raises one ``ValueError`` naming the file and the array.
"""

from __future__ import annotations

import difflib
import os

import numpy as np
import torch

from .bundle import RawData, Split

REQUIRED = ("x_train", "y_train", "x_test", "y_test")
OPTIONAL = ("x_val", "y_val", "class_names")
SUFFIXES = (".npz", ".safetensors")


def read_arrays(path: str) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` (no pickles) or ``.safetensors`` file, by name."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"tensors file {path} not found")
    if path.endswith(".npz"):
        try:
            with np.load(path, allow_pickle=False) as f:
                return {k: f[k] for k in f.files}
        except ValueError as exc:  # object arrays need pickles: refused
            raise ValueError(f"{path}: cannot read ({exc})") from None
        except Exception as exc:
            raise ValueError(f"{path}: not a readable .npz file ({type(exc).__name__}: {exc})") from None
    if path.endswith(".safetensors"):
        from safetensors.numpy import load_file

        try:
            return load_file(path)
        except Exception as exc:
            raise ValueError(f"{path}: not a readable .safetensors file ({type(exc).__name__}: {exc})") from None
    raise ValueError(f"{path}: a tensors file ends in {' or '.join(SUFFIXES)}")


def input_kind(x: np.ndarray) -> str:
    """``image``, ``text`` or ``features`` (see the module docstring)."""
    if x.dtype == np.uint8 and x.ndim in (3, 4):
        return "image"
    if np.issubdtype(x.dtype, np.integer) and x.dtype != np.uint8 and x.ndim == 2:
        return "text"
    if np.issubdtype(x.dtype, np.floating) or x.dtype == np.uint8:
        return "features"
    return "unknown"


def to_inputs(x: np.ndarray, kind: str, where: str) -> torch.Tensor:
    """The stored form of inputs of ``kind``, checked (NaN, negative ids)."""
    if x.ndim < 2:
        raise ValueError(f"{where}: inputs must be (N, ...) with at least one axis per example, got shape {x.shape}")
    if kind == "image":
        return torch.from_numpy(np.ascontiguousarray(x if x.ndim == 4 else x[:, None]))
    if kind == "text":
        if x.size and int(x.min()) < 0:
            raise ValueError(f"{where}: token ids must be >= 0, got {int(x.min())}")
        return torch.from_numpy(np.ascontiguousarray(x.astype(np.int64)))
    x = np.asarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        bad = int((~np.isfinite(x)).reshape(len(x), -1).any(1).sum())
        raise ValueError(f"{where}: {bad} example(s) hold NaN or infinite values")
    return torch.from_numpy(np.ascontiguousarray(x))


def _labels(y: np.ndarray, n: int, where: str) -> np.ndarray:
    if not np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_:
        raise ValueError(f"{where}: labels must be integers (class indices), got dtype {y.dtype}")
    if y.ndim != 1 or len(y) != n:
        raise ValueError(f"{where}: expected {n} labels (N,) for {n} inputs, got shape {y.shape}")
    if len(y) and int(y.min()) < 0:
        raise ValueError(f"{where}: labels must be >= 0, got {int(y.min())}")
    return y.astype(np.int64)


def read_tensors_file(path: str) -> RawData:
    """:class:`RawData` of a tensors file (see the module docstring)."""
    arrays = read_arrays(path)
    unknown = sorted(set(arrays) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        close = difflib.get_close_matches(unknown[0], REQUIRED + OPTIONAL, n=1)
        raise ValueError(f"{path}: unknown array {unknown[0]!r}" + (f" (nearest valid name: {close[0]})" if close else "")
                         + f"; a tensors file holds {', '.join(REQUIRED)} and optionally {', '.join(OPTIONAL)}")
    missing = [k for k in REQUIRED if k not in arrays]
    if missing:
        raise ValueError(f"{path}: missing array(s) {', '.join(missing)} (found: {', '.join(sorted(arrays)) or 'none'})")
    if ("x_val" in arrays) != ("y_val" in arrays):
        raise ValueError(f"{path}: give both x_val and y_val, or neither")
    names = ["train", "test"] + (["val"] if "x_val" in arrays else [])
    kind = input_kind(arrays["x_train"])
    if kind == "unknown":
        raise ValueError(f"{path}: x_train has dtype {arrays['x_train'].dtype}; expected uint8 images, integer token "
                         "ids or floating-point inputs")
    shape = arrays["x_train"].shape[1:]
    splits = {}
    for s in names:
        x, where = arrays[f"x_{s}"], f"{path}: x_{s}"
        if input_kind(x) != kind or (kind != "text" and x.shape[1:] != shape) or x.ndim != arrays["x_train"].ndim:
            raise ValueError(f"{where}: {x.dtype} {x.shape} does not match x_train's {arrays['x_train'].dtype} "
                             f"(N, {', '.join(map(str, shape))})")
        splits[s] = (to_inputs(x, kind, where), _labels(arrays[f"y_{s}"], len(x), f"{path}: y_{s}"))
    if not len(splits["train"][1]):  # else reported as every class having no example
        raise ValueError(f"{path}: x_train holds 0 rows; nothing to train on")
    k = 1 + max(int(y.max()) for _, y in splits.values() if len(y))
    present = set(np.unique(splits["train"][1]).tolist())
    absent = [c for c in range(k) if c not in present]
    if absent:
        raise ValueError(f"{path}: labels run 0..{k - 1}, but class(es) {absent[:5]} have no example in y_train; "
                         "use consecutive class indices 0..K-1")
    class_names = [str(c) for c in range(k)]
    if "class_names" in arrays:
        given = [str(c) for c in arrays["class_names"].reshape(-1)]
        if len(given) != k:
            raise ValueError(f"{path}: class_names holds {len(given)} names for {k} classes")
        class_names = given
    vocab = None
    if kind == "text":
        vocab = 1 + max(int(x.max()) for x, _ in splits.values() if x.numel())
    if kind == "text" and any(x.shape[1] != splits["train"][0].shape[1] for x, _ in splits.values()):
        raise ValueError(f"{path}: token ids of every split must have the same length L")
    make = {s: Split(x, torch.from_numpy(y)) for s, (x, y) in splits.items()}
    return RawData(train=make["train"], test=make["test"], val=make.get("val"), class_names=class_names,
                   modality=kind, in_channels=vocab if kind == "text" else int(make["train"].images.shape[1]),
                   record={"source_file": os.path.abspath(path)})
