"""Paired bootstrap of the ECE difference between two methods of a bench directory.

Usage::

    python benchmarks/pairwise_ece.py runs/default default mbls:ls fedlas_mbls:mbls csm:ls

For each ``A:B`` it prints ``A - B`` of the seed-averaged test ECE (x100) with its 95% basic
bootstrap interval (1000 resamples, seed 0; ``*`` when it excludes 0), the same statistic as the
report's "dECE vs CE" column (``calibkit.report.data.ece_deltas``) with B in CE's place.
"""

import argparse

from calibkit.report.data import paired_ece_delta, summarize
from calibkit.store import Store


def compare(summary: dict, a: str, b: str, n_boot: int = 1000) -> tuple[float, float, float]:
    """``(difference, low, high)`` of the seed-averaged ECE of ``a`` minus ``b``."""
    for m in (a, b):
        if m not in summary:
            raise SystemExit(f"no finished runs of method {m!r}; found: {', '.join(summary)}")
    delta = paired_ece_delta(summary[a]["runs"], summary[b]["runs"], n_boot=n_boot, seed=0)
    if delta is None:
        raise SystemExit(f"{a} and {b} share no seed")
    return delta["diff"], delta["lo"], delta["hi"]


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
