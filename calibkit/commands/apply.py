"""``calibkit apply --calibrator FILE --input F --out OUT.npz``: a saved calibrator on new logits."""

from __future__ import annotations

import argparse

EPILOG = """\
FILE is a calibrator written by `calibkit calibrate --save NAME` or calibkit.calibrators.save
(FILE may name STEM, STEM.json or STEM.safetensors). F holds 'logits' (or 'probs', then
logits = log(probs)) and optionally 'labels', as for `calibkit calibrate`. OUT.npz receives
'probs', the calibrated probabilities (float64), and 'labels' when F has them.

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
    p.add_argument("--calibrator", required=True, metavar="FILE", help="saved calibrator (STEM[.json|.safetensors])")
    p.add_argument("--input", required=True, metavar="F", help=".npz / .safetensors / .pt with 'logits' or 'probs'")
    p.add_argument("--out", required=True, metavar="OUT.npz", help="where to write the calibrated probabilities")
    from calibkit.commands import add_num_threads

    add_num_threads(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import os
    from pathlib import Path

    out = Path(args.out)
    if out.suffix != ".npz":
        raise ValueError(f"--out must name an .npz file, got {out}")
    from calibkit.calibrators import load
    from calibkit.commands.calibrate import read_scores

    cal = load(args.calibrator)
    x, y, source = read_scores(args.input, require_labels=False)
    probs = cal.predict_proba(x)

    import numpy as np

    arrays = {"probs": probs.double().cpu().numpy()}
    if y is not None:
        arrays["labels"] = y.cpu().numpy()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, out)
    print(f"{cal!r} applied to {args.input} ({len(probs)} rows, {source}): wrote {out}")
    return 0
