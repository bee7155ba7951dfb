"""The ``calibkit tune`` command line: its options and help (light: ``calibkit tune --help`` loads no
torch); the command runs in :mod:`calibkit.commands.tune`."""

from __future__ import annotations

import argparse

from calibkit.bench.grid import KEEP_POLICIES, METHODS, PRESETS
from calibkit.commands import Handler, add_executor, add_num_threads
from calibkit.commands import bounded as B
from calibkit.commands.presetargs import add_preset_options

EPILOG = """\
examples:
  calibkit tune --preset default --out runs/tune-default            # every method with a search space
  calibkit tune --preset default --out runs/tune-default --methods mbls fedlas_mbls
  calibkit tune --preset default --out runs/tune-default --workers 2   # two processes share the candidates
  calibkit bench --preset default --out runs/tuned --tune           # select, then bench at the selection
  torchrun --nproc_per_node 4 -m calibkit tune --preset cifar10 --data-dir ~/data --out runs/tune-c10
  calibkit tune --preset cifar10 --data-dir /shared/data --out /shared/tune-c10 --executor slurm --gpus-per-run 4

Every candidate is trained on the preset's selection seed and scored on the validation split only
(ECE of the deployed predictor before temperature scaling; candidates more than 1 accuracy point
below the method's best are excluded). A selection on the edge of its grid extends that axis (at
most twice, never past its bound) and tuning goes on. Everything is checked before anything is
written. Running the same command again never retrains a finished candidate; two processes on one
DIR share the candidates. Search spaces and the extension rule: docs/bench.md.
"""


def add_shared(p) -> None:
    """Options shared by ``tune`` and ``bench``."""
    p.add_argument("--csm-build", action="store_true",
                   help="with csm in the methods and no generated set: build one in DIR first (train the generator "
                   "on the training images outside every seed's validation split, then generate; resumable)")
    p.add_argument("--max-extensions", type=B.integer(0, 100), default=2, metavar="K",
                   help="times each grid axis may be extended when a selection lands on its edge (default 2; 0: "
                   "never)")
    p.add_argument("--keep", choices=KEEP_POLICIES,
                   help="checkpoint policy of every run (default: the preset's); one policy per output directory")
    p.add_argument("--store", metavar="URL",
                   help="results database: a postgresql:// URL shared by benches on several hosts (needs "
                   "calibkit[postgres]; one database per output directory; docs/store.md), or env:NAME to read "
                   "it from that environment variable (no password on the command line); default DIR/runs.db")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "tune", help="select each method's hyperparameters on the validation split (never the test split)",
        description="Train every candidate of each method's search space on the preset's selection seed, "
        "score it on the validation split and record all of them, and the selection, in the tuning table "
        "of DIR/runs.db.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )

    add_preset_options(p, PRESETS)
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (runs.db, tune/, runs/)")
    p.add_argument("--methods", nargs="+", metavar="M",
                   help="methods to tune (default: all with a search space): "
                   f"{', '.join(m for m, s in METHODS.items() if s.space)}")
    p.add_argument("--seed", type=B.SEED, metavar="S", help="selection seed (default: the preset's tune_seed)")
    p.add_argument("--data-dir", metavar="DIR", help="folder with the data set's files")
    p.add_argument("--csm-store", metavar="DIR", help="CSM generated set (default: the one shipped)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    add_shared(p)
    add_num_threads(p)
    p.add_argument("--workers", type=B.count(256), default=1, metavar="N",
                   help="processes on this machine sharing the candidates (default 1; one per core is usually fastest)")
    # an extra worker of --workers: start up, then wait for the caller's go (calibkit.bench.workers)
    p.add_argument("--await-start", action="store_true", help=argparse.SUPPRESS)

    add_executor(p)
    # the selection job of --executor slurm: select from the candidates' result files
    p.add_argument("--select-only", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=Handler("calibkit.commands.tune"))

