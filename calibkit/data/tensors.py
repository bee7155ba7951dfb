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
occur in ``y_train``; unsigned integer labels are accepted and read as int64 (a value above the
int64 range is refused). Every violation (a missing or unknown key, NaN or infinite inputs, labels
that are not integers, out of range or of another length, splits of different shapes or dtypes)
raises one ``ValueError`` naming the file and the array; so do a folder given as the file, a
damaged file and an object array (never unpickled). :func:`read_npz` and :func:`read_pt` are the
readers ``calibkit calibrate`` and ``calibkit apply`` use for their logits files too.
"""

from __future__ import annotations

import difflib
import itertools
import os
import pickle
import re
import zipfile

import numpy as np
import torch
from safetensors.numpy import load_file

from calibkit.errors import UserError

from .bundle import RawData, Split

REQUIRED = ("x_train", "y_train", "x_test", "y_test")
OPTIONAL = ("x_val", "y_val", "class_names")
SUFFIXES = (".npz", ".safetensors")


def check_is_file(path, what: str = "file") -> None:
    """Raise ``FileNotFoundError`` when ``path`` does not exist, ``ValueError`` when it is a folder."""
    if os.path.isdir(path):
        raise UserError(f"{path} is a directory, not a {what}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} {path} not found")


class _ObjectArray(Exception):
    """An ``.npz`` member that only unpickling could read (its name is the argument)."""


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()[:25])  # one line, without torch's paragraphs of advice
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _zip_archive(path) -> bool:
    """Whether ``path`` starts as a zip archive does and ends with its central directory (intact)."""
    with open(path, "rb") as f:
        head = f.read(4)
    return head in (b"PK\x03\x04", b"PK\x05\x06") and zipfile.is_zipfile(path)


def read_npz(path) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` archive, by name. Nothing is unpickled: an object array is refused.

    A file that is not an intact zip archive (random bytes, a truncated download, a ``.npy`` or a
    pickle renamed ``.npz``) is "not a readable .npz file".
    """
    if not _zip_archive(path):
        raise UserError(f"{path}: not a readable .npz file (not an intact zip archive: truncated, corrupt or "
                         "another format)")
    out = {}
    try:
        with np.load(path, allow_pickle=False) as f:
            for key in f.files:
                try:
                    out[key] = f[key]
                except ValueError as exc:
                    if "allow_pickle" not in str(exc):
                        raise
                    raise _ObjectArray(key) from None
    except _ObjectArray as refused:  # an object array: loading it would run pickled code
        raise UserError(f"{path}: array {refused.args[0]!r} holds Python objects (dtype object), which calibkit "
                         "does not unpickle; store numeric arrays") from None
    except Exception as exc:  # a damaged member: zipfile, zlib and numpy's header parser raise their own types
        raise UserError(f"{path}: not a readable .npz file ({_first_line(exc)})") from None
    return out


def read_pt(path) -> dict:
    """The dict of a ``torch.save`` file, loaded with ``weights_only=True`` (tensors and plain Python
    values only: any other pickled object is refused, never unpickled)."""
    with open(path, "rb") as f:
        zipped = f.read(4) == b"PK\x03\x04"
    if zipped and not _zip_archive(path):
        raise UserError(f"{path}: truncated or corrupt .pt file (its zip archive has no central directory)")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        what = f" ({found.group(1)})" if found else ""
        damaged = "" if zipped else ", or the file is truncated or corrupt"
        raise UserError(f"{path}: holds pickled Python objects other than tensors{what}, which calibkit does not "
                         f"load (weights_only){damaged}; save a dict of torch tensors") from None
    except Exception as exc:  # torch raises RuntimeError, EOFError, OSError, ... for a damaged file
        raise UserError(f"{path}: truncated or corrupt .pt file ({_first_line(exc)})") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path}: holds a {type(obj).__name__}, not a dict of tensors")
    return obj


def read_arrays(path: str) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` (no pickles) or ``.safetensors`` file, by name."""
    check_is_file(path, "tensors file")
    if path.endswith(".npz"):
        return read_npz(path)
    if path.endswith(".safetensors"):
        try:
            return load_file(path)
        except Exception as exc:
            raise UserError(f"{path}: not a readable .safetensors file ({type(exc).__name__}: {exc})") from None
    raise UserError(f"{path}: a tensors file ends in {' or '.join(SUFFIXES)}")


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
        raise UserError(f"{where}: inputs must be (N, ...) with at least one axis per example, got shape {x.shape}")
    if kind == "image":
        return torch.from_numpy(np.ascontiguousarray(x if x.ndim == 4 else x[:, None]))
    if kind == "text":
        if x.size and int(x.min()) < 0:
            raise UserError(f"{where}: token ids must be >= 0, got {int(x.min())}")
        return torch.from_numpy(np.ascontiguousarray(x.astype(np.int64)))
    x = np.asarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        bad = int((~np.isfinite(x)).reshape(len(x), -1).any(1).sum())
        raise UserError(f"{where}: {bad} example(s) hold NaN or infinite values")
    return torch.from_numpy(np.ascontiguousarray(x))


def _labels(y: np.ndarray, n: int, where: str) -> np.ndarray:
    if not np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_:
        raise UserError(f"{where}: labels must be integers (class indices), got dtype {y.dtype}")
    if y.ndim != 1 or len(y) != n:
        raise UserError(f"{where}: expected {n} labels (N,) for {n} inputs, got shape {y.shape}")
    if len(y) and int(y.min()) < 0:
        raise UserError(f"{where}: labels must be >= 0, got {int(y.min())}")
    if y.dtype.kind == "u" and len(y) and int(y.max()) > np.iinfo(np.int64).max:  # unsigned: accepted if they fit
        raise UserError(f"{where}: label {int(y.max())} is above the int64 range; labels are class indices 0..K-1")
    return y.astype(np.int64)


def read_tensors_file(path: str) -> RawData:
    """:class:`RawData` of a tensors file (see the module docstring)."""
    arrays = read_arrays(path)
    _check_names(path, arrays)
    kind = input_kind(arrays["x_train"])
    if kind == "unknown":
        raise UserError(f"{path}: x_train has dtype {arrays['x_train'].dtype}; expected uint8 images, integer token "
                         "ids or floating-point inputs")
    splits = _read_splits(path, arrays, kind)
    k = _check_labels(path, splits)
    class_names = _class_names(path, arrays, k)
    vocab = None
    if kind == "text":
        vocab = 1 + max(int(x.max()) for x, _ in splits.values() if x.numel())
    if kind == "text" and any(x.shape[1] != splits["train"][0].shape[1] for x, _ in splits.values()):
        raise UserError(f"{path}: token ids of every split must have the same length L")
    make = {s: Split(x, torch.from_numpy(y)) for s, (x, y) in splits.items()}
    return RawData(train=make["train"], test=make["test"], val=make.get("val"), class_names=class_names,
                   modality=kind, in_channels=vocab if kind == "text" else int(make["train"].images.shape[1]),
                   record={"source_file": os.path.abspath(path)})


def _check_names(path: str, arrays: dict) -> None:
    """Refuse unknown arrays (naming the nearest valid name), missing ones, and half a validation split."""
    unknown = sorted(set(arrays) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        close = difflib.get_close_matches(unknown[0], REQUIRED + OPTIONAL, n=1)
        raise UserError(f"{path}: unknown array {unknown[0]!r}"
                        + (f" (nearest valid name: {close[0]})" if close else "")
                         + f"; a tensors file holds {', '.join(REQUIRED)} and optionally {', '.join(OPTIONAL)}")
    missing = [k for k in REQUIRED if k not in arrays]
    if missing:
        raise UserError(f"{path}: missing array(s) {', '.join(missing)} (found: {', '.join(sorted(arrays)) or 'none'})")
    if ("x_val" in arrays) != ("y_val" in arrays):
        raise UserError(f"{path}: give both x_val and y_val, or neither")


def _read_splits(path: str, arrays: dict, kind: str) -> dict:
    """``{split: (inputs, labels)}`` of train, test and (when given) val, each checked against x_train."""
    names = ["train", "test"] + (["val"] if "x_val" in arrays else [])
    shape = arrays["x_train"].shape[1:]
    splits = {}
    for s in names:
        x, where = arrays[f"x_{s}"], f"{path}: x_{s}"
        if input_kind(x) != kind or (kind != "text" and x.shape[1:] != shape) or x.ndim != arrays["x_train"].ndim:
            raise UserError(f"{where}: {x.dtype} {x.shape} does not match x_train's {arrays['x_train'].dtype} "
                             f"(N, {', '.join(map(str, shape))})")
        splits[s] = (to_inputs(x, kind, where), _labels(arrays[f"y_{s}"], len(x), f"{path}: y_{s}"))
    if not len(splits["train"][1]):  # else reported as every class having no example
        raise UserError(f"{path}: x_train holds 0 rows; nothing to train on")
    if not len(splits["test"][1]):  # the array, not only "the test split"
        raise UserError(f"{path}: x_test holds 0 rows; nothing to evaluate")
    if "val" in splits and not len(splits["val"][1]):
        raise UserError(f"{path}: x_val holds 0 rows; give validation rows, or leave x_val and y_val out (a "
                         "validation split is then held out of x_train)")
    return splits


def _check_labels(path: str, splits: dict) -> int:
    """The number of classes K; refuses labels beyond y_train's classes and classes without a training example."""
    k_train = 1 + int(splits["train"][1].max())
    for s in list(splits)[1:]:  # a label beyond y_train's classes: name the array that holds it
        top = int(splits[s][1].max())
        if top >= k_train:
            raise UserError(f"{path}: y_{s} holds label {top}, but y_train's classes run 0..{k_train - 1}; every "
                             f"label of y_{s} must be a class with examples in y_train")
    k = 1 + max(int(y.max()) for _, y in splits.values() if len(y))
    present = set(np.unique(splits["train"][1]).tolist())
    absent = list(itertools.islice((c for c in range(k) if c not in present), 5))  # never walks up to a huge label
    if absent:
        raise UserError(f"{path}: labels run 0..{k - 1}, but class(es) {absent[:5]} have no example in y_train; "
                         "use consecutive class indices 0..K-1")
    return k


def _class_names(path: str, arrays: dict, k: int) -> list[str]:
    """The file's ``class_names`` (one per class), else ``"0"`` .. ``"K-1"``."""
    if "class_names" not in arrays:
        return [str(c) for c in range(k)]
    given = [str(c) for c in arrays["class_names"].reshape(-1)]
    if len(given) != k:
        raise UserError(f"{path}: class_names holds {len(given)} names for {k} classes")
    return given
