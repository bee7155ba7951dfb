"""Structured vector / matrix scaling with the fixed strengths (``n_folds=0``, ``s = 1``) against the
strength chosen by the inner cross-validation (the default), on the real-outputs test bed.

For every model of ``../shared/data/real_outputs/`` (rows 0-4999 fit, rows 5000-9999 test; logits =
``log(probs)`` with the probabilities raised to the smallest positive float32 first), fits SVS and
SMS both ways and prints one markdown row per fit: the chosen ``s``, the final fit's iterations, the
fit's wall and CPU seconds (one torch thread) and the test NLL.

Usage::

    python benchmarks/structured_search.py [FOLDER] [--models a b] [--calibrators svs sms]
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import torch
from real_outputs import DEFAULT, load  # the real-outputs files as every benchmark reads them

from calibkit.calibrators import StructuredMatrixScaling, StructuredVectorScaling

CLASSES = {"svs": StructuredVectorScaling, "sms": StructuredMatrixScaling}
MODELS = ["cifar10_lenet5", "cifar10_wrn16-4", "cifar10_vgg16", "cifar10_cleanlab-cv", "mnist_cleanlab-cv",
          "cifar100_densenet-bc-100", "cifar100_lenet5", "cifar100_wrn16-4"]


def main(folder: Path, models: list[str], names: list[str]) -> None:
    torch.set_num_threads(1)
    print("| model | calibrator | n_folds | s | iterations | fit wall s | fit CPU s | test NLL |")
    print("|---|---|---|---|---|---|---|---|")
    for model in models:
        z, y = load(folder / f"{model}.npz")
        for name in names:
            for n_folds in (0, 3):
                wall, cpu = time.perf_counter(), time.process_time()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    cal = CLASSES[name](n_folds=n_folds).fit(z[:5000], y[:5000])
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                q = cal.predict_proba(z[5000:])
                nll = float(-torch.log(q[torch.arange(5000), y[5000:]]).mean())
                print(f"| {model} | {name} | {n_folds} | {cal.reg_scale_:g} | {cal.n_iter_} | {wall:.1f} | {cpu:.1f} "
                      f"| {nll:.4f} |", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--calibrators", nargs="+", default=list(CLASSES), choices=list(CLASSES))
    a = ap.parse_args()
    main(a.folder, a.models, a.calibrators)
