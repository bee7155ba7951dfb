"""Coverage of the one- and two-level paired bootstrap of a method difference when seeds vary.

Population, K = 10 classes: "true" logits ``z ~ N(0, 2^2)`` per class, label ``y ~ softmax(z)``.
A run of method M with seed s predicts ``softmax((z + tau eta_s) / T_Ms)``: ``eta_s ~ N(0, 1)``
per sample and class, fresh for every run (``tau > 0``: runs disagree sample by sample, a
seed x sample interaction that leaves the population ECE unchanged), and a per-run temperature
``log T_Ms = log T_M + sigma eps_Ms``, ``eps ~ N(0, 1)`` (training randomness that moves the run's
population ECE). Method A has ``T_A = 0.8``, method B ``T_B = 0.9`` (both over-confident; A
more). Scenarios ``(tau, sigma)``: :data:`SCENARIOS`.

The target is the methods' difference ``theta = E_eps[ECE(A)] - E_eps[ECE(B)]`` (population ECE,
15 equal-width bins): ``ECE(T)`` is computed on ``--truth-n`` fresh samples (one sample for every
T, so the differences share their noise) on a grid of ``log T`` and integrated against the normal
density of ``sigma eps`` (trapezoid rule). For each repetition: one test set of ``--n`` samples,
``max(S)`` seeds per method, each run's test probabilities; the paired ECE differences of every
seed resampled ``--resamples`` times with one draw of test indices shared by all seeds (the draw
of ``calibkit.bootstrap``, seeded with the repetition number, checked against
``paired_bootstrap_diff`` on the first repetition); then, for S = 3 and 5 (the first S seeds),
the 95% basic interval of ``calibkit.seed_bootstrap.seed_paired_interval`` with one level (test
samples) and two levels (seeds and test samples).

Printed per scenario, S and interval: coverage of ``theta`` with its Monte-Carlo standard error
``sqrt(c (1 - c) / reps)``, the mean width, and how often the interval covers the drawn models'
own difference ``mean_s [ECE(A_s) - ECE(B_s)]`` (the target of the one-level bootstrap). The
``t`` row is a reference that calibkit does not report: ``mean_s d_s +- t_{S-1} sd(d_s) / sqrt(S)``
over the per-seed test-set differences ``d_s``. ``seed/test sd`` compares the two sources of
error of the seed-averaged difference: the sd of ``mean_s [ECE(A_s) - ECE(B_s)]`` over seeds
(``sd / sqrt(S)``, from the population curves) over the mean sd of its one-level resamples (the
test-set part). Usage::

    python benchmarks/seed_bootstrap_coverage.py [--n 2000] [--reps 2000] [--resamples 400] [--truth-n 1000000]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch

from calibkit.functional import ece
from calibkit.functional.binning import bin_indices, equal_width_edges, top_label
from calibkit.metrics import paired_bootstrap_diff
from calibkit.seed_bootstrap import seed_paired_interval

K, BINS, T_A, T_B = 10, 15, 0.8, 0.9
#: (tau, sigma): no seed effect on the population; a moderate one; a dominant one; a dominant one
#: without the per-sample disagreement between runs.
SCENARIOS = ((0.5, 0.0), (0.5, 0.01), (0.5, 0.03), (0.0, 0.03))
SEEDS = (3, 5)
# two-sided 97.5% t quantiles for S - 1 degrees of freedom
T975 = {2: 4.302652729911275, 4: 2.7764451051977987}


def _population(n: int, gen: torch.Generator):
    z = torch.randn(n, K, generator=gen, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=gen).squeeze(1)
    return z, y


def _truth_curve(n: int, tau: float, log_t: np.ndarray, gen: torch.Generator) -> np.ndarray:
    """Population ECE of ``softmax((z + tau eta) / T)`` at every ``T = exp(log_t)``, one sample."""
    z, y = _population(n, gen)
    noisy = z + tau * torch.randn(n, K, generator=gen, dtype=torch.float64)
    return np.array([float(ece(torch.softmax(noisy / math.exp(lt), 1), y, BINS)) for lt in log_t])


def _moments(grid: np.ndarray, curve: np.ndarray, sigma: float) -> tuple[float, float]:
    """Mean and variance of ``curve(sigma eps)``, trapezoid rule on the grid (it spans +-4 sigma_max)."""
    if sigma == 0:
        return float(np.interp(0.0, grid, curve)), 0.0
    w = np.exp(-0.5 * (grid / sigma) ** 2)
    w /= np.trapezoid(w, grid)
    mean = float(np.trapezoid(w * curve, grid))
    return mean, float(np.trapezoid(w * (curve - mean) ** 2, grid))


def _features(probs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``(N, 2B)``: one-hot bin x correct, one-hot bin x confidence (the sums of a weighted ECE)."""
    conf, pred = top_label(probs)
    onehot = torch.nn.functional.one_hot(bin_indices(conf, equal_width_edges(BINS, conf.dtype)), BINS).double()
    return torch.cat([onehot * (pred == y).double()[:, None], onehot * conf[:, None]], 1)


def _eces(feats: torch.Tensor, W: torch.Tensor, n: int) -> torch.Tensor:
    """ECE of every model (feature blocks of width 2B) under every row of counts ``W`` -> (R, models)."""
    sums = (W @ feats).view(W.shape[0], -1, 2, BINS)
    return (sums[:, :, 0] - sums[:, :, 1]).abs().sum(2) / n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="test samples per test set")
    ap.add_argument("--reps", type=int, default=2000, help="test sets (and seed draws) per scenario")
    ap.add_argument("--resamples", type=int, default=400, help="bootstrap resamples per interval")
    ap.add_argument("--truth-n", type=int, default=1_000_000, help="samples of the population ECE curves")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    n, reps, n_res, s_max = args.n, args.reps, args.resamples, max(SEEDS)
    half = 4 * max(s for _, s in SCENARIOS)
    grid = np.linspace(-half, half, 25)
    curves = {(tau, t): _truth_curve(args.truth_n, tau, math.log(t) + grid, torch.Generator().manual_seed(1))
              for tau in sorted({tau for tau, _ in SCENARIOS}) for t in (T_A, T_B)}
    print(f"N = {n} test samples, {reps} repetitions per scenario, {n_res} resamples, level 0.95; K = {K}, "
          f"T_A = {T_A}, T_B = {T_B}; truth on {args.truth_n} samples ({time.perf_counter() - t0:.0f} s)")
    print(f"{'tau':>4s} {'sigma':>5s} {'theta':>7s} {'S':>2s} {'seed/test sd':>12s} {'interval':>9s} {'coverage':>9s} "
          f"{'+- MC se':>8s} {'width':>7s} {'covers models':>13s}")
    for tau, sigma in SCENARIOS:
        curve_a, curve_b = curves[tau, T_A], curves[tau, T_B]
        (mean_a, var_a), (mean_b, var_b) = _moments(grid, curve_a, sigma), _moments(grid, curve_b, sigma)
        theta, sd_seed = mean_a - mean_b, math.sqrt(var_a + var_b)  # sd of one seed's population difference
        gen = torch.Generator().manual_seed(int(1000 * sigma) + int(10 * tau) + 7)
        stats = {(s, m): [0, 0.0, 0] for s in SEEDS for m in ("1 level", "2 levels", "t")}
        test_sd = {s: [] for s in SEEDS}
        for rep in range(reps):
            z, y = _population(n, gen)
            eps = torch.randn(2, s_max, generator=gen, dtype=torch.float64).numpy() * sigma  # log T offsets
            feats, runs = [], []
            for m, t in enumerate((T_A, T_B)):
                for s in range(s_max):
                    noisy = z + tau * torch.randn(n, K, generator=gen, dtype=torch.float64)
                    runs.append(torch.softmax(noisy / (t * math.exp(eps[m, s])), 1))
                    feats.append(_features(runs[-1], y))
            feats = torch.cat(feats, 1)  # (N, 2 S_max 2B): A's seeds, then B's
            idx = torch.randint(0, n, (n_res, n), generator=torch.Generator().manual_seed(rep))
            W = torch.bincount((idx + torch.arange(n_res).view(-1, 1) * n).reshape(-1),
                               minlength=n_res * n).view(n_res, n).double()
            boot = _eces(feats, W, n)  # (R, 2 S_max)
            full = _eces(feats, torch.ones(1, n, dtype=torch.float64), n)[0]
            samples = (boot[:, :s_max] - boot[:, s_max:]).T  # (S_max, R) paired differences
            est = (full[:s_max] - full[s_max:]).numpy()
            if rep == 0:  # the inner resamples are calibkit's paired bootstrap
                ref = paired_bootstrap_diff(runs[0], runs[s_max], y, "ece", n_resamples=n_res, seed=rep)
                assert torch.allclose(ref.samples, samples[0], atol=1e-12, rtol=0), "inner resamples differ"
            pop = (np.interp(math.log(T_A) + eps[0], math.log(T_A) + grid, curve_a)
                   - np.interp(math.log(T_B) + eps[1], math.log(T_B) + grid, curve_b))
            for s in SEEDS:
                models = float(pop[:s].mean())
                for levels, name in ((1, "1 level"), (2, "2 levels")):
                    r = seed_paired_interval(est[:s], samples[:s], 0.95, seed=rep, levels=levels)
                    if levels == 1:
                        test_sd[s].append(float(r["samples"].std()))
                    st = stats[s, name]
                    st[0] += r["lo"] <= theta <= r["hi"]
                    st[1] += r["hi"] - r["lo"]
                    st[2] += r["lo"] <= models <= r["hi"]
                half_t = T975[s - 1] * float(np.std(est[:s], ddof=1)) / math.sqrt(s)
                lo, hi = float(est[:s].mean()) - half_t, float(est[:s].mean()) + half_t
                st = stats[s, "t"]
                st[0] += lo <= theta <= hi
                st[1] += hi - lo
                st[2] += lo <= models <= hi
        for s in SEEDS:
            ratio = sd_seed / math.sqrt(s) / float(np.mean(test_sd[s]))
            for name in ("1 level", "2 levels", "t"):
                cover, width, models = stats[s, name]
                c = cover / reps
                print(f"{tau:4.1f} {sigma:5.2f} {theta:7.4f} {s:2d} {ratio:12.2f} {name:>9s} {c:9.3f} "
                      f"{math.sqrt(c * (1 - c) / reps):8.3f} {width / reps:7.4f} {models / reps:13.3f}")
    print(f"wall time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
