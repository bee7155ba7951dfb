"""The ``calibkit train`` command line: its options and help (light: ``calibkit train --help`` loads no
torch); the command runs in :mod:`calibkit.commands.train`."""

from __future__ import annotations

import argparse

from calibkit.commands import Handler
from calibkit.commands import bounded as B
from calibkit.config import CONFIG_DIR

EPILOG = """\
examples:
  calibkit train --data fmnist --model cnn --loss ce --epochs 30 --seed 0 --out runs/ce
  calibkit train --config fmnist --loss "mbls:margin=6" --out runs/mbls
  calibkit train --config cifar10 --data-dir ~/data/cifar-10-batches-py --out runs/c10
  torchrun --nproc_per_node 2 -m calibkit train --config fmnist --out runs/ddp
  calibkit train --config fmnist --method maccal --maccal "eta=2" --out runs/maccal

Values given here override the --config preset, which overrides the defaults.
Running the same command again resumes an interrupted run from its last epoch.
--method maccal trains stage 1 (plain training with --loss) into OUT/stage1, then MaC-Cal
stage 2 into OUT (see calibkit maccal --help and docs/maccal.md); it resumes the same way.
"""


def preset_names() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train", help="train a model (SGD, calibration loss, Mixup/RegMixup/CSM) into a run directory",
        description="Train one model and write a run directory: config.json, model.safetensors (the "
        "weights the checkpoint policy keeps), checkpoint.pt, history.json and logits.safetensors.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, metavar="DIR", help="run directory to create or resume")
    p.add_argument("--config", metavar="TOML", help="preset: a TOML file, or the name of one shipped "
                   f"with calibkit ({', '.join(preset_names())})")
    g = p.add_argument_group("data and model")
    g.add_argument("--data", help="data set name (default fmnist)")
    g.add_argument("--data-dir", metavar="DIR", help="folder with the data set's files")
    g.add_argument("--model", help="model name from calibkit.models.MODELS (default resnet20), or your own "
                   "'package.module:factory' / 'file.py:factory' (docs/own_data.md)")
    g.add_argument("--val-size", type=B.CountOrFraction(), metavar="N|F",
                   help="validation split drawn (class-stratified, seeded) from the training set: "
                   "a count (5000) or a fraction (0.1)")
    g.add_argument("--train-subset", type=B.SUBSET, metavar="N",
                   help="train on a class-stratified, seeded random subset of N training images")
    g.add_argument("--augment", action=argparse.BooleanOptionalAction, default=None,
                   help="random crop/flip as the data set allows (default on)")
    g.add_argument("--keep", metavar="POLICY", help="checkpoint policy, which epoch's weights the run keeps: "
                   "best-acc (default), best-nll, best-ece or last")
    g.add_argument("--finetune", metavar="PART", help="pretrained models: what is trained, all (default), head "
                   "(the backbone frozen) or last:N (the head and the last N backbone blocks)")
    g.add_argument("--backbone-lr-scale", type=B.number(0.0, 100.0, low_open=True), metavar="S",
                   help="pretrained models: the backbone learns at S x lr (default 0.1)")
    g = p.add_argument_group("loss and method")
    g.add_argument("--loss", metavar="SPEC",
                   help='loss spec, e.g. ce, "mbls:margin=6", "fedlas_ls:alpha=0.05" (default ce)')
    g.add_argument("--method", help="standard, mixup, regmixup, csm, or maccal (stage 1 standard, then MaC-Cal "
                   "stage 2) (default standard)")
    g.add_argument("--maccal", metavar="SPEC", help='MaC-Cal stage-2 settings for --method maccal, e.g. '
                   '"eta=2,mc_samples=64,epochs=30" (default: calibkit maccal\'s defaults)')
    g.add_argument("--mix-alpha", type=B.number(0.0, 1000.0, low_open=True), metavar="A",
                   help="Beta parameter of Mixup/RegMixup (default 0.2 / 20)")
    g.add_argument("--csm-data", metavar="DIR", help="generated set for --method csm")
    g.add_argument("--csm-weight", type=B.number(0.0, 1000.0, low_open=True), metavar="W",
                   help="weight of CSM's generated term (default 1)")
    g.add_argument("--csm-per-real", type=B.integer(2, 1024), metavar="N",
                   help="generated images per real one, even (default 2)")
    g.add_argument("--csm-loss", metavar="L", help="generated term: l2 (the paper, default) or ce (soft cross-entropy)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=B.EPOCHS, help="training epochs (default 30)")
    g.add_argument("--batch-size", type=B.BATCH, help="global batch size (default 128)")
    g.add_argument("--optimizer", choices=("sgd", "adam"), help="sgd (default) or adam")
    g.add_argument("--lr", type=B.LR, help="learning rate (default 0.1)")
    g.add_argument("--momentum", type=B.number(0.0, 1.0, high_open=True), help="SGD momentum (default 0.9)")
    g.add_argument("--weight-decay", type=B.WEIGHT_DECAY, help="weight decay (default 5e-4)")
    g.add_argument("--schedule", help="multistep, cosine or onecycle (default multistep)")
    g.add_argument("--milestones", type=B.IntList(B.EPOCHS, empty=True), metavar="E1,E2",
                   help="multistep drop epochs (default 50%%,75%%)")
    g.add_argument("--gamma", type=B.number(0.0, 1.0, low_open=True), help="multistep factor (default 0.1)")
    g.add_argument("--grad-clip", type=B.number(0.0, 1e6), metavar="NORM",
                   help="gradient-norm clip, 0 disables (default 2)")
    g.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None,
                   help="bfloat16 autocast (default off)")
    g.add_argument("--seed", type=B.SEED, help="seed of split, initialisation and data order (default 0)")
    g = p.add_argument_group("execution")
    g.add_argument("--device", help="auto, cpu, cuda or cuda:N (default auto)")
    g.add_argument("--num-threads", type=B.THREADS, metavar="N", help="torch CPU threads")
    g.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="train the model through torch.compile (default off)")
    g.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                   help="hold conv weights channels-last: faster convolutions on CPUs and GPUs (default off)")
    g.add_argument("--checkpoint-every", type=B.EPOCHS, metavar="E",
                   help="write the resume checkpoint every E epochs and after the last (default 1)")
    g.add_argument("--eval-batch-size", type=B.BATCH, metavar="N",
                   help="batch size for logits (default: 128 on a CPU, 1024 on an accelerator)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar (summary lines only)")
    g.add_argument("--quiet", action="store_true", help="no per-epoch output at all")
    p.set_defaults(func=Handler("calibkit.commands.train"))

