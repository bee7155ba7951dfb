"""Result files (what a scheduled run writes instead of a runs.db row) and their collection."""

import json
import os

import pytest

from calibkit.bench import resultfiles as R
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
    files.finish(key, metrics={"before": {"ece": ece}}, run_dir=str(run_dir),
                 logits_path=str(run_dir / "logits.safetensors"),
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
        files.claim(key, table="tuning", preset="smoke", method="ls", seed=100, hparams={"loss.alpha": alpha})
        files.finish(key, table="tuning", metrics={"acc": 0.6, "ece": ece},
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


# -- the fields of each file, the checks of a document, keys and paths ------------------------------
def test_every_field_of_a_run_candidate_and_selection_file(tmp_path, monkeypatch):
    from datetime import datetime

    for k in SLURM_ENV:
        monkeypatch.delenv(k, raising=False)
    files = R.ResultFiles(tmp_path)
    assert files.path == str(tmp_path) and files.owner.endswith(f":{os.getpid()}:files")
    assert files.busy_elsewhere("p/ce/0") is False and files.busy_elsewhere("p/ls/0/a=1", "tuning") is False
    assert files.claim("p/ce/0", preset="p", method="ce", seed=0, config={"e": 1}, git_commit="abc",
                       versions={"t": "2"})
    files.finish("p/ce/0", metrics={})
    doc = json.loads(R.result_path(tmp_path, "p/ce/0").read_text())
    row = doc["row"]
    assert doc["version"] == R.VERSION and doc["slurm"] == {}
    assert ((row["config"], row["git_commit"], row["versions"], row["owner"])
            == ({"e": 1}, "abc", {"t": "2"}, files.owner))
    stamps = [datetime.fromisoformat(row[c]) for c in ("created_at", "started_at", "finished_at")]
    assert all(s.utcoffset().total_seconds() == 0 for s in stamps) and stamps[0] <= stamps[2]  # UTC
    assert files.claim("p/ls/0/a=1", table="tuning", preset="p", method="ls", seed=0, hparams={"a": 1}, config={"e": 2},
                                 git_commit="def")
    files.finish("p/ls/0/a=1", table="tuning", metrics={})
    doc = json.loads(R.candidate_path(tmp_path, "p/ls/0/a=1").read_text())
    assert (doc["row"]["config"], doc["row"]["git_commit"], doc["row"]["selected"]) == ({"e": 2}, "def", 0)
    files.select_candidate("p", "ls", 0, "p/ls/0/a=1", {"metric": "ece"})
    doc = json.loads(R.selection_path(tmp_path, "p", "ls", 0).read_text())
    assert doc["version"] == R.VERSION and doc["slurm"] == {} and datetime.fromisoformat(doc["row"]["selected_at"])


def test_a_retry_keeps_its_creation_time_and_errors_are_cut_at_4000(tmp_path):
    files = R.ResultFiles(tmp_path)
    files.claim("p/ce/0", preset="p", method="ce", seed=0)
    files.fail("p/ce/0", "x" * 5000)
    first = json.loads(R.result_path(tmp_path, "p/ce/0").read_text())["row"]
    assert first["error"] == "x" * 4000 and first["status"] == "failed"
    again = R.ResultFiles(tmp_path)
    again.claim("p/ce/0", preset="p", method="ce", seed=0)
    again.finish("p/ce/0", metrics={})
    row = json.loads(R.result_path(tmp_path, "p/ce/0").read_text())["row"]
    assert row["created_at"] == first["created_at"] and row["started_at"] >= first["started_at"]
    files.claim("p/ls/0/a=1", table="tuning", preset="p", method="ls", seed=0, hparams={"a": 1})
    files.fail("p/ls/0/a=1", "y" * 5000, table="tuning")
    doc = json.loads(R.candidate_path(tmp_path, "p/ls/0/a=1").read_text())
    assert doc["table"] == "tuning" and doc["row"]["status"] == "failed" and doc["row"]["error"] == "y" * 4000
    assert doc["row"]["cand_key"] == "p/ls/0/a=1"
    files.finish("p/ls/0/a=1", table="tuning", metrics={})  # a failed candidate may still finish
    with pytest.raises(ValueError, match=r"candidate\.json already holds a finished result; not overwriting it$"):
        files.finish("p/ls/0/a=1", table="tuning", metrics={})


def test_documents_of_another_format_version_or_table_are_refused(tmp_path):
    path = tmp_path / "x.json"
    for text in ('[1]', '{"format": "other", "row": {}}', '{"format": "calibkit-result", "row": 3}'):
        path.write_text(text)
        with pytest.raises(ValueError, match=r"x\.json is not a calibkit result file$"):
            R.read_doc(path)
    path.write_text('{"format": "calibkit-result", "version": 2, "row": {}}')
    with pytest.raises(ValueError, match=r"x\.json: result file version 2 is newer than this calibkit \(1\)$"):
        R.read_doc(path)
    path.write_text('{"format": "calibkit-result", "row": {}, "table": "runs"}')  # no version: the first
    assert R.read_doc(path)["row"] == {}
    # a document of the wrong table where each reader expects its own
    files = R.ResultFiles(tmp_path)
    R.write_atomic(R.result_path(tmp_path, "p/ce/0"),
                   {"format": R.FORMAT, "table": "tuning", "row": {"status": "done"}})
    for call in (lambda: files.status("p/ce/0"), lambda: files.runs(),
                 lambda: files.claim("p/ce/0", preset="p", method="ce", seed=0)):
        with pytest.raises(ValueError, match="a 'tuning' result where a 'runs' one was expected"):
            call()
    R.write_atomic(R.candidate_path(tmp_path, "p/ls/0/a=1"),
                   {"format": R.FORMAT, "table": "runs", "row": {"status": "done"}})
    for call in (lambda: files.candidates(), lambda: files.select_candidate("p", "ls", 0, "p/ls/0/a=1", {})):
        with pytest.raises(ValueError, match="a 'runs' result where a 'tuning' one was expected"):
            call()


def test_selection_file_of_another_table_and_written_over_a_done_claim(tmp_path):
    files = R.ResultFiles(tmp_path)
    files.claim("p/ls/0/a=1", table="tuning", preset="p", method="ls", seed=0, hparams={"a": 1})
    files.finish("p/ls/0/a=1", table="tuning", metrics={})
    R.write_atomic(R.selection_path(tmp_path, "p", "ls", 0), {"format": R.FORMAT, "table": "runs", "row": {}})
    with pytest.raises(ValueError, match="a 'runs' result where a 'selection' one was expected"):
        files.candidates()
    # another process finished the run this one had claimed: its result stays
    a, b = R.ResultFiles(tmp_path), R.ResultFiles(tmp_path)
    assert a.claim("p/ce/0", preset="p", method="ce", seed=0) and b.claim("p/ce/0", preset="p", method="ce", seed=0)
    b.finish("p/ce/0", metrics={"m": 1})
    with pytest.raises(ValueError, match=r"^.*result\.json already holds a finished result; not overwriting it$"):
        a.fail("p/ce/0", "late")
    assert R.ResultFiles(tmp_path).runs()[0]["metrics"] == {"m": 1}


def test_keys_paths_and_the_slurm_task_of_an_environment(tmp_path, monkeypatch):
    assert R.split_run_key("p/m/-1") == ("p", "m", -1)
    for bad in ("p/m/1-", "p/m/X1", "p/m/ 1", "p/m"):
        with pytest.raises(ValueError, match=f"^run key {bad!r} is not preset/method/seed$"):
            R.split_run_key(bad)
    assert R.split_cand_key("p/m/-2/a=1") == ("p", "m", -2, "a=1")
    for bad in ("p/m/0", "p/m/1-/v", "p/m/X1/v", "p/m/ 1/v"):
        with pytest.raises(ValueError, match=f"^candidate key {bad!r} is not preset/method/seed/values$"):
            R.split_cand_key(bad)
    assert R.candidate_path(tmp_path, "p/ce/7/default") == tmp_path / "runs" / "p" / "ce" / "seed7" / "candidate.json"
    assert R.relative(tmp_path, "/elsewhere/x") == "/elsewhere/x" and R.relative(tmp_path, None) is None
    assert R.relative(tmp_path, tmp_path / "runs" / "a") == os.path.join("runs", "a")
    assert R.absolute(tmp_path, "/abs/x") == "/abs/x" and R.absolute(tmp_path, "r/x") == str(tmp_path.resolve() / "r/x")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert R.slurm_facts({"SLURM_JOB_ID": "9"}) == {"job_id": "9", "restart_count": 0}  # the given environment


def test_rows_filtered_by_preset_status_method_and_seed(tmp_path):
    files = R.ResultFiles(tmp_path)
    for key in ("a/ce/0", "a/ls/0", "b/ce/0"):
        p, m, s = R.split_run_key(key)
        files.claim(key, preset=p, method=m, seed=s)
    files.fail("a/ce/0", "boom")  # sorted first, and skipped
    run_dir = tmp_path / "runs" / "a" / "ls" / "seed0"
    files.finish("a/ls/0", metrics={}, run_dir=str(run_dir))
    files.finish("b/ce/0", metrics={})
    assert [r["run_key"] for r in files.runs("a")] == ["a/ls/0"]
    assert [r["run_key"] for r in files.runs()] == ["a/ls/0", "b/ce/0"]
    assert [r["run_key"] for r in files.runs("a", status=None)] == ["a/ce/0", "a/ls/0"]
    row = files.runs("a")[0]
    assert row["run_dir"] == str(run_dir.resolve()) and row["logits_path"] is None
    for key in ("a/ls/0/v=1", "a/ls/1/v=2", "a/focal/0/v=1", "b/ls/0/v=1"):
        p, m, s, _ = R.split_cand_key(key)
        files.claim(key, table="tuning", preset=p, method=m, seed=s, hparams={})
        files.finish(key, table="tuning", metrics={})
    files.claim("a/ls/0/v=3", table="tuning", preset="a", method="ls", seed=0, hparams={})
    files.fail("a/ls/0/v=3", "boom", table="tuning")
    keys = lambda rows: sorted(r["cand_key"] for r in rows)  # noqa: E731
    assert keys(files.candidates("a", "ls", 0)) == ["a/ls/0/v=1"]
    assert keys(files.candidates("a", "ls")) == ["a/ls/0/v=1", "a/ls/1/v=2"]
    assert keys(files.candidates("a", seed=0)) == ["a/focal/0/v=1", "a/ls/0/v=1"]
    assert keys(files.candidates("a", "ls", 0, status=None)) == ["a/ls/0/v=1", "a/ls/0/v=3"]
    files.select_candidate("a", "ls", 0, "a/ls/0/v=1", {"metric": "ece"})
    (row,) = files.candidates("a", "ls", 0)
    assert row["selected"] == 1 and row["criterion"] == {"metric": "ece"}
    assert [r["criterion"] for r in files.candidates("a", "ls", 1)] == [None]


def test_write_atomic_keeps_nan_sets_the_mode_and_leaves_nothing_when_it_fails(tmp_path):
    import math
    import stat

    path = tmp_path / "d" / "result.json"
    R.write_atomic(path, {"format": R.FORMAT, "row": {"ece": float("nan")}})
    assert math.isnan(json.loads(path.read_text())["row"]["ece"])  # a NaN metric is kept, as in runs.db
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # readable by the collecting user on another host
    before = path.read_bytes()
    with pytest.raises(TypeError):
        R.write_atomic(path, {"row": {"bad": {1, 2}}})  # not JSON
    assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == ["result.json"]
