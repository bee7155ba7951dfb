"""``calibkit apply --calibrator FILE --input F --out OUT.npz``: a saved calibrator on new logits."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

import calibkit.commands.calibrate
from calibkit.calibrators import load
from calibkit.commands import check_paths_given
from calibkit.commands.calibrate import same_file
from calibkit.errors import UserError
from calibkit.metrics import evaluate


def run(args) -> int:
    check_paths_given(calibrator=args.calibrator, input=args.input, out=args.out)
    out = Path(args.out)
    if out.suffix != ".npz":
        raise UserError(f"--out must name an .npz file, got {out}")
    if out.is_dir():
        raise UserError(f"--out {out} is a directory, not a file")

    if same_file(out, Path(args.input)):
        raise UserError(f"--out {out} is the input file {args.input}: writing there would overwrite its logits; "
                         "choose another path")

    cal = load(saved_in(args.calibrator))
    x, y, source = calibkit.commands.calibrate.read_scores(args.input, require_labels=False)
    check_fit_layout(cal, x, args.input, args.calibrator)
    probs = cal.predict_proba(x.double())  # float64 logits: float64 probabilities, computed in float64

    arrays = {"probs": probs.double().cpu().numpy()}
    if y is not None:
        arrays["labels"] = y.cpu().numpy()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, out)
    print(f"{cal!r} applied to {args.input} ({len(probs)} rows, {source}): wrote {out}")
    if y is not None:
        print(before_after(x, probs, y))
    return 0


METRICS = (("ECE x100", "ece", 100, 2), ("NLL", "nll", 1, 4), ("Brier", "brier", 1, 4), ("acc %", "acc", 100, 2))


def before_after(x, probs, labels, n_bins: int = 15) -> str:
    """A small table of the input's metrics before (``softmax`` of its logits, ``sigmoid`` for binary
    scores: the input's own probabilities when it held probabilities) and after calibration,
    computed with :func:`calibkit.metrics.evaluate` (ECE with ``n_bins`` equal-width bins)."""
    before = torch.sigmoid(x) if x.dim() == 1 else torch.softmax(x, 1)
    panels = [("before", evaluate(before, labels, n_bins=n_bins)), ("after", evaluate(probs.double(), labels,
                                                                                       n_bins=n_bins))]
    head = f"{'':<8}" + "".join(f"{h:>10}" for h, _, _, _ in METRICS)
    rows = [f"{name:<8}" + "".join(f"{scale * p[key]:>10.{d}f}" for _, key, scale, d in METRICS) for name, p in panels]
    return "\n".join([f"labels found: metrics on these {len(labels)} rows (ECE with {n_bins} bins)", head, *rows])


def saved_in(path):
    """``path``, or the one calibrator saved in the folder ``path`` (a ``calibkit calibrate`` output
    folder: ``NAME.json`` + ``NAME.safetensors`` at its top); a folder with none or several is refused,
    naming what it holds."""
    folder = Path(path)
    if not folder.is_dir():
        return path
    stems = sorted(p.with_suffix("") for p in folder.glob("*.json") if p.with_suffix(".safetensors").is_file())
    if len(stems) == 1:
        return stems[0]
    what = f"several: {', '.join(s.name for s in stems)}" if stems else "none"
    raise UserError(f"--calibrator {folder}: a folder, holding {what} of the saved calibrators (NAME.json + "
                     "NAME.safetensors); name one, e.g. --calibrator DIR/NAME (calibkit calibrate --save writes one)")


def check_fit_layout(cal, x, input_name, cal_name) -> None:
    """Refuse logits ``x`` whose layout or ``K`` differ from the fitted calibrator's (any calibrator:
    all record ``n_classes_`` and ``binary_``), naming both files."""
    fitted = "binary (N,) scores" if cal.binary_ else f"(N, {cal.n_classes_}) logits"
    if (x.dim() == 1) != cal.binary_:
        got = "binary (N,) scores" if x.dim() == 1 else f"(N, {x.shape[1]}) logits"
        raise UserError(f"{input_name} holds {got} but the calibrator {cal_name} was fitted on {fitted}")
    if x.dim() == 2 and x.shape[1] != cal.n_classes_:
        raise UserError(f"{input_name} has K = {x.shape[1]} classes but the calibrator {cal_name} was fitted on "
                         f"K = {cal.n_classes_}")
