"""``calibkit apply --calibrator FILE --input F --out OUT.npz``: a saved calibrator on new logits."""

from __future__ import annotations

import argparse

from calibkit.errors import UserError

EPILOG = """\
FILE is a calibrator written by `calibkit calibrate --save [NAME]` or calibkit.calibrators.save
(FILE may name STEM, STEM.json or STEM.safetensors, or the folder of `calibrate --out` when it
holds one saved calibrator). F holds 'logits' (or 'probs', then
logits = log(probs)) and optionally 'labels', as for `calibkit calibrate`. OUT.npz receives
'probs', the calibrated probabilities (computed and written in float64), and 'labels' when F
has them; then the ECE x100 (15 bins), NLL, Brier and accuracy of F's rows before and after
calibration are printed.

Refused with one line and exit status 1, nothing written: logits whose K or layout (binary
(N,) scores vs (N, K) logits) differ from the fit's, a calibrator file that fails load's
checks (format version, hyperparameters, every state field), an OUT.npz that is the
input file itself (also through a symlink or another relative path) or a folder, and an F
that `calibkit calibrate` would refuse (damaged, pickled, both 'logits' and 'probs', ...).

example:
  calibkit apply --calibrator calib/dirichlet --input new.npz --out new_calibrated.npz
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "apply", help="apply a saved calibrator to logits (writes calibrated probabilities)",
        description="Apply a calibrator saved by `calibkit calibrate --save` to a file of logits or "
        "probabilities and write the calibrated probabilities to an .npz file.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--calibrator", required=True, metavar="FILE",
                   help="saved calibrator (STEM[.json|.safetensors], or a calibrate --out folder holding one)")
    p.add_argument("--input", required=True, metavar="F", help=".npz / .safetensors / .pt with 'logits' or 'probs'")
    p.add_argument("--out", required=True, metavar="OUT.npz", help="where to write the calibrated probabilities")
    from calibkit.commands import add_num_threads

    add_num_threads(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import os
    from pathlib import Path

    from calibkit.commands import check_paths_given

    check_paths_given(calibrator=args.calibrator, input=args.input, out=args.out)
    out = Path(args.out)
    if out.suffix != ".npz":
        raise UserError(f"--out must name an .npz file, got {out}")
    if out.is_dir():
        raise UserError(f"--out {out} is a directory, not a file")
    from calibkit.commands.calibrate import read_scores, same_file

    if same_file(out, Path(args.input)):
        raise UserError(f"--out {out} is the input file {args.input}: writing there would overwrite its logits; "
                         "choose another path")
    from calibkit.calibrators import load

    cal = load(saved_in(args.calibrator))
    x, y, source = read_scores(args.input, require_labels=False)
    check_fit_layout(cal, x, args.input, args.calibrator)
    probs = cal.predict_proba(x.double())  # float64 logits: float64 probabilities, computed in float64

    import numpy as np

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
    import torch

    from calibkit.metrics import evaluate

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
    from pathlib import Path

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
