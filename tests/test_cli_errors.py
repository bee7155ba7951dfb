"""``calibkit.cli.main``: what the user can fix ends in one line; anything else is a bug and shows
its traceback (``calibkit.errors``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calibkit import errors
from calibkit.cli import BUG, main
from calibkit.commands import calibrate
from calibkit.errors import UserError, UserFileNotFoundError, UserKeyError, UserRuntimeError, shown_name
from calibkit.store.common import StoreError

BUG_LINE = "calibkit calibrate: error: this is a bug in calibkit: please report it with the traceback above"


def _scores(path, n=30, k=3, nan=False):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(n, k)).astype(np.float32)
    if nan:
        logits[4, 1] = np.nan
    np.savez(path, logits=logits, labels=(np.arange(n) % k).astype(np.int64))
    return str(path)


@pytest.fixture
def argv(tmp_path):
    """A ``calibrate`` command line on valid files, up to where the command reads them."""
    return ["calibrate", "--val", _scores(tmp_path / "val.npz"), "--test", _scores(tmp_path / "test.npz"),
            "--out", str(tmp_path / "out"), "--n-boot", "10", "--num-threads", "1"]


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("exc", [RuntimeError("shape mismatch"), IndexError("index 3 is out of bounds"),
                                 KeyError("temperature"), ValueError("a plain ValueError inside calibkit")])
def test_an_unexpected_exception_in_a_command_prints_its_traceback_and_the_bug_line(monkeypatch, argv, capsys,
                                                                                     exc):
    def broken(path, require_labels=True, **keys):
        raise exc

    monkeypatch.setattr(calibrate, "read_scores", broken)
    assert main(argv) == 1
    err = _lines(capsys.readouterr().err)
    assert err[0] == "Traceback (most recent call last):"
    assert any("in broken" in line for line in err)  # the frame where it happened
    assert err[-2] == f"{type(exc).__name__}: {exc}"
    assert err[-1] == BUG_LINE
    assert BUG_LINE.endswith(BUG)


def test_a_bug_traceback_masks_passwords(monkeypatch, argv, capsys):
    def broken(path, require_labels=True, **keys):
        raise RuntimeError("lost postgresql://calib:s3cretPW@db.example/bench")

    monkeypatch.setattr(calibrate, "read_scores", broken)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "s3cretPW" not in err
    assert "postgresql://calib:***@db.example/bench" in err
    assert _lines(err)[-1] == BUG_LINE


def test_a_bad_input_is_exactly_one_line_without_a_traceback(tmp_path, capsys):
    val = _scores(tmp_path / "bad.npz", nan=True)
    rc = main(["calibrate", "--val", val, "--test", _scores(tmp_path / "test.npz"), "--out", str(tmp_path / "o"),
               "--num-threads", "1"])
    captured = capsys.readouterr()
    assert rc == 1
    assert captured.err.splitlines() == [f"calibkit calibrate: error: {val}: 'logits' contains 1 NaN or infinite "
                                         "value(s)"]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("exc, line", [(UserError("--lr must be > 0"), "--lr must be > 0"),
                                       (UserKeyError("no finished run 'x'"), "no finished run 'x'"),
                                       (UserRuntimeError("loss is nan at epoch 2"), "loss is nan at epoch 2"),
                                       (StoreError("runs.db is not an SQLite database"),
                                        "runs.db is not an SQLite database")])
def test_every_user_error_class_is_one_line(monkeypatch, argv, capsys, exc, line):
    def refuse(path, require_labels=True, **keys):
        raise exc

    monkeypatch.setattr(calibrate, "read_scores", refuse)
    assert main(argv) == 1
    assert capsys.readouterr().err.splitlines() == [f"calibkit calibrate: error: {line}"]


def test_a_gpu_out_of_memory_is_one_line(monkeypatch, argv, capsys):
    def full(path, require_labels=True, **keys):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(calibrate, "read_scores", full)
    assert main(argv) == 1
    assert capsys.readouterr().err.splitlines() == [
        "calibkit calibrate: error: CUDA out of memory. Tried to allocate 2.00 GiB"]


def test_the_user_error_classes_keep_the_classes_callers_catch():
    assert issubclass(UserError, ValueError)
    assert issubclass(UserKeyError, KeyError) and issubclass(UserKeyError, UserError)
    assert issubclass(UserRuntimeError, RuntimeError) and issubclass(UserRuntimeError, UserError)
    assert str(UserKeyError("no run 'a'")) == "no run 'a'"  # not KeyError's quoted "\"no run 'a'\""
    assert str(KeyError("no run 'a'")) == "\"no run 'a'\""


def test_shown_name_is_the_builtin_class_a_user_error_stands_for():
    assert [shown_name(e("x")) for e in (UserError, UserKeyError, UserRuntimeError, UserFileNotFoundError)] == \
        ["ValueError", "KeyError", "RuntimeError", "FileNotFoundError"]
    assert shown_name(StoreError("x")) == "StoreError"
    assert shown_name(IndexError("x")) == "IndexError"
    assert set(errors.__all__) == {"UserError", "UserKeyError", "UserRuntimeError", "UserFileNotFoundError",
                                   "shown_name"}
