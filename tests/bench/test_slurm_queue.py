"""``calibkit.bench.slurm`` in-process: reading ``squeue``, the state of each key, submitting with
``sbatch``. SLURM's commands are replaced by recorded answers here; the tests marked ``slurm``
(tests/bench/test_slurm.py) run the same code against a real cluster."""

import json
import os
import subprocess
from types import SimpleNamespace

import pytest

from calibkit.bench import results as R
from calibkit.bench import slurm as S


def _fake_run(monkeypatch, answers):
    """``subprocess.run`` answering each command by its name (``answers[name](cmd) -> stdout``)."""
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        answer = answers[cmd[0]](cmd)
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, tuple):  # (returncode, stdout, stderr)
            rc, out, err = answer
            return SimpleNamespace(returncode=rc, stdout=out, stderr=err)
        return SimpleNamespace(returncode=0, stdout=answer, stderr="")

    monkeypatch.setattr(S.subprocess, "run", run)
    return calls


def test_squeue_states_reads_this_users_tasks_of_the_wanted_jobs(monkeypatch):
    calls = _fake_run(monkeypatch, {"squeue": lambda cmd: "12|3|RUNNING\n13|N/A|PENDING\n 14||PENDING \n99|1|RUNNING\n"})
    assert S.squeue_states(["12", 13, "14"]) == {"12_3": "RUNNING", "13_0": "PENDING", "14_0": "PENDING"}
    assert calls == [["squeue", "-h", "-r", "-u", str(os.getuid()), "-o", "%F|%K|%T"]]
    assert S.squeue_states([]) == {} and len(calls) == 1  # nothing to ask about: squeue is not run
    for failure in (OSError(2, "No such file or directory: 'squeue'"), subprocess.CalledProcessError(1, "squeue")):
        _fake_run(monkeypatch, {"squeue": lambda cmd, f=failure: f})
        assert S.squeue_states(["12"]) is None  # no queue to read here


def _submitted(out, job, tasks, script):
    (out / "slurm").mkdir(parents=True, exist_ok=True)
    with open(out / "slurm" / "submissions.jsonl", "a") as f:
        f.write(json.dumps({"number": 1, "stage": "train", "job_id": job, "script": str(script),
                            "tasks": {str(i): k for i, k in tasks.items()}}) + "\n")


def test_key_states_from_result_files_and_the_queue(tmp_path, monkeypatch):
    out = tmp_path / "b"
    files = R.ResultFiles(out)
    keys = [f"p/{m}/0" for m in ("ce", "ls", "focal", "mbls", "acls", "dfl")]
    for key in keys[:2]:
        _, method, seed = R.split_run_key(key)
        files.claim(key, preset="p", method=method, seed=seed)
    files.finish(keys[0], metrics={})
    files.fail(keys[1], "Traceback ...\nValueError: labels out of range")
    script = out / "slurm" / "001-train.sh"
    _submitted(out, "40", dict(enumerate(keys[:5])), script)
    _submitted(out, "41", {0: keys[3]}, script)  # resubmitted later: its newest task counts
    _fake_run(monkeypatch, {"squeue": lambda cmd: "40|2|RUNNING\n40|3|PENDING\n41|0|COMPLETING\n"})
    states = S.key_states(out, keys)
    assert states[keys[0]] == ("done", str(R.result_path(out, keys[0]).parent))
    assert states[keys[1]] == ("failed", f"{R.result_path(out, keys[1])}: ValueError: labels out of range")
    assert states[keys[2]] == ("running", "task 40_2")
    assert states[keys[3]] == ("running", "task 41_0")  # COMPLETING counts as running
    assert states[keys[4]] == ("failed", f"task 40_4 ended without a result; see {out / 'slurm' / 'logs'}")
    assert states[keys[5]] == ("not submitted", "")
    # a task still pending is queued, with its state
    _fake_run(monkeypatch, {"squeue": lambda cmd: "40|2|PENDING\n"})
    assert S.key_states(out, [keys[2]])[keys[2]] == ("queued", "task 40_2 pending")
    # without squeue nothing can be said of submitted tasks: they are not called failed
    _fake_run(monkeypatch, {"squeue": lambda cmd: OSError(2, "no squeue")})
    assert S.key_states(out, [keys[4]])[keys[4]] == ("not submitted", "")
    # the tuning table reads the candidates' files
    assert S.key_states(out, ["p/ls/0/a"], table="tuning")["p/ls/0/a"] == ("not submitted", "")


def _arrays():
    return [S.Array("ce", "bench", {0: "p/ce/0", 1: "p/ce/1"}),
            S.Array("maccal", "bench", {1: "p/maccal/1"}, after=[("aftercorr", "ce")], after_jobs=["7_1"]),
            S.Array("select", "tune", {}, after=[("afterok", "ce"), ("afterok", "nosuch")], single=True)]


def test_submit_records_each_job_and_chains_the_real_ids(tmp_path, monkeypatch):
    jobs = iter(["101", "102;cluster", "103"])
    calls = _fake_run(monkeypatch, {"sbatch": lambda cmd: next(jobs) + "\n"})
    said = []
    argv = {"bench": ["bench", "--out", "o"], "select": ["tune", "--select-only"]}
    ids = S.submit(tmp_path, _arrays(), argv, S.SlurmOptions(), log=said.append)
    assert ids == {"ce": "101", "maccal": "102", "select": "103"}  # ";cluster" is not part of the id
    sdir = tmp_path.resolve() / "slurm"
    assert calls == [["sbatch", "--parsable", str(sdir / "001-ce.sh")],
                     ["sbatch", "--parsable", "--dependency=aftercorr:101,afterok:7_1", str(sdir / "001-maccal.sh")],
                     ["sbatch", "--parsable", "--dependency=afterok:101", str(sdir / "001-select.sh")]]
    subs = S.submissions(tmp_path)
    assert [(s["number"], s["stage"], s["job_id"], s["tasks"]) for s in subs] == [
        (1, "ce", "101", {"0": "p/ce/0", "1": "p/ce/1"}), (1, "maccal", "102", {"1": "p/maccal/1"}),
        (1, "select", "103", {})]
    assert (sdir / "001-ce.keys").read_text() == "0 p/ce/0\n1 p/ce/1\n" and not (sdir / "001-select.keys").exists()
    assert os.access(sdir / "001-ce.sh", os.X_OK) and (sdir / "logs").is_dir()
    assert said[0] == f"submitted ce: job 101 (2 task(s)); script {sdir / '001-ce.sh'}"
    assert said[1].startswith("submitted maccal: job 102 (1 task(s), after aftercorr:101,afterok:7_1)")
    assert said[2].startswith("submitted select: job 103 (1 job, after afterok:101)")
    assert (sdir / "001-submit.sh").read_text().startswith("#!/bin/sh\nset -e\nce=$(sbatch --parsable ")
    # the next submission is numbered after it
    jobs = iter(["201"])
    S.submit(tmp_path, _arrays()[:1], argv, S.SlurmOptions(), log=said.append)
    assert (sdir / "002-ce.sh").is_file() and S.submissions(tmp_path)[-1]["number"] == 2


def test_a_failed_sbatch_names_its_script_and_keeps_what_was_submitted(tmp_path, monkeypatch):
    answers = iter(["101", (1, "", "sbatch: error: invalid partition specified: gpu")])
    _fake_run(monkeypatch, {"sbatch": lambda cmd: next(answers)})
    argv = {"bench": ["bench"], "select": ["tune"]}
    script = tmp_path.resolve() / "slurm" / "001-maccal.sh"
    with pytest.raises(RuntimeError, match=f"sbatch {script} failed: sbatch: error: invalid partition specified: gpu"):
        S.submit(tmp_path, _arrays(), argv, S.SlurmOptions(), log=lambda line: None)
    assert [s["job_id"] for s in S.submissions(tmp_path)] == ["101"]  # the first array is recorded
    answers = iter([(1, "only stdout said why", "")])
    with pytest.raises(RuntimeError, match="failed: only stdout said why"):
        S.submit(tmp_path, _arrays()[:1], argv, S.SlurmOptions(), log=lambda line: None)
