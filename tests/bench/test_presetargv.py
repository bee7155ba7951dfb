"""``calibkit.bench.presetargv``: the preset options given back to the processes a bench starts."""

from __future__ import annotations

import argparse

from calibkit.bench.presetargv import FLAGS, preset_argv
from calibkit.bench.presetfile import load_preset, write_effective
from calibkit.cli import build_parser
from calibkit.commands.presetargs import add_preset_options, preset_from_args


def test_every_flag_that_changes_a_preset_is_given_back():
    parser = argparse.ArgumentParser()
    add_preset_options(parser, ["default"])
    options = {a.option_strings[0]: a.dest for a in parser._actions if a.option_strings and a.dest != "help"}
    written = dict(FLAGS) | {"--augment": "augment", "--preset": "preset"}
    assert written == options


def test_a_preset_file_with_every_flag_reads_back_as_the_same_preset(tmp_path, monkeypatch):
    write_effective(load_preset("smoke"), tmp_path)  # a preset file, given by a relative path
    monkeypatch.chdir(tmp_path)
    parser = build_parser()
    args = parser.parse_args(["bench", "--out", "o", "--preset", "presets/smoke.toml", "--data", "digits",
                              "--model", "mlp", "--epochs", "2", "--lr", "0.1", "--batch-size", "16",
                              "--val-size", "50", "--train-subset", "300", "--augment", "--ood", "noise",
                              "--name", "mine"])
    mine, argv = preset_from_args(args), preset_argv(args)
    assert argv[:2] == ["--preset", str(tmp_path / "presets" / "smoke.toml")]
    assert argv[2:] == ["--data", "digits", "--model", "mlp", "--epochs", "2", "--lr", "0.1", "--batch-size", "16",
                        "--val-size", "50", "--train-subset", "300", "--ood", "noise", "--name", "mine", "--augment"]
    monkeypatch.chdir("/")  # a task may start elsewhere
    again = parser.parse_args(["bench", "--out", "o", *argv])
    assert preset_from_args(again) == mine
    assert mine.name == "mine" and (mine.train["lr"], mine.train["batch_size"], mine.model) == (0.1, 16, "mlp")


def test_an_unchanged_shipped_preset_is_its_name_alone():
    args = build_parser().parse_args(["bench", "--out", "o", "--preset", "smoke", "--no-augment", "--lr", "1e-3"])
    assert preset_argv(args) == ["--preset", "smoke", "--lr", "0.001", "--no-augment"]
