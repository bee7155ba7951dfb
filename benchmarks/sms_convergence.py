"""SMS capped at 30 L-BFGS iterations against SMS fitted to the solver's tolerance, side by side.

On each real-outputs model given (rows 0-4999 validation, 5000-9999 test; logits = log(probs) with
probabilities raised to the smallest positive float32 first), fits
``StructuredMatrixScaling(max_iter=30)`` and ``StructuredMatrixScaling(max_iter=M)`` (``M`` =
1000 by default; the solver stops earlier, at a largest gradient entry of 1e-7 or a relative drop
under 1e-12) and prints the iterations run, the fit's wall time (median of ``--repeat`` fits, one
thread), the validation (training) NLL of each fit, the test NLL and the share of test predictions on
which the two fits disagree.

Usage::

    python benchmarks/sms_convergence.py [FOLDER] [--models cifar100_densenet-bc-100 ...] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from pathlib import Path

import torch
from real_outputs import DEFAULT, load  # the real-outputs files as every benchmark reads them

from calibkit.calibrators import StructuredMatrixScaling


def _nll(cal, z, y):
    q = cal.predict_proba(z)
    return float(-torch.log(q[torch.arange(len(y)), y]).mean())


def main(folder: Path, models: list[str], repeat: int, max_iter: int) -> None:
    torch.set_num_threads(1)
    print("| model | max_iter | iterations | fit s (median) | validation NLL | test NLL | predictions differing % |")
    print("|---|---|---|---|---|---|---|")
    for name in models:
        z, y = load(folder / f"{name}.npz")
        fits = {}
        for cap in (30, max_iter):
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    cal = StructuredMatrixScaling(max_iter=cap).fit(z[:5000], y[:5000])
                times.append(time.perf_counter() - t0)
            fits[cap] = (cal, statistics.median(times))
        pred = {cap: fits[cap][0].predict_proba(z[5000:]) for cap in fits}
        differ = 100 * float((pred[30].argmax(1) != pred[max_iter].argmax(1)).double().mean())
        for cap, (cal, t) in fits.items():
            nll = _nll(cal, z[5000:], y[5000:])
            print(f"| {name} | {cap} | {cal.n_iter_} | {t:.2f} | {_nll(cal, z[:5000], y[:5000]):.7f} | {nll:.5f} "
                  f"| {differ:.2f} |", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--models", nargs="+", default=["cifar100_densenet-bc-100", "cifar10_wrn16-4"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-iter", type=int, default=1000)
    a = ap.parse_args()
    main(a.folder, a.models, a.repeat, a.max_iter)
