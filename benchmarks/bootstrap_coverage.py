"""Coverage of the bootstrap intervals of ECE: how often the 95% interval contains the true ECE.

Synthetic models with a known population ECE (15 equal-width bins), K = 10: "true" logits
``z ~ N(0, 2^2)`` per class and labels drawn from ``softmax(z)``; the scored model predicts
``softmax(z / T)``. ``T = 1`` is perfectly calibrated (population ECE exactly 0: within every
bin the chance of being right equals the confidence); ``T = 0.95`` and ``T = 0.8`` are
over-confident (population ECE computed on 4,000,000 fresh samples). For each model,
``--reps`` independent test sets of ``--n`` samples each get a bootstrap (``--resamples``
resamples, one seed per test set) and the interval of each method is checked against the truth.

Prints, per model and method: coverage (target 0.95), mean width, and how often the interval
contains the test set's own point estimate. Usage::

    python benchmarks/bootstrap_coverage.py [--n 3000] [--reps 200] [--resamples 500]
"""

from __future__ import annotations

import argparse
import time

import torch

from calibkit.bootstrap import bootstrap_interval
from calibkit.functional import ece
from calibkit.metrics import bootstrap_ci


def _sample(n: int, t: float, gen: torch.Generator):
    z = torch.randn(n, 10, generator=gen, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=gen).squeeze(1)
    return torch.softmax(z / t, 1), y


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--resamples", type=int, default=500)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    print(f"N = {args.n} per test set, {args.reps} test sets per model, {args.resamples} resamples, level 0.95")
    print(f"{'model':22s} {'true ECE':>9s} {'method':>11s} {'coverage':>9s} {'width':>8s} {'has estimate':>13s}")
    for t in (1.0, 0.95, 0.8):
        gen = torch.Generator().manual_seed(int(1000 * t))
        truth = 0.0 if t == 1.0 else float(ece(*_sample(4_000_000, t, gen)))
        stats = {m: [0, 0.0, 0] for m in ("percentile", "basic")}
        for rep in range(args.reps):
            probs, y = _sample(args.n, t, gen)
            res = bootstrap_ci("ece", probs, y, n_resamples=args.resamples, seed=rep, method="percentile")
            for method in stats:
                lo, hi = bootstrap_interval(res.samples, res.estimate, 0.95, method, (0.0, 1.0))
                stats[method][0] += lo <= truth <= hi
                stats[method][1] += hi - lo
                stats[method][2] += lo <= res.estimate <= hi
        for method, (cover, width, has) in stats.items():
            print(f"{f'softmax(z / {t:.2f})':22s} {truth:9.4f} {method:>11s} {cover / args.reps:9.3f} "
                  f"{width / args.reps:8.4f} {has / args.reps:13.3f}")
    print(f"wall time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
