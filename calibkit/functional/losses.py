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

import torch
import torch.nn.functional as F

from calibkit._arrays import array_io
from calibkit._validation import check_logits, upcast
from calibkit.functional._loss_parts import (  # IGNORE_INDEX and _check_number are read from here too
    IGNORE_INDEX,
    _check_number,
    _dense,
    _gap_penalty,
    _mean,
    _one_minus,
    _per_sample,
    _prepare,
)
from calibkit.functional.fedlas import (
    feature_l1_norms,
    fedlas_alpha,
    fedlas_nci,
    weighted_label_smoothing,
    weighted_mbls,
)
from calibkit.functional.pixels import dense_rows
from calibkit.functional.soft_losses import soft_cross_entropy, soft_l2

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


# ----------------------------------------------------------------------------- baselines
@array_io
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


@array_io
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


@array_io
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


@array_io
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


@array_io
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


@array_io
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


@array_io
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


@array_io
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


@array_io
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


@array_io
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
