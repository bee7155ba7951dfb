"""Each subcommand's parser names the function that runs it (``calibkit.commands.Handler``); the
function exists, and it is looked up on its module when the command runs."""

import argparse
import importlib

import calibkit.commands.eval as eval_cmd
from calibkit.cli import build_parser
from calibkit.commands import Handler


def _leaves(parser: argparse.ArgumentParser, words=(), func=None):
    """``(argv words, func)`` of every innermost parser (subcommands and their steps), with the
    ``func`` it runs: its own default, or the nearest enclosing parser's."""
    func = parser.get_default("func") or func
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield words, func
        return
    for name, sub in subs[0].choices.items():
        yield from _leaves(sub, (*words, name), func)


def test_every_subcommand_runs_a_function_of_its_own_module():
    seen = []
    for words, func in _leaves(build_parser()):
        assert isinstance(func, Handler), words
        assert func.module == f"calibkit.commands.{words[0]}", words
        module = importlib.import_module(func.module)
        assert callable(getattr(module, func.name)), (words, func)
        seen.append(words)
    assert {("csm", "annotate"), ("preset", "show"), ("eval",)} <= set(seen)


def test_the_handler_reads_the_function_on_its_module_at_each_call(monkeypatch):
    handler = build_parser().parse_args(["eval", "some/run"]).func
    calls = []
    monkeypatch.setattr(eval_cmd, "run", lambda args: calls.append(args.run_dir) or 7)
    assert handler(argparse.Namespace(run_dir="some/run")) == 7
    assert calls == ["some/run"]
