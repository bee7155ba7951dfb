"""Who owns a directory (``calibkit.bench.paths.OWNERS``): ``plot --out``, ``bench --out`` and ``tune --out``
refuse a directory that belongs to another run or bench, in one line, before writing anything."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest
import torch

from calibkit import rundir
from calibkit.bench import paths
from tests.conftest import PYTHON


def _fake_run(path, seed=0):
    """A finished run directory as ``calibkit train`` leaves it (the files plot reads)."""
    path.mkdir(parents=True)
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (60,), generator=g)
    rundir.write_tensors(path / rundir.LOGITS, {"val_logits": torch.randn(60, 3, generator=g), "val_labels": labels,
                                                 "test_logits": torch.randn(60, 3, generator=g),
                                                 "test_labels": labels.clone()})
    rundir.write_json(path / rundir.CONFIG, {"status": "done", "config": {"model": "mlp", "loss": "ce",
                                                                          "method": "standard"}})
    return path


def _snapshot(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _cli(args, cli_env):
    return subprocess.run([PYTHON, "-m", "calibkit", *args], capture_output=True, text=True, env=cli_env, timeout=300)


def test_directory_owner():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        assert paths.directory_owner(d / "absent") is None and paths.directory_owner(d) is None
        (d / "notes.txt").write_text("x")
        assert paths.directory_owner(d) is None  # a plain folder belongs to no command
        (d / "runs.db").write_bytes(b"")
        assert paths.directory_owner(d) == "a bench directory (calibkit bench/tune): it holds runs.db"
        (d / "config.json").write_text("{}")  # both: the run's marker is named first
        assert paths.directory_owner(d) == "a training run's directory (calibkit train): it holds config.json"


def test_plot_refuses_another_runs_directory_and_a_bench(tmp_path, cli_env):
    a, b = _fake_run(tmp_path / "a"), _fake_run(tmp_path / "b", seed=1)
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "runs.db").write_bytes(b"")
    before = _snapshot(tmp_path)
    for target, owner in ((b, "a training run's directory (calibkit train): it holds config.json"),
                          (bench, "a bench directory (calibkit bench/tune): it holds runs.db")):
        res = _cli(["plot", str(a), "--out", str(target)], cli_env)
        assert res.returncode == 1
        assert res.stderr == (f"calibkit plot: error: --out {target} is {owner}; plot would overwrite its files. "
                              f"Give a new or plain folder, or leave --out out to write into {a}\n")
    assert _snapshot(tmp_path) == before


@pytest.mark.slow  # draws the PNGs (matplotlib); the refusals above need none
def test_plot_writes_into_its_own_run_or_a_plain_folder(tmp_path, cli_env):
    a = _fake_run(tmp_path / "a")
    for args, where in ((["plot", str(a)], a), (["plot", str(a), "--out", str(a)], a),
                        (["plot", str(a), "--out", str(tmp_path / "figs")], tmp_path / "figs")):
        res = _cli(args, cli_env)
        assert res.returncode == 0, res.stderr
        assert (where / "reliability_ts.png").is_file()


@pytest.mark.parametrize("command", ["bench", "tune"])
def test_bench_and_tune_refuse_a_training_runs_directory(command, tmp_path, cli_env):
    run = _fake_run(tmp_path / "run")
    before = _snapshot(tmp_path)
    res = _cli([command, "--preset", "smoke", "--methods", "ce", "ls", "--out", str(run)], cli_env)
    assert res.returncode == 1
    assert res.stderr == (f"calibkit {command}: error: --out {run} is a training run's directory (calibkit train): "
                          "it holds config.json; a bench writes runs.db, runs/ and report/ into its own directory: "
                          "choose another path\n")
    assert _snapshot(tmp_path) == before  # no runs.db, no runs/


def test_train_refuses_a_bench_directory(tmp_path, cli_env):
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "runs.db").write_bytes(b"")
    res = _cli(["train", "--data", "digits", "--model", "mlp", "--out", str(bench)], cli_env)
    assert res.returncode == 1
    assert res.stderr == (f"calibkit train: error: out: {bench} is not empty and holds no calibkit run; "
                          "choose another directory\n")
    assert json.dumps(sorted(p.name for p in bench.iterdir())) == '["runs.db"]'
