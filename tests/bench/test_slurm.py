"""``--executor slurm`` on a real one-node SLURM cluster (``.ci/services.sh start-slurm``).

Skipped where no cluster answers (``CALIBKIT_TEST_SLURM`` unset); where it is set (CI), a cluster
that does not answer is a failure, not a skip.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from calibkit.store import Store

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster():
    if not os.environ.get("CALIBKIT_TEST_SLURM"):
        pytest.skip("no SLURM cluster: run `. .ci/services.sh && start-slurm` (sets CALIBKIT_TEST_SLURM=1)")
    if shutil.which("sbatch") is None:
        pytest.fail("CALIBKIT_TEST_SLURM is set but sbatch is not on PATH")
    proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        pytest.fail(f"CALIBKIT_TEST_SLURM is set but the cluster does not answer: {proc.stderr.strip()}")


@pytest.fixture
def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.setdefault("OMP_NUM_THREADS", "1")
    return e


def cli(args, env, cwd, check=True) -> str:
    proc = subprocess.run([sys.executable, "-m", "calibkit", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"calibkit {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def job_ids(out) -> set:
    path = Path(out) / "slurm" / "submissions.jsonl"
    return {json.loads(line)["job_id"] for line in path.read_text().splitlines()} if path.exists() else set()


def stage_job(out, stage: str) -> str:
    path = Path(out) / "slurm" / "submissions.jsonl"
    return [json.loads(line)["job_id"] for line in path.read_text().splitlines()
            if json.loads(line)["stage"] == stage][-1]


def queue(out) -> dict:
    """``{"JOB_TASK": state}`` of this bench's tasks still in the queue."""
    ids = job_ids(out)
    text = subprocess.run(["squeue", "-h", "-r", "-o", "%F %K %T"], capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in text.splitlines()]
    return {f"{j}_{t if t != 'N/A' else 0}": s for j, t, s in rows if j in ids}


def wait_until(predicate, timeout=600, what="condition"):
    t0 = time.time()
    while not predicate():
        if time.time() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(1)


def wait_idle(out, timeout=900):
    wait_until(lambda: not queue(out), timeout, f"the tasks of {out}")


def logs(out) -> str:
    return "".join(p.read_text() for p in sorted((Path(out) / "slurm" / "logs").glob("*.out")))


def ranking(text: str) -> list[str]:
    """The ranking table of a bench report (no timings in it)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Ranking"))
    end = next(i for i in range(start + 3, len(lines)) if not lines[i].strip())
    return lines[start:end]


# one method of every array kind: CE, a one-stage method, and the two built on CE's run (aftercorr)
EVERY_STAGE = ["--methods", "ce", "ls", "maccal", "csm"]


def test_smoke_grid_through_slurm_equals_the_local_bench(cluster, env, tmp_path):
    from calibkit.report import build_report

    t0 = time.time()
    said = cli(["bench", "--preset", "smoke", "--out", "viaslurm", "--executor", "slurm", *EVERY_STAGE], env, tmp_path)
    assert "submitted ce" in said and "submitted maccal" in said and "after aftercorr:" in said
    # meanwhile, here (an absolute --out: runs.db keeps the paths as given, and the report below
    # reads them from this process's folder)
    cli(["bench", "--preset", "smoke", "--out", str(tmp_path / "local"), "--no-report", *EVERY_STAGE], env, tmp_path)
    wait_idle(tmp_path / "viaslurm")
    print(f"smoke grid through SLURM: {time.time() - t0:.0f} s")
    status = cli(["bench", "--preset", "smoke", "--out", "viaslurm", "--status", *EVERY_STAGE], env, tmp_path)
    assert status.strip().splitlines()[-1] == "bench smoke: 4 done", status
    assert not (tmp_path / "viaslurm" / "runs.db").exists()  # no task opened it
    said = cli(["bench", "--preset", "smoke", "--out", "viaslurm", "--collect", *EVERY_STAGE], env, tmp_path)
    assert "4 new result(s) imported" in said
    assert "0 new result(s) imported" in cli(["bench", "--preset", "smoke", "--out", "viaslurm", "--collect",
                                              "--no-report", *EVERY_STAGE], env, tmp_path)
    with Store(tmp_path / "local" / "runs.db", readonly=True) as a, \
            Store(tmp_path / "viaslurm" / "runs.db", readonly=True) as b:
        ra, rb = ({r["run_key"]: r for r in s.runs("smoke")} for s in (a, b))
    assert len(ra) == 4 and ra.keys() == rb.keys()
    for key in ra:
        for col in ("metrics", "ood", "robustness", "config"):
            assert ra[key][col] == rb[key][col], (key, col)
        assert rb[key]["owner"].startswith("slurm:")
        preset, method, seed = key.split("/")  # the same logits, byte for byte
        a_logits, b_logits = (tmp_path / d / "runs" / preset / method / f"seed{seed}" / "logits.safetensors"
                              for d in ("local", "viaslurm"))
        assert a_logits.read_bytes() == b_logits.read_bytes(), key
    (spec,) = (tmp_path / "viaslurm" / "specs").iterdir()  # every task read the bench's one spec file
    assert f"--spec {spec.resolve()}" in (tmp_path / "viaslurm" / "slurm" / "001-ce.sh").read_text()
    tables = [ranking(build_report(tmp_path / d, preset="smoke", figures=False)["text"]) for d in ("local", "viaslurm")]
    assert tables[0] == tables[1] and sum(bool(re.match(r"\d+ ", line)) for line in tables[0]) == 4  # 4 ranks


def test_a_cancelled_task_is_the_only_run_resubmitted(cluster, env, tmp_path):
    # 40 epochs instead of smoke's 2 (a run of ~20 s, under the smoke preset's name): the 2-epoch run
    # can finish before scancel reaches it on an idle machine
    args = ["bench", "--preset", "smoke", "--out", "b", "--methods", "ls", "--executor", "slurm", "--epochs", "40",
            "--name", "smoke"]
    cli(args, env, tmp_path)
    out = tmp_path / "b"
    ls_run = out / "runs" / "smoke" / "ls" / "seed0"
    wait_until(lambda: (ls_run / "config.json").exists(), 300, "the LS run to start training")
    subprocess.run(["scancel", f"{stage_job(out, 'train')}_0"], check=True)
    wait_idle(out)
    # SIGTERM from scancel is an interruption: the task records the run as failed ("interrupted")
    row = json.loads((ls_run / "result.json").read_text())["row"]
    assert (row["status"], row["error"]) == ("failed", "interrupted")
    lines = dict(line.split()[:2] for line in cli(args + ["--status"], env, tmp_path).splitlines()[:-1])
    assert lines == {"smoke/ce/0": "done", "smoke/ls/0": "failed"}
    ce_result = (out / "runs" / "smoke" / "ce" / "seed0" / "result.json").read_bytes()
    said = cli(args, env, tmp_path)
    assert "submitted train" in said and "submitted ce" not in said
    assert (out / "slurm" / "002-train.keys").read_text() == "0 smoke/ls/0\n"
    assert sorted(p.name for p in (out / "slurm").glob("002-*.keys")) == ["002-train.keys"]
    wait_idle(out)
    assert (out / "runs" / "smoke" / "ce" / "seed0" / "result.json").read_bytes() == ce_result
    assert cli(args + ["--status"], env, tmp_path).strip().splitlines()[-1] == "bench smoke: 2 done"
    assert "nothing to submit" in cli(args, env, tmp_path)


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


def test_requeued_task_resumes_from_its_checkpoint(cluster, env, tmp_path):
    # default preset, CE only: 40 epochs, a checkpoint every 5
    args = ["bench", "--preset", "default", "--out", "r", "--methods", "ce", "--seeds", "0", "--executor", "slurm",
            "--requeue", "--signal", "120"]
    cli(args, env, tmp_path)
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
    assert [h["epoch"] for h in json.loads((run / "history.json").read_text())] == list(range(1, 41))


def test_two_gpu_task_runs_torchrun_with_two_processes(cluster, env, tmp_path):
    args = ["bench", "--preset", "smoke", "--out", "g", "--methods", "ce", "--executor", "slurm", "--gpus-per-run", "2",
            "--device", "cpu"]
    cli(args, env, tmp_path)
    out = tmp_path / "g"
    script = (out / "slurm" / "001-ce.sh").read_text()
    assert "#SBATCH --gres=gpu:2" in script and "torch.distributed.run --standalone --nproc_per_node=2" in script
    wait_idle(out)
    assert "GPUs 0,1" in logs(out)  # SLURM handed the task both (fake) GPUs
    info = json.loads((out / "runs" / "smoke" / "ce" / "seed0" / "config.json").read_text())
    assert info["status"] == "done" and info["world_size"] == 2
    assert json.loads((out / "runs" / "smoke" / "ce" / "seed0" / "result.json").read_text())["row"]["status"] == "done"


def test_tune_through_slurm_selects_what_a_local_tune_selects(cluster, env, tmp_path):
    # the result-file store keeps no grid extensions, so the local tune extends none either
    args = ["tune", "--preset", "smoke", "--methods", "ls", "--max-extensions", "0", "--out"]
    said = cli(args + ["viaslurm", "--executor", "slurm"], env, tmp_path)
    assert "submitted tune-select" in said and "afterok:" in said
    cli(args + [str(tmp_path / "local")], env, tmp_path)
    wait_idle(tmp_path / "viaslurm")
    cli(args + ["viaslurm", "--collect"], env, tmp_path)
    with Store(tmp_path / "local" / "runs.db", readonly=True) as a, \
            Store(tmp_path / "viaslurm" / "runs.db", readonly=True) as b:
        ca, cb = ({r["cand_key"]: r for r in s.candidates("smoke")} for s in (a, b))
    assert len(ca) == 6 and ca.keys() == cb.keys()
    for key in ca:
        assert ca[key]["metrics"] == cb[key]["metrics"] and ca[key]["selected"] == cb[key]["selected"], key
        assert ca[key]["criterion"] == cb[key]["criterion"]
    assert sum(r["selected"] for r in cb.values()) == 1


def test_a_cancelled_ce_task_leaves_nothing_stuck_and_the_same_command_finishes_the_bench(cluster, env, tmp_path):
    # MaC-Cal waits on the CE task (aftercorr); 40 epochs for a CE run that scancel can reach mid-run
    args = ["bench", "--preset", "smoke", "--out", "c", "--methods", "maccal", "--executor", "slurm", "--epochs", "40",
            "--name", "smoke"]
    said = cli(args, env, tmp_path)
    assert "submitted ce" in said and "submitted maccal" in said
    out = tmp_path / "c"
    ce_run = out / "runs" / "smoke" / "ce" / "seed0"
    wait_until(lambda: (ce_run / "config.json").exists(), 300, "the CE run to start training")
    subprocess.run(["scancel", f"{stage_job(out, 'ce')}_0"], check=True)
    # SLURM cancels the MaC-Cal task that can no longer start: the queue empties by itself
    wait_idle(out, timeout=120)
    status = cli(args + ["--status"], env, tmp_path)
    assert status.strip().splitlines()[-1] == "bench smoke: 2 failed", status
    proc = subprocess.run([sys.executable, "-m", "calibkit", *args, "--collect", "--no-report"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "2 run(s) missing" in proc.stderr, proc.stderr
    said = cli(args, env, tmp_path)  # the same submission command, nothing running
    assert "submitted ce" in said and "submitted maccal" in said and "stuck on a dependency" not in said
    wait_idle(out)
    assert cli(args + ["--status"], env, tmp_path).strip().splitlines()[-1] == "bench smoke: 2 done"
    assert not queue(out)
    assert "2 new result(s) imported" in cli(args + ["--collect", "--no-report"], env, tmp_path)


def test_a_task_left_pending_on_a_failed_dependency_is_read_as_stuck_and_cancelled(cluster, tmp_path):
    # what a submission made without --kill-on-invalid-dep (or a cluster keeping such jobs) leaves
    from calibkit.bench import slurm as S

    def sbatch(*words) -> str:
        return subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", *words], capture_output=True, text=True,
                              check=True).stdout.strip().split(";")[0]

    upstream = sbatch("--wrap", "sleep 120")
    # an array of one task, as calibkit submits
    waiting = sbatch("--array=0", f"--dependency=afterok:{upstream}", "--kill-on-invalid-dep=no", "--wrap", "true")
    try:
        subprocess.run(["scancel", upstream], check=True)
        wait_until(lambda: S.squeue_states([waiting]) == {f"{waiting}_0": S.STUCK}, 60, "the dependent to be stuck")
        states = {"p/maccal/0": ("stuck", f"task {waiting}_0 is stuck: its dependency failed")}
        assert S.cancel_stuck(states, log=lambda line: None) == [f"{waiting}_0"]
        wait_until(lambda: S.squeue_states([waiting]) == {}, 60, "the stuck task to leave the queue")
    finally:
        subprocess.run(["scancel", upstream, waiting], capture_output=True)
