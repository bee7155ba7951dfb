"""calibkit's calibrators against the reference package ``probmetrics`` on the real-outputs test bed.

For every model of ``../shared/data/real_outputs/`` (rows 0-4999 fit, rows 5000-9999 test; README
there) and every calibrator the two libraries share, both are fitted on the same validation rows
(calibkit on ``log p``, probmetrics on ``p``) and scored on the same test rows: test NLL of each,
their difference (also with probmetrics' rows floored at calibkit's 1e-12 and renormalised, which
removes the one convention that dominates where a row gives the true class ~0), and the share of
test rows whose argmax differs. A calibrator whose reference
needs a package that is not installed (``cir-model``, ``venn-abers``, ``lightgbm``) is skipped with
a note. Prints one markdown table (the one in docs/calibrators.md).

Usage::

    python benchmarks/real_outputs_calibrators.py [--models a,b] [--calibrators x,y]
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import numpy as np
import torch

REAL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real_outputs"
TINY = float(np.finfo(np.float32).tiny)
FLOOR = 1e-12  # calibkit's floor of the one-vs-rest rows (calibkit.calibrators._ovr.FLOOR)


def _reference(name: str):
    """A fresh probmetrics calibrator standing for calibkit's ``name`` (None: not shared), and the
    package it needs beyond probmetrics (None: none)."""
    from probmetrics.calibrators import (
        CDFSplineCalibrator,
        ETSCalibrator,
        LightGBMCalibrator,
        MatrixScalingCalibrator,
        MulticlassOneVsRestCalibrator,
        VectorScalingCalibrator,
    )
    from probmetrics.calibrators.factory import get_calibrator

    table = {
        "temperature": (lambda: get_calibrator("temp-scaling"), None),
        "vector": (VectorScalingCalibrator, None),
        "matrix": (MatrixScalingCalibrator, None),
        "ets": (ETSCalibrator, None),
        "isotonic": (lambda: get_calibrator("isotonic"), None),
        "svs": (lambda: get_calibrator("svs", svs_print_init_info=False), None),
        "sms": (lambda: get_calibrator("sms", sms_print_init_info=False), None),
        "cir": (lambda: get_calibrator("cir"), "cir_model"),
        "venn_abers": (lambda: get_calibrator("ivap-ovr"), "venn_abers"),
        "spline_ovr": (lambda: MulticlassOneVsRestCalibrator(CDFSplineCalibrator()), None),
        "lightgbm": (LightGBMCalibrator, "lightgbm"),
    }
    return table.get(name, (None, None))


def nll(q: np.ndarray, y: np.ndarray) -> float:
    """Mean negative log-likelihood (an exact zero counts as ``-log(1e-300)``)."""
    return float(-np.log(np.maximum(q[np.arange(len(y)), y], 1e-300)).mean())


def compare(path: Path, names: list[str]) -> list[dict]:
    from calibkit.calibrators import CALIBRATORS

    with np.load(path, allow_pickle=False) as f:
        probs, labels = f["probs"].astype(np.float64), f["labels"]
    probs /= probs.sum(1, keepdims=True)
    logits = torch.from_numpy(np.log(np.maximum(probs, TINY)))
    val, test = slice(0, 5000), slice(5000, 10000)
    rows = []
    for name in names:
        make, needs = _reference(name)
        if make is None:
            continue
        row = {"model": path.stem, "calibrator": name}
        if needs is not None and importlib.util.find_spec(needs) is None:
            row["note"] = f"reference needs {needs} (not installed)"
            rows.append(row)
            continue
        start = time.perf_counter()
        ours = CALIBRATORS[name]().fit(logits[val], torch.from_numpy(labels[val]))
        q_ours = ours.predict_proba(logits[test]).numpy()
        row["s_ours"] = time.perf_counter() - start
        start = time.perf_counter()
        ref = make().fit(probs[val], labels[val])
        q_ref = np.asarray(ref.predict_proba(probs[test]), dtype=np.float64)
        row["s_ref"] = time.perf_counter() - start
        y = labels[test]
        floored = np.maximum(q_ref, FLOOR)
        floored /= floored.sum(1, keepdims=True)
        row.update(nll_ours=nll(q_ours, y), nll_ref=nll(q_ref, y), nll_ref_floor=nll(floored, y),
                   argmax=float((q_ours.argmax(1) != q_ref.argmax(1)).mean()),
                   zeros_ref=int((q_ref[np.arange(len(y)), y] < 1e-12).sum()),
                   zeros_ours=int((q_ours[np.arange(len(y)), y] < 1e-12).sum()))
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def _line(r: dict) -> str:
    if "note" in r:
        return f"| {r['model']} | `{r['calibrator']}` | | | | | | {r['note']} |"
    d = r["nll_ours"] - r["nll_ref"]
    flag = "" if abs(d) <= 0.002 else " **"
    d_floor = r["nll_ours"] - r["nll_ref_floor"]
    flag_floor = "" if abs(d_floor) <= 0.002 else " **"
    return (f"| {r['model']} | `{r['calibrator']}` | {r['nll_ours']:.4f} | {r['nll_ref']:.4f} | {d:+.4f}{flag} | "
            f"{d_floor:+.4f}{flag_floor} | "
            f"{100 * r['argmax']:.2f} | {r['zeros_ours']} / {r['zeros_ref']}; "
            f"{r['s_ours']:.1f} s / {r['s_ref']:.1f} s |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help="comma-separated file stems (default: all)")
    ap.add_argument("--calibrators", help="comma-separated calibkit names (default: every shared one)")
    args = ap.parse_args(argv)
    if importlib.util.find_spec("probmetrics") is None:
        print("probmetrics is not installed: pip install probmetrics (it needs torch; keep calibkit's)")
        return 1
    from calibkit.calibrators import CALIBRATORS

    torch.set_num_threads(1)
    files = sorted(REAL.glob("*.npz"))
    if args.models:
        keep = set(args.models.split(","))
        files = [f for f in files if f.stem in keep]
    names = args.calibrators.split(",") if args.calibrators else list(CALIBRATORS)
    print("| model | calibrator | test NLL calibkit | test NLL probmetrics | difference | difference, both floored "
          "at 1e-12 | argmax differs % | notes (true class < 1e-12: calibkit / probmetrics; fit+predict s) |")
    print("|---|---|---|---|---|---|---|---|")
    for f in files:
        compare(f, names)
    print("\n** : the difference exceeds 0.002 (docs/calibrators.md explains each)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
