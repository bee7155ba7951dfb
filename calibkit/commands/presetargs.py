"""The preset options of ``calibkit bench`` and ``tune``: ``--preset NAME|FILE`` and the flags of
the common case on top of it (``calibkit.bench.overrides``), and the hidden ``--spec FILE`` with which
the processes a bench starts read the bench's spec file (:mod:`calibkit.pipeline.spec`)."""

from __future__ import annotations

import argparse

from calibkit.bench.grid import with_keep
from calibkit.commands import bounded as B


def add_preset_options(p, names) -> None:
    """``--preset`` and the flags that change it (wiring only)."""
    p.add_argument("--preset", default="default", metavar="NAME|FILE",
                   help=f"a shipped preset ({', '.join(names)}) or a preset TOML file (`calibkit preset show NAME` "
                   "prints one to start from; docs/own_data.md) (default: default)")
    g = p.add_argument_group("changes to the preset (the changed preset's name says so, e.g. default+epochs=5)")
    g.add_argument("--data", metavar="NAME", help="data set: a calibkit.data name, e.g. imagefolder or tensors "
                   "(with --data-dir the folder or the .npz/.safetensors file)")
    g.add_argument("--model", metavar="NAME", help="a calibkit.models name or your own 'package.module:factory' "
                   "(or 'file.py:factory')")
    g.add_argument("--epochs", type=B.EPOCHS, help="training epochs (explicit milestones scale with them)")
    g.add_argument("--lr", type=B.LR, help="learning rate")
    g.add_argument("--batch-size", type=B.BATCH, metavar="N", help="batch size")
    g.add_argument("--val-size", type=B.CountOrFraction(), metavar="N|F",
                   help="validation split: a count (5000) or a fraction (0.1) of the training set")
    g.add_argument("--train-subset", type=B.SUBSET, metavar="N", help="train on a stratified subset of N images")
    g.add_argument("--augment", action=argparse.BooleanOptionalAction, default=None,
                   help="random crop/flip as the data set allows")
    g.add_argument("--ood", metavar="SET", help="OOD set: digits, noise, none, a data set name, or a folder or "
                   ".npz/.safetensors file of your OOD inputs (default: the preset's; none for your own data)")
    g.add_argument("--name", help="name of the changed preset (default: the preset's name + what changed)")
    # a process a bench or tuning started: run the spec file its starter wrote (the other options are not read)
    p.add_argument("--spec", metavar="FILE", help=argparse.SUPPRESS)


def changes_from_args(args) -> dict:
    """The preset's changes ``args`` ask for, as :func:`calibkit.bench.overrides.with_flags`'s keywords."""
    return {"name": args.name, "dataset": args.data, "model": args.model, "epochs": args.epochs, "lr": args.lr,
            "batch_size": args.batch_size, "val_size": args.val_size, "train_subset": args.train_subset,
            "augment": args.augment, "ood": args.ood}


def spec_from_args(args, command: str, options):
    """The :class:`calibkit.pipeline.spec.BenchSpec` of a ``bench``/``tune`` command line: the file
    of ``--spec`` when given (a process a bench started), else ``--preset``, its changes, ``--out``
    and ``options`` (the command's options, built from ``args``, called only then)."""
    from calibkit.pipeline.spec import BenchSpec, read_spec  # noqa: PLC0415 (start-up: the parsers import this module)

    if args.spec is not None:
        return read_spec(args.spec, command)
    return BenchSpec(command, args.preset, args.out, options(), changes=changes_from_args(args))


def preset_from_args(args):
    """The preset ``args`` ask for: ``--preset`` (name or file), the flags on top, ``--keep``."""
    # start-up: the parsers of bench and tune import this module; these two load torch
    from calibkit.bench.overrides import with_flags  # noqa: PLC0415
    from calibkit.bench.presetfile import load_preset  # noqa: PLC0415

    return with_keep(with_flags(load_preset(args.preset), **changes_from_args(args)), args.keep)

