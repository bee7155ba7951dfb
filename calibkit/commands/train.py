"""``calibkit train``: train one model into a run directory (resumes an unfinished one)."""

from __future__ import annotations

import calibkit.train
from calibkit.commands.maccal import train_command
from calibkit.data import check_dataset
from calibkit.errors import UserError
from calibkit.train import load_config

# argparse destination -> TrainConfig field (identical names by construction)
FIELDS = ("data", "data_dir", "model", "loss", "method", "mix_alpha", "csm_data", "csm_weight", "csm_per_real",
          "csm_loss", "epochs", "batch_size", "lr", "optimizer", "momentum", "weight_decay", "schedule", "milestones",
          "gamma", "grad_clip", "amp", "seed", "val_size", "train_subset", "augment", "keep", "eval_batch_size",
          "device", "num_threads", "compile", "channels_last", "checkpoint_every", "finetune", "backbone_lr_scale")


def run(args) -> int:
    two_stage = args.method == "maccal"
    if args.maccal is not None and not two_stage:
        raise UserError("--maccal is only used with --method maccal")
    values = {name: getattr(args, name) for name in FIELDS}
    cfg = load_config(args.config, **{**values, "method": "standard" if two_stage else args.method})
    check_dataset(cfg.data)  # a missing extra package is named before anything is written
    # Ctrl-C, SIGTERM and file-system failures: one line saying how to resume (calibkit.cli.KEPT).
    if two_stage:
        return train_command(cfg, args)
    calibkit.train.train(cfg, args.out, progress=not (args.no_progress or args.quiet), verbose=not args.quiet)
    return 0
