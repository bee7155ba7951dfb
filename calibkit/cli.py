"""The ``calibkit`` command line: wiring only.

Each subcommand lives in ``calibkit/commands/<name>.py`` and defines
``register(subparsers)``, which adds its parser and sets ``func`` (called with the parsed
arguments). Heavy imports happen inside ``func`` so that ``calibkit --help`` stays fast.

Every command that computes takes ``--num-threads N``; :func:`main` applies it
(``torch.set_num_threads``) before the command runs, so a command only declares the option
(``calibkit.commands.add_num_threads``). On a shared machine one thread per process is often the fastest.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from calibkit import __version__
from calibkit.commands import apply_num_threads
from calibkit.extras import MissingExtra

# name -> module; one literal table, so the list of subcommands is visible at a glance.
COMMANDS = {
    "train": "calibkit.commands.train",
    "eval": "calibkit.commands.eval",
    "plot": "calibkit.commands.plot",
    "bench": "calibkit.commands.bench",
    "tune": "calibkit.commands.tune",
    "report": "calibkit.commands.report",
    "csm": "calibkit.commands.csm",
    "maccal": "calibkit.commands.maccal",
    "calibrate": "calibkit.commands.calibrate",
    "apply": "calibkit.commands.apply",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="calibkit",
        description="Train, calibrate, evaluate and compare calibrated classifiers.",
    )
    parser.add_argument("--version", action="version", version=f"calibkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        apply_num_threads(args)
        rc = args.func(args)
        sys.stdout.flush()  # a closed pipe shows up here at the latest, not at interpreter exit
    except BrokenPipeError:
        return _closed_pipe()
    except (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, KeyError, RuntimeError,
            MissingExtra) as exc:
        # Expected user-facing failures (bad input, missing files or extras): one line, no traceback.
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"calibkit {args.command}: error: {msg}", file=sys.stderr)
        return 1
    return int(rc or 0)


def _closed_pipe() -> int:
    """The reader of stdout went away (``calibkit eval RUN | head``): stop quietly, like other tools.

    Python would otherwise report the failed flush of the remaining output at exit; pointing
    stdout at /dev/null discards it. The exit status is the shell's for a process ended by SIGPIPE.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (e.g. captured in tests)
        pass
    return 141


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
