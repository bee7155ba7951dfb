"""Calibration-error estimators beyond fixed bins: smooth ECE, the monotonic sweep, KS error.

All three are top-label estimators: they see each sample's top-label confidence ``c_i`` and its
correctness ``a_i = [argmax_k p_ik = y_i]``, like :func:`calibkit.functional.ece`, and take
**probabilities** in every layout of the metrics (``(N, K)``, binary ``(N,)``, dense
``(N, K, *spatial)`` with ``ignore_index``). Tied confidences are always treated as one block
(a block of ``n`` samples at confidence ``v`` with ``s`` of them correct), so no result depends
on the order of the rows; :func:`tie_blocks` builds these blocks, and the streaming pixel
accumulator passes the blocks of its fine confidence histogram instead (``docs/metrics.md``).

* :func:`smooth_ece` (Blasiok & Nakkiran, "Smooth ECE: principled reliability diagrams via
  kernel smoothing", ICLR 2024). With residuals ``r_i = c_i - a_i`` and the Gaussian kernel
  reflected at 0 and 1,
  ``K_s(t, x) = sum_{k in Z} [phi_s(t - x + 2k) + phi_s(t + x + 2k)]`` (``phi_s`` the normal
  density of standard deviation ``s``; ``int_0^1 K_s(t, x) dt = 1`` for every ``x`` in [0, 1]),
  ``smECE_s = int_0^1 |(1/N) sum_i K_s(t, c_i) r_i| dt``, i.e. the kernel-smoothed residual
  ``r_s(t) = sum_i K r_i / sum_i K`` weighted by the kernel density ``(1/N) sum_i K``.
  ``smECE_s`` does not increase with ``s``; the estimator is ``smECE = smECE_{s*}`` at the
  fixed point ``smECE_{s*} = s*`` (found by bisection on ``[1e-4, 1]``; below ``1e-4`` the value
  at ``s = 1e-4`` is returned).
* :func:`ece_sweep` (Roelofs, Cain, Shlens & Mozer, "Mitigating bias in calibration error
  estimation", AISTATS 2022): equal-mass bins (the AECE's, :mod:`calibkit.functional.binning`:
  ``N / b`` samples each when ``b`` divides ``N``, ties never split) for ``b = 1, 2, ...``; the
  sweep stops at the first ``b`` whose bin accuracies (non-empty bins in confidence order) are
  not non-decreasing and uses ``b* = b - 1`` (or stops when every block of tied confidences is a
  bin of its own). ``ECE_sweep = (sum_j (n_j/N) |acc_j - conf_j|^p)^(1/p)``
  over the ``b*`` bins, ``p = 1`` (default) or ``p = 2``.
* :func:`ks_error` (Gupta, Rahimi, Ajanthan, Mensink, Sminchisescu & Hartley, "Calibration of
  neural networks using splines", ICLR 2021): with the samples sorted by confidence,
  ``KS = max_i |(1/N) sum_{j <= i} (a_j - c_j)|``, the largest gap between the cumulative
  accuracy and the cumulative confidence; the maximum is taken at the end of every block of tied
  confidences (where the two cumulative curves are defined whatever the order inside a tie).

Streaming: none of the three is a function of per-bin sums of fixed bins (the bandwidth, the
number of bins and the sort order depend on every sample), so the exact values need every
sample's confidence and correctness (2 numbers per sample), as AECE does; the fixed-memory
pixel state evaluates them on the blocks of its fine histogram (exact when no fine bin holds two
different confidences).

Example:
    >>> import torch
    >>> probs = torch.tensor([[0.8, 0.2]] * 5)       # confidence 0.8 everywhere
    >>> labels = torch.tensor([0, 0, 0, 1, 1])        # accuracy 0.6
    >>> round(float(smooth_ece(probs, labels)), 6)    # one block: |0.8 - 0.6|
    0.2
    >>> round(float(ks_error(probs, labels)), 6)
    0.2
"""

from __future__ import annotations

import math

import numpy as np
import torch

from calibkit._arrays import array_io
from calibkit.errors import UserError
from calibkit.functional.binning import equal_mass_ranks
from calibkit.functional.metrics import _sums

__all__ = ["smooth_ece", "ece_sweep", "ks_error", "tie_blocks", "block_estimators", "block_estimator_jobs",
           "SMECE_SIGMA_MIN"]

#: Lower end of the bandwidth search of :func:`smooth_ece`.
SMECE_SIGMA_MIN = 1e-4
_GRID_MIN, _GRID_MAX = 1024, 1 << 18  # grid intervals of the smoothing (powers of two)


def tie_blocks(conf, correct, weight=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blocks of tied confidences: ``(values, count, correct)``, float64 numpy arrays ``(M,)``.

    ``values`` are the distinct confidences, ascending; ``count[m]`` the (weighted) number of
    samples at ``values[m]``, ``correct[m]`` how many of them are correct. ``weight``: optional
    ``(N,)`` 0/1 weights (rows with weight 0 are left out). One sort of the confidences.

    Boolean ``correct`` and confidences ``>= 0`` (the panel's case) take :func:`_key_blocks`,
    which sorts integer keys instead of arg-sorting floats; other inputs an ``argsort``. Same
    blocks either way.
    """
    c = torch.as_tensor(conf).detach().double().cpu().numpy()
    a = torch.as_tensor(correct).detach().cpu().numpy()
    if weight is not None:
        keep = torch.as_tensor(weight).detach().double().cpu().numpy() > 0
        c, a = c[keep], a[keep]  # 0/1 weights: the kept rows weigh 1
    if a.dtype == np.bool_ and c.size and c.min() >= 0:
        return _key_blocks(c, a)
    a = a.astype(np.float64)
    order = np.argsort(c)
    c, a = c[order], a[order]
    starts = np.flatnonzero(np.concatenate([[True], c[1:] != c[:-1]]))
    return c[starts], np.diff(np.append(starts, len(c))).astype(np.float64), np.add.reduceat(a, starts)


def _key_blocks(c: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`tie_blocks` of confidences ``c >= 0`` and boolean ``a`` by sorting integer keys.

    The bit pattern of a non-negative float, read as an integer, orders as the float does
    (``-0.0`` is first made ``0.0``), so ``key = bits << 1 | a`` sorts by confidence and carries
    the correctness in its last bit: one sort of ``N`` integers, no index array and no gathers.
    Float32 confidences (every float32 input) use 32-bit keys, others 64-bit ones. The keys are
    sorted by ``torch.sort(stable=True)``, a radix sort for integers on the CPU, on torch's
    threads: 20 ms for 10^6 32-bit keys at one thread against 45 ms for ``np.sort``
    (docs/performance.md).
    """
    narrow = c.astype(np.float32)
    if np.array_equal(narrow, c):
        bits, back = np.abs(narrow).view(np.int32), np.float32
    else:
        bits, back = np.abs(c).view(np.int64), np.float64
    key = bits << 1
    key |= a
    key = torch.sort(torch.from_numpy(key), stable=True).values.numpy()
    bits = key >> 1
    ends = np.append(np.flatnonzero(bits[1:] != bits[:-1]), key.size - 1)  # last row of each block
    hits = np.cumsum(key & 1)[ends]
    values = bits[ends].view(back).astype(np.float64)
    count = np.diff(ends, prepend=-1).astype(np.float64)
    return values, count, np.diff(hits, prepend=0).astype(np.float64)


def _grid_size(sigma: float) -> int:
    """Grid intervals for bandwidth ``sigma``: a power of two with at least 40 steps per ``sigma``."""
    return min(max(_GRID_MIN, 1 << math.ceil(math.log2(40 / sigma))), _GRID_MAX)


def _on_grid(values, resid, g: int) -> np.ndarray:
    """The residual masses split linearly onto the ``g + 1`` points ``j / g`` (mass and mean kept)."""
    u = np.clip(values, 0.0, 1.0) * g
    j = np.minimum(np.floor(u).astype(np.int64), g - 1)
    frac = u - j
    return np.bincount(j, resid * (1 - frac), g + 1) + np.bincount(j + 1, resid * frac, g + 1)


def _coarser(fine: np.ndarray, g: int) -> np.ndarray:
    """:func:`_on_grid` with ``g`` intervals from the split onto a finer power-of-two grid: the
    coarse points are fine points, and the coarse hat functions are linear between them, so the
    two-step split gives exactly the masses of the direct one."""
    r = (len(fine) - 1) // g
    pos = np.arange(len(fine)) / r
    j = np.minimum(np.floor(pos).astype(np.int64), g - 1)
    frac = pos - j
    return np.bincount(j, fine * (1 - frac), g + 1) + np.bincount(j + 1, fine * frac, g + 1)


# exp(-0.5 * 40**2) underflows to exactly 0.0 in float64: kernel values past 40 bandwidths are zeros
_KERNEL_REACH = 40.0


def _kernel(period: int, h: float, sigma: float) -> np.ndarray:
    """The Gaussian of bandwidth ``sigma`` wrapped to period 2, at the ``period`` grid points of [0, 2).

    Where 40 bandwidths fall short of the circle's half-length 1, only the unwrapped Gaussian has
    values that do not underflow, and only within 40 bandwidths of 0: just those are computed (the
    same floats as the full sum over the wrapped images, whose other terms are exact zeros), which
    makes the narrow bandwidths of the finest grids cheap.
    """
    d = np.minimum(np.arange(period), period - np.arange(period)) * h  # distance on the circle, <= 1
    norm = sigma * math.sqrt(2 * math.pi)
    if _KERNEL_REACH * sigma < 1.0:
        ker = np.zeros(period)
        near = d <= _KERNEL_REACH * sigma
        ker[near] = np.exp(-0.5 * (d[near] / sigma) ** 2) / norm
        return ker
    shifts = 2.0 * np.arange(-math.ceil(2.5 * sigma) - 1, math.ceil(2.5 * sigma) + 2)
    return np.exp(-0.5 * ((d[:, None] + shifts[None, :]) / sigma) ** 2).sum(1) / norm


def _grid_spectrum(grid: np.ndarray) -> np.ndarray:
    """The FFT of the even extension of ``grid`` to [0, 2) (:func:`_smece_at`)."""
    g = len(grid) - 1
    period = 2 * g  # grid points of [0, 2)
    ext = np.zeros(period)
    ext[: g + 1] += grid
    ext[(period - np.arange(g + 1)) % period] += grid  # mirror images; 0 and 1 are their own
    return np.fft.rfft(ext)


def _smece_at(spectrum: np.ndarray, n: float, sigma: float) -> float:
    """``smECE_sigma`` of the residual masses on the points ``j / g`` (:func:`_on_grid`), given
    by their :func:`_grid_spectrum` (``g + 1`` coefficients), which the caller keeps across bandwidths.

    The reflected kernel is a circular convolution of the even extension of the grid to [0, 2)
    with the Gaussian wrapped to period 2 (reflection at 0 and 1 generates exactly these images),
    done by FFT; the integral over [0, 1] is the trapezoid rule.
    """
    g = len(spectrum) - 1
    h = 1.0 / g
    period = 2 * g
    smooth = np.fft.irfft(spectrum * np.fft.rfft(_kernel(period, h, sigma)), period)[: g + 1]
    a = np.abs(smooth)
    return float(h * (a.sum() - 0.5 * (a[0] + a[-1])) / n)


def _smece(values, count, correct, tol: float = 1e-7) -> tuple[float, float]:
    """``(smECE, sigma*)`` of tie blocks (see the module docstring)."""
    n = float(count.sum())
    resid = values * count - correct
    # many blocks: split them once onto the finest grid, and the coarser grids from it
    fine = _on_grid(values, resid, _GRID_MAX) if len(values) > _GRID_MAX else None
    spectra: dict[int, np.ndarray] = {}  # the bisection visits few grid sizes: split and transform once per size

    def at(s):
        g = _grid_size(s)
        if g not in spectra:
            if fine is None:
                grid = _on_grid(values, resid, g)
            else:
                grid = fine if g == _GRID_MAX else _coarser(fine, g)
            spectra[g] = _grid_spectrum(grid)
        return _smece_at(spectra[g], n, s)

    def gap(s):
        return at(s) - s

    lo, hi = SMECE_SIGMA_MIN, 1.0
    if gap(hi) >= 0:
        return at(hi), hi
    # gap is decreasing: its root is the fixed point. Bisection from the top, so the fine grids of
    # small bandwidths are built only when the fixed point is small; a fixed point below lo ends
    # the bisection at lo.
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if gap(mid) > 0:
            lo = mid
        else:
            hi = mid
    s = 0.5 * (lo + hi)
    return at(s), s


def _mass_cuts(values, cum, n: float, b: int) -> np.ndarray:
    """Block indices where the ``b`` equal-mass bins start (``(b - 1,)``, non-decreasing).

    The bins of :func:`calibkit.functional.binning.weighted_equal_mass_bins` on the blocks: the
    inner edges are the order statistics of ranks ``ceil(j n / b) - 1``
    (:func:`~calibkit.functional.binning.equal_mass_ranks`) and a block goes to bin ``j`` when
    ``edge_j < value <= edge_{j+1}``.
    """
    ranks = equal_mass_ranks(int(round(n)), b).numpy()
    edges = values[np.minimum(np.searchsorted(cum, ranks, side="right"), len(values) - 1)]
    return np.searchsorted(values, edges, side="right")


def _sweep(values, count, correct, p: int = 1) -> tuple[float, int]:
    """``(ECE_sweep, number of non-empty bins)`` of tie blocks (see the module docstring)."""
    n = float(count.sum())
    cum = np.cumsum(count)
    cum0 = np.concatenate([[0.0], cum])
    conf0 = np.concatenate([[0.0], np.cumsum(values * count)])
    hit0 = np.concatenate([[0.0], np.cumsum(correct)])
    m = len(values)

    def bins(b):
        cuts = np.concatenate([[0], _mass_cuts(values, cum, n, b), [m]])
        cuts = np.unique(cuts)  # empty bins dropped
        cnt = np.diff(cum0[cuts])
        return cnt, np.diff(conf0[cuts]), np.diff(hit0[cuts])

    best = bins(1)
    b = 1
    while True:
        cand = bins(b + 1)
        acc = cand[2] / cand[0]
        if np.any(np.diff(acc) < 0):
            break
        best, b = cand, b + 1
        if len(cand[0]) == m or b >= n:  # every block is its own bin: more bins change nothing
            break
    cnt, conf_s, hit_s = best
    gaps = np.abs(hit_s - conf_s) / cnt
    err = float(np.sum(cnt / n * gaps ** p) ** (1.0 / p))
    return err, len(cnt)


def _ks(values, count, correct) -> float:
    n = float(count.sum())
    return float(np.abs(np.cumsum(correct - values * count)).max() / n)


def block_estimators(values, count, correct) -> dict[str, float]:
    """``{"smece", "ece_sweep", "ks"}`` of tie blocks (``ece_sweep`` with ``p = 1``): the panel's entries."""
    return {name: job() for name, job in block_estimator_jobs(values, count, correct).items()}


def block_estimator_jobs(values, count, correct) -> dict:
    """The entries of :func:`block_estimators` as independent functions of no argument (the panel
    runs them on several threads)."""
    return {"smece": lambda: _smece(values, count, correct)[0], "ece_sweep": lambda: _sweep(values, count, correct)[0],
            "ks": lambda: _ks(values, count, correct)}


def _blocks(probs, labels, ignore_index) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s = _sums(probs, labels, 1, ignore_index=ignore_index)
    return tie_blocks(s.conf, s.correct, s.weight)


def _out(value: float, probs) -> torch.Tensor:
    dev = probs.device if isinstance(probs, torch.Tensor) else "cpu"
    return torch.tensor(value, dtype=torch.float64, device=dev)


@array_io
def smooth_ece(probs, labels, ignore_index: int | None = None, return_sigma: bool = False):
    """Smooth ECE (Blasiok & Nakkiran, ICLR 2024) of the top label, a 0-dim float64 tensor.

    ``smECE_s = int_0^1 |(1/N) sum_i K_s(t, c_i) (c_i - a_i)| dt`` with the Gaussian kernel of
    width ``s`` reflected at 0 and 1, evaluated at the fixed point ``smECE_s = s`` of the
    bandwidth (module docstring). Computed on a grid of at least 40 points per ``s`` (relative
    discretisation error below 1e-3). With ``return_sigma=True``: ``(smECE, s*)``.
    """
    value, sigma = _smece(*_blocks(probs, labels, ignore_index))
    return (_out(value, probs), sigma) if return_sigma else _out(value, probs)


@array_io
def ece_sweep(probs, labels, p: int = 1, ignore_index: int | None = None, return_bins: bool = False):
    """Monotonic-sweep ECE (Roelofs et al., AISTATS 2022) of the top label, a 0-dim float64 tensor.

    The largest number of equal-mass bins ``b*`` reached by the sweep ``b = 1, 2, ...`` while
    the bin accuracies stay non-decreasing in confidence; then the ``L_p`` calibration error of
    those bins, ``p = 1`` (ECE) or ``p = 2`` (RMS). With ``return_bins=True``: ``(ECE_sweep, n)``,
    ``n`` the number of non-empty bins of ``b*`` (fewer than ``b*`` only under ties).
    """
    if p not in (1, 2):
        raise UserError(f"p must be 1 or 2, got {p!r}")
    value, b = _sweep(*_blocks(probs, labels, ignore_index), p=p)
    return (_out(value, probs), b) if return_bins else _out(value, probs)


@array_io
def ks_error(probs, labels, ignore_index: int | None = None) -> torch.Tensor:
    """Kolmogorov-Smirnov calibration error (Gupta et al., ICLR 2021) of the top label.

    ``KS = max_i |(1/N) sum_{j <= i} (a_j - c_j)|`` over the samples sorted by confidence,
    evaluated at the end of each block of tied confidences. A 0-dim float64 tensor.
    """
    return _out(_ks(*_blocks(probs, labels, ignore_index)), probs)
