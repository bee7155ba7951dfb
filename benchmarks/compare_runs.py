"""Compare finished run directories on their test logits, with bootstrap intervals.

Prints, for each run, accuracy, ECE, AECE, O-ECE and U-ECE (x100) with 95% percentile-bootstrap
intervals, and for every run after the first the paired bootstrap interval of its ECE difference
from the first run (same resamples for both; the runs must share one test set).

    python benchmarks/compare_runs.py runs/bench-default/runs/default/ce/seed0 \\
        runs/bench-default/runs/default/maccal/seed0 runs/bench-default/runs/default/csm/seed0

``--ts`` adds, after each run, the same run after temperature scaling (T fitted on its own
validation logits, NLL), named ``RUN+TS``; ``--diff`` chooses the metrics of the paired intervals
(default: ece); ``--ref I`` makes row ``I`` (0-based, counting the ``+TS`` rows) the reference, e.g.
``--ts --ref 1`` compares every row with the first run after temperature scaling.
"""

from __future__ import annotations

import argparse

import torch

from calibkit.metrics import bootstrap_ci, paired_bootstrap_diff
from calibkit.rundir import load_logits

METRICS = ("acc", "ece", "aece", "o_ece", "u_ece")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run directories; the first is the reference")
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ts", action="store_true",
                    help="also each run after temperature scaling (fitted on its val logits)")
    ap.add_argument("--ref", type=int, default=0, help="row of the reference (0-based, +TS rows counted)")
    ap.add_argument("--diff", nargs="+", default=["ece"], choices=METRICS, help="metrics of the paired intervals")
    args = ap.parse_args()

    loaded = []
    for run in args.runs:
        lg = load_logits(run)
        loaded.append((run, torch.softmax(lg["test_logits"].double(), dim=1), lg["test_labels"]))
        if args.ts:
            from calibkit.calibrators import TemperatureScaling

            ts = TemperatureScaling().fit(lg["val_logits"], lg["val_labels"])
            loaded.append((f"{run}+TS (T={ts.temperature_:.3f})", ts.predict_proba(lg["test_logits"].double()),
                           lg["test_labels"]))
    if not 0 <= args.ref < len(loaded):
        raise SystemExit(f"--ref {args.ref}: there are {len(loaded)} rows (0..{len(loaded) - 1})")
    ref_run, ref_probs, labels = loaded[args.ref]
    for run, _, y in loaded:
        if not torch.equal(y, labels):
            raise SystemExit(f"{run}: test labels differ from {ref_run}'s; the runs do not share a test set")

    for run, probs, _ in loaded:
        cells = []
        for name in METRICS:
            r = bootstrap_ci(name, probs, labels, n_resamples=args.resamples, seed=args.seed)
            cells.append(f"{name} {100 * r.estimate:.2f} [{100 * r.low:.2f}, {100 * r.high:.2f}]")
        if run != ref_run:
            for name in args.diff:
                d = paired_bootstrap_diff(probs, ref_probs, labels, name, n_resamples=args.resamples, seed=args.seed)
                cells.append(f"d{name} {100 * d.estimate:+.2f} [{100 * d.low:+.2f}, {100 * d.high:+.2f}]")
        print(f"{run}\n    " + "; ".join(cells))


if __name__ == "__main__":
    main()
