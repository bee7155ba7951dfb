"""The ``calibkit csm`` command line: its options and help (light: ``calibkit csm --help`` loads no
torch); the command runs in :mod:`calibkit.commands.csm`."""

from __future__ import annotations

from calibkit.commands import Handler
from calibkit.commands import bounded as B

DEVICE_HELP = "auto, cpu, cuda or cuda:N (default auto: the GPU when there is one)"


def register(sub) -> None:
    p = sub.add_parser("csm", help="CSM: diffusion generator, semantic mixing groups, calibrated reannotation")
    csm = p.add_subparsers(dest="csm_command", metavar="STEP")

    t = csm.add_parser("train-generator", help="train the class-conditional EDM generator (resumable)")
    t.add_argument("--data", default="fmnist", help="data set name (calibkit.data.DATASETS)")
    t.add_argument("--data-dir", default=None)
    t.add_argument("--steps", type=B.STEPS, default=2000, help="total optimiser steps (raise to continue)")
    t.add_argument("--batch-size", type=B.BATCH, default=64)
    t.add_argument("--seed", type=B.SEED, default=0)
    t.add_argument("--lr", type=B.LR, default=1e-3)
    t.add_argument("--channels", type=B.IntList(B.count(4096), tuple_=True), default=(32, 64, 64),
                   help="UNet widths, e.g. 32,64,64")
    t.add_argument("--p-uncond", type=B.number(0.0, 1.0, high_open=True), default=0.1,
                   help="class dropout for guidance")
    t.add_argument("--checkpoint-every", type=B.STEPS, default=100)
    t.add_argument("--num-threads", type=B.THREADS, default=None,
                   help="torch CPU threads (1 is fastest on a busy machine; default: torch's choice)")
    t.add_argument("--exclude-val-seeds", type=B.IntList(B.SEED, tuple_=True), default=None, metavar="S,S,...",
                   help="train on the official training images outside the validation split of each of "
                        "these seeds (e.g. the benchmark's 0,1), instead of the training split of --seed")
    t.add_argument("--val-size", type=B.CountOrFraction(), default=None,
                   help="validation size of those splits (count, or fraction < 1; default: the data set's)")
    t.add_argument("--device", default="auto", help=DEVICE_HELP)
    t.add_argument("--out", required=True, help="output directory (resumed if it holds a checkpoint)")
    t.set_defaults(func=Handler("calibkit.commands.csm", "run_train_generator"))

    g = csm.add_parser("generate", help="generate mixing groups into a store (torchrun-shardable, resumable)")
    g.add_argument("--generator", required=True, help="generator directory")
    g.add_argument("--groups", type=B.count(10**8), required=True, help="number of groups of 8 images")
    g.add_argument("--seed", type=B.SEED, default=0)
    g.add_argument("--steps", type=B.count(100_000), default=20, help="Heun sampler steps")
    g.add_argument("--guidance", type=B.number(0.0, 100.0), default=1.0, help="guidance weight w (1 = none)")
    g.add_argument("--groups-per-shard", type=B.count(10**8), default=16)
    g.add_argument("--num-threads", type=B.THREADS, default=None, help="torch CPU threads per process")
    g.add_argument("--device", default="auto", help=DEVICE_HELP + "; under torchrun, auto = cuda:LOCAL_RANK")
    g.add_argument("--batch-size", type=B.BATCH, default=None,
                   help="images per sampler batch (default 64 on the CPU, 4096 on a GPU)")
    g.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="bf16: bfloat16 autocast of the network (faster on CPUs with AVX512-BF16 and on GPUs)")
    g.add_argument("--out", required=True, help="store directory")
    g.set_defaults(func=Handler("calibkit.commands.csm", "run_generate"))

    a = csm.add_parser("annotate", help="calibrated reannotation of a store's soft labels")
    a.add_argument("store", help="store directory written by `calibkit csm generate`")
    a.add_argument("--encoder", choices=("classifier", "clip", "efficientnet_lite0"), default="classifier",
                   help="classifier: a calibkit run's penultimate features (--run); clip: a local CLIPModel "
                        "(--clip-dir); efficientnet_lite0: the ImageNet EfficientNet-Lite0 backbone of "
                        "calibkit[pretrained] (default: classifier)")
    a.add_argument("--run", default=None, help="run directory of the reference classifier (--encoder classifier)")
    a.add_argument("--clip-dir", default=None, help="local CLIPModel directory (--encoder clip)")
    a.add_argument("--data", default=None, help="data set of the prototypes (default: the run's)")
    a.add_argument("--data-dir", default=None)
    a.add_argument("--sharpness", type=B.number(0.0, 1000.0, low_open=True), default=4.0,
                   help="s in sigmoid(s (lam_hat - 0.5))")
    a.add_argument("--device", default="auto", help=DEVICE_HELP)
    a.set_defaults(func=Handler("calibkit.commands.csm", "run_annotate"))
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])

