"""Every numeric option of the command line is bounded: the test walks calibkit's real argparse
parser (every subcommand, every action) and feeds each option that takes a number values out of
its range. Each must end in argparse's usage and one error line naming the option (exit 2), never
a traceback or the bug line, and nothing may be written to ``--out``.

The bounds themselves are checked against the rules they stand for: the seeds' 64-bit limit and
the bootstrap's minimum number of resamples, the training config's own checks (every bound's end
is a valid config value), and every option's default lies inside its bounds.
"""

from __future__ import annotations

import argparse
import math

import pytest

from calibkit.cli import BUG, build_parser, main
from calibkit.commands import bounded as B

NUMERIC_KINDS = (B.Bounded, B.CountOrFraction, B.IntList)


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, (*path, name))
        elif action.type is not None:
            yield path, parser, action


TYPED = [(path, parser, action) for path, parser, action in _walk(build_parser())]
IDS = [" ".join(path) + " " + (action.option_strings or [action.dest])[0] for path, _, action in TYPED]


def _item(kind) -> B.Bounded:
    """The bounded number behind a type (a list's items; a count-or-fraction's count)."""
    return kind.item if isinstance(kind, B.IntList) else kind.count if isinstance(kind, B.CountOrFraction) else kind


def _bad_values(kind) -> list[str]:
    """Values that must be refused: negative, NaN, infinities, overflowing, not a number, empty, just
    past the top, and zero where the bound leaves it out."""
    item = _item(kind)
    top = item.high * 10 if item.kind is float else item.high + 1
    bad = ["-1", "-0.5", "nan", "inf", "-inf", "1e400", "9" * 40, "abc", "1,5x", str(top)]
    if not isinstance(kind, B.IntList):
        bad.append("")  # an empty list is a value of its own (--milestones "": no drop)
    if isinstance(kind, B.CountOrFraction) or not item.inside(0):
        bad.append("0")
    if isinstance(kind, B.IntList):
        bad = [f"{item.low},{v}" for v in bad]  # one bad item among good ones
    return bad


def test_the_walk_finds_every_command_and_the_known_numeric_options():
    commands = {path[0] for path, _, _ in TYPED}
    assert {"train", "eval", "plot", "bench", "tune", "report", "compare", "csm", "maccal", "calibrate",
            "apply"} <= commands  # every command that takes a number (``preset`` takes none)
    assert len(TYPED) > 90


@pytest.mark.parametrize("path,parser,action", TYPED, ids=IDS)
def test_every_typed_option_is_a_bounded_number(path, parser, action):
    assert isinstance(action.type, NUMERIC_KINDS), f"{IDS[TYPED.index((path, parser, action))]}: use a " \
        "calibkit.commands.bounded type, not a bare int or float"
    item = _item(action.type)
    assert item.low >= 0 and math.isfinite(item.high)  # so that -1 and a huge value are always refused
    if action.default is not None:  # the default passes its own type (the bounds are not too tight)
        text = ",".join(map(str, action.default)) if isinstance(action.default, (list, tuple)) else str(action.default)
        parsed = action.type(text)
        assert parsed == (list(action.default) if isinstance(action.default, list) else action.default)


@pytest.mark.parametrize("path,parser,action", TYPED, ids=IDS)
def test_out_of_range_values_end_in_one_argparse_line(path, parser, action, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    flag = action.option_strings[0]
    has_out = "--out" in parser._option_string_actions
    for value in _bad_values(action.type):
        argv = [*path, *(["--out", str(tmp_path / "out")] if has_out else []), f"{flag}={value}"]
        with pytest.raises(SystemExit) as exc:
            main(argv)
        out, err = capsys.readouterr()
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert exc.value.code == 2, (argv, err)
        head = f"calibkit {' '.join(path)}: error: argument {flag}: "
        assert lines[-1].startswith((head + "must be ", head + "every value must be ")), (argv, err)
        assert repr(value) in lines[-1] or repr(value.split(",")[-1]) in lines[-1], (argv, lines[-1])
        assert lines[0].startswith("usage:") and all(ln.startswith(" ") for ln in lines[1:-1]), err
        assert "Traceback" not in err + out and BUG not in err + out
        assert list(tmp_path.iterdir()) == [], argv  # nothing written, --out included


@pytest.mark.parametrize("kind", [B.integer(2, 9), B.count(50), B.number(0.0, 1.0, low_open=True), B.fraction(),
                                  B.number(0.5, 100.0)])
def test_a_bounded_type_accepts_its_closed_ends_and_refuses_its_open_ones(kind):
    for end, is_open in ((kind.low, kind.low_open), (kind.high, kind.high_open)):
        if is_open:
            with pytest.raises(argparse.ArgumentTypeError, match=r"^must be (an integer|a number) in [\[(]"):
                kind(str(end))
        else:
            assert kind(str(end)) == end and type(kind(str(end))) is kind.kind
    inner = (kind.low + kind.high) / 2
    assert kind(str(int(inner) if kind.kind is int else inner)) == (int(inner) if kind.kind is int else inner)


def test_count_or_fraction_and_int_lists():
    val = B.CountOrFraction(1000)
    assert val("5") == 5 and type(val("5")) is int and val("0.25") == 0.25 and val("1000") == 1000
    for bad in ("0", "1.0", "1001", "nan", "-0.1"):
        with pytest.raises(argparse.ArgumentTypeError, match="image count in \\[1, 1000\\]"):
            val(bad)
    assert B.IntList(B.count(9))("1, 2 3") == [1, 2, 3]
    assert B.IntList(B.count(9), tuple_=True)("4,5") == (4, 5)
    assert B.IntList(B.count(9), empty=True)("") == []
    with pytest.raises(argparse.ArgumentTypeError, match="expected comma-separated integers"):
        B.IntList(B.count(9))(" ")


def test_shared_bounds_agree_with_the_rules_they_stand_for():
    from calibkit.bench.presetcheck import MAX_SEED
    from calibkit.bootstrap import MIN_RESAMPLES

    assert B.N_BOOT.low == MIN_RESAMPLES and B.SEED.low == 0 and B.SEED.high == MAX_SEED == B.MAX_SEED


def _train_options():
    from calibkit.commands.train import FIELDS

    parser = build_parser()._subparsers._group_actions[0].choices["train"]
    for action in parser._actions:
        if isinstance(action.type, B.Bounded) and action.dest in FIELDS:
            yield action


@pytest.mark.parametrize("action", list(_train_options()), ids=lambda a: a.option_strings[0])
def test_every_train_bound_end_is_a_valid_config_value(action):
    """What the command line lets through, the training config accepts: each closed end, and a value
    just inside each open end (the config is the rule the Python API keeps)."""
    from calibkit.config import TrainConfig

    kind = action.type
    tiny = 1e-9 if kind.kind is float else 1
    for end, is_open, step in ((kind.low, kind.low_open, tiny), (kind.high, kind.high_open, -tiny)):
        value = kind.kind(end + step if is_open else end)
        try:
            TrainConfig(**{action.dest: value}).validate()
        except ValueError as exc:
            assert not str(exc).startswith(action.dest + ":"), (action.dest, value, str(exc))
