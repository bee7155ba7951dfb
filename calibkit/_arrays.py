"""The numpy/torch boundary of the public API: numpy in, numpy out; torch in, torch out.

Every public function and calibrator method that takes arrays computes on torch tensors inside.
:func:`array_io` wraps it once, at the boundary:

* if any argument is a ``torch.Tensor``, the result is returned as computed (tensors stay tensors,
  on their device, with their autograd graph where the computation has one);
* otherwise (numpy arrays, lists, python numbers) the result is converted: a 0-dim tensor becomes a
  python ``float`` (``int`` or ``bool`` for integer or boolean tensors), a tensor with dimensions a
  numpy array (same dtype; bfloat16, which numpy lacks, as float32), numpy scalars python numbers,
  and tuples, lists and dicts are converted item by item (named tuples keep their type).

The rule looks only at the arguments' types, never at their values, so one call always returns
one kind. A mix of numpy and torch arguments returns torch (the caller already works in torch).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch

__all__ = ["array_io", "to_numpy_side", "wants_torch"]

F = TypeVar("F", bound=Callable[..., Any])


_Tensor = torch.Tensor


def wants_torch(args: tuple, kwargs: dict) -> bool:
    """Whether any positional or keyword argument is a ``torch.Tensor`` (plain loops: this runs on
    every call of every wrapped function, losses in training loops included)."""
    for a in args:
        if isinstance(a, _Tensor):
            return True
    for v in kwargs.values():
        if isinstance(v, _Tensor):
            return True
    return False


def to_numpy_side(value):
    """``value`` as a numpy user expects it (module docstring): tensors -> float/int/bool or ndarray."""
    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.dim() == 0:
            return t.item()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.cpu().numpy()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        items = [to_numpy_side(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, list):
        return [to_numpy_side(v) for v in value]
    if isinstance(value, dict):
        return {k: to_numpy_side(v) for k, v in value.items()}
    return value


def array_io(fn: F) -> F:
    """Decorate a public function (or method) that takes arrays: numpy in -> numpy out (module docstring)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        return out if wants_torch(args, kwargs) else to_numpy_side(out)

    return wrapper  # type: ignore[return-value]
