"""The ``calibkit compare`` command line: its options and help (light: ``calibkit compare --help`` loads no
torch); the command runs in :mod:`calibkit.commands.compare`."""

from __future__ import annotations

import argparse

from calibkit.commands import Handler, add_num_threads
from calibkit.commands import bounded as B

EPILOG = """\
Both methods' saved test predictions are compared seed by seed (the seeds they share), on the same
bootstrap resamples of the test set; every panel metric gets A - B with its 95% basic interval.
--after fits a post-hoc calibrator on each run's validation logits first (both A and B).
A finished run of A or B that cannot be used (its logits file missing, a damaged field) is named in
a warning and left out, as `calibkit report` does; when none of a method's runs is left, the error
names them.

examples:
  calibkit compare runs/default ls ce
  calibkit compare runs/default mbls ce --after temperature
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "compare", help="paired bootstrap difference of two methods of a bench (optionally after a calibrator)",
        description="Print the paired bootstrap difference A - B of every panel metric of two methods of the "
        "bench in DIR, over the seeds they share, optionally after a post-hoc calibrator.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dir", metavar="DIR", help="a bench output directory (holding runs.db)")
    p.add_argument("a", metavar="A", help="a method of the bench (e.g. ls)")
    p.add_argument("b", metavar="B", help="the method it is compared with (e.g. ce)")
    p.add_argument("--after", metavar="CALIBRATOR",
                   help="fit this calibrator of calibkit.calibrators.CALIBRATORS on each run's validation logits "
                   "first (e.g. temperature)")
    p.add_argument("--preset", help="which preset's runs (default: the most recent in the database)")
    p.add_argument("--n-boot", type=B.N_BOOT, metavar="N", help="bootstrap resamples (default: the preset's)")
    p.add_argument("--store", metavar="URL", help="the bench's postgresql:// results database, or env:NAME to "
                   "read it from that environment variable (default: DIR/runs.db)")

    add_num_threads(p)
    p.set_defaults(func=Handler("calibkit.commands.compare"))

