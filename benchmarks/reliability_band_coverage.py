"""Coverage of the reliability diagram's bands, measured on perfectly calibrated simulated models.

Each simulation draws ``N`` top-label confidences ``c_i = 1 - 0.9 B_i`` with ``B_i ~ Beta(1, 6)``
(most mass near 1, as trained networks have), a predicted class, and the label: correct with
probability ``c_i`` (so the model is calibrated by construction), else another class drawn
uniformly; the other ``K - 1 = 9`` classes share ``1 - c_i`` equally. For 15 equal-width bins it
reports, over the simulations and the non-empty bins:

* consistency band (``band_kind="consistency"``): the share of bars inside the band per bin
  (nominal ``level``), the same for bins under 20 rows, and the share of simulations whose bars
  are **all** inside (pointwise band and ``simultaneous=True``);
* bootstrap band (``band_kind="bootstrap"``): the share of bins whose band contains the bin's
  mean confidence (where a calibrated bar belongs), and the share of simulations where every bin's
  band does.

Usage::

    python benchmarks/reliability_band_coverage.py [--sims 300] [--level 0.9] [--n 1000 5000]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from calibkit.plots import reliability_curve


def _simulate(rng, n, k=10):
    c = 1 - 0.9 * rng.beta(1, 6, size=n)
    pred = rng.integers(0, k, size=n)
    correct = rng.random(n) < c
    other = (pred + rng.integers(1, k, size=n)) % k
    labels = np.where(correct, pred, other)
    probs = np.repeat(((1 - c) / (k - 1))[:, None], k, axis=1)
    probs[np.arange(n), pred] = c
    return torch.from_numpy(probs), torch.from_numpy(labels)


def main(sims: int, level: float, sizes: list[int], n_boot: int) -> None:
    print(f"| N | band | per-bin coverage | bins < 20 rows | all bins at once | (nominal {level:g}) |")
    print("|---|---|---|---|---|---|")
    for n in sizes:
        rng = np.random.default_rng(n)
        stats = {key: [[], [], []] for key in ("consistency", "consistency, simultaneous", "bootstrap")}
        for s in range(sims):
            probs, labels = _simulate(rng, n)
            for key, kind, simul in (("consistency", "consistency", False),
                                     ("consistency, simultaneous", "consistency", True),
                                     ("bootstrap", "bootstrap", False)):
                cur = reliability_curve(probs, labels, 15, band=True, level=level, band_kind=kind,
                                        simultaneous=simul, n_boot=n_boot, seed=s)
                full = cur.count > 0
                # consistency: is the bar inside? bootstrap: does the band hold the calibrated value?
                target = cur.accuracy if kind == "consistency" else cur.confidence
                inside = (cur.band_lo[full] - 1e-12 <= target[full]) & (target[full] <= cur.band_hi[full] + 1e-12)
                small = cur.count[full] < 20
                stats[key][0].extend(inside.tolist())
                stats[key][1].extend(inside[small].tolist())
                stats[key][2].append(bool(inside.all()))
        for key, (per_bin, small_bins, joint) in stats.items():
            small_text = f"{np.mean(small_bins):.3f} ({len(small_bins)} bins)" if small_bins else "none"
            print(f"| {n} | {key} | {np.mean(per_bin):.3f} | {small_text} | {np.mean(joint):.3f} | |", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=300)
    ap.add_argument("--level", type=float, default=0.9)
    ap.add_argument("--n", type=int, nargs="+", default=[1000, 5000])
    ap.add_argument("--n-boot", type=int, default=300)
    a = ap.parse_args()
    main(a.sims, a.level, a.n, a.n_boot)
