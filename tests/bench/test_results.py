"""Result files (what a scheduled run writes instead of a runs.db row) and their collection."""

import json
import os

import pytest

from calibkit.bench import results as R
from calibkit.bench.collect import collect
from calibkit.store import Store

SLURM_ENV = {"SLURM_JOB_ID": "41", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "1", "SLURM_RESTART_COUNT": "2",
             "SLURMD_NODENAME": "node7"}


def _finish(out, key, ece, monkeypatch=None):
    files = R.ResultFiles(out)
    preset, method, seed = R.split_run_key(key)
    assert files.claim(key, preset=preset, method=method, seed=seed, config={"epochs": 2}, git_commit="abc",
                       versions={"torch": "x"})
    run_dir = out / "runs" / preset / method / f"seed{seed}"
    files.finish(key, metrics={"before": {"ece": ece}}, run_dir=str(run_dir), logits_path=str(run_dir / "logits.safetensors"),
                 train_time_s=1.5, eval_time_s=0.5, ood=None, robustness=None, extra=None)
    return run_dir


def test_result_file_holds_the_row_with_relative_paths_and_the_slurm_task(tmp_path, monkeypatch):
    for k, v in SLURM_ENV.items():
        monkeypatch.setenv(k, v)
    run_dir = _finish(tmp_path, "smoke/ls/0", 0.25)
    doc = json.loads((run_dir / "result.json").read_text())
    assert doc["table"] == "runs" and doc["format"] == R.FORMAT
    row = doc["row"]
    assert row["status"] == "done" and row["run_key"] == "smoke/ls/0" and row["seed"] == 0
    assert row["run_dir"] == os.path.join("runs", "smoke", "ls", "seed0")
    assert row["logits_path"] == os.path.join("runs", "smoke", "ls", "seed0", "logits.safetensors")
    assert row["metrics"] == {"before": {"ece": 0.25}} and row["attempts"] == 1
    assert doc["slurm"] == {"job_id": "41", "array_job_id": "40", "array_task_id": "1", "node": "node7",
                            "restart_count": 2}
    assert not list(run_dir.glob(".*tmp"))  # no temporary file left behind


def test_a_done_result_is_never_claimed_or_replaced(tmp_path):
    run_dir = _finish(tmp_path, "smoke/ce/0", 0.3)
    before = (run_dir / "result.json").read_bytes()
    files = R.ResultFiles(tmp_path)
    assert files.status("smoke/ce/0") == "done" and files.status("smoke/ce/1") is None
    assert not files.claim("smoke/ce/0", preset="smoke", method="ce", seed=0)
    with pytest.raises(KeyError, match="never claimed"):
        files.fail("smoke/ce/0", "boom")
    assert (run_dir / "result.json").read_bytes() == before


def test_a_failed_result_is_retried_with_one_more_attempt(tmp_path):
    files = R.ResultFiles(tmp_path)
    assert files.claim("smoke/ls/1", preset="smoke", method="ls", seed=1)
    files.fail("smoke/ls/1", "RuntimeError: out of memory")
    assert [r["status"] for r in R.ResultFiles(tmp_path).runs("smoke", status=None)] == ["failed"]
    again = R.ResultFiles(tmp_path)
    assert again.claim("smoke/ls/1", preset="smoke", method="ls", seed=1)
    again.finish("smoke/ls/1", metrics={"before": {"ece": 0.1}})
    (row,) = R.ResultFiles(tmp_path).runs("smoke")
    assert row["attempts"] == 2 and row["status"] == "done" and row.get("error") is None


def test_corrupt_or_foreign_result_files_are_named(tmp_path):
    path = tmp_path / "runs" / "smoke" / "ce" / "seed0" / "result.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"format": "calibkit-result", "row": ')
    with pytest.raises(ValueError, match=r"seed0/result\.json: corrupt result file"):
        R.ResultFiles(tmp_path).claim("smoke/ce/0", preset="smoke", method="ce", seed=0)
    path.write_text('{"hello": 1}')
    with pytest.raises(ValueError, match="is not a calibkit result file"):
        R.read_doc(path)
    with pytest.raises(ValueError, match="not preset/method/seed"):
        R.split_run_key("smoke/ce")


def test_collect_imports_once_and_never_rewrites_a_done_row(tmp_path, monkeypatch):
    for k, v in SLURM_ENV.items():
        monkeypatch.setenv(k, v)
    _finish(tmp_path, "smoke/ce/0", 0.3)
    run_dir = _finish(tmp_path, "smoke/ls/0", 0.2)
    failed = R.ResultFiles(tmp_path)
    failed.claim("smoke/focal/0", preset="smoke", method="focal", seed=0)
    failed.fail("smoke/focal/0", "boom")
    assert collect(tmp_path) == {"files": 3, "imported": 3, "unchanged": 0, "selections": 0}
    with Store(tmp_path / "runs.db", readonly=True) as db:
        row = db.get("smoke/ls/0")
        assert row["status"] == "done" and row["metrics"] == {"before": {"ece": 0.2}}
        assert row["run_dir"] == str(run_dir.resolve())  # this host's view of the bench directory
        assert row["owner"] == "slurm:40_1:restarts=2" and row["train_time_s"] == 1.5
        assert db.get("smoke/focal/0")["status"] == "failed"
    # again: nothing new; an edited done file does not reach the done row
    doc = json.loads((run_dir / "result.json").read_text())
    doc["row"]["metrics"] = {"before": {"ece": 0.9}}
    (run_dir / "result.json").write_text(json.dumps(doc))
    assert collect(tmp_path)["imported"] == 1  # only the failed row is written again
    with Store(tmp_path / "runs.db", readonly=True) as db:
        assert db.get("smoke/ls/0")["metrics"] == {"before": {"ece": 0.2}}
    # the failed run succeeds later: its row becomes done
    retry = R.ResultFiles(tmp_path)
    retry.claim("smoke/focal/0", preset="smoke", method="focal", seed=0)
    retry.finish("smoke/focal/0", metrics={"before": {"ece": 0.15}})
    collect(tmp_path)
    with Store(tmp_path / "runs.db", readonly=True) as db:
        assert db.get("smoke/focal/0")["status"] == "done"
        # every done run once (a replaced row keeps its place in the table, so no order is implied)
        assert sorted(r["run_key"] for r in db.runs("smoke")) == ["smoke/ce/0", "smoke/focal/0", "smoke/ls/0"]


def test_collect_flags_the_selected_candidate(tmp_path):
    files = R.ResultFiles(tmp_path)
    for alpha, ece in ((0.01, 0.3), (0.05, 0.2)):
        key = f"smoke/ls/100/alpha={alpha:g}"
        files.claim_candidate(key, preset="smoke", method="ls", seed=100, hparams={"loss.alpha": alpha})
        files.finish_candidate(key, metrics={"acc": 0.6, "ece": ece},
                               run_dir=str(tmp_path / "tune" / "smoke" / "ls" / f"alpha={alpha:g}"))
    files.select_candidate("smoke", "ls", 100, "smoke/ls/100/alpha=0.05", {"metric": "ece"})
    rows = R.ResultFiles(tmp_path).candidates("smoke", "ls", 100)
    assert [(r["cand_key"], r["selected"]) for r in rows] == [("smoke/ls/100/alpha=0.01", 0),
                                                             ("smoke/ls/100/alpha=0.05", 1)]
    assert collect(tmp_path) == {"files": 2, "imported": 2, "unchanged": 0, "selections": 1}
    with Store(tmp_path / "runs.db", readonly=True) as db:
        sel = [(r["cand_key"], r["selected"], r["criterion"]) for r in db.candidates("smoke", "ls", 100)]
    assert sel == [("smoke/ls/100/alpha=0.01", 0, None), ("smoke/ls/100/alpha=0.05", 1, {"metric": "ece"})]
    assert collect(tmp_path)["selections"] == 0  # already flagged
    with pytest.raises(KeyError, match="no finished candidate"):
        files.select_candidate("smoke", "ls", 100, "smoke/ls/100/alpha=0.2", {})


def test_report_command_imports_result_files_first(tmp_path, capsys):
    from calibkit.cli import main

    _finish(tmp_path, "smoke/ce/0", 0.3)
    # the row's logits file does not exist: the report fails, but only after the import
    assert main(["report", str(tmp_path)]) == 1
    assert "1 new result(s) imported" in capsys.readouterr().out
    with Store(tmp_path / "runs.db", readonly=True) as db:
        assert db.get("smoke/ce/0")["status"] == "done"


def test_run_key_runs_one_run_into_its_result_file_without_runs_db(tmp_path, capsys):
    from calibkit.cli import main

    out = tmp_path / "b"
    argv = ["bench", "--preset", "smoke", "--out", str(out), "--device", "cpu", "--run-key", "smoke/ce/0"]
    assert main(argv) == 0
    path = out / "runs" / "smoke" / "ce" / "seed0" / "result.json"
    doc = json.loads(path.read_text())
    row = doc["row"]
    assert row["status"] == "done" and row["run_key"] == "smoke/ce/0" and doc["slurm"] == {}
    assert row["logits_path"] == os.path.join("runs", "smoke", "ce", "seed0", "logits.safetensors")
    assert 0 <= row["metrics"]["before"]["ece"] <= 1 and row["config"]["hparams"] is not None
    assert not (out / "runs.db").exists()
    before = path.read_bytes()
    assert main(argv) == 0  # done: skipped, the file untouched
    assert path.read_bytes() == before and "skipped" in capsys.readouterr().out
