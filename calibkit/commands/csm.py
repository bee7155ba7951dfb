"""``calibkit csm ...``: train the CSM generator, generate mixing groups, annotate them.

    calibkit csm train-generator --data fmnist --steps 2000 --batch-size 64 --seed 0 --out DIR
    calibkit csm generate --generator DIR --groups 270 --seed 0 --out STORE [--steps 20 --guidance 3]
    torchrun --nproc_per_node 2 -m calibkit csm generate ...   (sharded; identical output)
    calibkit csm annotate STORE --encoder classifier --run RUN_DIR
    calibkit csm annotate STORE --encoder clip --clip-dir DIR --data fmnist

Wiring only: the work happens in ``calibkit.methods.csm``.
"""

from __future__ import annotations

import shlex

from calibkit.extras import require


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(","))
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None


def register(sub) -> None:
    p = sub.add_parser("csm", help="CSM: diffusion generator, semantic mixing groups, calibrated reannotation")
    csm = p.add_subparsers(dest="csm_command", metavar="STEP")

    t = csm.add_parser("train-generator", help="train the class-conditional EDM generator (resumable)")
    t.add_argument("--data", default="fmnist", help="data set name (calibkit.data.DATASETS)")
    t.add_argument("--data-dir", default=None)
    t.add_argument("--steps", type=int, default=2000, help="total optimiser steps (raise to continue)")
    t.add_argument("--batch-size", type=int, default=64)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--channels", type=_ints, default=(32, 64, 64), help="UNet widths, e.g. 32,64,64")
    t.add_argument("--p-uncond", type=float, default=0.1, help="class dropout for guidance")
    t.add_argument("--checkpoint-every", type=int, default=100)
    t.add_argument("--num-threads", type=int, default=None,
                   help="torch CPU threads (1 is fastest on a busy machine; default: torch's choice)")
    t.add_argument("--out", required=True, help="output directory (resumed if it holds a checkpoint)")
    t.set_defaults(func=_train_generator)

    g = csm.add_parser("generate", help="generate mixing groups into a store (torchrun-shardable, resumable)")
    g.add_argument("--generator", required=True, help="generator directory")
    g.add_argument("--groups", type=int, required=True, help="number of groups of 8 images")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--steps", type=int, default=20, help="Heun sampler steps")
    g.add_argument("--guidance", type=float, default=1.0, help="guidance weight w (1 = none)")
    g.add_argument("--groups-per-shard", type=int, default=16)
    g.add_argument("--num-threads", type=int, default=None, help="torch CPU threads per process")
    g.add_argument("--out", required=True, help="store directory")
    g.set_defaults(func=_generate)

    a = csm.add_parser("annotate", help="calibrated reannotation of a store's soft labels")
    a.add_argument("store", help="store directory written by `calibkit csm generate`")
    a.add_argument("--encoder", choices=("classifier", "clip"), default="classifier")
    a.add_argument("--run", default=None, help="run directory of the reference classifier (--encoder classifier)")
    a.add_argument("--clip-dir", default=None, help="local CLIPModel directory (--encoder clip)")
    a.add_argument("--data", default=None, help="data set of the prototypes (default: the run's)")
    a.add_argument("--data-dir", default=None)
    a.add_argument("--sharpness", type=float, default=4.0, help="s in sigmoid(s (lam_hat - 0.5))")
    a.set_defaults(func=_annotate)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _command_line(args) -> str:
    """The train-generator command that reproduces this run (all settings explicit)."""
    parts = ["calibkit", "csm", "train-generator", "--data", args.data, "--steps", str(args.steps),
             "--batch-size", str(args.batch_size), "--seed", str(args.seed), "--lr", str(args.lr),
             "--channels", ",".join(map(str, args.channels)), "--p-uncond", str(args.p_uncond),
             "--out", args.out]
    if args.data_dir:
        parts += ["--data-dir", args.data_dir]
    return " ".join(shlex.quote(p) for p in parts)


def _set_threads(n) -> None:
    if n is not None:
        if n < 1:
            raise ValueError(f"--num-threads must be >= 1, got {n}")
        import torch

        torch.set_num_threads(n)


def _train_generator(args) -> int:
    from calibkit.data import load
    from calibkit.methods.csm.generator import GeneratorConfig
    from calibkit.methods.csm.train_generator import GeneratorTrainConfig, train_generator

    require("diffusers", "training the CSM generator")  # before anything is written
    _set_threads(args.num_threads)
    bundle = load(args.data, data_dir=args.data_dir, seed=args.seed)
    size = bundle.image_size[0]
    # The UNet runs on the native size when the downsampling divides it (28 -> 14 -> 7 for three
    # levels, attention at 7x7); otherwise the images are padded with the background value up to
    # the next size it divides (e.g. 30 -> 32).
    factor = 2 ** (len(args.channels) - 1)
    image_size = -(-(size + 2) // factor) * factor if size % factor else size
    gen_cfg = GeneratorConfig(num_classes=bundle.num_classes, in_channels=bundle.in_channels,
                              data_size=size, image_size=image_size, block_out_channels=args.channels,
                              attention_levels=(False,) * (len(args.channels) - 1) + (True,))
    train_cfg = GeneratorTrainConfig(steps=args.steps, batch_size=args.batch_size, seed=args.seed,
                                     lr=args.lr, p_uncond=args.p_uncond)
    extra = {"data": args.data, "class_names": bundle.class_names, "split": bundle.split,
             "command": _command_line(args)}
    train_generator(bundle.train.images, bundle.train.labels, args.out, train_cfg, gen_cfg,
                    checkpoint_every=args.checkpoint_every, extra_meta=extra)
    print(f"generator written to {args.out}")
    return 0


def _generate(args) -> int:
    from calibkit.methods.csm.generate import generate_store

    require("diffusers", "generating a CSM set")  # before anything is written
    _set_threads(args.num_threads)
    generate_store(args.generator, args.out, num_groups=args.groups, seed=args.seed, steps=args.steps,
                   guidance=args.guidance, groups_per_shard=args.groups_per_shard, distributed="env")
    return 0


def _annotate(args) -> int:
    from calibkit.methods.csm.annotate import annotate_command

    if args.encoder == "clip":
        require("transformers", "the CLIP encoder")  # before anything is written
    annotate_command(args)
    return 0
