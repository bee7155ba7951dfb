"""Misspelt subcommands and options on the command line: one line naming the nearest valid one.

argparse answers ``calibkit calibarte`` with a bare "invalid choice" and checks the required
options before it reports unknown ones, so ``calibkit calibrate --valid x`` would say that
``--val`` is required without saying that ``--valid`` is unknown. :func:`check_argv` looks at the
command line first, with the parser's own tables, and refuses the first unknown subcommand or
option with the nearest valid name (:func:`calibkit.suggest.closest`, the rule of the preset
names), or the list of valid ones when none is close.

What counts as known follows argparse: an option string of the (sub)command, ``--name=value``, or
a prefix of one or more options (argparse itself resolves a prefix and reports an ambiguous one).
A misspelt subcommand gets the same answer. Only ``--long`` tokens are checked; a ``--`` ends the
options. A token that is an option's value and starts with ``--`` is read as an option, as argparse reads it,
except one holding a space, which argparse takes as a value (``--sbatch-arg "--constraint=a b"``).
"""

from __future__ import annotations

import argparse

from calibkit.suggest import closest


class Typo(Exception):
    """An unknown subcommand or option: ``prog`` (``calibkit``, ``calibkit calibrate``) and the line."""

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


def _subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:  # argparse keeps no public table of a parser's subcommands
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(s for s in parser._option_string_actions if s.startswith("--"))


def check_argv(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """Raise :class:`Typo` for the first unknown subcommand or ``--option`` of ``argv``."""
    current, prog = parser, parser.prog
    sub = _subparsers(current)
    for token in argv:
        if token == "--":
            return
        if token.startswith("--") and len(token) > 2 and " " not in token:
            flag = token.split("=", 1)[0]
            valid = _options(current)
            if not any(v.startswith(flag) for v in valid):
                near = closest(flag, valid)
                hint = f"; did you mean {near}?" if near else ""
                raise Typo(prog, f"unknown option {flag}{hint} (`{prog} --help` lists the options)")
            continue
        if token.startswith("-") or sub is None:
            continue
        if token in sub.choices:
            current = sub.choices[token]
            prog, sub = f"{prog} {token}", _subparsers(current)
            continue
        if _takes_value(current, argv, token):
            continue
        near = closest(token, sub.choices)
        hint = f"did you mean {near}?" if near else f"valid: {', '.join(sub.choices)}"
        what = "command" if current is parser else "action"
        raise Typo(prog, f"unknown {what} {token!r}; {hint} (`{prog} --help` lists them)")


def _takes_value(parser, argv, token) -> bool:
    """Whether ``token`` follows an option of ``parser`` that takes a value (then it is that value)."""
    i = argv.index(token)
    if i == 0:
        return False
    action = parser._option_string_actions.get(argv[i - 1])
    return action is not None and action.nargs != 0
