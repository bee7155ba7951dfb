"""The ``calibkit report`` command line: its options and help (light: ``calibkit report --help`` loads no
torch); the command runs in :mod:`calibkit.commands.report`."""

from __future__ import annotations

from calibkit.commands import Handler, add_num_threads
from calibkit.commands import bounded as B


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="rebuild the bench report (tables, report.md, index.html) from DIR/runs.db",
        description="Print the bench tables and write DIR/report/ (report.md, a self-contained "
        "index.html, figures/) from DIR/runs.db and the logits files its rows point to. Result files "
        "of runs executed elsewhere (--executor slurm) are imported into DIR/runs.db first.",
    )
    p.add_argument("dir", metavar="DIR", help="a bench output directory (holding runs.db)")
    p.add_argument("--preset", metavar="NAME|FILE", help="which preset's runs: a preset name or a preset file (its "
                   "name is used) (default: the most recent in the database)")
    p.add_argument("--n-boot", type=B.N_BOOT, metavar="N", help="bootstrap resamples (default: the preset's)")
    p.add_argument("--store", metavar="URL", help="the bench's postgresql:// results database, or env:NAME to "
                   "read it from that environment variable (default: DIR/runs.db)")
    p.add_argument("--alpha", type=B.ALPHA, default=0.1,
                   help="miscoverage of the conformal prediction sets, in (0, 1) (default 0.1: 90%% coverage)")
    p.add_argument("--quiet", action="store_true", help="no progress (the phases of the build and their times)")
    p.add_argument("--jobs", type=B.count(1024), metavar="N", help="processes fitting the runs' calibrators, each with "
                   "--num-threads torch threads (default: one per core when there are enough fits; 1: this process "
                   "only); the report is the same")

    p.add_argument("--all-figures", action="store_true", help="draw every method's reliability figure (the smoke "
                   "preset draws CE's and the recommended method's only: its report_figures)")
    add_num_threads(p)
    p.set_defaults(func=Handler("calibkit.commands.report"))

