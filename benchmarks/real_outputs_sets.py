"""Selective prediction and APS conformal sets on the published outputs of real classifiers.

For every ``.npz`` of the real-outputs folder (``probs`` (10000, K) and ``labels``; see its README):
rows 0-4999 are the validation split, rows 5000-9999 the test split; logits = log(probs) with the
probabilities raised to the smallest positive float32 first. As ``calibkit calibrate`` does
(:func:`calibkit.report.sets.calibrator_sets`): the uncalibrated model and temperature scaling, each
with APS sets (randomised) at ``--alpha``: the calibrator fitted on one half of the validation rows,
the conformal threshold on the other half, coverage and mean set size on the test rows; AURC and
AUGRC x100 of the test probabilities (TS fitted on all validation rows). Then the plain check: APS
on the uncalibrated probabilities with the threshold fitted on all 5,000 validation rows, its test
coverage, whether it lies within 1 point of ``1 - alpha``, and, to tell a property of the fixed split
from a property of the sets, the mean and standard deviation of the coverage over ``--splits``
random splits of the 10,000 rows into 5,000 threshold rows and 5,000 test rows (each with its own
randomisation seed): conformal coverage of one split of 5,000 rows varies by about
``sqrt(alpha (1 - alpha) (1/5000 + 1/5000))`` = 0.6 points at ``alpha = 0.1``. The last two
columns put the fixed split's coverage in standard deviations of those random splits, and test
whether the two halves are exchangeable at all (the guarantee of split conformal prediction needs
it): the top-label accuracy of rows 0-4999 and of rows 5000-9999, and the two-proportion z
statistic of their difference (pooled variance; ``|z| > 1.96`` rejects equal accuracy at 5%).

Usage::

    python benchmarks/real_outputs_sets.py [FOLDER] [--alpha 0.1] [--n-boot 200] [--splits 40]

FOLDER defaults to ``../shared/data/real_outputs`` beside the repository. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from real_outputs import DEFAULT, load  # the same folder and the same logits as the calibrator choice

from calibkit.calibrators import TemperatureScaling
from calibkit.conformal import SplitConformal, coverage
from calibkit.report.sets import calibrator_sets


def _coverage(p, y, cal, test, alpha, seed=0) -> float:
    sets = SplitConformal("aps", alpha=alpha, seed=seed).fit(p[cal], y[cal]).predict_set(p[test])
    return float(coverage(sets, y[test]))


def row(path: Path, alpha: float, n_boot: int, splits: int) -> list:
    x, y = load(path)
    val, test = (x[:5000], y[:5000]), (x[5000:], y[5000:])
    ts = TemperatureScaling().fit(*val)
    probs = {"none": test[0].softmax(1), "temperature": ts.predict_proba(test[0]).double()}
    res = calibrator_sets(val, test, probs, alpha=alpha, n_boot=n_boot)
    n, t = res["none"], res["temperature"]
    d = n["d_size"]  # none - TS
    size_d = f"{-d['diff']:+.2f} [{-d['hi']:+.2f}, {-d['lo']:+.2f}]" if d else "-"
    p = x.softmax(1)
    full = _coverage(p, y, slice(0, 5000), slice(5000, None), alpha)
    covs = []
    for seed in range(splits):
        perm = torch.from_numpy(np.random.default_rng(seed).permutation(len(y)))
        covs.append(_coverage(p, y, perm[:5000], perm[5000:], alpha, seed))
    hit = (p.argmax(1) == y).double()
    a, b = float(hit[:5000].mean()), float(hit[5000:].mean())
    pooled = float(hit.mean())
    z = (a - b) / np.sqrt(pooled * (1 - pooled) * (1 / 5000 + 1 / 5000))
    return [path.stem, x.shape[1], f"{n['aurc'] * 100:.2f} / {t['aurc'] * 100:.2f}",
            f"{n['augrc'] * 100:.2f} / {t['augrc'] * 100:.2f}",
            f"{n['coverage'] * 100:.1f} / {t['coverage'] * 100:.1f}",
            f"{n['size']:.2f} / {t['size']:.2f}", size_d, f"{full * 100:.2f}",
            "yes" if abs(full - (1 - alpha)) <= 0.01 else "no", f"{np.mean(covs) * 100:.2f} ± {np.std(covs) * 100:.2f}",
            f"{(full - np.mean(covs)) / np.std(covs):+.1f}", f"{a * 100:.2f} / {b * 100:.2f} ({z:+.2f})"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default=str(DEFAULT))
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--n-boot", type=int, default=200)
    ap.add_argument("--splits", type=int, default=40)
    args = ap.parse_args(argv)
    files = sorted(Path(args.folder).glob("*.npz"))
    if not files:
        print(f"no .npz files in {args.folder}", file=sys.stderr)
        return 1
    start = time.perf_counter()
    print(f"| model | K | AURC x100 none / TS | AUGRC x100 none / TS | APS coverage % none / TS (alpha = "
          f"{args.alpha:g}), half/half | mean set size none / TS | size TS - none [95% CI] | APS coverage %, all 5,000 "
          f"val rows | within 1 pt | coverage % over {args.splits} random 5,000/5,000 splits (mean ± sd) | fixed split "
          "in sd | accuracy % rows 0-4999 / 5000-9999 (z) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for path in files:
        print("| " + " | ".join(map(str, row(path, args.alpha, args.n_boot, args.splits))) + " |", flush=True)
    print(f"\n{len(files)} models in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
