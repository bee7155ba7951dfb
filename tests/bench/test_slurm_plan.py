"""What ``--executor slurm --dry-run`` writes: the arrays per stage and resource shape, their
key maps, directives and dependencies (no cluster needed: a dry run submits nothing)."""

import re

import pytest

from calibkit.bench import results as R
from calibkit.bench.grid import METHODS
from calibkit.bench.slurm import _ranges
from calibkit.cli import main

ONE_STAGE = [m for m in METHODS if m != "ce" and METHODS[m].kind == "train"]


def dry(tmp_path, capsys, *extra, command="bench", preset="smoke"):
    argv = [command, "--preset", preset, "--out", str(tmp_path / "out"), "--executor", "slurm", "--dry-run", *extra]
    assert main(argv) == 0
    return capsys.readouterr().out


def read(tmp_path, name):
    return (tmp_path / "out" / "slurm" / name).read_text()


def test_array_ranges():
    assert _ranges([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert _ranges([3]) == "3"


def test_one_array_per_stage_and_shape_with_dependencies(tmp_path, capsys):
    said = dry(tmp_path, capsys, "--seeds", "0", "1", "--gpus-per-run", "2", "--requeue", "--signal", "300",
               "--partition", "gpu", "--time", "12:00:00", "--array-parallelism", "4", "--sbatch-arg=--constraint=a100")
    assert read(tmp_path, "001-ce.keys") == "0 smoke/ce/0\n1 smoke/ce/1\n"
    train = [f"{i} smoke/{m}/{s}" for i, (s, m) in enumerate((s, m) for s in (0, 1) for m in ONE_STAGE)]
    assert read(tmp_path, "001-train.keys").splitlines() == train
    assert read(tmp_path, "001-maccal.keys") == "0 smoke/maccal/0\n1 smoke/maccal/1\n"  # indexed like ce
    ce, maccal, csm = (read(tmp_path, f"001-{s}.sh") for s in ("ce", "maccal", "csm"))
    for line in ("#SBATCH --array=0-1%4", "#SBATCH --gres=gpu:2", "#SBATCH --requeue", "#SBATCH --signal=B:USR1@300",
                 "#SBATCH --partition=gpu", "#SBATCH --time=12:00:00", "#SBATCH --constraint=a100"):
        assert line in ce.splitlines(), line
    assert "torch.distributed.run --standalone --nproc_per_node=2 -m calibkit bench" in ce
    assert "#SBATCH --gres=gpu:1" in maccal and "torch.distributed.run" not in maccal  # stage 2: one process
    assert "#SBATCH --gres=gpu:2" in csm and "--nproc_per_node=2" in csm
    # the forwarded signal goes to torchrun's workers, not to the launcher
    assert "kill -USR1 $(ps -o pid= --ppid \"$child\")" in ce and 'kill -USR1 "$child"' in maccal
    assert '--run-key "$key"' in ce and "--seeds 0 1" in ce
    lines = [line.strip() for line in said.splitlines() if "sbatch" in line]
    assert lines[0].startswith("ce=$(sbatch --parsable ") and lines[0].endswith("001-ce.sh)")
    assert "--dependency=aftercorr:$ce " in lines[2] and lines[2].startswith("maccal=")
    assert "--dependency=aftercorr:$ce " in lines[3] and lines[3].startswith("csm=")
    assert "--dependency" not in lines[1]
    assert not (tmp_path / "out" / "slurm" / "submissions.jsonl").exists()  # nothing submitted
    assert not (tmp_path / "out" / "runs.db").exists()


def test_runs_with_a_done_result_are_left_out(tmp_path, capsys):
    files = R.ResultFiles(tmp_path / "out")
    for key in ["smoke/ce/0", *(f"smoke/{m}/0" for m in ONE_STAGE)]:
        _, method, seed = R.split_run_key(key)
        files.claim(key, preset="smoke", method=method, seed=seed)
        files.finish(key, metrics={})
    dry(tmp_path, capsys, "--seeds", "0", "1")
    assert read(tmp_path, "001-ce.keys") == "1 smoke/ce/1\n"
    assert [line.split()[1] for line in read(tmp_path, "001-train.keys").splitlines()] == [
        f"smoke/{m}/1" for m in ONE_STAGE]
    # both MaC-Cal runs are missing; the one whose CE is done waits for the CE array (SLURM's rule
    # for an aftercorr task without a partner)
    assert read(tmp_path, "001-maccal.keys") == "0 smoke/maccal/0\n1 smoke/maccal/1\n"
    assert "#SBATCH --array=1\n" in read(tmp_path, "001-ce.sh")


def test_bench_tune_chain_candidates_selection_then_bench(tmp_path, capsys):
    said = dry(tmp_path, capsys, "--tune", "--methods", "ls", "maccal")
    stages = re.findall(r"^\s+(\w+)=\$\(sbatch", said, flags=re.M)
    assert stages == ["tune_ce", "tune_train", "tune_maccal", "tune_select", "ce", "train", "maccal"]
    line = {s: l for s, l in zip(stages, (l for l in said.splitlines() if "sbatch" in l))}
    assert "--dependency=afterok:$tune_ce " in line["tune_maccal"]
    assert all(f"afterok:${s}" in line["tune_select"] for s in ("tune_ce", "tune_train", "tune_maccal"))
    assert "--dependency=afterok:$tune_select " in line["ce"] and "afterok:$tune_select" in line["train"]
    assert "aftercorr:$ce" in line["maccal"] and "afterok:$tune_select" in line["maccal"]
    assert len(read(tmp_path, "001-tune-train.keys").splitlines()) == len(METHODS["ls"].space["loss.alpha"].values)
    select = read(tmp_path, "001-tune-select.sh")
    assert "--select-only" in select and "--array" not in select and "--run-key" not in select
    assert "bench --preset smoke" in read(tmp_path, "001-ce.sh") and " --tune" in read(tmp_path, "001-ce.sh")
    note = "bench smoke: on SLURM the grids are not extended: a selection on a grid edge is kept"
    assert note in said


def test_only_a_submission_with_a_selection_job_says_grids_are_not_extended(tmp_path, capsys):
    said = dry(tmp_path, capsys, "--methods", "ls", command="tune")
    assert "tune smoke: on SLURM the grids are not extended" in said
    assert "not extended" not in dry(tmp_path / "b", capsys, "--methods", "ls")  # a plain bench selects nothing


@pytest.mark.parametrize("extra,message", [
    (["--signal", "60"], "--signal makes a task requeue itself; it needs --requeue"),
    (["--gpus-per-run", "-1"], "--gpus-per-run must be >= 0"),
    (["--workers", "2"], "--workers is for --executor local"),
])
def test_bad_options_are_one_line_errors(tmp_path, capsys, extra, message):
    argv = ["bench", "--preset", "smoke", "--out", str(tmp_path / "o"), "--executor", "slurm", "--dry-run", *extra]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o" / "slurm").exists() or not list((tmp_path / "o" / "slurm").glob("*.sh"))


def test_run_key_of_another_preset_is_refused(tmp_path, capsys):
    assert main(["bench", "--preset", "smoke", "--out", str(tmp_path), "--run-key", "default/ce/0"]) == 1
    assert "is not a run of preset smoke" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["bench", "tune"])
def test_slurm_options_without_the_slurm_executor_are_refused(tmp_path, capsys, command):
    assert main([command, "--preset", "smoke", "--out", str(tmp_path / "o"), "--gpus-per-run", "2"]) == 1
    assert "--gpus-per-run is an option of --executor slurm" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_status_from_result_files_without_a_queue(tmp_path, capsys):
    files = R.ResultFiles(tmp_path / "out")
    files.claim("smoke/ce/0", preset="smoke", method="ce", seed=0)
    files.finish("smoke/ce/0", metrics={})
    files.claim("smoke/ls/0", preset="smoke", method="ls", seed=0)
    files.fail("smoke/ls/0", "Traceback ...\nRuntimeError: CUDA out of memory")
    assert main(["bench", "--preset", "smoke", "--out", str(tmp_path / "out"), "--methods", "ls", "--status"]) == 0
    lines = [line.split(None, 2) for line in capsys.readouterr().out.splitlines()]
    assert lines[0][:2] == ["smoke/ce/0", "done"]
    assert lines[1][:2] == ["smoke/ls/0", "failed"] and lines[1][2].endswith("RuntimeError: CUDA out of memory")
    assert lines[2] == ["bench", "smoke:", "1 done, 1 failed"]
