"""The ``calibkit eval`` command line: its options and help (light: ``calibkit eval --help`` loads no
torch); the command runs in :mod:`calibkit.commands.eval`."""

from __future__ import annotations

import argparse

from calibkit.commands import Handler, add_num_threads
from calibkit.commands import bounded as B

EPILOG = """\
The temperature is fitted on the run's validation logits (NLL) and applied to its test logits.
Calibration errors are printed x100, accuracy in %, NLL and Brier as they are.
Segmentation runs: T is fitted on the stored validation pixel sample and the metrics (with mIoU)
cover every labelled test pixel; the trainer's own evaluation is reused for the default settings,
other settings stream the test images through the model again (needs the data).

example:
  calibkit eval runs/ce
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "eval", help="metrics of a run before/after temperature scaling (table + metrics.json)",
        description="Evaluate a finished run on its test logits, before and after temperature scaling "
        "fitted on its validation logits; print a table and write DIR/metrics.json.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", metavar="DIR", help="run directory written by calibkit train")
    p.add_argument("--n-bins", type=B.N_BINS, default=15, help="bins of the binned calibration errors (default 15)")
    p.add_argument("--ts-objective", choices=("nll", "ece"), default="nll",
                   help="fit T by validation NLL (default) or by the literature's grid search on validation ECE")

    add_num_threads(p)
    p.set_defaults(func=Handler("calibkit.commands.eval"))

