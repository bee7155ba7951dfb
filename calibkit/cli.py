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
import sys

from calibkit.commands import apply_num_threads

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
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="calibkit",
        description="Train, calibrate, evaluate and compare calibrated classifiers.",
    )
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
    except (ValueError, FileNotFoundError, KeyError, RuntimeError) as exc:
        # Expected user-facing failures: one line, no traceback.
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"calibkit {args.command}: error: {msg}", file=sys.stderr)
        return 1
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
