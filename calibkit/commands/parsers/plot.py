"""The ``calibkit plot`` command line: its options and help (light: ``calibkit plot --help`` loads no
torch); the command runs in :mod:`calibkit.commands.plot`."""

from __future__ import annotations

import argparse

from calibkit.commands import Handler, add_num_threads
from calibkit.commands import bounded as B

EPILOG = """\
Writes four PNG files into DIR (or --out):
  reliability.png      reliability_ts.png      (accuracy vs confidence per bin, with the gap and
                                               the 90% consistency band: where a calibrated
                                               model's bars would lie, per bin)
  confidence.png       confidence_ts.png       (histogram of confidences, mean accuracy/confidence)
The *_ts files use the temperature fitted on the validation logits.

example:
  calibkit plot runs/ce
  calibkit plot runs/ce --out figures/ce

--out refuses another run's directory (it holds config.json) and a bench directory (runs.db).
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "plot", help="reliability diagrams and confidence histograms of a run (PNG)",
        description="Draw the reliability diagram and the confidence histogram of a finished run's test "
        "predictions, before and after temperature scaling fitted on its validation logits.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", metavar="DIR", help="run directory written by calibkit train")
    p.add_argument("--out", metavar="DIR", help="where to write the PNGs (default: the run directory)")
    p.add_argument("--n-bins", type=B.N_BINS, default=15, help="confidence bins (default 15)")
    p.add_argument("--dpi", type=B.DPI, default=150, help="resolution of the PNGs (default 150)")

    add_num_threads(p)
    p.set_defaults(func=Handler("calibkit.commands.plot"))

