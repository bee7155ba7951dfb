"""``calibkit.bench.slurm`` in-process: reading ``squeue``, the state of each key, submitting with
``sbatch``. SLURM's commands are replaced by recorded answers here; the tests marked ``slurm``
(tests/bench/test_slurm.py) run the same code against a real cluster."""

import json
import os
import shlex
import subprocess
from types import SimpleNamespace

import pytest

from calibkit.bench import resultfiles as R
from calibkit.bench import slurm as S


def _fake_run(monkeypatch, answers):
    """``subprocess.run`` answering each command by its name (``answers[name](cmd) -> stdout``)."""
    calls = []

    def run(cmd, capture_output=False, text=False, check=False):
        # as subprocess.run: output only when captured, bytes unless text, an error status raised with check
        calls.append(cmd)
        answer = answers[cmd[0]](cmd)
        if isinstance(answer, BaseException):
            raise answer
        rc, out, err = answer if isinstance(answer, tuple) else (0, answer, "")
        if check and rc != 0:
            raise subprocess.CalledProcessError(rc, cmd, out, err)
        if not capture_output:
            out = err = None
        elif not text:
            out, err = out.encode(), err.encode()
        return SimpleNamespace(returncode=rc, stdout=out, stderr=err)

    monkeypatch.setattr(S.subprocess, "run", run)
    return calls


def test_squeue_states_reads_this_users_tasks_of_the_wanted_jobs(monkeypatch):
    calls = _fake_run(monkeypatch,
                      {"squeue": lambda cmd: "12|3|RUNNING\n13|N/A|PENDING\n 14||PENDING \n99|1|RUNNING\n"})
    assert S.squeue_states(["12", 13, "14"]) == {"12_3": "RUNNING", "13_0": "PENDING", "14_0": "PENDING"}
    assert calls == [["squeue", "-h", "-r", "-u", str(os.getuid()), "-o", "%F|%K|%T|%r"]]
    assert S.squeue_states([]) == {} and len(calls) == 1  # nothing to ask about: squeue is not run
    for failure in (OSError(2, "No such file or directory: 'squeue'"), (1, "", "slurm_load_jobs error")):
        _fake_run(monkeypatch, {"squeue": lambda cmd, f=failure: f})
        assert S.squeue_states(["12"]) is None  # no queue to read here


def test_a_task_pending_on_a_dependency_that_can_never_be_met_is_stuck(monkeypatch):
    _fake_run(monkeypatch, {"squeue": lambda cmd: "12|0|PENDING|DependencyNeverSatisfied\n12|1|PENDING|Dependency\n"
                                                  "13|N/A|PENDING|Resources\n14|2|RUNNING|None\n"
                                                  "15|0|PENDING|\n16|0|RUNNING\n"})
    assert S.squeue_states(["12", "13", "14", "15", "16"]) == {
        "12_0": S.STUCK, "12_1": "PENDING", "13_0": "PENDING", "14_2": "RUNNING", "15_0": "PENDING",
        "16_0": "RUNNING"}


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
    # pending on a dependency that failed: stuck, with what to do
    _fake_run(monkeypatch, {"squeue": lambda cmd: "40|2|PENDING|DependencyNeverSatisfied\n"})
    assert S.key_states(out, [keys[2]])[keys[2]] == (
        "stuck", "task 40_2 is stuck: its dependency failed, it can never start (the same submission command "
                 "cancels it and submits the run again)")
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
    tmp_path = tmp_path / "my bench"  # a space: every path is quoted in the submit script
    jobs = iter(["101", "102;cluster", "103"])
    calls = _fake_run(monkeypatch, {"sbatch": lambda cmd: next(jobs) + "\n"})
    said = []
    argv = {"bench": ["bench", "--out", "o"], "select": ["tune", "--select-only"]}
    ids = S.submit(tmp_path, _arrays(), argv, S.SlurmOptions(), log=said.append)
    assert ids == {"ce": "101", "maccal": "102", "select": "103"}  # ";cluster" is not part of the id
    sdir = tmp_path.resolve() / "slurm"
    assert calls == [["sbatch", "--parsable", str(sdir / "001-ce.sh")],
                     ["sbatch", "--parsable", "--dependency=aftercorr:101,afterok:7_1", "--kill-on-invalid-dep=yes",
                      str(sdir / "001-maccal.sh")],
                     ["sbatch", "--parsable", "--dependency=afterok:101", "--kill-on-invalid-dep=yes",
                      str(sdir / "001-select.sh")]]
    subs = S.submissions(tmp_path)
    assert [(s["number"], s["stage"], s["job_id"], s["tasks"]) for s in subs] == [
        (1, "ce", "101", {"0": "p/ce/0", "1": "p/ce/1"}), (1, "maccal", "102", {"1": "p/maccal/1"}),
        (1, "select", "103", {})]
    assert (sdir / "001-ce.keys").read_text() == "0 p/ce/0\n1 p/ce/1\n" and not (sdir / "001-select.keys").exists()
    assert (sdir / "001-ce.sh").stat().st_mode & 0o777 == 0o755 and (sdir / "logs").is_dir()
    assert [s["script"] for s in subs] == [str(sdir / f"001-{n}.sh") for n in ("ce", "maccal", "select")]
    ce = (sdir / "001-ce.sh").read_text()
    # the folder's space: '_' in the job name, the log path in sbatch's quotes (one argument)
    assert "#SBATCH --job-name=calibkit-my_bench-ce" in ce and f"keys={sdir / '001-ce.keys'}" in ce.replace("'", "")
    assert f'#SBATCH --output="{sdir / "logs"}/%A_%a-ce.out"' in ce
    assert said[0] == f"submitted ce: job 101 (2 task(s)); script {sdir / '001-ce.sh'}"
    assert said[1].startswith("submitted maccal: job 102 (1 task(s), after aftercorr:101,afterok:7_1)")
    assert said[2].startswith("submitted select: job 103 (1 job, after afterok:101)")
    q = lambda p: "'" + str(p) + "'"  # noqa: E731  (shlex.quote of a path with a space)
    assert (sdir / "001-submit.sh").read_text() == (
        f"#!/bin/sh\nset -e\nce=$(sbatch --parsable {q(sdir / '001-ce.sh')})\n"
        f"maccal=$(sbatch --parsable --dependency=aftercorr:101,afterok:7_1 --kill-on-invalid-dep=yes "
        f"{q(sdir / '001-maccal.sh')})\n"
        f"select=$(sbatch --parsable --dependency=afterok:101 --kill-on-invalid-dep=yes {q(sdir / '001-select.sh')})\n")
    # the next submission is numbered after it
    jobs = iter(["201"])
    S.submit(tmp_path, _arrays()[:1], argv, S.SlurmOptions(), log=said.append)
    assert (sdir / "002-ce.sh").is_file() and S.submissions(tmp_path)[-1]["number"] == 2
    # a dry run writes the scripts and says how to submit them, submitting nothing
    said.clear()
    ids = S.submit(tmp_path, _arrays()[:1], argv, S.SlurmOptions(), dry_run=True, log=said.append)
    assert ids == {"ce": "$ce"} and len(S.submissions(tmp_path)) == 4
    assert said == [f"dry run: 1 script(s) written to {sdir}; submit them with:",
                    f"  ce=$(sbatch --parsable {q(sdir / '003-ce.sh')})"]


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


# ------------------------------------------------------------------ the scripts, run by bash


FAKE_PYTHON = """#!/bin/bash
# stands in for the interpreter a task runs: prints its arguments, stops on SIGUSR1 with status 7
echo "args: $*"
trap 'echo "got USR1"; exit 7' USR1
touch "$READY"
if [ -n "$WAIT" ]; then for i in $(seq 400); do sleep 0.05; done; fi
exit 3
"""


def _script(tmp_path, monkeypatch, array, opts=None):
    opts = S.SlurmOptions() if opts is None else opts
    fake = tmp_path / "fakepython"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    monkeypatch.setattr(S.sys, "executable", str(fake))
    keys = tmp_path / "001-train.keys"
    keys.write_text("".join(f"{i} {k}\n" for i, k in sorted(array.tasks.items())))
    text = S.script_text(array, "calibkit-b-train", keys, tmp_path / "logs", ["bench", "--out", "o b"], opts)
    path = tmp_path / "task.sh"
    path.write_text(text)
    return text, path


def _run_task(path, tmp_path, index, usr1=False):
    import signal
    import time

    ready = tmp_path / f"ready{index}"
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": str(index), "SLURM_JOB_ID": "55", "SLURM_RESTART_COUNT": "2",
           "CUDA_VISIBLE_DEVICES": "0,1", "READY": str(ready), "WAIT": "1" if usr1 else ""}
    proc = subprocess.Popen(["bash", str(path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if usr1:
        deadline = time.time() + 20
        while not ready.exists() and time.time() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGUSR1)  # what SLURM sends the batch shell before the time limit
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def test_an_array_task_runs_its_key_and_forwards_sigusr1(tmp_path, monkeypatch):
    array = S.Array("train", "bench", {0: "p/ls/0", 4: "p/focal/1"})
    opts = S.SlurmOptions(partition="gpu", account="lab", qos="high", time="1:00:00", mem="8G", cpus_per_run=4,
                          array_parallelism=2, requeue=True, signal_s=120, sbatch_args=("--constraint=a100",))
    text, path = _script(tmp_path, monkeypatch, array, opts)
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash" and "#SBATCH --job-name=calibkit-b-train" in lines
    assert f"#SBATCH --output={tmp_path / 'logs'}/%A_%a-train.out" in lines and "#SBATCH --array=0,4%2" in lines
    for d in ("--open-mode=append", "--cpus-per-task=4", "--partition=gpu", "--account=lab", "--qos=high",
              "--time=1:00:00", "--mem=8G", "--requeue", "--signal=B:USR1@120", "--constraint=a100"):
        assert f"#SBATCH {d}" in lines, d
    assert "--gres" not in text  # no GPU asked for
    assert lines[1] == ("# calibkit bench --executor slurm: stage train, 2 task(s); "
                        f"index -> key: {tmp_path / '001-train.keys'}")
    assert f"cd {shlex.quote(os.getcwd())}" in lines and text.endswith("\nexit $rc\n")
    assert f"{S.sys.executable} -m calibkit bench" in text and "torch.distributed.run" not in text
    rc, out, err = _run_task(path, tmp_path, 4)
    assert rc == 3, err  # the task's status is the command's
    said = out.splitlines()
    assert said[0].startswith("calibkit: p/focal/1 (job 55, restart 2) on ") and said[0].endswith(", GPUs 0,1")
    assert said[1] == "args: -m calibkit bench --out o b --run-key p/focal/1"  # quoted: "o b" is one argument
    rc, out, err = _run_task(path, tmp_path, 0, usr1=True)
    assert rc == 7 and "calibkit: SIGUSR1: stopping after this epoch" in out and "got USR1" in out, (out, err)
    rc, out, err = _run_task(path, tmp_path, 2)  # an index the key map does not hold
    assert rc == 2 and err.strip() == f"calibkit: no key for array index 2 in {tmp_path / '001-train.keys'}"


def test_several_processes_per_task_run_under_torchrun_and_take_the_signal(tmp_path, monkeypatch):
    one, _ = _script(tmp_path, monkeypatch, S.Array("ce", "bench", {0: "p/ce/0"}, gpus=1, torchrun=1))
    assert "torch.distributed.run" not in one and 'kill -USR1 "$child"' in one  # one process: no launcher
    two, _ = _script(tmp_path, monkeypatch, S.Array("ce", "bench", {0: "p/ce/0"}, gpus=2, torchrun=2))
    assert f"{S.sys.executable} -m torch.distributed.run --standalone --nproc_per_node=2 -m calibkit bench" in two
    assert "kill -USR1 $(ps -o pid= --ppid \"$child\")" in two and "#SBATCH --gres=gpu:2" in two


def test_the_selection_job_has_no_array_and_no_key(tmp_path, monkeypatch):
    text, path = _script(tmp_path, monkeypatch, S.Array("tune-select", "tune", {}, single=True))
    assert "#SBATCH --array" not in text and f"#SBATCH --output={tmp_path / 'logs'}/%j-tune-select.out" in text
    assert "the selection job" in text.splitlines()[1]
    rc, out, _ = _run_task(path, tmp_path, 0)
    assert rc == 3 and out.splitlines()[0].startswith("calibkit: selection (job 55")
    assert out.splitlines()[1] == "args: -m calibkit bench --out o b"  # no --run-key


def test_options_refuse_bad_values_with_their_flag():
    for opts, message in ((S.SlurmOptions(cpus_per_run=0), "--cpus-per-run must be >= 1, got 0"),
                          (S.SlurmOptions(array_parallelism=0), "--array-parallelism must be >= 1, got 0"),
                          (S.SlurmOptions(signal_s=0, requeue=True), "--signal must be >= 1 second, got 0"),
                          (S.SlurmOptions(signal_s=5), "--signal makes a task requeue itself; it needs --requeue")):
        with pytest.raises(ValueError) as err:
            opts.validate()
        assert str(err.value) == message
    ok = S.SlurmOptions(array_parallelism=1, signal_s=1, requeue=True)
    assert ok.validate() is ok
    assert S.SlurmOptions().directives(2) == ["--cpus-per-task=1", "--gres=gpu:2"]


def test_a_failed_result_without_an_error_says_so(tmp_path, monkeypatch):
    out = tmp_path / "b"
    files = R.ResultFiles(out)
    files.claim("p/ls/0", preset="p", method="ls", seed=0)
    files.fail("p/ls/0", "")
    (out / "slurm").mkdir(parents=True)
    (out / "slurm" / "submissions.jsonl").write_text(json.dumps({"job_id": "5", "script": "s"}) + "\n")  # no tasks
    _fake_run(monkeypatch, {"squeue": lambda cmd: ""})
    assert S.key_states(out, ["p/ls/0"])["p/ls/0"] == ("failed", f"{R.result_path(out, 'p/ls/0')}: no error recorded")
