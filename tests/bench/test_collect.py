"""``calibkit.bench.collect``: result files into ``runs.db`` (the slurm owner, the preset filter,
the store it is given, the files it cannot import, selections that change)."""

import json

import pytest

from calibkit.bench import resultfiles as R
from calibkit.bench.collect import collect
from calibkit.store import Store


def _done(out, key, **fields):
    files = R.ResultFiles(out)
    preset, method, seed = R.split_run_key(key)
    assert files.claim(key, preset=preset, method=method, seed=seed)
    files.finish(key, metrics={"before": {"ece": 0.1}}, **fields)
    return R.result_path(out, key)


def _candidate(out, key, alpha):
    files = R.ResultFiles(out)
    preset, method, seed, _ = R.split_cand_key(key)
    assert files.claim(key, table="tuning", preset=preset, method=method, seed=seed, hparams={"loss.alpha": alpha})
    files.finish(key, table="tuning", metrics={"ece": alpha})
    return files


def test_nothing_to_collect_opens_no_database(tmp_path):
    assert collect(tmp_path) == {"files": 0, "imported": 0, "unchanged": 0, "selections": 0}
    assert not (tmp_path / "runs.db").exists()


def test_owner_of_a_plain_job_and_of_a_file_written_outside_slurm(tmp_path, monkeypatch):
    for k in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT", "SLURMD_NODENAME"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "77")  # not an array task, never restarted
    _done(tmp_path, "p/ce/0")
    monkeypatch.delenv("SLURM_JOB_ID")
    outside = R.ResultFiles(tmp_path)  # no SLURM at all: the row keeps the owner that wrote it
    assert outside.claim("p/ls/0", preset="p", method="ls", seed=0)
    outside.finish("p/ls/0", metrics={})
    collect(tmp_path)
    with Store(tmp_path / "runs.db", readonly=True) as db:
        assert db.get("p/ce/0")["owner"] == "slurm:77_0:restarts=0"
        assert db.get("p/ls/0")["owner"] == outside.owner


def test_a_minimal_slurm_record_is_task_0_never_restarted(tmp_path):
    path = _done(tmp_path, "p/ce/0")
    doc = json.loads(path.read_text())
    doc["slurm"] = {"job_id": "5"}  # a file whose record names only the job
    path.write_text(json.dumps(doc))
    collect(tmp_path)
    with Store(tmp_path / "runs.db", readonly=True) as db:
        assert db.get("p/ce/0")["owner"] == "slurm:5_0:restarts=0"


def test_candidates_are_flagged_by_selection_files_only(tmp_path):
    _candidate(tmp_path, "p/ls/100/alpha=0.1", 0.1)
    path = R.candidate_path(tmp_path, "p/ls/100/alpha=0.1")
    doc = json.loads(path.read_text())
    doc["row"]["selected"], doc["row"]["criterion"] = 1, {"metric": "ece"}  # a flag in the file itself
    path.write_text(json.dumps(doc))
    assert collect(tmp_path)["selections"] == 0
    with Store(tmp_path / "runs.db", readonly=True) as db:
        (row,) = db.candidates("p", "ls", 100)
    assert row["selected"] == 0 and row["criterion"] is None


def test_paths_are_made_absolute_under_this_hosts_view(tmp_path):
    run_dir = tmp_path / "runs" / "p" / "ce" / "seed0"
    _done(tmp_path, "p/ce/0", run_dir=str(run_dir), logits_path=str(run_dir / "logits.safetensors"))
    collect(tmp_path)
    with Store(tmp_path / "runs.db", readonly=True) as db:
        row = db.get("p/ce/0")
    assert row["run_dir"] == str(run_dir.resolve())
    assert row["logits_path"] == str((run_dir / "logits.safetensors").resolve())


def test_only_the_named_presets_files_are_imported(tmp_path):
    _done(tmp_path, "a/ce/0")
    _done(tmp_path, "b/ce/0")
    _candidate(tmp_path, "b/ls/100/alpha=0.1", 0.1).select_candidate("b", "ls", 100, "b/ls/100/alpha=0.1", {"m": 1})
    assert collect(tmp_path, "a") == {"files": 1, "imported": 1, "unchanged": 0, "selections": 0}
    with Store(tmp_path / "runs.db", readonly=True) as db:
        assert [r["run_key"] for r in db.runs()] == ["a/ce/0"] and db.candidates("b") == []
    assert collect(tmp_path, "b") == {"files": 2, "imported": 2, "unchanged": 0, "selections": 1}
    assert collect(tmp_path) == {"files": 3, "imported": 0, "unchanged": 3, "selections": 0}


def test_the_store_given_is_used_and_left_open(tmp_path):
    _done(tmp_path, "p/ce/0")
    db = Store(tmp_path / "other.db")
    try:
        assert collect(tmp_path, store=db)["imported"] == 1
        assert db.get("p/ce/0")["status"] == "done"  # still open
        assert not (tmp_path / "runs.db").exists()
    finally:
        db.close()
    assert collect(tmp_path / "empty", store=None)["files"] == 0


def test_corrupt_files_are_named_and_the_others_are_imported(tmp_path):
    _done(tmp_path, "p/ls/0")
    bad = [R.result_path(tmp_path, "p/ce/0"), R.result_path(tmp_path, "p/mbls/0")]  # sorted before and after it
    for path in bad:
        path.parent.mkdir(parents=True)
        path.write_text('{"format": ')
    with pytest.raises(ValueError) as err:
        collect(tmp_path)
    each = []
    for path in bad:
        with pytest.raises(ValueError, match="corrupt result file") as one:
            R.read_doc(path)
        each.append(str(one.value))
    assert str(err.value) == f"2 result file(s) not imported: {each[0]}; {each[1]}"
    with Store(tmp_path / "runs.db", readonly=True) as db:
        assert [r["run_key"] for r in db.runs(status=None)] == ["p/ls/0"]


def test_a_foreign_file_among_the_selections_is_named(tmp_path):
    _done(tmp_path, "p/ce/0")
    path = R.selection_path(tmp_path, "p", "ls", 100)
    R.write_atomic(path, {"format": R.FORMAT, "version": R.VERSION, "table": "runs", "row": {}})
    with pytest.raises(ValueError, match=r"ls-seed100\.json: a 'runs' result where a 'selection' one was expected"):
        collect(tmp_path)


def test_a_selection_of_an_unfinished_candidate_is_named(tmp_path):
    files = _candidate(tmp_path, "p/ls/100/alpha=0.1", 0.1)
    files.select_candidate("p", "ls", 100, "p/ls/100/alpha=0.1", {"m": 1})
    _candidate(tmp_path, "p/mbls/100/margin=6", 6.0).select_candidate("p", "mbls", 100, "p/mbls/100/margin=6", {})
    sel = R.selection_path(tmp_path, "p", "ls", 100)  # sorted before the good one
    doc = json.loads(sel.read_text())
    doc["row"]["cand_key"] = "p/ls/100/alpha=0.3"
    sel.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"^1 result file\(s\) not imported: .*ls-seed100\.json: selects "
                                         r"p/ls/100/alpha=0\.3, which is not a finished candidate$"):
        collect(tmp_path)
    with Store(tmp_path / "runs.db", readonly=True) as db:  # the other selection is made all the same
        assert [r["selected"] for r in db.candidates("p", "mbls", 100)] == [1]
    # a finished candidate of another preset, method or seed is not this selection's either
    _candidate(tmp_path, "q/ls/100/alpha=0.1", 0.1)
    _candidate(tmp_path, "p/ls/7/alpha=0.2", 0.2)
    for other in ("q/ls/100/alpha=0.1", "p/mbls/100/margin=6", "p/ls/7/alpha=0.2"):
        doc["row"]["cand_key"] = other
        sel.write_text(json.dumps(doc))
        with pytest.raises(ValueError, match=f"selects {other}, which is not a finished candidate$"):
            collect(tmp_path)


def test_a_changed_criterion_selects_again(tmp_path):
    files = _candidate(tmp_path, "p/ls/100/alpha=0.1", 0.1)
    files.select_candidate("p", "ls", 100, "p/ls/100/alpha=0.1", {"metric": "ece"})
    assert collect(tmp_path)["selections"] == 1
    files.select_candidate("p", "ls", 100, "p/ls/100/alpha=0.1", {"metric": "nll"})
    assert collect(tmp_path)["selections"] == 1
    with Store(tmp_path / "runs.db", readonly=True) as db:
        (row,) = db.candidates("p", "ls", 100)
    assert row["selected"] == 1 and row["criterion"] == {"metric": "nll"}
    # the same criterion written in another key order is no change
    files.select_candidate("p", "ls", 100, "p/ls/100/alpha=0.1", {"metric": "nll", "direction": "min"})
    _candidate(tmp_path, "p/mbls/100/margin=6", 6.0).select_candidate("p", "mbls", 100, "p/mbls/100/margin=6", {})
    assert collect(tmp_path)["selections"] == 2  # the count adds up
    path = R.selection_path(tmp_path, "p", "ls", 100)
    doc = json.loads(path.read_text())
    assert list(doc["row"]["criterion"]) == ["direction", "metric"]
    doc["row"]["criterion"] = {"metric": "nll", "direction": "min"}
    path.write_text(json.dumps(doc))  # unsorted keys
    assert collect(tmp_path)["selections"] == 0


# ------------------------------------------------------------------------------ runs that left no result


def _submitted(out, job, keys):
    (out / "slurm").mkdir(parents=True, exist_ok=True)
    with open(out / "slurm" / "submissions.jsonl", "a") as f:
        f.write(json.dumps({"number": 1, "stage": "train", "job_id": job, "script": str(out / "slurm" / "001-train.sh"),
                            "tasks": {str(i): k for i, k in enumerate(keys)}}) + "\n")


@pytest.fixture
def queue(monkeypatch):
    """``squeue``'s answer (``{"JOB_TASK": state}``; None: no squeue on this host)."""
    from calibkit.bench import slurm

    answer = {"tasks": {}}
    monkeypatch.setattr(slurm, "squeue_states", lambda jobs: answer["tasks"])
    return answer


def test_unfinished_names_every_run_without_a_result_and_why(tmp_path, queue):
    from calibkit.bench.collect import unfinished

    _done(tmp_path, "p/ce/0")
    _submitted(tmp_path, "40", ["p/ce/0", "p/ls/0", "p/focal/0"])
    queue["tasks"] = {"40_2": "RUNNING"}
    keys = ["p/ce/0", "p/ls/0", "p/focal/0", "p/mbls/0"]
    assert unfinished(tmp_path, keys) == [
        ("p/ls/0", "failed", f"task 40_1 ended without a result; see {tmp_path / 'slurm' / 'logs'}"),
        ("p/focal/0", "running", "task 40_2"), ("p/mbls/0", "not submitted", "")]
    queue["tasks"] = None  # a copy of the folder on a laptop: no queue to ask
    assert unfinished(tmp_path, keys)[:2] == [
        ("p/ls/0", "no result", "submitted, no result file; no squeue here to say whether it still runs"),
        ("p/focal/0", "no result", "submitted, no result file; no squeue here to say whether it still runs")]


def test_collect_names_a_run_whose_task_died_without_a_result_and_fails(tmp_path, queue, capsys):
    from calibkit.cli import main

    out = tmp_path / "b"
    _done(out, "smoke/ce/0")
    _submitted(out, "40", ["smoke/ce/0", "smoke/ls/0"])
    argv = ["bench", "--preset", "smoke", "--methods", "ls", "--seeds", "0", "--out", str(out), "--collect",
            "--no-report"]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out.startswith(f"collect {out}: 1 new result(s) imported")
    assert captured.err.splitlines() == [
        f"collect {out}: smoke/ls/0: failed (task 40_1 ended without a result; see {out / 'slurm' / 'logs'})",
        f"collect {out}: 1 run(s) missing (smoke/ls/0); run the same submission command again to submit them"]
    queue["tasks"] = {"40_1": "PENDING"}  # still queued: named, but nothing is missing yet
    assert main(argv) == 0
    assert capsys.readouterr().err == f"collect {out}: smoke/ls/0: queued (task 40_1 pending)\n"
    _done(out, "smoke/ls/0")
    assert main(argv) == 0 and capsys.readouterr().err == ""


def test_the_report_names_a_submitted_run_that_left_no_result(tmp_path, queue, one_thread):
    from calibkit.report.build import build_report
    from tests.report.test_report_edges import make_runs

    make_runs(tmp_path, methods=("ce", "ls"), seeds=(0,))
    _submitted(tmp_path, "40", ["smoke/ce/0", "smoke/ls/0", "smoke/focal/0", "other/ce/0"])
    rep = build_report(tmp_path, figures=False, width=0)
    assert (rep["text"].splitlines()[0]
            == "calibkit bench: preset smoke, 2 finished runs, 1 unfinished (smoke/focal/0 (failed))")
    assert "\n\nUnfinished runs: smoke/focal/0 (failed).\n" in (tmp_path / "report" / "report.md").read_text()
