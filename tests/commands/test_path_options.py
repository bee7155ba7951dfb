"""File and folder inputs of every command, missing or corrupt: one error line (exit 1) naming the
file, no traceback, and nothing written (the working folder and ``--out`` stay as they were)."""

from __future__ import annotations

import hashlib
import os

import pytest

from calibkit.cli import BUG, main

JUNK = bytes(range(256)) * 2  # not UTF-8, not a zip archive, not SQLite, not JSON

# argv (``{junk}`` a corrupt file of that name, ``junkdir`` a folder whose files are corrupt), the
# file the message must name, and words of its next step (empty: the file's name is all it gives)
CASES = [
    (["calibrate", "--val", "gone.npz", "--test", "gone2.npz", "--out", "o"], "gone.npz", ""),
    (["calibrate", "--val", "junk.npz", "--test", "junk.npz", "--out", "o"], "junk.npz", ""),
    (["calibrate", "--from", "gone.npz", "--out", "o"], "gone.npz", ""),
    (["calibrate", "--run", "gone", "--out", "o"], "gone", "give a calibkit run directory"),
    (["apply", "--calibrator", "gone", "--input", "junk.npz", "--out", "a.npz"], "gone.json", "calibrate --save"),
    (["eval", "gone"], "gone", "calibkit train --out"),
    (["eval", "junkdir"], "junkdir/config.json", ""),
    (["plot", "gone", "--out", "p"], "gone", "calibkit train --out"),
    (["report", "gone"], "gone/runs.db", "bench output directory"),
    (["report", "junkdir"], "junkdir/runs.db", "move it away"),
    (["compare", "gone", "a", "b"], "gone/runs.db", "bench output directory"),
    (["compare", "junkdir", "a", "b"], "junkdir/runs.db", "move it away"),
    (["bench", "--preset", "gone.toml", "--out", "b"], "gone.toml", "give an existing preset TOML file"),
    (["bench", "--preset", "junk.toml", "--out", "b"], "junk.toml", ""),
    (["preset", "check", "gone.toml"], "gone.toml", "give an existing preset TOML file"),
    (["preset", "check", "junk.toml"], "junk.toml", ""),
    (["train", "--config", "gone.toml", "--out", "r"], "gone.toml", "a TOML file, or one of"),
    (["train", "--config", "junk.toml", "--out", "r"], "junk.toml", ""),
    (["maccal", "gone", "--out", "m"], "gone", "calibkit train --out"),
    (["maccal", "junkdir", "--out", "m"], "junkdir/config.json", ""),
    (["csm", "generate", "--generator", "gone", "--groups", "1", "--out", "s"], "gone", "csm train-generator"),
    (["csm", "generate", "--generator", "junkdir", "--groups", "1", "--out", "s"], "junkdir", "csm train-generator"),
    (["csm", "annotate", "gone", "--run", "gone"], "gone", "calibkit train --out"),
    (["bench", "--preset", "smoke", "--data", "tensors", "--data-dir", "gone.npz", "--out", "b"], "gone.npz", ""),
    (["bench", "--preset", "smoke", "--data", "tensors", "--data-dir", "junk.npz", "--out", "b"], "junk.npz", ""),
    (["bench", "--preset", "smoke", "--ood", "gone.npz", "--out", "b"], "gone.npz", "an OOD set is"),
]


def _snapshot(root) -> dict:
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            out[os.path.relpath(path, root)] = (hashlib.sha256(open(path, "rb").read()).hexdigest()
                                                if os.path.isfile(path) else "dir")
    return out


@pytest.mark.parametrize("argv, name, step", CASES, ids=[" ".join(c[0][:3]) for c in CASES])
def test_a_missing_or_corrupt_file_is_named_in_one_line(argv, name, step, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for f in ("junk.npz", "junk.toml"):
        (tmp_path / f).write_bytes(JUNK)
    (tmp_path / "junkdir").mkdir()
    for f in ("runs.db", "config.json"):
        (tmp_path / "junkdir" / f).write_bytes(JUNK)
    before = _snapshot(tmp_path)
    assert main(argv) == 1
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"calibkit {argv[0]}: error: "), err
    assert name in lines[0], (name, lines[0])
    assert step in lines[0], (step, lines[0])
    assert "Traceback" not in err + out and BUG not in err
    assert _snapshot(tmp_path) == before  # nothing written, no --out created
