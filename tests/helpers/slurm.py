"""Helpers of the tests that run ``--executor slurm`` on a real one-node SLURM cluster
(``.ci/services.sh start-slurm``): ``tests/bench/test_slurm.py`` and ``test_slurm_faults.py``, two
files so that the two test processes run them side by side. Their ``cluster`` fixture is in
``tests/bench/conftest.py``; the command line's environment is the ``cli_env`` fixture."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest


def require_cluster() -> None:
    """Skip where no cluster is configured (``CALIBKIT_TEST_SLURM`` unset); where it is set (CI), a
    cluster that does not answer is a failure, not a skip."""
    if not os.environ.get("CALIBKIT_TEST_SLURM"):
        pytest.skip("no SLURM cluster: run `. .ci/services.sh && start-slurm` (sets CALIBKIT_TEST_SLURM=1)")
    if shutil.which("sbatch") is None:
        pytest.fail("CALIBKIT_TEST_SLURM is set but sbatch is not on PATH")
    proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        pytest.fail(f"CALIBKIT_TEST_SLURM is set but the cluster does not answer: {proc.stderr.strip()}")


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
