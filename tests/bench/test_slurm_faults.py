"""``--executor slurm`` faults on a real one-node SLURM cluster (``.ci/services.sh start-slurm``):
a cancelled task, a task requeued twice (by ``scontrol requeue`` and by the time limit's signal)
that resumes from its checkpoint each time, and a cancelled CE task that others depend on.
Skipped, or failed, as ``test_slurm.py`` is (``tests/helpers/slurm.py``, ``require_cluster``).
"""

import json
import re
import subprocess
import sys
import time

import pytest

from tests.helpers.slurm import cli, logs, queue, stage_job, wait_idle, wait_until

pytestmark = pytest.mark.slurm


def test_a_cancelled_task_is_the_only_run_resubmitted(cluster, cli_env, tmp_path):
    # 40 epochs instead of smoke's 2 (a run of ~20 s, under the smoke preset's name): the 2-epoch run
    # can finish before scancel reaches it on an idle machine
    args = ["bench", "--preset", "smoke", "--out", "b", "--methods", "ls", "--executor", "slurm", "--epochs", "40",
            "--name", "smoke"]
    cli(args, cli_env, tmp_path)
    out = tmp_path / "b"
    ls_run = out / "runs" / "smoke" / "ls" / "seed0"
    wait_until(lambda: (ls_run / "config.json").exists(), 300, "the LS run to start training")
    subprocess.run(["scancel", f"{stage_job(out, 'train')}_0"], check=True)
    wait_idle(out)
    # SIGTERM from scancel is an interruption: the task records the run as failed ("interrupted")
    row = json.loads((ls_run / "result.json").read_text())["row"]
    assert (row["status"], row["error"]) == ("failed", "interrupted")
    lines = dict(line.split()[:2] for line in cli(args + ["--status"], cli_env, tmp_path).splitlines()[:-1])
    assert lines == {"smoke/ce/0": "done", "smoke/ls/0": "failed"}
    ce_result = (out / "runs" / "smoke" / "ce" / "seed0" / "result.json").read_bytes()
    said = cli(args, cli_env, tmp_path)
    assert "submitted train" in said and "submitted ce" not in said
    assert (out / "slurm" / "002-train.keys").read_text() == "0 smoke/ls/0\n"
    assert sorted(p.name for p in (out / "slurm").glob("002-*.keys")) == ["002-train.keys"]
    wait_idle(out)
    assert (out / "runs" / "smoke" / "ce" / "seed0" / "result.json").read_bytes() == ce_result
    assert cli(args + ["--status"], cli_env, tmp_path).strip().splitlines()[-1] == "bench smoke: 2 done"
    assert "nothing to submit" in cli(args, cli_env, tmp_path)


def _task(out) -> str:
    (task,) = queue(out)
    return task


def _restarted(out, task, n: int):
    """Wait for restart ``n`` of ``task``, skipping SLURM's eligibility delay after a requeue
    (``StartTime=now`` while it is pending)."""
    pending_since = []

    def started() -> bool:
        # A task started again within a second of its requeue can meet the credential the requeue
        # revoked ("Killing non-startable batch job: Job credential revoked"): let it be pending 5 s first.
        if queue(out).get(task) == "PENDING":
            pending_since.append(pending_since[0] if pending_since else time.time())
            if time.time() - pending_since[0] >= 5:
                subprocess.run(["scontrol", "update", f"JobId={task}", "StartTime=now"], capture_output=True)
        return f"restart {n})" in logs(out)

    wait_until(started, 300, f"restart {n} of {task}")


def test_requeued_task_resumes_from_its_checkpoint(cluster, cli_env, tmp_path):
    # default preset, CE only, a checkpoint every 5 epochs; 20 epochs instead of 40 (the second stop
    # comes after epoch 8 or so: 20 leave it a dozen epochs to spare)
    args = ["bench", "--preset", "default", "--out", "r", "--methods", "ce", "--seeds", "0", "--executor", "slurm",
            "--requeue", "--signal", "120", "--epochs", "20", "--name", "default"]
    cli(args, cli_env, tmp_path)
    out = tmp_path / "r"
    run = out / "runs" / "default" / "ce" / "seed0"
    task = _task(out)
    epochs = lambda: len(json.loads((run / "history.json").read_text())) if (run / "history.json").exists() else 0  # noqa: E731
    wait_until(lambda: epochs() >= 7, 600, "7 epochs")
    subprocess.run(["scontrol", "requeue", task], check=True)  # killed and queued again, as after preemption
    _restarted(out, task, 1)
    wait_until(lambda: "resuming after epoch" in logs(out), 300, "the resumed task")
    first = epochs()
    wait_until(lambda: epochs() >= first + 2, 300, "two more epochs")
    # the warning a time limit gives: SIGUSR1 to the batch shell, forwarded to the run
    subprocess.run(["scancel", "--signal=USR1", "--batch", task], check=True)
    wait_until(lambda: "requeued" in logs(out), 300, "the run to requeue itself")
    _restarted(out, task, 2)
    wait_idle(out)
    text = logs(out)
    resumed = [int(n) for n in re.findall(r"resuming after epoch (\d+)", text)]
    stopped = [int(n) for n in re.findall(r"stopped on request after epoch (\d+)", text)]
    assert len(resumed) == 2 and resumed[0] % 5 == 0 and resumed[0] >= 5, text
    assert stopped and resumed[1] == stopped[0] > resumed[0], text
    doc = json.loads((run / "result.json").read_text())
    assert doc["row"]["status"] == "done" and doc["slurm"]["restart_count"] == 2
    assert [h["epoch"] for h in json.loads((run / "history.json").read_text())] == list(range(1, 21))


def test_a_cancelled_ce_task_leaves_nothing_stuck_and_the_same_command_finishes_the_bench(cluster, cli_env, tmp_path):
    # MaC-Cal waits on the CE task (aftercorr); 40 epochs for a CE run that scancel can reach mid-run
    args = ["bench", "--preset", "smoke", "--out", "c", "--methods", "maccal", "--executor", "slurm", "--epochs", "40",
            "--name", "smoke"]
    said = cli(args, cli_env, tmp_path)
    assert "submitted ce" in said and "submitted maccal" in said
    out = tmp_path / "c"
    ce_run = out / "runs" / "smoke" / "ce" / "seed0"
    wait_until(lambda: (ce_run / "config.json").exists(), 300, "the CE run to start training")
    subprocess.run(["scancel", f"{stage_job(out, 'ce')}_0"], check=True)
    # SLURM cancels the MaC-Cal task that can no longer start: the queue empties by itself
    wait_idle(out, timeout=120)
    status = cli(args + ["--status"], cli_env, tmp_path)
    assert status.strip().splitlines()[-1] == "bench smoke: 2 failed", status
    proc = subprocess.run([sys.executable, "-m", "calibkit", *args, "--collect", "--no-report"], cwd=tmp_path,
                          env=cli_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "2 run(s) missing" in proc.stderr, proc.stderr
    said = cli(args, cli_env, tmp_path)  # the same submission command, nothing running
    assert "submitted ce" in said and "submitted maccal" in said and "stuck on a dependency" not in said
    wait_idle(out)
    assert cli(args + ["--status"], cli_env, tmp_path).strip().splitlines()[-1] == "bench smoke: 2 done"
    assert not queue(out)
    assert "2 new result(s) imported" in cli(args + ["--collect", "--no-report"], cli_env, tmp_path)
