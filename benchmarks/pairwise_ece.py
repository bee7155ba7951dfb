"""Paired bootstrap of the ECE difference between two methods of a bench directory.

Usage::

    python benchmarks/pairwise_ece.py runs/default default mbls:ls fedlas_mbls:mbls csm:ls

For each ``A:B`` it prints ``A - B`` of the seed-averaged test ECE (x100) with its 95% basic
bootstrap interval (1000 resamples, seed 0; ``*`` when it excludes 0), the same statistic as the
report's "dECE vs CE" column (``calibkit.report.data.ece_deltas``) with B in CE's place.
"""

import argparse

import numpy as np
import torch

from calibkit.bootstrap import bootstrap_interval
from calibkit.metrics import paired_bootstrap_diff
from calibkit.report.data import load_probs, summarize
from calibkit.store import Store


def compare(summary: dict, a: str, b: str, n_boot: int = 1000) -> tuple[float, float, float]:
    """``(difference, low, high)`` of the seed-averaged ECE of ``a`` minus ``b``."""
    for m in (a, b):
        if m not in summary:
            raise SystemExit(f"no finished runs of method {m!r}; found: {', '.join(summary)}")
    ra = {r["seed"]: r for r in summary[a]["runs"]}
    rb = {r["seed"]: r for r in summary[b]["runs"]}
    seeds = sorted(set(ra) & set(rb))
    if not seeds:
        raise SystemExit(f"{a} and {b} share no seed")
    samples, estimates = [], []
    for seed in seeds:
        pa, la, _ = load_probs(ra[seed])
        pb, lb, _ = load_probs(rb[seed])
        if not np.array_equal(la, lb):
            raise SystemExit(f"{a} and {b} were tested on different test sets (seed {seed})")
        res = paired_bootstrap_diff(torch.from_numpy(pa), torch.from_numpy(pb), torch.from_numpy(la), "ece",
                                    n_resamples=n_boot, seed=0)
        samples.append(res.samples)
        estimates.append(res.estimate)
    diff = float(np.mean(estimates))
    lo, hi = bootstrap_interval(torch.stack(samples).mean(0), diff, 0.95, "basic")
    return diff, lo, hi


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="bench output directory (holding runs.db)")
    p.add_argument("preset")
    p.add_argument("pairs", nargs="+", metavar="A:B")
    args = p.parse_args()
    with Store(f"{args.out}/runs.db", readonly=True) as store:
        summary = summarize(store.runs(args.preset))
    for pair in args.pairs:
        a, _, b = pair.partition(":")
        diff, lo, hi = compare(summary, a, b)
        star = "*" if not lo <= 0.0 <= hi else ""
        print(f"{a} - {b}: {100 * diff:+.2f} [{100 * lo:+.2f}, {100 * hi:+.2f}]{star}")


if __name__ == "__main__":
    main()
