"""The ``calibkit`` command line: wiring only.

Each subcommand has two modules: its parser, ``calibkit/commands/parsers/<name>.py``, whose
``register(subparsers)`` adds the options and help and sets ``func`` to a
:class:`calibkit.commands.Handler`, and the module that runs it, ``calibkit/commands/<name>.py``,
which imports what it needs (torch included) at its top. The parsers import only light modules, so
``calibkit --help`` and every ``calibkit CMD --help`` load no torch; the ``Handler`` imports the
command's module when the command runs, the one place the command line defers an import.

Every command that computes takes ``--num-threads N``; :func:`main` applies it
(``torch.set_num_threads``) before the command runs, so a command only declares the option
(``calibkit.commands.add_num_threads``). On a shared machine one thread per process is often the fastest.

Failures a user can meet (bad input, i.e. a :class:`calibkit.errors.UserError`, missing files, a
missing extra, a read-only or full disk, a database that cannot be opened, Ctrl-C, ``kill``) end in
one line on stderr, ``calibkit CMD: error: ...``, never a traceback; the ones that can strike
mid-way also say what was kept and how to continue (:data:`KEPT`); so does a GPU that ran out of
memory. Any other exception is a bug in calibkit: its full traceback is printed (passwords masked),
then one line asking for a report (:data:`BUG`), and the exit status is 1. Exit status: 1 for an
error, 130 for Ctrl-C (SIGINT) and 143 for SIGTERM (128 + the signal number, as a shell reports a
process that a signal ended). SIGTERM is turned into
:class:`Terminated`, a ``KeyboardInterrupt``, so every clean-up written for Ctrl-C (a run marked
interrupted in ``runs.db``, the extra bench workers stopped, temporary files removed) runs for it too.
Warnings are printed as one line, ``calibkit CMD: warning: ...``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sqlite3
import sys
import traceback
import warnings

from calibkit import __version__
from calibkit.commands import apply_num_threads
from calibkit.commands.typos import Typo, check_argv
from calibkit.errors import UserError
from calibkit.extras import MissingExtra

BUG = "this is a bug in calibkit: please report it with the traceback above"

# name -> its parser's module; one literal table, so the list of subcommands is visible at a glance.
COMMANDS = {
    "train": "calibkit.commands.parsers.train",
    "eval": "calibkit.commands.parsers.eval",
    "plot": "calibkit.commands.parsers.plot",
    "bench": "calibkit.commands.parsers.bench",
    "tune": "calibkit.commands.parsers.tune",
    "report": "calibkit.commands.parsers.report",
    "compare": "calibkit.commands.parsers.compare",
    "csm": "calibkit.commands.parsers.csm",
    "maccal": "calibkit.commands.parsers.maccal",
    "calibrate": "calibkit.commands.parsers.calibrate",
    "apply": "calibkit.commands.parsers.apply",
    "preset": "calibkit.commands.parsers.preset",
}


# What an interrupted or failed command keeps and how to continue it: (the file whose presence in
# its output directory means something was kept, what to say then). {out}: the output directory;
# {db}: where the records are (OUT/runs.db, or the --store URL without its password).
KEPT = {
    "train": ("config.json", "every epoch completed up to the last checkpoint is kept; run the same command "
              "again to resume {out}"),
    "bench": ("runs.db", "finished runs are kept in {db}; run the same command again to continue "
              "(it skips them)"),
    "tune": ("runs.db", "finished candidates are kept in {db}; run the same command again to continue "
             "(it skips them)"),
    "report": ("runs.db", "the runs and {db} are untouched; run the same command again to rebuild the report"),
}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that the clean-up of an interrupt runs (exit 143)."""


def _on_sigterm(signum, frame):
    raise Terminated()


def _kept(args, interrupted: bool = False) -> str:
    """What was kept and how to continue (:data:`KEPT`); "nothing written" when the marker is absent."""
    out = getattr(args, "out", None) or getattr(args, "dir", None)
    if args.command not in KEPT or not out:
        return "run the same command again once the cause is fixed"
    if getattr(args, "run_key", None):  # a scheduler's task: what it keeps lies in its own run directory
        from calibkit.bench.results import task_kept  # noqa: PLC0415 (start-up: loads torch; scheduled tasks only)

        return task_kept(out, args.run_key)
    marker, kept = KEPT[args.command]
    store = getattr(args, "store", None)
    if store is not None and marker == "runs.db":  # the records are on a server: OUT need hold none
        return kept.format(out=out, db=_store().describe_store(out, store))
    if os.path.exists(os.path.join(out, marker)):
        return kept.format(out=out, db=os.path.join(out, marker))
    if interrupted:
        return f"nothing was written to {out} yet"
    return f"nothing was written to {out}; run the same command again once the cause is fixed"


def _store():
    """:mod:`calibkit.store`, imported on first use: it loads sqlite3, json, logging and socket, which
    ``--help`` and ``--version`` do not need."""
    import calibkit.store.secrets  # noqa: PLC0415 (start-up: tens of ms that --help would pay)

    return calibkit.store


def _os_error(exc: OSError) -> str:
    """``Permission denied: '/x/config.json'`` rather than ``[Errno 13] Permission denied: ...``."""
    if exc.strerror and exc.filename:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc) or type(exc).__name__


def _driver_line(exc: Exception, store: str | None) -> str:
    """The first line of a database driver's error, with the store's passwords masked."""
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return _store().secrets.scrub(line, store) if store else line


def _one_line_warning(message, category, filename, lineno, file=None, line=None, *, command="calibkit"):
    print(f"calibkit {command}: warning: {message}", file=file or sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="calibkit",
        description="Train, calibrate, evaluate and compare calibrated classifiers.",
    )
    parser.add_argument("--version", action="version", version=f"calibkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS.values():
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        check_argv(parser, sys.argv[1:] if argv is None else list(argv))
    except Typo as exc:  # before argparse, which would report a missing required option first
        print(f"{exc.prog}: error: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    def error(msg) -> None:
        print(f"calibkit {args.command}: error: {_store().secrets.redact(str(msg))}", file=sys.stderr, flush=True)

    handlers = _install_handlers(args.command)
    try:
        if getattr(args, "store", None):  # --store env:NAME: the URL from the environment (docs/store.md)
            args.store = _store().resolve_store(args.store)
        apply_num_threads(args)
        rc = args.func(args)
        sys.stdout.flush()  # a closed pipe shows up here at the latest, not at interpreter exit
    except BrokenPipeError:
        return _closed_pipe()
    except Terminated:
        error(f"terminated (SIGTERM); {_kept(args, interrupted=True)}")
        return 143
    except KeyboardInterrupt:
        print(file=sys.stderr)  # after the ^C the terminal echoed
        error(f"interrupted; {_kept(args, interrupted=True)}")
        return 130
    except (UserError, FileNotFoundError, FileExistsError, NotADirectoryError, MissingExtra) as exc:
        # What the user can fix (bad input, missing files or extras): one line, no traceback.
        error(exc)
        return 1
    except sqlite3.Error as exc:  # a database that cannot be opened, written (read-only) or read
        error(f"results database: {exc}; {_kept(args)}")
        return 1
    except OSError as exc:  # permissions, a read-only or full file system, ...
        error(f"{_os_error(exc)}; {_kept(args)}")
        return 1
    except Exception as exc:
        if type(exc).__module__.startswith("psycopg"):
            # The PostgreSQL driver's own error, past the store's retries (calibkit.store.postgres)
            error(f"results database: {_driver_line(exc, getattr(args, 'store', None))}; {_kept(args)}")
        elif _out_of_memory(exc):  # the GPU's memory, not a bug: a smaller batch or model fits
            error(exc)
        else:  # anything else is a bug in calibkit (calibkit.errors): show where it happened
            _print_bug(exc)
            error(BUG)
        return 1
    finally:
        _restore_handlers(handlers)
    return int(rc or 0)


def _out_of_memory(exc: Exception) -> bool:
    """torch's ``OutOfMemoryError`` (the GPU ran out of memory), told by name so that the
    command line need not import torch."""
    return type(exc).__name__ == "OutOfMemoryError" and type(exc).__module__.startswith("torch")


def _print_bug(exc: BaseException) -> None:
    """The full traceback of an unexpected exception on stderr, with any password masked."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    print(_store().secrets.redact(text).rstrip("\n"), file=sys.stderr, flush=True)


def _install_handlers(command: str):
    """SIGTERM -> :class:`Terminated`, warnings -> one line; returns what to restore."""
    previous = None
    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread (main() called from a thread): leave SIGTERM alone
        pass
    shown = warnings.showwarning
    warnings.showwarning = lambda *a, **k: _one_line_warning(*a, **k, command=command)
    return previous, shown


def _restore_handlers(handlers) -> None:
    previous, shown = handlers
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)
    warnings.showwarning = shown


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
