"""What ``--executor slurm --dry-run`` writes: the arrays per stage and resource shape, their
key maps, directives and dependencies (no cluster needed: a dry run submits nothing)."""

import re

import pytest

from calibkit.bench import resultfiles as R
from calibkit.bench.grid import METHODS
from calibkit.bench.slurm import _ranges
from calibkit.cli import main
from calibkit.pipeline.spec import read_spec

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
    assert '--run-key "$key"' in ce and "--spec" in ce and "--seeds" not in ce  # every value in the spec file
    (spec,) = re.findall(r"--spec (\S+)", ce)
    assert read_spec(spec, "bench").options.seeds == (0, 1)
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
    line = dict(zip(stages, (text for text in said.splitlines() if "sbatch" in text)))
    assert "--dependency=afterok:$tune_ce " in line["tune_maccal"]
    assert all(f"afterok:${s}" in line["tune_select"] for s in ("tune_ce", "tune_train", "tune_maccal"))
    assert "--dependency=afterok:$tune_select " in line["ce"] and "afterok:$tune_select" in line["train"]
    assert "aftercorr:$ce" in line["maccal"] and "afterok:$tune_select" in line["maccal"]
    assert len(read(tmp_path, "001-tune-train.keys").splitlines()) == len(METHODS["ls"].space["loss.alpha"].values)
    select = read(tmp_path, "001-tune-select.sh")
    assert "--select-only" in select and "--array" not in select and "--run-key" not in select
    (spec,) = re.findall(r"-m calibkit bench --out \S+ --spec (\S+)", read(tmp_path, "001-ce.sh"))
    assert read_spec(spec, "bench").options.tune and read_spec(spec, "bench").preset == "smoke"
    (tuning,) = set(re.findall(r"-m calibkit tune --out \S+ --spec (\S+)", select + read(tmp_path, "001-tune-ce.sh")))
    assert read_spec(tuning, "tune").options.methods == ("ls", "maccal")
    note = "bench smoke: on SLURM the grids are not extended: a selection on a grid edge is kept"
    assert note in said


def test_only_a_submission_with_a_selection_job_says_grids_are_not_extended(tmp_path, capsys):
    said = dry(tmp_path, capsys, "--methods", "ls", command="tune")
    assert "tune smoke: on SLURM the grids are not extended" in said
    assert "not extended" not in dry(tmp_path / "b", capsys, "--methods", "ls")  # a plain bench selects nothing


@pytest.mark.parametrize("extra,message", [
    (["--signal", "60"], "--signal makes a task requeue itself; it needs --requeue"),
    # --gpus-per-run -1 stops at argparse (tests/commands/test_numeric_options.py)
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


# -- the planning functions alone (a stand-in for the result files and the queue) ------------------
from argparse import Namespace  # noqa: E402
from dataclasses import replace  # noqa: E402

from calibkit.bench import slurm_plan as SP  # noqa: E402
from calibkit.bench.slurm import Array, SlurmOptions  # noqa: E402
from calibkit.pipeline import BenchOptions, TuneOptions  # noqa: E402

SLURM = SlurmOptions()
ARGV = {"bench": ["bench", "--out", "o", "--spec", "b.json"], "tune": ["tune", "--out", "o", "--spec", "t.json"],
        "select": ["tune", "--out", "o", "--spec", "t.json", "--select-only"]}


def _tuned_at_7():
    """The smoke preset with selection seed 7."""
    from calibkit.bench.grid import PRESETS

    return replace(PRESETS["smoke"], tune_seed=7)


def test_the_tasks_read_the_spec_files_of_the_submission(tmp_path):
    from calibkit.pipeline.executor import submission_argv
    from calibkit.pipeline.spec import BenchSpec, read_spec

    out = str(tmp_path / "o")
    opts = BenchOptions(seeds=(0, 1), methods=("ls", "ce"), data_dir="/d", device="cuda", csm_store="/c",
                        keep="last", num_threads=4, tune=True)
    spec = BenchSpec("bench", "smoke", out, opts, changes={"lr": 0.5})
    argv = submission_argv(spec, ("bench", "tune", "select"))
    bench, tune = (f"{out}/specs/{c}-" for c in ("bench", "tune"))
    assert argv["bench"][:4] == ["bench", "--out", out, "--spec"] and argv["bench"][4].startswith(bench)
    assert argv["tune"][:4] == ["tune", "--out", out, "--spec"] and argv["tune"][4].startswith(tune)
    assert argv["select"] == [*argv["tune"], "--select-only"] and len(argv["bench"]) == len(argv["tune"]) == 5
    assert read_spec(argv["bench"][4], "bench") == spec  # every option, the preset and its changes
    tuning = read_spec(argv["tune"][4], "tune")  # bench --tune's tuning: the same values, tuned on the preset's seed
    assert tuning.options == opts.tune_options() and (tuning.preset, tuning.changes) == ("smoke", {"lr": 0.5})
    # a tuning's submission has no bench tasks; its spec is the tuning's own
    alone = BenchSpec("tune", "smoke", out, TuneOptions(seed=0))
    assert read_spec(submission_argv(alone, ("tune", "select"))["tune"][4], "tune") == alone


def test_slurm_options_take_every_flag():
    from calibkit.commands.executing import slurm_options

    args = Namespace(partition="gpu", account="acc", qos="high", time="1:00:00", gpus_per_run=2, cpus_per_run=8,
                     mem="32G", array_parallelism=3, sbatch_arg=["--constraint=a100"], requeue=True, signal=120)
    assert slurm_options(args) == SlurmOptions("gpu", "acc", "high", "1:00:00", 2, 8, "32G", 3, ("--constraint=a100",),
                                               True, 120)


def test_task_shape_and_the_task_holding_a_key():
    opts = lambda g: SlurmOptions(gpus_per_run=g)  # noqa: E731
    assert SP._shape("train", opts(2)) == {"gpus": 2, "torchrun": 2}
    assert SP._shape("train", opts(1)) == {"gpus": 1, "torchrun": 0}  # one GPU: no torchrun
    assert SP._shape("train", opts(0)) == {"gpus": 0, "torchrun": 0}
    assert SP._shape("maccal", opts(4)) == {"gpus": 1, "torchrun": 0} and SP._shape("maccal", opts(0))["gpus"] == 0
    assert SP._active_task(("queued", "task 40_3 pending")) == "40_3"
    assert SP._active_task(("running", "task 41_0")) == "41_0"
    assert SP._active_task(("failed", "task 9_9 failed")) is None and SP._active_task(("done", "/x y")) is None


def _states(monkeypatch, given, seen):
    def fake(out, keys, table="runs"):
        seen.append(table)
        return {k: given.get(k, ("not submitted", "")) for k in keys}
    monkeypatch.setattr(SP, "key_states", fake)


def test_bench_arrays_skip_what_is_done_or_held_and_wait_for_a_ce_held_elsewhere(monkeypatch):
    seen, opts = [], SlurmOptions(gpus_per_run=2)
    p = Namespace(name="p")
    _states(monkeypatch, {"p/ce/0": ("done", "/d"), "p/ce/1": ("running", "task 40_1"),
                          "p/ls/0": ("queued", "task 40_2 pending"), "p/maccal/1": ("done", "/d")}, seen)
    arrays, _ = SP.bench_arrays("/o", p, [0, 1], ["ce", "maccal", "ls", "csm"], opts, prefix="x-")
    assert seen == ["runs"]
    # no CE array (one done, one running elsewhere): the two-stage runs wait for that task, not for a stage
    assert arrays == [Array("x-train", "bench", {1: "p/ls/1"}, gpus=2, torchrun=2),
                      Array("x-maccal", "bench", {0: "p/maccal/0"}, gpus=1, after_jobs=[]),
                      Array("x-csm", "bench", {0: "p/csm/0", 1: "p/csm/1"}, gpus=2, torchrun=2, after_jobs=["40_1"])]
    # with a pending CE the two-stage arrays depend on its array (aftercorr), after the given stages too
    seen.clear()
    _states(monkeypatch, {"p/maccal/0/k": ("done", "/d")}, seen)  # nothing of MaC-Cal to run
    arrays, _ = SP.bench_arrays("/o", p, [0], ["ce", "maccal", "csm"], opts, after=[("afterok", "sel")],
                                key_of=lambda m, s, v=None: f"p/{m}/{s}/k", table="tuning")
    assert seen == ["tuning"]
    assert arrays == [Array("ce", "bench", {0: "p/ce/0/k"}, gpus=2, torchrun=2, after=[("afterok", "sel")]),
                      Array("csm", "bench", {0: "p/csm/0/k"}, gpus=2, torchrun=2,
                            after=[("aftercorr", "ce"), ("afterok", "sel")])]


class _Tuner:
    methods = ["ls", "maccal", "csm"]

    def __init__(self, selected):
        self._selected = selected

    def items(self):
        return [("ce", {}), ("ls", {"a": 1}), ("ls", {"a": 2}), ("maccal", {"e": 1}), ("csm", {"s": 1})]

    def key(self, method, values):
        return f"p/{method}/100/" + (",".join(f"{k}={v}" for k, v in values.items()) or "none")

    def selection(self):
        return self._selected


def test_tune_arrays_per_stage_and_the_selection_job(monkeypatch):
    seen, opts = [], SlurmOptions(gpus_per_run=2)
    _states(monkeypatch, {"p/ce/100/none": ("running", "task 7_0"), "p/ls/100/a=1": ("done", "/d"),
                          "p/ls/100/a=2": ("queued", "task 7_2 pending")}, seen)
    arrays, _ = SP.tune_arrays("/o", _Tuner({}), opts)
    assert seen == ["tuning"]
    assert arrays == [Array("tune-maccal", "tune", {3: "p/maccal/100/e=1"}, gpus=1, after=[("afterok", "tune-ce")],
                            after_jobs=["7_0"]),
                      Array("tune-csm", "tune", {4: "p/csm/100/s=1"}, gpus=2, torchrun=2,
                            after=[("afterok", "tune-ce")],
                            after_jobs=["7_0"]),
                      Array("tune-select", "tune", {}, after=[("afterok", "tune-maccal"), ("afterok", "tune-csm")],
                            after_jobs=["7_0", "7_2"], single=True)]
    _states(monkeypatch, {}, seen)
    arrays, _ = SP.tune_arrays("/o", _Tuner({}), opts)
    assert [(a.stage, a.tasks) for a in arrays[:2]] == [("tune-ce", {0: "p/ce/100/none"}),
                                                        ("tune-train", {1: "p/ls/100/a=1", 2: "p/ls/100/a=2"})]
    # everything done: a selection job only while some method has no selection
    done = {k: ("done", "/d")
            for k in ("p/ce/100/none", "p/ls/100/a=1", "p/ls/100/a=2", "p/maccal/100/e=1", "p/csm/100/s=1")}
    _states(monkeypatch, done, seen)
    assert SP.tune_arrays("/o", _Tuner({"ls": {}, "maccal": {}, "csm": {}}), opts)[0] == []
    assert SP.tune_arrays("/o", _Tuner({"ls": {}, "maccal": {}}), opts)[0] == [
        Array("tune-select", "tune", {}, single=True)]


def test_submit_bench_hands_the_planned_arrays_to_submit(monkeypatch, tmp_path):
    from calibkit.bench.grid import PRESETS

    calls = []
    monkeypatch.setattr(SP, "submit",
                        lambda out, arrays, argv, opts, dry_run: calls.append((arrays, argv, dry_run)) or {"x": 1})
    opts = BenchOptions(device="cpu", methods=("ls",))
    assert SP.submit_bench(tmp_path, PRESETS["smoke"], opts, SLURM, ARGV) == {"x": 1}
    ((arrays, argv, dry_run),) = calls
    assert dry_run is False and argv == ARGV
    seeds = PRESETS["smoke"].seeds
    assert [(a.stage, sorted(a.tasks.values())) for a in arrays] == [
        ("ce", [f"smoke/ce/{s}" for s in seeds]), ("train", [f"smoke/ls/{s}" for s in seeds])]
    for s in seeds:  # every run done: nothing to submit
        for m in ("ce", "ls"):
            files = R.ResultFiles(tmp_path)
            files.claim(f"smoke/{m}/{s}", preset="smoke", method=m, seed=s)
            files.finish(f"smoke/{m}/{s}", metrics={})
    assert SP.submit_bench(tmp_path, PRESETS["smoke"], opts, SLURM, ARGV) == {} and len(calls) == 1


def test_submit_bench_cancels_the_tasks_stuck_on_a_failed_dependency_then_submits_their_runs(monkeypatch, tmp_path,
                                                                                             capsys):
    from calibkit.bench import slurm as S
    from calibkit.bench.grid import PRESETS

    order = []
    monkeypatch.setattr(SP, "submit", lambda out, arrays, argv, opts, dry_run: order.append(
        ("submit", [(a.stage, a.tasks, a.after, a.after_jobs) for a in arrays], dry_run)) or {"x": 1})
    stuck = "task 41_0 is stuck: its dependency failed, it can never start"
    _states(monkeypatch, {"smoke/ce/0": ("failed", "task 40_0 ended without a result"),
                          "smoke/maccal/0": ("stuck", stuck), "smoke/ls/0": ("done", "/d")}, [])
    ran = []

    def run(cmd, capture_output=False, text=False):
        ran.append(cmd)
        order.append(("scancel", cmd[1:]))
        return Namespace(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(S.subprocess, "run", run)
    args = (tmp_path, PRESETS["smoke"], BenchOptions(device="cpu", methods=("ls", "maccal"), seeds=(0,)), SLURM, ARGV)
    assert SP.submit_bench(*args) == {"x": 1}
    # the stuck task is cancelled first, then CE and MaC-Cal are submitted again (MaC-Cal after the new CE)
    assert order == [("scancel", ["41_0"]),
                     ("submit", [("ce", {0: "smoke/ce/0"}, [], []),
                                 ("maccal", {0: "smoke/maccal/0"}, [("aftercorr", "ce")], [])], False)]
    assert capsys.readouterr().out == "cancelled 1 task(s) stuck on a dependency that failed: 41_0\n"
    # a dry run cancels nothing and says so
    order.clear()
    SP.submit_bench(*args, dry_run=True)
    assert [o[0] for o in order] == ["submit"] and len(ran) == 1
    assert capsys.readouterr().out == "dry run: would cancel 1 task(s) stuck on a dependency that failed: 41_0\n"
    # scancel refused: nothing submitted, one line saying what to do
    monkeypatch.setattr(S.subprocess, "run", lambda cmd, capture_output=False, text=False: Namespace(
        returncode=1, stdout="", stderr="scancel: error: Kill job error on job id 41_0: Access/permission denied"))
    order.clear()
    with pytest.raises(RuntimeError, match=r"^scancel 41_0 failed: scancel: error: Kill job error .* denied; "
                                           r"cancel them yourself, then run the same submission command again$"):
        SP.submit_bench(*args)
    assert order == []


def test_status_lines_of_a_bench_with_its_tuning_candidates(tmp_path):
    from calibkit.bench.grid import PRESETS

    files = R.ResultFiles(tmp_path)
    files.claim("smoke/ls/7/alpha=0.05", table="tuning",
                preset="smoke", method="ls", seed=7, hparams={"loss.alpha": 0.05})
    files.finish("smoke/ls/7/alpha=0.05", table="tuning", metrics={})
    files.claim("smoke/ls/3", preset="smoke", method="ls", seed=3)
    files.fail("smoke/ls/3", "ValueError: bad")
    lines, counts = SP.status_lines(tmp_path, _tuned_at_7(), BenchOptions(seeds=(3,), methods=("ls",), tune=True))
    width = len("smoke/ls/7/alpha=0.01")
    cands = ["smoke/ce/7/default", *(f"smoke/ls/7/alpha={a:g}" for a in METHODS["ls"].space["loss.alpha"].values)]
    assert [line.split()[0] for line in lines] == [*cands, "smoke/ce/3", "smoke/ls/3"]  # candidates first
    done = R.candidate_path(tmp_path, "smoke/ls/7/alpha=0.05").parent
    assert lines[3] == f"{'smoke/ls/7/alpha=0.05':<{width}}  {'done':<13}  {done}"
    assert lines[0] == f"{'smoke/ce/7/default':<{width}}  not submitted"  # no trailing blanks
    assert (lines[-1]
            == f"{'smoke/ls/3':<{width}}  {'failed':<13}  {R.result_path(tmp_path, 'smoke/ls/3')}: ValueError: bad")
    assert counts == {"not submitted": len(cands), "done": 1, "failed": 1}
    # without --tune: the bench's runs only; no seeds, no lines
    opts = BenchOptions(seeds=(3,), methods=("ls",))
    assert SP.status_lines(tmp_path, PRESETS["smoke"], opts)[0] == [
        f"smoke/ce/3  {'not submitted'}", f"smoke/ls/3  {'failed':<13}  {lines[-1].split(None, 2)[2]}"]
    # a tuning's options: its candidates only
    lines, counts = SP.status_lines(tmp_path, PRESETS["smoke"], TuneOptions(methods=("ls",), seed=7))
    assert [line.split()[0] for line in lines] == cands and counts == {"not submitted": len(cands) - 1, "done": 1}
    assert not (tmp_path / "runs.db").exists()


def test_submit_tune_plans_the_candidates_of_the_given_seed_then_the_bench(monkeypatch, tmp_path):
    from calibkit.bench.grid import PRESETS

    calls = []
    monkeypatch.setattr(SP, "submit",
                        lambda out, arrays, argv, opts, dry_run: calls.append((arrays, argv, dry_run)) or {})
    SP.submit_tune(tmp_path, PRESETS["smoke"], TuneOptions(device="cpu", methods=("ls",), seed=7), SLURM, ARGV)
    ((arrays, argv, dry_run),) = calls
    assert dry_run is False and argv == ARGV
    assert [a.stage for a in arrays] == ["tune-ce", "tune-train", "tune-select"]
    assert arrays[0].tasks == {0: "smoke/ce/7/default"} and all("/ls/7/" in k for k in arrays[1].tasks.values())
    opts = BenchOptions(device="cpu", methods=("ls",), seeds=(3,), tune=True)  # bench --tune: tuned on seed 7
    SP.submit_bench(tmp_path, _tuned_at_7(), opts, SLURM, ARGV)
    arrays = calls[1][0]
    assert [(a.stage, a.after) for a in arrays[3:]] == [("ce", [("afterok", "tune-select")]),
                                                        ("train", [("afterok", "tune-select")])]
    assert arrays[3].tasks == {0: "smoke/ce/3"}
    assert not (tmp_path / "runs.db").exists()  # planned from the result files alone


def test_status_of_tuning_reads_candidate_files_only_and_takes_the_presets_seed(tmp_path):
    from calibkit.bench.grid import PRESETS

    seed = PRESETS["smoke"].tune_seed
    path = R.candidate_path(tmp_path, f"smoke/ls/{seed}/alpha=0.05")
    R.write_atomic(path, {"format": R.FORMAT, "version": R.VERSION, "table": "runs", "row": {"status": "done"}})
    opts = BenchOptions(seeds=(0,), methods=("ls",), tune=True)  # a bench's: no seed of its own
    with pytest.raises(ValueError, match="a 'runs' result where a 'tuning' one was expected"):
        SP.status_lines(tmp_path, PRESETS["smoke"], opts)
    path.unlink()
    lines, _ = SP.status_lines(tmp_path, PRESETS["smoke"], opts)
    assert lines[0].split()[0] == f"smoke/ce/{seed}/default"


def test_submit_tune_with_everything_tuned_submits_no_selection_and_the_bench_waits_for_none(monkeypatch, tmp_path):
    from calibkit.bench.grid import PRESETS
    from calibkit.bench.tune import Tuner

    calls = []
    monkeypatch.setattr(SP, "submit", lambda out, arrays, argv, opts, dry_run: calls.append(arrays) or {"j": 1})
    bench = (tmp_path, _tuned_at_7(), BenchOptions(device="cpu", methods=("ls",), seeds=(3,), tune=True), SLURM, ARGV)
    files = R.ResultFiles(tmp_path)
    tuner = Tuner(PRESETS["smoke"], tmp_path, methods=["ls"], seed=7, device="cpu", log=lambda *a: None, store=files)
    items = [(tuner.key(m, v), m, v) for m, v in tuner.items()]
    tuner.close()
    keys = [key for key, _, _ in items]
    for key, method, values in items:
        files.claim(key, table="tuning", preset="smoke", method=method, seed=7, hparams=values)
        files.finish(key, table="tuning", metrics={})
    # every candidate done but none selected: only the selection job, and the bench after it
    SP.submit_bench(*bench)
    assert [(a.stage, a.after) for a in calls[-1]] == [("tune-select", []), ("ce", [("afterok", "tune-select")]),
                                                       ("train", [("afterok", "tune-select")])]
    files.select_candidate("smoke", "ls", 7, keys[1], {})
    SP.submit_bench(*bench)
    assert [(a.stage, a.after) for a in calls[-1]] == [("ce", []), ("train", [])]  # nothing to wait for
    n = len(calls)
    tune = TuneOptions(device="cpu", methods=("ls",), seed=7)
    assert SP.submit_tune(tmp_path, PRESETS["smoke"], tune, SLURM, ARGV) == {} and len(calls) == n  # nothing at all
