"""The ``calibkit bench`` command line: its options and help (light: ``calibkit bench --help`` loads no
torch); the command runs in :mod:`calibkit.commands.bench`."""

from __future__ import annotations

import argparse
import textwrap

from calibkit.bench.grid import METHODS, PRESETS
from calibkit.commands import Handler, add_executor, add_num_threads
from calibkit.commands import bounded as B
from calibkit.commands.parsers.tune import add_shared
from calibkit.commands.presetargs import add_preset_options

EPILOG = """\
examples:
  calibkit bench --preset smoke --out runs/smoke            # every method in ~30 s: checks the set-up
  calibkit bench --preset default --out runs/default        # the main job, one process
  calibkit bench --preset default --out runs/default --workers 2   # two processes share the runs (make bench)
  calibkit bench --preset default --out runs/default --methods ls mbls --seeds 0
  calibkit bench --preset default --out runs/tuned --tune   # select on validation first (calibkit tune)
  calibkit bench --preset default --out runs/last --keep last
  calibkit bench --preset mine.toml --out runs/mine --csm-build     # CSM on data without a shipped set
  torchrun --nproc_per_node 4 -m calibkit bench --preset cifar10 --data-dir ~/data --out runs/c10
  calibkit bench --preset cifar10 --data-dir /shared/data --out /shared/c10 --executor slurm \
      --gpus-per-run 4 --time 24:00:00 --requeue --signal 600     # job arrays (docs/cluster.md)
  calibkit bench --preset cifar10 --out /shared/c10 --status      # then --collect for the table

Times are wall times on a 2-core CPU (smoke: 15 runs of ~1-2 s plus the report; default: 30 runs
of 27-60 s). Everything a preset needs (data, extra packages, CSM set) is checked before anything
is written. Running the same command again skips finished runs and resumes interrupted ones; a
second process running the same command shares the work (each process trains different runs).
The report is written to OUT/report/ (index.html, report.md, figures/); rebuild it with
`calibkit report OUT`.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="compare every calibration method side by side (results database + report)",
        description="Train and evaluate a grid of methods x seeds; record every run in OUT/runs.db and\n"
        "write a report to OUT/report/.\n\npresets:\n" + "\n".join(
            textwrap.fill(v.note, 100, initial_indent=f"  {k:<13} ", subsequent_indent=" " * 16)
            for k, v in PRESETS.items()),
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )

    add_preset_options(p, PRESETS)
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (runs.db, runs/, report/)")
    p.add_argument("--seeds", type=B.SEED, nargs="+", metavar="S", help="seeds (default: the preset's)")
    p.add_argument("--methods", nargs="+", metavar="M",
                   help=f"methods to run (default: the preset's list, else all): {', '.join(METHODS)}; CE is "
                        "always included; text presets skip mixup, regmixup and csm")
    p.add_argument("--data-dir", metavar="DIR", help="folder with the data set's files")
    p.add_argument("--csm-store", metavar="DIR", help="CSM generated set, an existing folder even without csm "
                   "in --methods (default: the one shipped for "
                   "Fashion-MNIST; other data sets: make one with `calibkit csm generate`)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    p.add_argument("--tune", action="store_true",
                   help="first select every method's hyperparameters on validation (calibkit tune, into the same "
                   "DIR), then run the grid at the selected values")

    add_shared(p)
    add_num_threads(p)
    add_executor(p)
    p.add_argument("--workers", type=B.count(256), default=1, metavar="N",
                   help="processes on this machine sharing the runs (default 1; one per core is usually fastest)")
    p.add_argument("--no-report", action="store_true", help="record the runs only; no table or report")
    p.add_argument("--all-figures", action="store_true", help="the report draws every method's reliability figure "
                   "(the smoke preset draws CE's and the recommended method's only: its report_figures)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress: neither a line per run nor the report's phases (the tables are still printed)")
    # an extra worker of --workers: start up, then wait for the caller's go (calibkit.bench.workers)
    p.add_argument("--await-start", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=Handler("calibkit.commands.bench"))

