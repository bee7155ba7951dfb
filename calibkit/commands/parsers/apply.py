"""The ``calibkit apply`` command line: its options and help (light: ``calibkit apply --help`` loads no
torch); the command runs in :mod:`calibkit.commands.apply`."""

from __future__ import annotations

import argparse

from calibkit.commands import Handler, add_num_threads

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

    add_num_threads(p)
    p.set_defaults(func=Handler("calibkit.commands.apply"))

