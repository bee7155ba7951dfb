"""Dense (per-pixel) predictions: select the valid pixels of ``(N, K, *S)`` logits.

Segmentation networks output logits ``(N, K, H, W)`` (or ``(N, K, D, H, W)`` for volumes) with
targets ``(N, H, W)``; pixels whose target equals ``ignore_index`` (255 in PASCAL VOC: object
borders and "void") carry no label. Every dense loss in calibkit is *defined* as the same loss on
the valid pixels gathered into a ``(P, K)`` matrix, ``P`` = number of valid pixels, so its
reduction is the mean over valid pixels (all images of the batch pooled, as
``torch.nn.functional.cross_entropy(..., ignore_index=255)`` does), and its gradient with respect
to an ignored pixel's logits is exactly zero.

    >>> import torch
    >>> logits = torch.zeros(1, 3, 2, 2)
    >>> targets = torch.tensor([[[0, 255], [2, 1]]])
    >>> flat, y, _ = flatten_pixels(logits, targets)
    >>> flat.shape, y.tolist()
    (torch.Size([3, 3]), [0, 2, 1])

The losses themselves use :func:`dense_rows`, which keeps every pixel as a row with a validity
mask and averages with ``where(valid, term, 0).sum() / valid.sum()``: the same value as the mean
over the gathered valid rows, without the data-dependent shapes of boolean indexing (which would
make the host wait for the device at every training step).
"""

from __future__ import annotations

import torch

from calibkit._validation import as_tensor, trusting
from calibkit.errors import UserError

__all__ = ["flatten_pixels", "dense_rows", "feature_rows", "is_dense", "check_ignore_index"]


def is_dense(x) -> bool:
    """True for a tensor with spatial axes, ``(N, K, *S)`` with at least one ``S``."""
    return isinstance(x, torch.Tensor) and x.dim() >= 3


def check_ignore_index(ignore_index) -> int | None:
    """``ignore_index`` must be an integer or ``None`` (nothing ignored)."""
    if ignore_index is None:
        return None
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise UserError(f"ignore_index must be an integer or None, got {ignore_index!r}")
    return ignore_index


def _check_dense(x: torch.Tensor, name: str) -> torch.Tensor:
    if not x.dtype.is_floating_point:
        raise UserError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.shape[0] == 0 or x.shape[1] == 0 or any(s == 0 for s in x.shape[2:]):
        raise UserError(f"{name} is empty: got shape {tuple(x.shape)}")
    if x.numel() and not trusting():
        lo, hi = torch.aminmax(x.detach())
        if not (bool(torch.isfinite(lo)) and bool(torch.isfinite(hi))):
            raise UserError(f"{name} contains {int((~torch.isfinite(x)).sum())} NaN or infinite value(s)")
    return x


def _checked(logits, targets, ignore_index, name):
    """Shape/dtype checks (always) and value checks (unless trusting); ``(logits, long targets, valid)``."""
    ignore_index = check_ignore_index(ignore_index)
    logits = as_tensor(logits, name)
    if logits.dim() < 3:
        raise UserError(f"{name} must have shape (N, K, H, W) (dense), got {tuple(logits.shape)}")
    _check_dense(logits, name)
    k = logits.shape[1]
    if k < 2:
        raise UserError(f"{name} must have at least 2 classes (K >= 2) on axis 1, got K = {k}")
    targets = as_tensor(targets, "targets")
    want = (logits.shape[0], *logits.shape[2:])
    if tuple(targets.shape) != want:
        raise UserError(f"targets must have shape {want} to match {name} {tuple(logits.shape)}, "
                         f"got {tuple(targets.shape)}")
    if targets.dtype.is_floating_point or targets.dtype == torch.bool or targets.dtype.is_complex:
        raise UserError(f"targets must hold integer class indices, got dtype {targets.dtype}")
    targets = targets.to(logits.device).long()
    valid = targets != ignore_index if ignore_index is not None else torch.ones_like(targets, dtype=torch.bool)
    if not trusting():
        bad = valid & ((targets < 0) | (targets >= k))
        if bool(bad.any()):
            v = int(targets[bad][0])
            raise UserError(f"targets out of range: found {v}, expected values in [0, {k - 1}]"
                             + (f" or ignore_index={ignore_index}" if ignore_index is not None else ""))
    return logits, targets, valid


def dense_rows(logits, targets, ignore_index: int | None = 255, name: str = "logits"):
    """Every pixel as a row, with a validity mask (no boolean indexing, no host synchronisation).

    Args:
        logits: float ``(N, K, *S)``. targets: integer ``(N, *S)``. ignore_index: as in :func:`flatten_pixels`.

    Returns:
        ``(rows (M, K), targets (M,), valid (M,) bool)`` with ``M = N * prod(S)``; ignored pixels
        get target 0 (any class would do: their terms are masked out by ``valid``).
    """
    logits, targets, valid = _checked(logits, targets, ignore_index, name)
    k = logits.shape[1]
    rows = logits.movedim(1, -1).reshape(-1, k)
    valid = valid.reshape(-1)
    return rows, torch.where(valid, targets.reshape(-1), 0), valid


def flatten_pixels(logits, targets, ignore_index: int | None = 255, features=None, name: str = "logits"):
    """Gather the valid pixels of dense logits (and features) into rows.

    Args:
        logits: float ``(N, K, *S)``, K >= 2 classes on axis 1, at least one spatial axis.
        targets: integer ``(N, *S)``, values in [0, K) or ``ignore_index``.
        ignore_index: target value of unlabelled pixels (default 255); ``None``: every pixel counts.
        features: optional float ``(N, D, *S)`` features at the same resolution (FeDLaS's per-pixel
            penultimate features).
        name: the argument name used in error messages.

    Returns:
        ``(logits (P, K), targets (P,), features (P, D) or None)``, pixels in row-major order of
        ``(N, *S)``. Gradients flow back to the selected entries only. ``P`` may be 0.

    Raises:
        ValueError: wrong shapes or dtypes, NaN/inf values, or a target outside [0, K) that is not
            ``ignore_index``.
    """
    logits, targets, valid = _checked(logits, targets, ignore_index, name)
    y = targets[valid]
    flat = logits.movedim(1, -1)[valid]  # (P, K)
    feats = None
    if features is not None:
        feats = feature_rows(features, logits, name).reshape(*valid.shape, -1)[valid.to(features.device)]
    return flat, y, feats


def feature_rows(features, logits, name: str = "logits") -> torch.Tensor:
    """Per-pixel features ``(N, D, *S)`` at the resolution of ``logits`` ``(N, K, *S)`` -> rows ``(M, D)``."""
    features = _check_dense(as_tensor(features, "features"), "features")
    if features.dim() != logits.dim() or features.shape[0] != logits.shape[0] \
            or features.shape[2:] != logits.shape[2:]:
        raise UserError(f"features must have shape (N, D, *S) = ({logits.shape[0]}, D, "
                         f"{', '.join(map(str, logits.shape[2:]))}) to match {name}, got {tuple(features.shape)}")
    return features.movedim(1, -1).reshape(-1, features.shape[1])
