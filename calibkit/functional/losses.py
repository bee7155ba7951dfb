"""Calibration training losses as pure tensor functions.

Every loss takes raw logits ``(N, K)`` and integer targets ``(N,)`` (or soft targets ``(N, K)``)
and returns a 0-dim tensor: the **mean** over the batch, never the sum. Inputs are validated by
:mod:`calibkit._validation` (shape, NaN/inf logits, targets out of range -> ``ValueError``);
float16/bfloat16 logits are upcast to float32 before any softmax or log, so the result of a
half-precision input is a float32 scalar. All probabilities come from ``log_softmax`` so that no
``log(0)`` can occur.

Dense prediction (semantic segmentation): every hard-label loss also takes logits
``(N, K, *S)`` (e.g. ``(N, K, H, W)``) with targets ``(N, *S)``. Pixels whose target equals
``ignore_index`` (default 255) are dropped and the loss is, by definition, the same loss on the
remaining ``P`` pixels gathered into a ``(P, K)`` matrix (:func:`calibkit.functional.pixels.flatten_pixels`):
the mean over valid pixels, all images pooled. When every pixel is ignored the loss is 0 with a zero
gradient (so a crop of "void" does not stop training). ``ignore_index`` acts on dense inputs only:
with ``(N, K)`` logits every target must be a class (an out-of-range label stays an error, so a
1000-class problem never silently drops class 255). The soft-label losses (Mixup, RegMixup, CSM:
image-level methods) refuse dense logits.

Notation: ``p = softmax(l)``, ``p_y`` the probability of the target class,
``d_k = max_j l_j - l_k`` the logit gap to the largest logit. The methods and every choice
the papers leave open are described in ``docs/methods.md``; the dense conventions in
``docs/segmentation.md``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from calibkit._validation import as_tensor, check_logits, check_probs, trusting, upcast
from calibkit.errors import UserError
from calibkit.functional.pixels import dense_rows

__all__ = [
    "cross_entropy",
    "label_smoothing",
    "focal",
    "flsd",
    "ecp",
    "margin_penalty",
    "mbls",
    "acls",
    "dual_focal",
    "adafocal",
    "soft_cross_entropy",
    "soft_l2",
    "feature_l1_norms",
    "fedlas_nci",
    "fedlas_alpha",
    "weighted_label_smoothing",
    "weighted_mbls",
]


# ----------------------------------------------------------------------------- helpers
IGNORE_INDEX = 255  # PASCAL VOC's "void" label; the default of every dense loss


def _rows(logits, targets, ignore_index):
    """Validated ``(logits (M, K), targets (M,), valid)``: the input itself (``valid`` None), or every
    pixel of a dense input as a row with its validity mask (:func:`calibkit.functional.pixels.dense_rows`)."""
    logits = as_tensor(logits, "logits")
    if logits.dim() >= 3:
        return dense_rows(logits, targets, ignore_index)
    logits, targets = check_logits(logits, targets)
    return logits, targets, None


def _prepare(logits, targets, ignore_index=IGNORE_INDEX):
    """Validate, upcast half precision; ``(logits, targets, log_probs, log_p_y, valid)`` over rows."""
    logits, targets, valid = _rows(logits, targets, ignore_index)
    logits = upcast(logits)
    targets = targets.to(logits.device)
    logp = F.log_softmax(logits, dim=1)  # (M, K)
    logp_y = logp.gather(1, targets[:, None]).squeeze(1)  # (M,)
    return logits, targets, logp, logp_y, valid


def _mean(x: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """Mean over rows, or over the valid rows of a dense input (0 with a zero gradient when none is).

    ``where`` (not a product with the mask) keeps a non-finite term of an ignored pixel out.
    """
    if valid is None:
        return x.mean()
    return torch.where(valid, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum() / valid.sum().clamp_min(1)


def _check_number(value, name: str, low: float | None = None, high: float | None = None) -> float:
    """A finite real hyperparameter inside ``[low, high]``; a clear error otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise UserError(f"{name} must be finite, got {value}")
    if (low is not None and value < low) or (high is not None and value > high):
        lo = "-inf" if low is None else low
        hi = "inf" if high is None else high
        raise UserError(f"{name} must lie in [{lo}, {hi}], got {value}")
    return value


def _per_sample(value, name: str, logits: torch.Tensor, dense_targets=None) -> torch.Tensor:
    """A scalar or a tensor of finite per-sample values -> (M,) as logits' dtype/device.

    ``logits`` are the validated rows (M, K). For a dense call, pass the original targets
    ``(N, *S)``: a value of that shape gives one value per pixel, like the rows.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = torch.tensor(float(value))
    value = as_tensor(value, name)
    if not value.dtype.is_floating_point:
        value = value.float()
    n = logits.shape[0]
    if value.dim() == 0:
        value = value.expand(n)
    elif dense_targets is not None:
        dense_targets = as_tensor(dense_targets, "targets")
        if value.shape != dense_targets.shape:
            raise UserError(f"{name} must be a scalar or have the targets' shape {tuple(dense_targets.shape)}, "
                             f"got {tuple(value.shape)}")
        value = value.reshape(-1)  # one value per pixel, like the rows
    if value.shape != (n,):
        raise UserError(f"{name} must be a scalar or have shape ({n},), got {tuple(value.shape)}")
    if not trusting() and not torch.isfinite(value).all():
        raise UserError(f"{name} contains NaN or infinite value(s)")
    return value.to(device=logits.device, dtype=logits.dtype)


def _dense(logits) -> bool:
    return isinstance(logits, torch.Tensor) and logits.dim() >= 3


def _one_minus(p: torch.Tensor) -> torch.Tensor:
    # Clamped away from 0 so that (1 - p)^g keeps a finite gradient for 0 < g < 1 when
    # p rounds to exactly 1; the change in value is below the dtype's resolution.
    return p.clamp_min(torch.finfo(p.dtype).tiny)


def _gap_penalty(logits: torch.Tensor, margin: float) -> torch.Tensor:
    """Per-sample ``mean_k relu(d_k - m)``, shape (N,). Gradient flows through the max logit too."""
    gaps = logits.max(dim=1, keepdim=True).values - logits  # (N, K), d_k >= 0
    return F.relu(gaps - margin).mean(dim=1)


# ----------------------------------------------------------------------------- baselines
def cross_entropy(logits, targets, ignore_index: int | None = IGNORE_INDEX) -> torch.Tensor:
    """Cross-entropy ``mean_i(-log p_{i,y_i})``.

    Args:
        logits: (N, K) raw scores, or dense ``(N, K, *S)``.
        targets: (N,) integer class indices in [0, K), or ``(N, *S)`` for dense logits.
        ignore_index: dense inputs only: target value of unlabelled pixels (default 255).
    Returns:
        0-dim tensor, the batch mean (dense: the mean over valid pixels).

    >>> round(float(cross_entropy(torch.zeros(1, 4), torch.tensor([2]))), 4)  # log 4
    1.3863
    """
    _, _, _, logp_y, valid = _prepare(logits, targets, ignore_index)
    return _mean(-logp_y, valid)


def label_smoothing(logits, targets, alpha: float = 0.05, ignore_index: int | None = IGNORE_INDEX) -> torch.Tensor:
    """Label smoothing ``(1 - a) * (-log p_y) + a * mean_k(-log p_k)`` (Szegedy et al., CVPR 2016).

    Equivalent to cross-entropy against the target ``(1 - a) * onehot(y) + a / K``.

    Args:
        logits: (N, K) or ``(N, K, *S)``. targets: (N,) or ``(N, *S)``. alpha: smoothing weight ``a`` in
        [0, 1] (default 0.05). ignore_index: dense inputs only (default 255).
    """
    alpha = _check_number(alpha, "alpha", 0.0, 1.0)
    _, _, logp, logp_y, valid = _prepare(logits, targets, ignore_index)
    return _mean((1 - alpha) * (-logp_y) + alpha * (-logp.mean(dim=1)), valid)


def focal(logits, targets, gamma: float = 3.0, ignore_index: int | None = IGNORE_INDEX) -> torch.Tensor:
    """Focal loss ``-(1 - p_y)^g log p_y`` (Lin et al., ICCV 2017; Mukhoti et al., NeurIPS 2020).

    The modulating factor is not detached (gradient flows through it, as in the references).

    Args:
        logits: (N, K) or ``(N, K, *S)``. targets: (N,) or ``(N, *S)``. gamma: focusing parameter
        ``g >= 0`` (default 3). ignore_index: dense inputs only (default 255).
    """
    gamma = _check_number(gamma, "gamma", 0.0)
    _, _, _, logp_y, valid = _prepare(logits, targets, ignore_index)
    return _mean(-(_one_minus(-torch.expm1(logp_y)) ** gamma * logp_y), valid)


def flsd(logits, targets, ignore_index: int | None = IGNORE_INDEX) -> torch.Tensor:
    """FLSD-53 (Mukhoti et al., NeurIPS 2020): focal loss with a per-sample ``g``.

    ``g_i = 5`` if ``sg(p_{i,y}) < 0.2`` else ``3``; the choice uses the detached ``p_y``
    (a step function has no useful gradient), the focal factor itself is differentiable.
    Dense ``(N, K, *S)`` input: per valid pixel, ``ignore_index`` as in :func:`cross_entropy`.
    """
    _, _, _, logp_y, valid = _prepare(logits, targets, ignore_index)
    with torch.no_grad():
        gamma = torch.where(logp_y.exp() < 0.2, 5.0, 3.0).to(logp_y.dtype)
    return _mean(-(_one_minus(-torch.expm1(logp_y)) ** gamma * logp_y), valid)


def ecp(logits, targets, beta: float = 0.1, ignore_index: int | None = IGNORE_INDEX) -> torch.Tensor:
    """Confidence penalty ``CE - b * H(p) / K`` (Pereyra et al., ICLR-W 2017).

    ``H(p) = -sum_k p_k log p_k``; dividing by K (entropy averaged over classes) follows the MbLS
    baseline code that produced the published tables. ``b`` default 0.1. Dense ``(N, K, *S)`` input:
    per valid pixel, ``ignore_index`` as in :func:`cross_entropy`.
    """
    beta = _check_number(beta, "beta")
    logits, _, logp, logp_y, valid = _prepare(logits, targets, ignore_index)
    entropy = -(logp.exp() * logp).sum(dim=1)  # (M,)
    return _mean(-logp_y - beta * entropy / logits.shape[1], valid)


def margin_penalty(logits, margin: float = 10.0, targets=None, ignore_index: int | None = IGNORE_INDEX) -> torch.Tensor:
    """MbLS penalty ``mean_{i,k} relu(d_ik - m)`` over all N x K entries (0-dim tensor).

    Dense ``(N, K, *S)`` logits: the mean over every pixel and class, or, when ``targets`` ``(N, *S)``
    are given, over the pixels whose target is not ``ignore_index`` (the penalty itself does not
    read the targets).
    """
    margin = _check_number(margin, "margin", 0.0)
    valid = None
    if _dense(logits):
        if targets is None:  # every pixel counts
            targets, ignore_index = torch.zeros((logits.shape[0], *logits.shape[2:]), dtype=torch.long), None
        logits, _, valid = dense_rows(logits, targets, ignore_index)
    else:
        logits = check_logits(logits)
    return _mean(_gap_penalty(upcast(logits), margin), valid)


def mbls(logits, targets, margin: float = 10.0, lam: float = 0.1,
         ignore_index: int | None = IGNORE_INDEX) -> torch.Tensor:
    """Margin-based label smoothing ``CE + lam * mean_{i,k} relu(d_ik - m)`` (Liu et al., CVPR 2022).

    The mean runs over all N x K entries (the paper's sum over k divided by K, the convention
    the published ``lam`` was tuned with). Gradient flows through both the max logit and ``l_k``.

    Args:
        logits: (N, K). targets: (N,). margin: ``m >= 0`` (default 10; 6 for CIFAR configs).
        lam: penalty weight ``>= 0`` (default 0.1). ignore_index: dense inputs only (default 255);
        dense, both terms average over the valid pixels (the penalty over valid pixels x K).
    """
    margin = _check_number(margin, "margin", 0.0)
    lam = _check_number(lam, "lam", 0.0)
    logits, _, _, logp_y, valid = _prepare(logits, targets, ignore_index)
    return _mean(-logp_y, valid) + lam * _mean(_gap_penalty(logits, margin), valid)


def acls(logits, targets, alpha: float = 0.1, lam1: float = 1.0, lam2: float = 0.1,
         margin: float = 10.0, ignore_index: int | None = IGNORE_INDEX) -> torch.Tensor:
    """Adaptive and conditional label smoothing ``CE + a * R`` (Park et al., ICCV 2023).

    With ``j* = argmax_j l_ij`` (first index on ties)::

        R = lam1 * mean_i relu(l_ij* - M)^2
          + lam2 / (N (K - 1)) * sum_i sum_{j != j*} relu(sg(l_ij*) - l_ij - M)^2

    Args:
        logits: (N, K). targets: (N,). alpha: weight ``a`` (0.1). lam1, lam2: term weights
        (1.0, 0.1). margin: ``M`` (10). ignore_index: dense inputs only (default 255); dense, ``N``
        above is the number of valid pixels.
    """
    alpha = _check_number(alpha, "alpha", 0.0)
    lam1 = _check_number(lam1, "lam1", 0.0)
    lam2 = _check_number(lam2, "lam2", 0.0)
    margin = _check_number(margin, "margin")
    logits, _, _, logp_y, valid = _prepare(logits, targets, ignore_index)
    k = logits.shape[1]
    top = logits.argmax(dim=1, keepdim=True)  # (N, 1)
    l_top = logits.gather(1, top)  # (N, 1), carries gradient in the first term only
    first = _mean(F.relu(l_top.squeeze(1) - margin).pow(2), valid)
    others = F.relu(l_top.detach() - logits - margin).pow(2)  # (N, K)
    others = others.scatter(1, top, 0.0)  # exclude j*
    second = _mean(others.sum(dim=1), valid) / (k - 1)  # = sum / (N (K - 1)) over the (valid) rows
    return _mean(-logp_y, valid) + alpha * (lam1 * first + lam2 * second)


def dual_focal(logits, targets, gamma: float = 5.0, ignore_index: int | None = IGNORE_INDEX) -> torch.Tensor:
    """Dual focal loss ``-(1 - p_y + p_j)^g log p_y`` (Tao et al., ICML 2023).

    ``p_j`` is the largest probability strictly below ``p_y`` (0 when ``p_y`` is the smallest);
    gradient flows through ``p_y`` and ``p_j`` as in the reference implementation.
    ``g`` default 5 (the paper tunes it per data set). Dense ``(N, K, *S)`` input: per valid pixel,
    ``ignore_index`` as in :func:`cross_entropy`.
    """
    gamma = _check_number(gamma, "gamma", 0.0)
    _, _, logp, logp_y, valid = _prepare(logits, targets, ignore_index)
    p = logp.exp()
    p_y = logp_y.exp()
    below = p * (p < p_y[:, None])  # entries >= p_y (the target itself included) become 0
    p_j = below.max(dim=1).values
    return _mean(-(_one_minus(1 - p_y + p_j) ** gamma * logp_y), valid)


def adafocal(logits, targets, gamma, ignore_index: int | None = IGNORE_INDEX) -> torch.Tensor:
    """Focal loss with a per-sample ``g`` that may be negative (AdaFocal, Ghosh et al., NeurIPS 2022).

    ``g_i >= 0``: focal ``-(1 - p_y)^g_i log p_y``; ``g_i < 0``: inverse focal
    ``-(1 + p_y)^|g_i| log p_y``, which pushes confidence up (for under-confident regions).

    Args:
        logits: (N, K) or ``(N, K, *S)``. targets: (N,) or ``(N, *S)``. gamma: scalar, or a tensor shaped
        like ``targets`` (treated as a constant). ignore_index: dense inputs only (default 255).
    """
    dense_targets = targets if _dense(logits) else None
    logits, _, _, logp_y, valid = _prepare(logits, targets, ignore_index)
    gamma = _per_sample(gamma, "gamma", logits, dense_targets).detach()
    p_y = logp_y.exp()
    # Both factors in one product: exactly one of the two exponents is non-zero per sample.
    weight = _one_minus(-torch.expm1(logp_y)) ** gamma.clamp_min(0) * (1 + p_y) ** (-gamma).clamp_min(0)
    return _mean(-(weight * logp_y), valid)


# ----------------------------------------------------------------------------- soft targets
def _prepare_soft(logits, soft_targets):
    if _dense(logits):
        raise UserError(f"logits have shape {tuple(logits.shape)}: the soft-label losses serve image-level "
                         "methods (Mixup, RegMixup, CSM) and take (N, K) logits; they are not defined per pixel")
    logits = upcast(check_logits(logits))
    soft = check_probs(soft_targets, name="soft_targets")
    if soft.shape != logits.shape:
        raise UserError(f"soft_targets has shape {tuple(soft.shape)} but logits have {tuple(logits.shape)}")
    return logits, soft.to(device=logits.device, dtype=logits.dtype)


def soft_cross_entropy(logits, soft_targets) -> torch.Tensor:
    """Cross-entropy with soft labels ``mean_i(-sum_k y_ik log p_ik)`` (Mixup, RegMixup).

    Args:
        logits: (N, K). soft_targets: (N, K), rows are probability vectors.
    """
    logits, soft = _prepare_soft(logits, soft_targets)
    return -(soft * F.log_softmax(logits, dim=1)).sum(dim=1).mean()


def soft_l2(logits, soft_targets) -> torch.Tensor:
    """CSM's loss on generated samples ``mean_i sum_k (p_ik - y_ik)^2`` (Luo et al., ICML 2025).

    Args:
        logits: (N, K). soft_targets: (N, K), rows are probability vectors.
    """
    logits, soft = _prepare_soft(logits, soft_targets)
    return (F.softmax(logits, dim=1) - soft).pow(2).sum(dim=1).mean()


# ----------------------------------------------------------------------------- FeDLaS pieces
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


def fedlas_nci(norms: torch.Tensor, mu, sigma) -> torch.Tensor:
    """FeDLaS norm-confidence index ``gamma_i = (||sg(z_i)||_1 - mu) / (sigma + 1e-3)``, shape (N,).

    Args:
        norms: (N,) feature L1 norms (see :func:`feature_l1_norms`).
        mu, sigma: the running mean and std of the feature L1 norms (floats or 0-dim tensors).
    """
    return (norms - mu) / (sigma + 1e-3)


def fedlas_alpha(nci: torch.Tensor, psi: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """FeDLaS adaptive smoothing ``alpha_i = a * 2 * sigmoid(beta * psi_i * gamma_i)``, in (0, 2a).

    ``beta = 0`` gives ``alpha_i = a`` for every sample (the base loss). Gradient flows to ``psi``.
    """
    return alpha * 2 * torch.sigmoid(beta * psi * nci)


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
