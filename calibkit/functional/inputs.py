"""The input layouts every metric accepts, turned into rows of class probabilities.

* ``(N, K)`` probabilities with ``(N,)`` labels: multiclass (``K = 2`` included).
* ``(N,)`` positive-class probabilities with ``(N,)`` 0/1 labels: **binary**, the scikit-learn
  convention. A 1-D input is binary by contract; it becomes the two columns ``(1 - p, p)``, so
  the top-label confidence is ``max(p, 1 - p)`` and the prediction is 1 exactly when ``p > 0.5``
  (a tie at 0.5 predicts class 0, the first index). An ``(N, 2)`` input stays a K = 2 problem,
  with the same numbers: nothing is guessed from the values.
* ``(N, K, *spatial)`` probabilities with ``(N, *spatial)`` labels: **dense** (segmentation),
  one row per pixel, equal to the same metric on ``probs.movedim(1, -1).reshape(-1, K)``.

``ignore_index`` (default ``None``) drops the rows whose label equals it (segmentation void
pixels, usually 255) before anything else, so their probabilities are never read and their
labels may lie outside ``[0, K)``. On the CPU the kept rows are copied out; on other devices a
0/1 row weight is returned instead, so that no step waits for the device to learn how many rows
are left.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from calibkit._validation import as_tensor, check_labels, probs_error
from calibkit.errors import UserError

__all__ = ["Rows", "to_rows"]


@dataclass
class Rows:
    """Probabilities as rows, see :func:`to_rows`.

    Attributes:
        probs: ``(P, K)`` probabilities (a view or copy of the input, dtype unchanged).
        labels: ``(P,)`` integer labels (on the device path, ignored rows hold label 0).
        valid: ``(P,)`` bool, the rows that count (device path with ``ignore_index``), else ``None``.
        dense: the input had spatial dimensions.
        binary: the input was a 1-D vector of positive-class probabilities.
    """

    probs: torch.Tensor
    labels: torch.Tensor
    valid: torch.Tensor | None = None
    dense: bool = False
    binary: bool = False


def _check_integer(labels: torch.Tensor, name: str = "labels") -> None:
    if labels.dtype.is_floating_point or labels.dtype == torch.bool or labels.dtype.is_complex:
        raise UserError(f"{name} must hold integer class indices, got dtype {labels.dtype}")


def _binary_rows(p: torch.Tensor, labels: torch.Tensor, name: str) -> torch.Tensor:
    if labels.dim() != 1 or labels.shape[0] != p.shape[0]:
        raise UserError(f"1-D {name} (binary: positive-class probabilities, shape ({p.shape[0]},)) need labels "
                         f"of shape ({p.shape[0]},), got {tuple(labels.shape)}")
    if not p.dtype.is_floating_point:
        raise UserError(f"{name} must be a floating-point tensor, got dtype {p.dtype}")
    if p.device.type == "cpu" and p.numel():
        lo, hi = torch.aminmax(p)
        err = probs_error(name, float(lo), float(hi), 0.0, p.dtype)
        if err is not None:
            raise err
    return torch.stack([1 - p, p], 1)


def to_rows(probs, labels, ignore_index: int | None = None, name: str = "probs", compact: bool | None = None) -> Rows:
    """Bring any accepted layout (module docstring) to ``(P, K)`` rows and ``(P,)`` labels.

    Checks the layout only (shapes, label dtype with ``ignore_index``); the values are checked
    by the caller, on the rows. ``compact`` (default: on the CPU) removes ignored rows instead of
    returning ``valid``.
    """
    probs, labels = as_tensor(probs, name), as_tensor(labels, "labels")
    binary = dense = False
    if probs.dim() == 1:
        binary = True
        probs = _binary_rows(probs, labels, name)
    elif probs.dim() >= 3:
        dense = True
        expected = probs.shape[:1] + probs.shape[2:]
        if tuple(labels.shape) != tuple(expected):
            raise UserError(f"dense {name} of shape {tuple(probs.shape)} (N, K, *spatial) need labels of shape "
                             f"{tuple(expected)}, got {tuple(labels.shape)} (binary maps: pass 1-D positive-class "
                             "probabilities and labels, e.g. probs.flatten(), labels.flatten())")
    if ignore_index is None:
        if dense:
            probs = probs.movedim(1, -1).reshape(-1, probs.shape[1])
            labels = labels.reshape(-1)
        return Rows(probs, labels, None, dense, binary)
    _check_integer(labels)
    if probs.dim() == 0:  # before the mask indexes it
        raise UserError(f"{name} must have shape (N, K), got ()")
    if not dense and probs.dim() == 2:
        check_labels(labels, None, probs.shape[0])  # shape errors before indexing with the mask
    keep = labels != ignore_index
    if compact is None:
        compact = probs.device.type == "cpu"
    if compact:
        # boolean indexing of the class-last view copies only the kept rows
        rows = probs.movedim(1, -1)[keep] if dense else probs[keep]
        return Rows(rows, labels[keep], None, dense, binary)
    if dense:
        probs = probs.movedim(1, -1).reshape(-1, probs.shape[1])
        keep, labels = keep.reshape(-1), labels.reshape(-1)
    return Rows(probs, torch.where(keep, labels, torch.zeros_like(labels)), keep, dense, binary)
