"""Family-wise error rate of the bench report's confirmatory comparisons on simulated null methods.

Each simulation draws one test set (``--rows`` rows, 3 classes, labels drawn from the true
probabilities) and ``m`` + 1 models, CE and ``m`` methods, each the true logits plus its own
independent standard normal noise: every model has the same expected test NLL, so every null
hypothesis "method + calibrator = CE + TS" is true. Each method's NLL difference from CE is
bootstrapped (``--boot`` resamples of the rows, one draw shared by all methods, as the report's
paired bootstrap does), its p-value is the inversion of the basic interval
(:func:`calibkit.report.confirm.basic_p_value`), and the family is Holm-adjusted
(:func:`calibkit.report.confirm.holm`). The family-wise error rate is the share of simulations in
which any method is declared different at 5%; printed with Holm and without correction, and the
Monte Carlo standard error ``sqrt(0.05 x 0.95 / sims)``.

Usage::

    python benchmarks/confirmatory_fwer.py [--sims 1000] [--rows 300] [--boot 400] [--methods 1 3 6 12]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from calibkit.report.confirm import holm, null_p_values


def p_values(n_methods: int, n_rows: int, n_boot: int, sim: int) -> dict:
    """The p-values of ``n_methods`` null methods against CE on one simulated test set."""
    return null_p_values(n_methods, n_rows, n_boot, seed=1_000_000 + sim)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=1000)
    ap.add_argument("--rows", type=int, default=300)
    ap.add_argument("--boot", type=int, default=400)
    ap.add_argument("--methods", type=int, nargs="+", default=[1, 3, 6, 12])
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    se = (0.05 * 0.95 / args.sims) ** 0.5
    print(f"{args.sims} simulations, {args.rows} test rows, {args.boot} resamples; Monte Carlo standard error "
          f"{100 * se:.2f} points\n")
    print("| methods | FWER, Holm % | FWER, uncorrected % |\n|---|---|---|")
    for m in args.methods:
        holm_hits = raw_hits = 0
        for sim in range(args.sims):
            ps = p_values(m, args.rows, args.boot, sim)
            holm_hits += any(p <= 0.05 for p in holm(ps).values())
            raw_hits += any(p <= 0.05 for p in ps.values())
        print(f"| {m} | {100 * holm_hits / args.sims:.1f} | {100 * raw_hits / args.sims:.1f} |")
    print(f"\n{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
