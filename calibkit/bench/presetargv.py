"""The preset of a bench or tuning as command-line arguments, for the processes it starts.

The extra workers of ``--workers N`` (:mod:`calibkit.bench.workers`) and the tasks of
``--executor slurm`` (:mod:`calibkit.bench.slurm_plan`) run ``calibkit bench`` / ``tune`` again;
each must build the same preset as the process that started it. They are given the options it
was given (``--preset`` and the flags that change it, ``calibkit.commands.presetargs``), so each
rebuilds the preset exactly as the first process did (the same checks, the same name).
"""

from __future__ import annotations

import os

from calibkit.bench.grid import PRESETS

# The flags that change a preset (calibkit.commands.presetargs.add_preset_options) and the
# attributes of the parsed arguments that hold them; --augment is written on its own.
FLAGS = (("--data", "data"), ("--model", "model"), ("--epochs", "epochs"), ("--lr", "lr"),
         ("--batch-size", "batch_size"), ("--val-size", "val_size"), ("--train-subset", "train_subset"),
         ("--ood", "ood"), ("--name", "name"))


def preset_argv(args) -> list[str]:
    """``--preset`` and the given flags of ``args`` as command-line arguments.

    A preset file is given by its absolute path (a task may start in another directory); a float
    by its ``repr``, which reads back as the same number.
    """
    argv = ["--preset", args.preset if args.preset in PRESETS else os.path.abspath(args.preset)]
    for flag, attr in FLAGS:
        value = getattr(args, attr)
        if value is not None:
            argv += [flag, repr(value) if isinstance(value, float) else str(value)]
    if args.augment is not None:
        argv.append("--augment" if args.augment else "--no-augment")
    return argv
