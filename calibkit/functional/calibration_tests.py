"""Tests of top-label calibration with p-values: Spiegelhalter's Z and a KS-type test.

Both see each sample's top-label confidence ``c_i = max_k p_ik`` and correctness
``a_i = [argmax_k p_ik = y_i]`` (every input layout of the metrics, ``ignore_index`` included).
The null hypothesis is top-label calibration, ``P(a_i = 1 | c_i) = c_i``; the confidences are
treated as fixed, so under the null the ``a_i`` are independent ``Bernoulli(c_i)``. Both return
``(statistic, p_value)`` as 0-dim float64 tensors; a small p-value is evidence of miscalibration.

* :func:`spiegelhalter_z` (Spiegelhalter, Statistics in Medicine 1986): the Brier score
  ``sum_i (a_i - c_i)^2`` against its null mean ``sum_i c_i (1 - c_i)``, standardised:
  ``Z = sum_i (a_i - c_i)(1 - 2 c_i) / sqrt(sum_i (1 - 2 c_i)^2 c_i (1 - c_i))``, with the
  two-sided normal p-value ``P(|N(0, 1)| >= |Z|) = erfc(|Z| / sqrt 2)``. Over-confidence above
  0.5 gives ``Z > 0``. Rows at ``c = 0.5`` carry no weight, and miscalibration of the same sign
  below and above 0.5 (possible with ``K > 2``) partly cancels: it tests the Brier score, not
  the shape of the miscalibration.
* :func:`ks_calibration_test`: the KS calibration error of Gupta et al. (ICLR 2021),
  ``KS = max_m |S_m| / N`` with ``S_m = sum_{j <= m} (a_j - c_j)`` over the samples sorted by
  confidence (ascending; the maximum at the end of each block of tied confidences, as
  :func:`calibkit.functional.ks_error`). Under the null ``S_m`` is a martingale with
  independent increments of variance ``c_j (1 - c_j)``, **not pinned at the end** (``S_N`` is
  free), so on the time scale ``t = V_m / V_N``, ``V_m = sum_{j <= m} c_j (1 - c_j)``,
  ``S / sqrt(V_N)`` tends to a standard Brownian motion ``W`` on [0, 1] (not a bridge).
  The statistic ``T = N KS / sqrt(V_N)`` is referred to ``sup_{[0,1]} |W|``:
  ``p = P(sup |W| >= T) = 4 sum_{k>=0} (-1)^k Phi_bar((2k + 1) T)`` (reflection), computed for
  ``T < 1`` from the equivalent series
  ``1 - (4/pi) sum_{k>=0} (-1)^k / (2k + 1) exp(-(2k + 1)^2 pi^2 / (8 T^2))``.
  This is the asymptotic null distribution (large N, no single row dominating ``V_N``). The
  maximum over finitely many times (and only over block ends when confidences are tied) is at
  most the supremum, so the test is conservative at finite N; the level is checked by
  simulation in the tests and ``docs/metrics.md``.

Degenerate variance: when ``V_N = 0`` (every confidence 0 or 1 for the KS test; every weight
``(1 - 2c)^2 c (1 - c)`` zero for Z), the data either agree with the null exactly (statistic 0,
p = 1) or contradict it with certainty (a wrong prediction at confidence 1: p = 0, ``Z = +-inf``).

Streaming: Z needs two running sums (numerator and variance) and streams in O(1) memory; the
KS test sorts every confidence (2 numbers per sample, as AECE).

Example:
    >>> import torch
    >>> probs = torch.tensor([[0.8, 0.2], [0.8, 0.2], [0.6, 0.4], [0.9, 0.1]])
    >>> labels = torch.tensor([0, 1, 0, 0])
    >>> z, p = spiegelhalter_z(probs, labels)       # 0.2 / sqrt(0.1824)
    >>> round(float(z), 4), round(float(p), 4)
    (0.4683, 0.6396)
"""

from __future__ import annotations

import math

import numpy as np
import torch

from calibkit._arrays import array_io
from calibkit.errors import UserError
from calibkit.functional.estimators import tie_blocks
from calibkit.functional.metrics import _sums

__all__ = ["MIN_ROWS", "spiegelhalter_z", "ks_calibration_test", "sup_abs_brownian_sf"]


#: fewer scored rows than this: the tests refuse (their normal and Brownian approximations say
#: nothing on a handful of rows; one row gave p = 0.035 and 0.07).
MIN_ROWS = 10


def _top(probs, labels, ignore_index, owner: str):
    """Validated ``(confidence, correct)`` float64 numpy arrays ``(P,)`` (ignored rows removed),
    at least :data:`MIN_ROWS` of them."""
    s = _sums(probs, labels, 1, ignore_index=ignore_index)
    c = s.conf.detach().double().cpu().numpy()
    a = s.correct.detach().double().cpu().numpy()
    if s.weight is not None:
        keep = s.weight.detach().cpu().numpy() > 0
        c, a = c[keep], a[keep]
    if c.size < MIN_ROWS:
        raise UserError(f"{owner} needs at least {MIN_ROWS} scored rows, got {c.size}: its p-value rests on a "
                        "large-sample approximation; test on more rows")
    return c, a


def _pair(stat: float, p: float, probs):
    dev = probs.device if isinstance(probs, torch.Tensor) else "cpu"
    return (torch.tensor(stat, dtype=torch.float64, device=dev),
            torch.tensor(min(max(p, 0.0), 1.0), dtype=torch.float64, device=dev))


def sup_abs_brownian_sf(t: float) -> float:
    """``P(sup_{0 <= u <= 1} |W(u)| >= t)`` for a standard Brownian motion ``W`` (``W(0) = 0``).

    ``t >= 1``: ``4 sum_{k>=0} (-1)^k Phi_bar((2k+1) t)`` (reflection principle), accurate in the
    far tail. ``t < 1``: ``1 - (4/pi) sum_{k>=0} (-1)^k/(2k+1) exp(-(2k+1)^2 pi^2 / (8 t^2))``
    (eigenfunction expansion). Both series converge fast on their side of 1.
    """
    t = float(t)
    if math.isnan(t):
        raise UserError("t is NaN")
    if t <= 0:
        return 1.0
    if t >= 1:
        total = 0.0
        for k in range(64):
            term = math.erfc((2 * k + 1) * t / math.sqrt(2)) / 2
            total += term if k % 2 == 0 else -term
            if term < 1e-300:
                break
        return min(4 * total, 1.0)
    cdf = 0.0
    for k in range(64):
        m = 2 * k + 1
        term = math.exp(-m * m * math.pi ** 2 / (8 * t * t)) / m
        cdf += term if k % 2 == 0 else -term
        if term < 1e-300:
            break
    return min(max(1.0 - 4 / math.pi * cdf, 0.0), 1.0)


@array_io
def spiegelhalter_z(probs, labels, ignore_index: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Spiegelhalter's Z test of top-label calibration, ``(Z, p_value)``.

    ``Z = sum_i (a_i - c_i)(1 - 2 c_i) / sqrt(sum_i (1 - 2 c_i)^2 c_i (1 - c_i))`` over the
    top-label confidences ``c_i`` and correctness ``a_i``; two-sided normal p-value
    ``erfc(|Z| / sqrt 2)``. ``Z > 0``: the Brier score is higher than calibration predicts
    (typically over-confidence). Inputs as the metrics (``(N, K)``, binary ``(N,)``, dense with
    ``ignore_index``). Streams in O(1) memory (two running sums). See the module docstring.
    """
    c, a = _top(probs, labels, ignore_index, "spiegelhalter_z")
    w = 1.0 - 2.0 * c
    num = float(np.sum((a - c) * w))
    var = float(np.sum(w * w * c * (1.0 - c)))
    if var > 0:
        z = num / math.sqrt(var)
    else:  # every row at confidence 0.5, 0 or 1: the numerator is 0 unless a certain prediction failed
        z = 0.0 if num == 0 else math.copysign(math.inf, num)
    return _pair(z, math.erfc(abs(z) / math.sqrt(2)), probs)


@array_io
def ks_calibration_test(probs, labels, ignore_index: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """KS-type test of top-label calibration, ``(KS, p_value)``.

    ``KS = max_m |sum_{j <= m} (a_j - c_j)| / N`` along the confidences sorted ascending, taken at
    the end of each block of ties (equals :func:`calibkit.functional.ks_error`). p-value: the
    asymptotic null distribution of ``T = N KS / sqrt(sum_i c_i (1 - c_i))``, the supremum of
    ``|W|`` of a standard Brownian motion on [0, 1] (:func:`sup_abs_brownian_sf`): under the null
    the cumulative sum is a martingale whose end is not pinned, so a Brownian bridge (the
    classical Kolmogorov distribution) would be wrong. Conservative at finite N and under ties.
    """
    c, a = _top(probs, labels, ignore_index, "ks_calibration_test")
    values, count, correct = tie_blocks(c, a)
    n = float(count.sum())
    dev = np.abs(np.cumsum(correct - values * count))
    ks = float(dev.max() / n)
    var = float(np.sum(c * (1.0 - c)))
    if var > 0:
        p = sup_abs_brownian_sf(n * ks / math.sqrt(var))
    else:
        p = 1.0 if ks == 0 else 0.0
    return _pair(ks, p, probs)
