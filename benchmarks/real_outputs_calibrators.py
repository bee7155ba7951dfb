"""calibkit's calibrators against the reference package ``probmetrics`` on the real-outputs test bed.

For every model of ``../shared/data/real_outputs/`` (rows 0-4999 fit, rows 5000-9999 test; README
there) and every calibrator the two libraries share (the pairs and their like-for-like settings:
``tests/helpers/reference.py``, which ``tests/calibrators/test_reference.py`` runs on small data), both
are fitted on the same validation rows (calibkit on ``log p``, probmetrics on ``p``) and scored on the
same test rows: test NLL of each, their difference (also with probmetrics' rows floored at calibkit's
floor and renormalised, which removes the one convention that dominates where a row gives the true
class ~0), and the share of test rows whose argmax differs. A calibrator whose reference needs a
package that is not installed (``cir-model``, ``venn-abers``, ``lightgbm``) is skipped with a note.
Prints one markdown table (the one in docs/calibrators.md).

Usage::

    python benchmarks/real_outputs_calibrators.py [--models a,b] [--calibrators x,y]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT.parent / "shared" / "data" / "real_outputs"

sys.path.insert(0, str(ROOT))
from tests.helpers.reference import PAIRS, fit_ours, fit_reference, floored, nll  # noqa: E402


def compare(path: Path, names: list[str]) -> list[dict]:
    with np.load(path, allow_pickle=False) as f:
        probs, labels = f["probs"].astype(np.float64), f["labels"]
    probs /= probs.sum(1, keepdims=True)
    val, test = slice(0, 5000), slice(5000, 10000)
    rows = []
    for name in names:
        if name not in PAIRS:
            continue
        pair = PAIRS[name]
        row = {"model": path.stem, "calibrator": name}
        if pair.needs is not None and importlib.util.find_spec(pair.needs) is None:
            row["note"] = f"reference needs {pair.needs} (not installed)"
            rows.append(row)
            continue
        start = time.perf_counter()
        q_ours = fit_ours(name, probs[val], labels[val], probs[test])
        row["s_ours"] = time.perf_counter() - start
        start = time.perf_counter()
        q_ref = fit_reference(name, probs[val], labels[val], probs[test])
        row["s_ref"] = time.perf_counter() - start
        y = labels[test]
        row.update(nll_ours=nll(q_ours, y), nll_ref=nll(q_ref, y), nll_ref_floor=nll(floored(q_ref, pair.floor), y),
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
        print("probmetrics is not installed: pip install -e '.[test]' (it keeps calibkit's torch)")
        return 1
    from calibkit.calibrators import CALIBRATORS

    torch.set_num_threads(1)
    files = sorted(REAL.glob("*.npz"))
    if args.models:
        keep = set(args.models.split(","))
        files = [f for f in files if f.stem in keep]
    names = args.calibrators.split(",") if args.calibrators else list(CALIBRATORS)
    print("| model | calibrator | test NLL calibkit | test NLL probmetrics | difference | difference, both floored "
          "| argmax differs % | notes (true class < 1e-12: calibkit / probmetrics; fit+predict s) |")
    print("|---|---|---|---|---|---|---|---|")
    for f in files:
        compare(f, names)
    print("\n** : the difference exceeds 0.002 (docs/calibrators.md explains each)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
