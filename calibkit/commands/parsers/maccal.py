"""The ``calibkit maccal`` command line: its options and help (light: ``calibkit maccal --help`` loads no
torch); the command runs in :mod:`calibkit.commands.maccal`."""

from __future__ import annotations

import argparse

from calibkit.commands import Handler
from calibkit.commands import bounded as B
from calibkit.methods.maccal.defaults import DEFAULTS as D

EPILOG = """\
examples:
  calibkit train --config fmnist --out runs/ce
  calibkit maccal runs/ce --out runs/ce_maccal
  calibkit maccal runs/ce --out runs/ce_maccal_s128 --mc-samples 128 --eta 2
  calibkit train --config fmnist --method maccal --out runs/maccal     # both stages, resumable
  calibkit eval runs/ce_maccal

Stage 2 freezes the stage-1 backbone, computes the features once (no augmentation) and retrains
a copy of the linear head under a Bernoulli(r) DropConnect mask. The deployed predictor averages
the probabilities of S seeded masked heads (--mc-samples S); after every epoch its validation
confidence c and accuracy a set r <- clip(r - eta * (c - a), r_min, 1), and the epoch with its
lowest validation ECE is kept. This keep-rate rule is calibkit's own (the published one is not
public); see docs/maccal.md. --mc-samples 0 deploys the unmasked head instead.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "maccal", help="MaC-Cal stage 2: retrain the head of a finished run under adaptive random masks",
        description="Retrain the linear head of a finished calibkit run under adaptive DropConnect masks "
        "(MaC-Cal stage 2) and write a new run directory that calibkit eval / plot read like any other.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("stage1", metavar="STAGE1_DIR", help="finished run directory written by calibkit train")
    p.add_argument("--out", required=True, metavar="DIR", help="new (or empty) run directory to write")
    g = p.add_argument_group("keep-rate rule and deployed predictor")
    g.add_argument("--r-init", type=B.number(0.0, 1.0, low_open=True), default=D["r_init"],
                   help=f"initial keep rate (default {D['r_init']})")
    g.add_argument("--eta", type=B.number(0.0, 1000.0), default=D["eta"],
                   help=f"keep-rate step size (default {D['eta']})")
    g.add_argument("--r-min", type=B.fraction(), default=D["r_min"], help=f"lowest keep rate (default {D['r_min']})")
    g.add_argument("--mc-samples", type=B.count(100_000), default=D["mc_samples"], metavar="S",
                   help=f"masked heads averaged by the deployed predictor (default {D['mc_samples']}); "
                   "0: the deterministic unmasked head")
    g = p.add_argument_group("stage-2 optimisation")
    g.add_argument("--epochs", type=B.EPOCHS, default=D["epochs"], help=f"stage-2 epochs (default {D['epochs']})")
    g.add_argument("--lr", type=B.LR, default=D["lr"], help=f"initial SGD lr, cosine to 0 (default {D['lr']})")
    g.add_argument("--batch-size", type=B.BATCH, default=D["batch_size"], help=f"(default {D['batch_size']})")
    g.add_argument("--weight-decay", type=B.WEIGHT_DECAY, default=D["weight_decay"],
                   help=f"(default {D['weight_decay']})")
    g.add_argument("--loss", default="ce", metavar="SPEC",
                   help='stage-2 loss spec (default ce); "stage1" reuses the stage-1 run\'s loss')
    g.add_argument("--seed", type=B.SEED, default=D["seed"], help="seed of the masks and data order (default 0)")
    g = p.add_argument_group("execution")
    g.add_argument("--data-dir", metavar="DIR", help="data set folder (default: the stage-1 run's)")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    g.add_argument("--num-threads", type=B.THREADS, metavar="N", help="torch CPU threads (default: torch's)")
    g.add_argument("--quiet", action="store_true", help="no per-epoch output (the result line is still printed)")
    p.set_defaults(func=Handler("calibkit.commands.maccal"))

