"""The binning family on the published outputs of real classifiers: exact zeros, test NLL and the
share of predictions each convention changes.

For every ``.npz`` of the real-outputs folder (rows 0-4999 validation, 5000-9999 test; logits =
log(probs) with probabilities raised to the smallest positive float32 first), fits on the
validation rows and prints, per calibrator and convention: test NLL, accuracy (%), the share of
test predictions changed against the uncalibrated argmax (%), and the count of exact zeros in the
test rows (``zeros``) and of rows whose true class gets < 1e-12 (``true~0``). Conventions compared:
histogram binning one-vs-rest renormalised (``ovr``) and top-label (``top``), equal-mass and
equal-width, each with ``floor=0`` (the unfloored maps) and the default floor; isotonic, spline,
scaling-binning and BBQ with ``floor=0`` and the default.

Usage::

    python benchmarks/binning_conventions.py [FOLDER]

FOLDER defaults to ``../shared/data/real_outputs`` beside the repository. Prints a markdown table.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import torch

from calibkit.calibrators import (
    BBQ,
    HistogramBinning,
    IsotonicCalibration,
    ScalingBinning,
    SplineCalibration,
    UniformHistogramBinning,
)

CANDIDATES = [
    ("histogram ovr, floor 0", lambda: HistogramBinning(multiclass="ovr", floor=0.0)),
    ("histogram ovr", lambda: HistogramBinning(multiclass="ovr")),
    ("histogram top, floor 0", lambda: HistogramBinning(floor=0.0)),
    ("histogram top (default)", lambda: HistogramBinning()),
    ("histogram_uniform ovr", lambda: UniformHistogramBinning(multiclass="ovr")),
    ("histogram_uniform top (default)", lambda: UniformHistogramBinning()),
    ("isotonic, floor 0", lambda: IsotonicCalibration(floor=0.0)),
    ("isotonic (default)", lambda: IsotonicCalibration()),
    ("spline, floor 0", lambda: SplineCalibration(floor=0.0)),
    ("spline (default)", lambda: SplineCalibration()),
    ("scaling_binning (default)", lambda: ScalingBinning()),
    ("bbq (default)", lambda: BBQ()),
]


def main(folder: Path) -> None:
    print("| model | calibrator | test NLL | acc % | changed % | zeros | true~0 |")
    print("|---|---|---|---|---|---|---|")
    tiny = float(np.finfo(np.float32).tiny)
    for path in sorted(folder.glob("*.npz")):
        d = np.load(path)
        p = torch.from_numpy(d["probs"]).double()
        y = torch.from_numpy(d["labels"]).long()
        z = torch.log(p.clamp(min=tiny))
        zv, yv, zt, yt = z[:5000], y[:5000], z[5000:], y[5000:]
        base = zt.argmax(1)
        for label, make in CANDIDATES:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                q = make().fit(zv, yv).predict_proba(zt)
            true = q[torch.arange(len(yt)), yt]
            nll = float(-torch.log(true.clamp(min=1e-300)).mean())
            acc = 100 * float((q.argmax(1) == yt).double().mean())
            changed = 100 * float((q.argmax(1) != base).double().mean())
            print(f"| {path.stem} | {label} | {nll:.4f} | {acc:.2f} | {changed:.2f} | {int((q == 0).sum())} "
                  f"| {int((true < 1e-12).sum())} |", flush=True)


if __name__ == "__main__":
    default = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real_outputs"
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else default)
