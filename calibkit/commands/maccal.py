"""``calibkit maccal STAGE1_DIR --out DIR``: MaC-Cal stage 2 (masked head retraining) on a finished run."""

from __future__ import annotations

import argparse

EPILOG = """\
examples:
  calibkit train --config fmnist --out runs/ce
  calibkit maccal runs/ce --out runs/ce_maccal
  calibkit maccal runs/ce --out runs/ce_maccal_mc --mc-samples 32 --epochs 10
  calibkit eval runs/ce_maccal

Stage 2 freezes the stage-1 backbone, caches the features of the training split (no
augmentation) and retrains a copy of the linear head under a Bernoulli(r) DropConnect mask,
with r <- clip(r - eta * (conf - acc), r_min, 1) after every epoch on the validation split.
This keep-rate rule is calibkit's own (the published one is not public); see docs/maccal.md.
Optimiser: SGD momentum 0.9, weight decay 5e-4, cosine lr from --lr, batch 128, grad clip 2.
"""


def register(subparsers) -> None:
    from calibkit.methods.maccal import DEFAULTS as D

    p = subparsers.add_parser(
        "maccal", help="MaC-Cal stage 2: retrain the head of a finished run under adaptive random masks",
        description="Retrain the linear head of a finished calibkit run under adaptive DropConnect masks "
        "(MaC-Cal stage 2) and write a new run directory that calibkit eval / plot read like any other.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("stage1", metavar="STAGE1_DIR", help="finished run directory written by calibkit train")
    p.add_argument("--out", required=True, metavar="DIR", help="new (or empty) run directory to write")
    g = p.add_argument_group("keep-rate rule")
    g.add_argument("--r-init", type=float, default=D["r_init"], help=f"initial keep rate (default {D['r_init']})")
    g.add_argument("--eta", type=float, default=D["eta"], help=f"keep-rate step size (default {D['eta']})")
    g.add_argument("--r-min", type=float, default=D["r_min"], help=f"lowest keep rate (default {D['r_min']})")
    g = p.add_argument_group("stage-2 optimisation")
    g.add_argument("--epochs", type=int, default=D["epochs"], help=f"stage-2 epochs (default {D['epochs']})")
    g.add_argument("--lr", type=float, default=D["lr"], help=f"initial SGD lr, cosine to 0 (default {D['lr']})")
    g.add_argument("--batch-size", type=int, default=D["batch_size"], help=f"(default {D['batch_size']})")
    g.add_argument("--weight-decay", type=float, default=D["weight_decay"], help=f"(default {D['weight_decay']})")
    g.add_argument("--loss", default="ce", metavar="SPEC",
                   help='stage-2 loss spec (default ce); "stage1" reuses the stage-1 run\'s loss')
    g.add_argument("--seed", type=int, default=D["seed"], help="seed of the masks and data order (default 0)")
    g = p.add_argument_group("inference and execution")
    g.add_argument("--mc-samples", type=int, default=0, metavar="S",
                   help="0: full unmasked head (default); S > 0: average the probabilities of S masked heads")
    g.add_argument("--data-dir", metavar="DIR", help="data set folder (default: the stage-1 run's)")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    g.add_argument("--quiet", action="store_true", help="no per-epoch output")
    p.set_defaults(func=run)


def run(args) -> int:
    from calibkit.methods.maccal import run_maccal

    log = (lambda line: None) if args.quiet else (lambda line: print(line, flush=True))
    summary = run_maccal(
        args.stage1, args.out, r_init=args.r_init, eta=args.eta, r_min=args.r_min, epochs=args.epochs,
        lr=args.lr, batch_size=args.batch_size, weight_decay=args.weight_decay, loss=args.loss,
        seed=args.seed, mc_samples=args.mc_samples, data_dir=args.data_dir, device=args.device, log=log)
    return 0 if summary["status"] == "done" else 1
