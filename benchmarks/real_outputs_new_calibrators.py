"""Platt scaling, beta calibration, BBQ, SVS and SMS on the published outputs of real classifiers.

For every ``.npz`` of the real-outputs folder (its README: rows 0-4999 validation, rows 5000-9999
test; logits = log of the probabilities, clipped at the smallest positive float32, as
``benchmarks/real_outputs.py`` reads them), each calibrator (default hyperparameters) is fitted on
the validation rows and scored on the test rows: ECE x100 (15 equal-width bins, top label), NLL and
accuracy %, with the uncalibrated model and temperature scaling for reference.

Usage::

    python benchmarks/real_outputs_new_calibrators.py [FOLDER]

Prints a markdown table (one row per model and calibrator).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import calibkit.functional as F
from calibkit.calibrators import CALIBRATORS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_outputs import DEFAULT, load  # noqa: E402

NAMES = ("temperature", "platt", "beta", "bbq", "svs", "sms")


def scores(p: torch.Tensor, y: torch.Tensor) -> str:
    return f"{100 * float(F.ece(p, y)):.2f} | {float(F.nll(p, y)):.4f} | {100 * float(F.accuracy(p, y)):.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", type=Path, default=DEFAULT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("| model | K | calibrator | test ECE x100 | test NLL | test acc % |")
    print("|---|---|---|---|---|---|")
    for path in sorted(args.folder.glob("*.npz")):
        z, y = load(path)
        half = len(y) // 2
        zv, yv, zt, yt = z[:half], y[:half], z[half:], y[half:]
        print(f"| {path.stem} | {z.shape[1]} | none | {scores(torch.softmax(zt, 1), yt)} |")
        for name in NAMES:
            cal = CALIBRATORS[name]().fit(zv, yv)
            print(f"| | | {name} | {scores(cal.predict_proba(zt).double(), yt)} |", flush=True)


if __name__ == "__main__":
    main()
