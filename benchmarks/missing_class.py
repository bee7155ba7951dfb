"""A class missing from the validation split: what ``calibkit calibrate`` chooses, and what each
calibrator does to that class.

Test bed: the LeNet-5 CIFAR-10 outputs of the real-outputs folder (its README), restricted to
classes 0-4 (logits = log of the probabilities of those five classes, clipped at the smallest
positive float32). Validation: rows 0-1199 of classes 0-3 (class 4 left out; 488 rows, about the
size of the case first reported); test: rows 5000-9999 of classes 0-4 (2491 rows). A second,
synthetic bed where a per-class map wins on validation: 600 rows of 5 classes, logits =
N(0, 1) noise + 2 on the true class + per-class offsets (2.5, 0, -2, 1, 0) (a bias that one
temperature cannot fix), validation without class 4 (463 rows), 600 test rows. Prints, per bed,

1. ``calibrate``'s warnings, its choice, and the test accuracy and NLL of the uncalibrated model
   and of the chosen calibrator (the promise: accuracy within 0.5 points);
2. per calibrator, fitted on the validation split: the test rows predicted as class 4
   against the uncalibrated model's, and the test accuracy.

Usage::

    PYTHONPATH=$PWD python benchmarks/missing_class.py [FOLDER]
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

DEFAULT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real_outputs"
ABSENT, K = 4, 5
VAL_ROWS = 1200


def split(folder: Path):
    with np.load(folder / "cifar10_lenet5.npz", allow_pickle=False) as f:
        probs, labels = f["probs"][:, :K], f["labels"]
    logits = np.log(np.maximum(probs, np.finfo(np.float32).tiny)).astype(np.float32)
    rows = np.arange(len(labels))
    val = (rows < VAL_ROWS) & (labels < K) & (labels != ABSENT)
    test = (rows >= 5000) & (labels < K)
    return (logits[val], labels[val]), (logits[test], labels[test])


def synthetic():
    g = np.random.default_rng(0)

    def make(n):
        y = g.integers(0, K, n)
        z = g.normal(size=(n, K))
        z[np.arange(n), y] += 2.0
        return (z + np.array([2.5, 0.0, -2.0, 1.0, 0.0])).astype(np.float32), y.astype(np.int64)
    zv, yv = make(600)
    return (zv[yv != ABSENT], yv[yv != ABSENT]), make(600)


def run_calibrate(val, test) -> None:
    from calibkit.cli import main

    with tempfile.TemporaryDirectory() as d:
        np.savez(Path(d) / "val.npz", logits=val[0], labels=val[1])
        np.savez(Path(d) / "test.npz", logits=test[0], labels=test[1])
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            rc = main(["calibrate", "--val", f"{d}/val.npz", "--test", f"{d}/test.npz", "--out", f"{d}/out",
                       "--n-boot", "200"])
        rows = json.loads((Path(d) / "out/report/results.json").read_text())
    print(f"calibrate exit {rc}; {len(val[1])} validation rows (no class {ABSENT}), {len(test[1])} test rows")
    for line in err.getvalue().splitlines():
        print(f"  {line}")
    by = {r["calibrator"]: r for r in rows}
    chosen = next(r["calibrator"] for r in rows if r["selected"])
    for name in ("none", chosen):
        r = by[name]
        print(f"  {name:<12} test accuracy {100 * r['acc']:.2f}%  NLL {r['nll']:.4f}")
    print(f"  chosen {chosen}: accuracy {100 * (by[chosen]['acc'] - by['none']['acc']):+.2f} points")


def per_calibrator(val, test) -> None:
    from calibkit.calibrators import CALIBRATORS

    zv, yv = torch.from_numpy(val[0]), torch.from_numpy(val[1])
    zt, yt = torch.from_numpy(test[0]), torch.from_numpy(test[1])
    base = int((zt.argmax(1) == ABSENT).sum())
    print(f"\n| calibrator | test rows predicted {ABSENT} (uncalibrated {base}) | test accuracy % |")
    print("|---|---|---|")
    print(f"| none | {base} | {100 * float((zt.argmax(1) == yt).double().mean()):.2f} |")
    for name, cls in CALIBRATORS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pred = cls().fit(zv, yv).predict_proba(zt).argmax(1)
        print(f"| {name} | {int((pred == ABSENT).sum())} | {100 * float((pred == yt).double().mean()):.2f} |")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    torch.set_num_threads(1)
    for title, (val, test) in (("LeNet-5 CIFAR-10, classes 0-4", split(Path(argv[0]) if argv else DEFAULT)),
                               ("synthetic, per-class offsets", synthetic())):
        print(f"\n## {title}\n")
        run_calibrate(val, test)
        per_calibrator(val, test)
    return 0


if __name__ == "__main__":
    sys.exit(main())
