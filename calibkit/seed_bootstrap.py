"""Two-level (seeds x test samples) paired bootstrap of a seed-averaged difference between two methods.

**Setting.** Methods A and B are trained once per seed; runs ``A_s`` and ``B_s`` share seed ``s``
(``s = 1..S``, the seeds both methods have) and every run is scored on the same test set of ``N``
samples. The quantity of interest is the difference of the methods, not of these ``2 S`` models:

    theta = E_seed[m(A_seed)] - E_seed[m(B_seed)],

each ``m`` the metric on the population the test set was drawn from, the expectation over the
training randomness a seed stands for.

**Estimator.** ``theta_hat = (1/S) sum_s d_s`` with ``d_s = m(A_s) - m(B_s)`` on the full test set.

**Resampling.** Resample ``r`` (``r = 1..R``) has two independent draws:

* inner, test samples: ``N`` test indices with replacement, the draw of :mod:`calibkit.bootstrap`
  (or whole test images, :mod:`calibkit.grouped_bootstrap`), the **same** for both runs of a pair
  and for every seed. The test set is one and the same for every run, so its sampling noise is
  common to all seeds: seeds and test samples are crossed factors, not nested ones, and an
  independent test draw per seed would shrink the test-set part of the variance by ``1/S``, which
  the estimator does not have. The caller passes the per-seed resampled differences
  ``d_s^{*r}`` (``samples[s, r]``), column ``r`` from test draw ``r`` for every seed;
* outer, seeds: ``S`` seed positions ``J_r1, ..., J_rS`` drawn with replacement from ``0..S-1``
  (:func:`seed_draws`).

The resampled value is ``theta*_r = (1/S) sum_k d_{J_rk}^{*r}`` (:func:`resampled_means`). The
**one-level** bootstrap is the same formula with ``J_rk = k`` (every seed once): the mean of the
seeds' resampled differences, the paired bootstrap of a seed average over a fixed set of trained
models, which covers test-set noise only.

**Interval.** Basic, as everywhere in calibkit: ``[2 theta_hat - q_hi, 2 theta_hat - q_lo]``
(``q_a`` the linear-interpolation ``a`` quantile of the ``theta*_r``, ``lo = (1 - level)/2``,
``hi = (1 + level)/2``), not clipped by default: a difference may take either sign. It corrects
the bootstrap's estimate of the bias, which matters for binned calibration errors
(:mod:`calibkit.bootstrap`).

**Why.** With fixed models, a "significant" difference says that *these* ``2 S`` models differ on
the population; training another seed could reverse it. Drawing the seeds too puts the spread
between seeds into the interval, so that it speaks about the methods. Below :data:`MIN_SEEDS`
shared seeds the report keeps the one-level interval and says that it covers test-set noise only:
with 2 seeds the outer draw has three outcomes (seed 1 twice, each once, seed 2 twice), so the
seed-level spread would rest on a single difference between two values.

**Identity.** When every seed has the same resampled differences (``samples[s] == samples[0]`` for
all ``s``: zero seed variance, e.g. the same pair of runs under every seed), both levels average
``S`` copies of the same number with the same reduction (:func:`resampled_means` gathers, then
takes the mean over the seed axis), so the two-level resampled values, and hence the interval,
equal the one-level ones bit for bit, whatever the outer draw.

**Known limits.** The outer draw is the plain bootstrap of a mean of ``S`` values: its variance is
``(S - 1)/S`` times the unbiased one (2/3 for 3 seeds) and its quantiles take few distinct values,
so with 3 to 5 seeds the interval tends to be too narrow when the seed spread dominates; the
measured coverage is in docs/metrics.md ("Seeds in the interval").

**Randomness.** The outer draw comes from ``numpy.random.default_rng(numpy.random.SeedSequence(seed)
.spawn(1)[0]).integers(0, S, size=(R, S))``: a child stream of ``seed``, independent of the test
draws made from the same bootstrap seed (a ``torch.Generator`` or ``default_rng(seed)``). Equal
seeds give equal intervals.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from calibkit.bootstrap import bootstrap_interval, holding
from calibkit.errors import UserError

__all__ = ["MIN_SEEDS", "seed_draws", "resampled_means", "seed_paired_interval", "auto_levels"]

#: Fewest shared seeds for which the report resamples seeds (the two-level bootstrap).
MIN_SEEDS = 3


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise UserError(f"seed must be an integer >= 0, got {seed!r}")
    return int(seed)


def seed_draws(n_seeds: int, n_resamples: int, seed: int = 0) -> torch.Tensor:
    """``(n_resamples, n_seeds)`` int64 seed positions drawn with replacement from ``0..n_seeds-1``.

    Row ``r`` is the outer draw of resample ``r`` (module docstring, "Randomness").
    """
    rng = np.random.default_rng(np.random.SeedSequence(_check_seed(seed)).spawn(1)[0])
    return torch.from_numpy(rng.integers(0, n_seeds, size=(n_resamples, n_seeds)).astype(np.int64))


def resampled_means(samples: torch.Tensor, draws: torch.Tensor | None = None) -> torch.Tensor:
    """``(R,)`` resampled seed averages ``theta*_r = mean_k samples[draws[r, k], r]``.

    ``samples``: ``(S, R)`` per-seed resampled differences (column ``r`` from one test draw).
    ``draws``: ``(R, S)`` seed positions (:func:`seed_draws`); None = every seed once (the
    one-level bootstrap). Both levels use this one reduction, which makes the identity of the
    module docstring exact.
    """
    samples = torch.as_tensor(samples, dtype=torch.float64)
    n_seeds, n_res = samples.shape
    if draws is None:
        draws = torch.arange(n_seeds).expand(n_res, n_seeds)
    if draws.shape != (n_res, n_seeds):
        raise UserError(f"draws must be (R, S) = {(n_res, n_seeds)}, got {tuple(draws.shape)}")
    return samples.T.gather(1, draws).mean(1)


def auto_levels(n_seeds: int, same_models: bool = False) -> int:
    """2 for a comparison of methods across trained runs with at least :data:`MIN_SEEDS` shared
    seeds, else 1 (fewer seeds, or both sides the same models: post-hoc calibrators compared on
    one run per seed resample test samples only)."""
    return 2 if n_seeds >= MIN_SEEDS and not same_models else 1


def seed_paired_interval(estimates, samples, level: float = 0.95, seed: int = 0, levels: int | None = None,
                         bounds: tuple[float, float] = (-math.inf, math.inf)) -> dict:
    """Basic bootstrap interval of the seed-averaged paired difference, one or two levels.

    Args:
        estimates: ``(S,)`` per-seed differences ``d_s`` on the full test set.
        samples: ``(S, R)`` per-seed resampled differences ``d_s^{*r}``; column ``r`` must come
            from the same test draw for every seed (equal bootstrap seed and test set).
        level: nominal coverage. seed: seed of the outer (seed) draw; the report passes its
            bootstrap seed, whose child stream this is.
        levels: 1 (test samples only), 2 (seeds and test samples), or None for
            :func:`auto_levels` of ``S`` (2 from :data:`MIN_SEEDS` seeds on).
        bounds: clip the interval's ends to this range (default: none).

    Returns:
        ``{"estimate", "lo", "hi", "levels", "seeds", "samples", "bias"}`` (``[lo, hi]`` extended to
        hold ``estimate``, as :func:`calibkit.bootstrap.holding`): ``estimate`` =
        ``mean(estimates)``, ``samples`` the ``(R,)`` resampled ``theta*_r``, ``bias`` =
        ``mean(samples) - estimate`` (the basic interval is centred on ``estimate - bias``),
        ``seeds`` = ``S``.
    """
    estimates = np.asarray(estimates, dtype=np.float64)
    samples = torch.as_tensor(samples, dtype=torch.float64)
    if samples.dim() != 2 or estimates.shape != (samples.shape[0],) or samples.shape[0] < 1 or samples.shape[1] < 1:
        raise UserError(f"need estimates (S,) and samples (S, R) with S, R >= 1, got {estimates.shape} and "
                         f"{tuple(samples.shape)}")
    if not 0 < level < 1:
        raise UserError(f"level must be in (0, 1), got {level!r}")
    n_seeds, n_res = samples.shape
    levels = auto_levels(n_seeds) if levels is None else levels
    if levels not in (1, 2):
        raise UserError(f"levels must be 1 or 2, got {levels!r}")
    draws = seed_draws(n_seeds, n_res, seed) if levels == 2 else None
    thetas = resampled_means(samples, draws)
    estimate = float(np.mean(estimates))
    lo, hi = holding(*bootstrap_interval(thetas, estimate, level, "basic", bounds), estimate)  # holds the estimate
    return {"estimate": estimate, "lo": lo, "hi": hi, "levels": levels, "seeds": n_seeds, "samples": thetas,
            "bias": float(thetas.mean()) - estimate}
