"""``--executor slurm`` on a real one-node SLURM cluster (``.ci/services.sh start-slurm``): the
smoke grid, a tune, a two-GPU task and a stuck dependency; the faults (cancelled and requeued
tasks) are in ``test_slurm_faults.py``.

Skipped where no cluster answers (``CALIBKIT_TEST_SLURM`` unset); where it is set (CI), a cluster
that does not answer is a failure, not a skip.
"""

import json
import re
import subprocess
import time

import pytest

from calibkit.store import Store
from tests.helpers.slurm import cli, logs, wait_idle, wait_until

pytestmark = pytest.mark.slurm


def ranking(text: str) -> list[str]:
    """The ranking table of a bench report (no timings in it)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Ranking"))
    end = next(i for i in range(start + 3, len(lines)) if not lines[i].strip())
    return lines[start:end]


# one method of every array kind: CE, a one-stage method, and the two built on CE's run (aftercorr)
EVERY_STAGE = ["--methods", "ce", "ls", "maccal", "csm"]


def test_smoke_grid_through_slurm_equals_the_local_bench(cluster, cli_env, tmp_path):
    from calibkit.report import build_report

    t0 = time.time()
    said = cli(["bench", "--preset", "smoke", "--out", "viaslurm", "--executor", "slurm", *EVERY_STAGE], cli_env,
               tmp_path)
    assert "submitted ce" in said and "submitted maccal" in said and "after aftercorr:" in said
    # meanwhile, here (an absolute --out: runs.db keeps the paths as given, and the report below
    # reads them from this process's folder)
    cli(["bench", "--preset", "smoke", "--out", str(tmp_path / "local"), "--no-report", *EVERY_STAGE], cli_env,
        tmp_path)
    wait_idle(tmp_path / "viaslurm")
    print(f"smoke grid through SLURM: {time.time() - t0:.0f} s")
    status = cli(["bench", "--preset", "smoke", "--out", "viaslurm", "--status", *EVERY_STAGE], cli_env, tmp_path)
    assert status.strip().splitlines()[-1] == "bench smoke: 4 done", status
    assert not (tmp_path / "viaslurm" / "runs.db").exists()  # no task opened it
    said = cli(["bench", "--preset", "smoke", "--out", "viaslurm", "--collect", *EVERY_STAGE], cli_env, tmp_path)
    assert "4 new result(s) imported" in said
    assert "0 new result(s) imported" in cli(["bench", "--preset", "smoke", "--out", "viaslurm", "--collect",
                                              "--no-report", *EVERY_STAGE], cli_env, tmp_path)
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


def test_two_gpu_task_runs_torchrun_with_two_processes(cluster, cli_env, tmp_path):
    args = ["bench", "--preset", "smoke", "--out", "g", "--methods", "ce", "--executor", "slurm", "--gpus-per-run", "2",
            "--device", "cpu"]
    cli(args, cli_env, tmp_path)
    out = tmp_path / "g"
    script = (out / "slurm" / "001-ce.sh").read_text()
    assert "#SBATCH --gres=gpu:2" in script and "torch.distributed.run --standalone --nproc_per_node=2" in script
    wait_idle(out)
    assert "GPUs 0,1" in logs(out)  # SLURM handed the task both (fake) GPUs
    info = json.loads((out / "runs" / "smoke" / "ce" / "seed0" / "config.json").read_text())
    assert info["status"] == "done" and info["world_size"] == 2
    assert json.loads((out / "runs" / "smoke" / "ce" / "seed0" / "result.json").read_text())["row"]["status"] == "done"


def test_tune_through_slurm_selects_what_a_local_tune_selects(cluster, cli_env, tmp_path):
    # the result-file store keeps no grid extensions, so the local tune extends none either
    args = ["tune", "--preset", "smoke", "--methods", "ls", "--max-extensions", "0", "--out"]
    said = cli(args + ["viaslurm", "--executor", "slurm"], cli_env, tmp_path)
    assert "submitted tune-select" in said and "afterok:" in said
    cli(args + [str(tmp_path / "local")], cli_env, tmp_path)
    wait_idle(tmp_path / "viaslurm")
    cli(args + ["viaslurm", "--collect"], cli_env, tmp_path)
    with Store(tmp_path / "local" / "runs.db", readonly=True) as a, \
            Store(tmp_path / "viaslurm" / "runs.db", readonly=True) as b:
        ca, cb = ({r["cand_key"]: r for r in s.candidates("smoke")} for s in (a, b))
    assert len(ca) == 6 and ca.keys() == cb.keys()
    for key in ca:
        assert ca[key]["metrics"] == cb[key]["metrics"] and ca[key]["selected"] == cb[key]["selected"], key
        assert ca[key]["criterion"] == cb[key]["criterion"]
    assert sum(r["selected"] for r in cb.values()) == 1


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
