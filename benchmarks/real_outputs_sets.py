"""Selective prediction and APS conformal sets on the published outputs of real classifiers.

For every ``.npz`` of the real-outputs folder (``probs`` (10000, K) and ``labels``; see its README):
rows 0-4999 are the validation split, rows 5000-9999 the test split; logits = log(probs) with the
probabilities raised to the smallest positive float32 first. As ``calibkit calibrate`` does
(:func:`calibkit.report.sets.calibrator_sets`): the uncalibrated model and temperature scaling, each
with APS sets (randomised) at ``--alpha``: the calibrator fitted on one half of the validation rows,
the conformal threshold on the other half, coverage and mean set size on the test rows; AURC and
AUGRC x100 of the test probabilities (TS fitted on all validation rows). The last column checks that
the coverage lies within 1 point of ``1 - alpha`` for both.

Usage::

    python benchmarks/real_outputs_sets.py [FOLDER] [--alpha 0.1] [--n-boot 200]

FOLDER defaults to ``../shared/data/real_outputs`` beside the repository. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from calibkit.calibrators import TemperatureScaling
from calibkit.report.sets import calibrator_sets

DEFAULT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real_outputs"


def load(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits, labels)``: log of the probabilities clipped at the smallest positive float32."""
    with np.load(path, allow_pickle=False) as f:
        probs, labels = f["probs"], f["labels"]
    tiny = np.finfo(np.float32).tiny
    return torch.from_numpy(np.log(np.maximum(probs.astype(np.float64), tiny))), torch.from_numpy(labels).long()


def row(path: Path, alpha: float, n_boot: int) -> list:
    x, y = load(path)
    val, test = (x[:5000], y[:5000]), (x[5000:], y[5000:])
    ts = TemperatureScaling().fit(*val)
    probs = {"none": test[0].softmax(1), "temperature": ts.predict_proba(test[0]).double()}
    res = calibrator_sets(val, test, probs, alpha=alpha, n_boot=n_boot)
    n, t = res["none"], res["temperature"]
    within = all(abs(r["coverage"] - (1 - alpha)) <= 0.01 for r in (n, t))
    d = t["d_size"] if t["d_size"] else n["d_size"]
    size_d = f"{-d['diff']:+.2f} [{-d['hi']:+.2f}, {-d['lo']:+.2f}]" if d else "-"
    return [path.stem, x.shape[1], f"{n['aurc'] * 100:.2f} / {t['aurc'] * 100:.2f}",
            f"{n['augrc'] * 100:.2f} / {t['augrc'] * 100:.2f}", f"{n['coverage'] * 100:.1f} / {t['coverage'] * 100:.1f}",
            f"{n['size']:.2f} / {t['size']:.2f}", size_d, "yes" if within else "NO"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default=str(DEFAULT))
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--n-boot", type=int, default=200)
    args = ap.parse_args(argv)
    files = sorted(Path(args.folder).glob("*.npz"))
    if not files:
        print(f"no .npz files in {args.folder}", file=sys.stderr)
        return 1
    start = time.perf_counter()
    print(f"| model | K | AURC x100 none / TS | AUGRC x100 none / TS | APS coverage % none / TS (alpha = "
          f"{args.alpha:g}) | mean set size none / TS | size TS - none [95% CI] | coverage within 1 pt |")
    print("|---|---|---|---|---|---|---|---|")
    for path in files:
        print("| " + " | ".join(map(str, row(path, args.alpha, args.n_boot))) + " |", flush=True)
    print(f"\n{len(files)} models in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
