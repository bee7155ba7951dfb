"""The subcommands of the ``calibkit`` command line (one module each; see ``calibkit.cli``)."""

from __future__ import annotations

import argparse
import importlib

from calibkit.commands import bounded as B
from calibkit.errors import UserError


class Handler:
    """A subcommand's ``func``: the function ``name`` of the module that runs the command, imported
    when the command runs, never when its parser is built (``calibkit/commands/parsers/``), so that
    ``--help`` loads no torch. The function is looked up at each call, on its module."""

    def __init__(self, module: str, name: str = "run") -> None:
        self.module, self.name = module, name

    def __call__(self, args):
        return getattr(importlib.import_module(self.module), self.name)(args)

    def __repr__(self) -> str:
        return f"Handler({self.module!r}, {self.name!r})"


def add_num_threads(parser, default: str = "torch's") -> None:
    """Declare ``--num-threads N`` on a subcommand's parser (``calibkit.cli.main`` applies it when
    given; ``default`` says what the command uses without it)."""
    parser.add_argument("--num-threads", type=B.THREADS, metavar="N",
                        help=f"torch CPU threads (default: {default}; one is often fastest on a shared machine)")


def check_paths_given(**paths) -> None:
    """Refuse an empty (or all-blank) path option: ``Path("")`` is ``.``, so an empty ``--out`` would
    write into the working directory and an empty input would read it as a folder.

    ``paths`` maps an option's flag, written with underscores (``out``, ``val``), to its value;
    ``None`` (an option not given) passes.

    Raises:
        ValueError: naming the first empty option, e.g. ``--out: empty path``.
    """
    for name, value in paths.items():
        if value is not None and not str(value).strip():
            flag = "--" + name.replace("_", "-")
            raise UserError(f"{flag}: empty path {value!r}; give a file or folder name")


def apply_num_threads(args) -> None:
    """``torch.set_num_threads(args.num_threads)`` when the command declared and was given it.

    Raises:
        ValueError: a thread count below 1.
    """
    threads = getattr(args, "num_threads", None)
    if threads is None:
        return
    if threads < 1:
        raise UserError(f"--num-threads must be >= 1, got {threads}")
    import torch  # noqa: PLC0415 (start-up: the parsers import this module; --num-threads only)

    torch.set_num_threads(threads)


def add_executor(parser) -> None:
    """Declare where the runs execute (``--executor``) and the SLURM options of ``bench`` and ``tune``,
    plus the hidden options of one scheduled task (``--run-key``)."""
    g = parser.add_argument_group("executing on a SLURM cluster (docs/cluster.md)")
    g.add_argument("--executor", choices=("local", "slurm"), default="local",
                   help="local: run here (default); slurm: write sbatch array scripts to OUT/slurm/ and submit them")
    g.add_argument("--dry-run", action="store_true", help="with --executor slurm: write the scripts and print the "
                   "sbatch commands, submit nothing")
    g.add_argument("--partition", help="sbatch --partition")
    g.add_argument("--account", help="sbatch --account")
    g.add_argument("--qos", help="sbatch --qos")
    g.add_argument("--time", help="sbatch --time of every task (e.g. 12:00:00)")
    g.add_argument("--gpus-per-run", type=B.integer(0, 1024), default=0, metavar="N",
                   help="GPUs per run (default 0); N > 1 runs torchrun --standalone --nproc_per_node N in the task")
    g.add_argument("--cpus-per-run", type=B.count(100_000), default=1, metavar="N",
                   help="sbatch --cpus-per-task (default 1)")
    g.add_argument("--mem", help="sbatch --mem of every task (e.g. 32G)")
    g.add_argument("--array-parallelism", type=B.count(10**6), metavar="N",
                   help="at most N tasks of an array at once (%%N)")
    g.add_argument("--sbatch-arg", action="append", metavar="ARG",
                   help="one more sbatch option, passed through (repeatable), e.g. --sbatch-arg=--constraint=a100")
    g.add_argument("--requeue", action="store_true", help="sbatch --requeue: a preempted task runs again")
    g.add_argument("--signal", type=B.count(65535), metavar="S", help="SIGUSR1 S seconds before the time limit "
                   "(--signal=B:USR1@S): the run checkpoints after its epoch, requeues its task and exits")
    g.add_argument("--status", action="store_true", help="print each run key's state (done, queued, running, "
                   "failed, not submitted) from the result files and squeue")
    g.add_argument("--collect", action="store_true", help="import the runs' result files into OUT/runs.db "
                   "(idempotent), then report")
    # one task of a scheduler: run exactly this key, write its result file, never open runs.db
    parser.add_argument("--run-key", help=argparse.SUPPRESS)
