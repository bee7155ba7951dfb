"""``calibrate``'s choice on the published outputs of real classifiers (the real-outputs test bed).

For every ``.npz`` of the folder (``probs`` (10000, K) and ``labels``; see its README): rows
0-4999 are the validation split, rows 5000-9999 the test split; logits = log(probs) with
probabilities raised to the smallest positive float32 first. The calibrator is chosen on the
validation rows alone (:func:`calibkit.calibrators.selection.select_calibrator`, the default rule),
then the test rows are scored: accuracy, ECE x100 (15 equal-width bins) and NLL uncalibrated, after
temperature scaling and after the chosen calibrator, the share of test predictions it changed, and
the paired bootstrap interval of its ECE minus temperature scaling's (``*`` / ``!``: significantly
lower / higher). The last two columns check the two promises of the rule: the chosen calibrator
keeps accuracy within 0.5 points, and its test ECE is not significantly above temperature scaling's.

Usage::

    python benchmarks/real_outputs.py [FOLDER] [--n-boot 1000]

FOLDER defaults to ``../shared/data/real_outputs`` beside the repository. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

import calibkit.functional as F
from calibkit.bootstrap import paired_bootstrap_diff
from calibkit.calibrators.selection import NONE, select_calibrator

DEFAULT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real_outputs"


def load(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits, labels)`` of one file: log of the probabilities clipped at the smallest positive float32."""
    with np.load(path, allow_pickle=False) as f:
        probs, labels = f["probs"], f["labels"]
    tiny = float(np.finfo(np.float32).tiny)
    return torch.log(torch.as_tensor(probs, dtype=torch.float64).clamp(min=tiny)), torch.as_tensor(labels).long()


def row(path: Path, n_boot: int) -> dict:
    z, y = load(path)
    half = len(y) // 2
    start = time.perf_counter()
    sel = select_calibrator(z[:half], y[:half])
    zt, yt = z[half:], y[half:]
    probs = {NONE: torch.softmax(zt, 1), "temperature": sel.fitted["temperature"].predict_proba(zt).double()}
    if sel.chosen not in probs:
        probs[sel.chosen] = sel.fitted[sel.chosen].predict_proba(zt).double()
    out = {"model": path.stem, "K": z.shape[1], "chosen": sel.chosen, "runner_up": sel.runner_up,
           "seconds": time.perf_counter() - start}
    for name, p in probs.items():
        out[name] = {"acc": float(F.accuracy(p, yt)), "ece": float(F.ece(p, yt)), "nll": float(F.nll(p, yt))}
    base_pred = probs[NONE].argmax(1)
    out["changed"] = float((probs[sel.chosen].argmax(1) != base_pred).double().mean())
    out["chosen_scores"] = out[sel.chosen]
    out["vs_ts"] = (None if sel.chosen == "temperature" else
                    paired_bootstrap_diff(probs[sel.chosen], probs["temperature"], yt, "ece", n_boot, seed=0))
    return out


def _fmt(m: dict) -> str:
    return f"{100 * m['acc']:.2f} / {100 * m['ece']:.2f} / {m['nll']:.4f}"


def table(rows: list[dict]) -> str:
    head = ["model", "K", "uncalibrated acc / ECE / NLL", "TS acc / ECE / NLL", "chosen", "chosen acc / ECE / NLL",
            "changed %", "dECE vs TS x100 [95% CI]", "acc kept (0.5 pt)", "ECE not above TS"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        d = r["vs_ts"]
        if d is None:
            delta, not_above = "(is TS)", True
        else:
            mark = " *" if d.high < 0 else " !" if d.low > 0 else ""
            delta, not_above = f"{100 * d.estimate:+.2f} [{100 * d.low:+.2f}, {100 * d.high:+.2f}]{mark}", d.low <= 0
        kept = abs(r["chosen_scores"]["acc"] - r[NONE]["acc"]) <= 0.005
        lines.append(f"| {r['model']} | {r['K']} | {_fmt(r[NONE])} | {_fmt(r['temperature'])} | {r['chosen']} | "
                     f"{_fmt(r['chosen_scores'])} | {100 * r['changed']:.2f} | {delta} | {'yes' if kept else 'NO'} | "
                     f"{'yes' if not_above else 'NO'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default=str(DEFAULT))
    ap.add_argument("--n-boot", type=int, default=1000)
    args = ap.parse_args(argv)
    files = sorted(Path(args.folder).glob("*.npz"))
    if not files:
        print(f"no .npz files in {args.folder}", file=sys.stderr)
        return 1
    torch.set_num_threads(1)
    rows = []
    for path in files:
        rows.append(row(path, args.n_boot))
        print(f"{path.stem}: chose {rows[-1]['chosen']} (runner-up {rows[-1]['runner_up']}) in "
              f"{rows[-1]['seconds']:.1f} s", file=sys.stderr)
    print("Validation = rows 0-4999, test = rows 5000-9999; acc %, ECE x100 (15 bins), NLL on the test rows.\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
