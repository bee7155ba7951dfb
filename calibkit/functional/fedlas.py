"""The pieces of FeDLaS (feature-dependent label smoothing): feature norms, the norm-confidence
index, the adaptive per-sample weight, and the two losses it weights (label smoothing and MbLS).

:class:`calibkit.losses.FeDLaS` puts them together with its running statistics and gate; the
conventions (dense inputs, ``ignore_index``) are those of :mod:`calibkit.functional.losses`, which
re-exports every function here.
"""

from __future__ import annotations

import torch

from calibkit._arrays import array_io
from calibkit._validation import as_tensor, trusting, upcast
from calibkit.errors import UserError
from calibkit.functional._loss_parts import (
    IGNORE_INDEX,
    _check_number,
    _dense,
    _gap_penalty,
    _mean,
    _per_sample,
    _prepare,
)


@array_io
def feature_l1_norms(features) -> torch.Tensor:
    """L1 norms ``||sg(z_i)||_1`` of penultimate features (N, D) -> (N,), validated and detached."""
    z = as_tensor(features, "features")
    if z.dim() != 2 or z.shape[0] == 0 or z.shape[1] == 0:
        raise UserError(f"features must have shape (N, D) with N, D >= 1, got {tuple(z.shape)}")
    if not z.dtype.is_floating_point:
        raise UserError(f"features must be a floating-point tensor, got dtype {z.dtype}")
    if not trusting() and not torch.isfinite(z).all():
        raise UserError("features contains NaN or infinite value(s)")
    return upcast(z).detach().abs().sum(dim=1)


@array_io
def fedlas_nci(norms: torch.Tensor, mu, sigma) -> torch.Tensor:
    """FeDLaS norm-confidence index ``gamma_i = (||sg(z_i)||_1 - mu) / (sigma + 1e-3)``, shape (N,).

    Args:
        norms: (N,) feature L1 norms (see :func:`feature_l1_norms`).
        mu, sigma: the running mean and std of the feature L1 norms (floats or 0-dim tensors).
    """
    return (norms - mu) / (sigma + 1e-3)


@array_io
def fedlas_alpha(nci: torch.Tensor, psi: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """FeDLaS adaptive smoothing ``alpha_i = a * 2 * sigmoid(beta * psi_i * gamma_i)``, in (0, 2a).

    ``beta = 0`` gives ``alpha_i = a`` for every sample (the base loss). Gradient flows to ``psi``.
    """
    return alpha * 2 * torch.sigmoid(beta * psi * nci)


@array_io
def weighted_label_smoothing(logits, targets, alpha, ignore_index: int | None = IGNORE_INDEX) -> torch.Tensor:
    """Label smoothing with a per-sample weight: ``mean_i[(1 - a_i) NLL_i + a_i mean_k(-log p_ik)]``.

    FeDLaS-LS (spec section 3). Gradient flows to ``alpha`` (FeDLaS trains its gate through it).

    Args:
        logits: (N, K) or ``(N, K, *S)``. targets: (N,) or ``(N, *S)``. alpha: scalar or a tensor shaped
        like ``targets``. ignore_index: dense inputs only (default 255).
    """
    dense_targets = targets if _dense(logits) else None
    logits, _, logp, logp_y, valid = _prepare(logits, targets, ignore_index)
    alpha = _per_sample(alpha, "alpha", logits, dense_targets)
    return _mean((1 - alpha) * (-logp_y) + alpha * (-logp.mean(dim=1)), valid)


@array_io
def weighted_mbls(logits, targets, alpha, margin: float, ignore_index: int | None = IGNORE_INDEX) -> torch.Tensor:
    """MbLS with a per-sample weight in convex form (FeDLaS-MbLS, spec section 3).

    ``mean_i[(1 - a_i) NLL_i] + mean_i[a_i * mean_k relu(d_ik - m)]``; note the CE weight
    ``1 - a_i`` (unlike :func:`mbls`, where CE has weight 1).

    Args:
        logits: (N, K) or ``(N, K, *S)``. targets: (N,) or ``(N, *S)``. alpha: scalar or a tensor shaped
        like ``targets``. margin: ``m >= 0``. ignore_index: dense inputs only (default 255).
    """
    margin = _check_number(margin, "margin", 0.0)
    dense_targets = targets if _dense(logits) else None
    logits, _, _, logp_y, valid = _prepare(logits, targets, ignore_index)
    alpha = _per_sample(alpha, "alpha", logits, dense_targets)
    return _mean((1 - alpha) * (-logp_y), valid) + _mean(alpha * _gap_penalty(logits, margin), valid)
