"""The executors of calibkit.pipeline.executor: each runs the same preflight before it starts anything."""

import pytest

import calibkit.pipeline.run as pipeline_run
from calibkit.bench.slurm import SlurmOptions
from calibkit.cli import main
from calibkit.errors import UserError
from calibkit.pipeline import BenchOptions, BenchSpec, Inline, LocalProcesses, SlurmArrays, TuneOptions
from calibkit.pipeline import executor as ex


class Refused(UserError):
    pass


@pytest.fixture
def checks(monkeypatch):
    """The checks each executor asked for (then refused: nothing runs past them)."""
    seen = []

    def refuse(name):
        def check(preset, out, **kw):
            seen.append((name, preset.name, str(out), kw))
            raise Refused("refused by the preflight")
        return check

    monkeypatch.setattr(pipeline_run, "check_bench", refuse("bench"))
    monkeypatch.setattr(pipeline_run, "check_tune", refuse("tune"))
    return seen


def _local(monkeypatch):
    started, cancelled = [], []
    monkeypatch.setattr(ex, "start_workers", lambda argv, n, store=None: started.append(n) or ["w"] * n)
    monkeypatch.setattr(ex, "cancel_workers", lambda procs: cancelled.append(len(procs)))
    return LocalProcesses(3), started, cancelled


@pytest.mark.parametrize("spec", [
    BenchSpec("bench", "smoke", "o", BenchOptions(seeds=(0, 2), methods=("ls",), data_dir="d", device="cpu")),
    BenchSpec("tune", "smoke", "o", TuneOptions(methods=("ls",), seed=3, data_dir="d", device="cpu")),
], ids=["bench", "tune"])
def test_every_executor_runs_the_same_preflight_first(monkeypatch, tmp_path, checks, spec):
    spec = BenchSpec(spec.command, spec.preset, tmp_path / "o", spec.options)
    local, started, cancelled = _local(monkeypatch)
    for executor in (Inline(), local, SlurmArrays(SlurmOptions().validate(), dry_run=True)):
        with pytest.raises(Refused):
            executor.execute(spec)
    assert len(checks) == 3 and checks[0] == checks[1] == checks[2], checks
    name, preset, out, kw = checks[0]
    assert (name, preset, out, kw["data_dir"], kw["device"]) == (spec.command, "smoke", str(tmp_path / "o"), "d", "cpu")
    assert started == [2] and cancelled == [2]  # the waiting workers were told the bench will not run
    assert not (tmp_path / "o").exists()  # nothing written, no job script either


def test_a_released_worker_runs_the_preflight_too(monkeypatch, tmp_path, checks):
    from calibkit.commands import bench as bench_cmd
    from calibkit.commands import tune as tune_cmd

    for command, module, options in (("bench", bench_cmd, BenchOptions()), ("tune", tune_cmd, TuneOptions())):
        spec = BenchSpec(command, "smoke", tmp_path / "o", options)
        monkeypatch.setattr(module, "await_spec", lambda args, name, spec=spec: spec)
        assert main([command, "--out", str(tmp_path / "o"), "--spec", "s.json", "--await-start"]) == 1
        assert checks[-1][0] == command
    assert len(checks) == 2


def test_a_released_worker_never_writes_the_report_whatever_its_spec_says(monkeypatch, tmp_path):
    """LocalProcesses' workers get the caller's spec, whose options may ask for the report (the Python
    API's default): only the caller writes it, once every run is done."""
    from calibkit.commands import bench as bench_cmd
    from calibkit.commands import tune as tune_cmd

    ran = []

    def execute(self, spec):
        ran.append(spec)
        raise Refused("stop here")

    monkeypatch.setattr(Inline, "execute", execute)
    for command, module, options in (("bench", bench_cmd, BenchOptions()), ("tune", tune_cmd, TuneOptions())):
        assert options.report  # the Python API's default
        spec = BenchSpec(command, "smoke", tmp_path / "o", options)
        monkeypatch.setattr(module, "await_spec", lambda args, name, spec=spec: spec)
        assert main([command, "--out", str(tmp_path / "o"), "--spec", "s.json", "--await-start"]) == 1
    assert [(s.command, s.options.report) for s in ran] == [("bench", False), ("tune", False)]


def test_slurm_refuses_what_its_tasks_would_not_do_and_checks_a_tuning_too(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["bench", "--preset", "smoke", "--out", str(out), "--executor", "slurm", "--dry-run",
                 "--csm-build"]) == 1
    assert "--csm-build builds CSM's generated set" in capsys.readouterr().err
    # a tuning's submission is checked like a local tuning: a data folder that does not exist
    assert main(["tune", "--preset", "smoke", "--out", str(out), "--executor", "slurm", "--dry-run", "--methods",
                 "ls", "--data-dir", str(tmp_path / "nowhere")]) == 1
    assert "nowhere" in capsys.readouterr().err
    assert not out.exists()
