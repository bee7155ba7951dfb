"""``calibkit.pipeline.run``: the bench and the tuning as library calls, checked against the store
they record into and against the command line."""

import dataclasses

import pytest

from calibkit.bench.attempts import Counts
from calibkit.bench.grid import PRESETS
from calibkit.bench.presetfile import dump_preset, read_effective
from calibkit.errors import UserError
from calibkit.pipeline import BenchOptions, TuneOptions, load, run_bench, run_tune
from calibkit.store import Store

QUIET = dict(device="cpu", num_threads=1, log=lambda *a, **k: None)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The smoke preset cut to seconds (one epoch on 300 images, a small evaluation), with a
    two-value grid for LS, written as a preset file."""
    smoke = PRESETS["smoke"]
    preset = dataclasses.replace(smoke, name="tiny", train={**smoke.train, "epochs": 1, "train_subset": 300,
                                                            "val_size": 100},
                                 maccal={"epochs": 1}, robust_n=50, severities=(), n_boot=20)
    path = tmp_path_factory.mktemp("preset") / "tiny.toml"
    path.write_text(dump_preset(preset) + '\n[space.ls]\n"loss.alpha" = [0.05, 0.1]\n')
    return path


def _rows(out, name="tiny"):
    store = Store(out / "runs.db", readonly=True)
    try:
        return {r["run_key"]: r for r in store.runs(name, status=None)}
    finally:
        store.close()


def test_a_preset_is_an_object_a_shipped_name_or_a_file(tiny):
    assert load("smoke") is PRESETS["smoke"]
    from_file = load(tiny)  # a pathlib.Path: always a file
    assert from_file.name == "tiny" and load(str(tiny)) == from_file
    assert load(from_file, keep="last").keep == "last"
    with pytest.raises(UserError, match="unknown preset 'smok'"):
        load("smok")
    with pytest.raises(UserError, match="preset: expected a Preset"):
        load(3)


@pytest.mark.parametrize("options", [dict(methods=("nosuch",)), dict(seeds=(0,), keep="last", methods=("ls", "x"))])
def test_a_bench_that_cannot_run_writes_nothing(tiny, tmp_path, options):
    out = tmp_path / "out"
    with pytest.raises(UserError, match="unknown method"):
        run_bench(tiny, out, BenchOptions(**options, **QUIET))
    assert not out.exists()
    with pytest.raises(UserError, match="repeated seed"):  # refused before run_bench is reached
        run_bench(tiny, out, BenchOptions(seeds=(0, 0), **QUIET))
    assert not out.exists()


def test_counts_are_what_the_store_records_and_a_second_call_skips(tiny, tmp_path):
    out = tmp_path / "out"
    opts = BenchOptions(methods=("ls",), seeds=(0,), report=False, **QUIET)
    first = run_bench(tiny, out, opts)
    rows = _rows(out)
    assert sorted(rows) == ["tiny/ce/0", "tiny/ls/0"]  # CE, the reference, always runs
    assert first.counts == Counts(done=2, skipped=0, failed=0) and first.failures == []
    assert all(r["status"] == "done" for r in rows.values())
    assert first.report is None and first.tuning is None and first.main
    assert first.store == str(out / "runs.db")
    assert read_effective(out, "tiny") == first.preset == load(tiny)  # the effective preset is recorded
    second = run_bench(tiny, out, dataclasses.replace(opts, report=True, figures=False))
    assert second.counts == Counts(done=0, skipped=2, failed=0)
    assert _rows(out) == rows  # nothing retrained or rewritten
    assert second.report["paths"]["md"].is_file() and "Ranking by test ECE" in second.report["text"]


def test_the_command_line_records_what_the_function_records(tiny, tmp_path, capsys):
    from calibkit.cli import main

    run_bench(tiny, tmp_path / "lib", BenchOptions(methods=("ls",), seeds=(0,), report=False, **QUIET))
    assert main(["bench", "--preset", str(tiny), "--out", str(tmp_path / "cli"), "--methods", "ls", "--seeds", "0",
                 "--device", "cpu", "--num-threads", "1", "--no-report"]) == 0
    assert "bench tiny: 2 run(s) done, 0 skipped (finished earlier), 0 failed" in capsys.readouterr().out
    lib, cli = _rows(tmp_path / "lib"), _rows(tmp_path / "cli")
    assert sorted(lib) == sorted(cli)
    for key in lib:
        for col in ("status", "method", "seed", "config", "metrics"):
            assert lib[key][col] == cli[key][col], (key, col)
    assert read_effective(tmp_path / "lib", "tiny") == read_effective(tmp_path / "cli", "tiny")


def test_tune_then_bench_at_the_selection(tiny, tmp_path):
    out = tmp_path / "out"
    tuned = run_tune(tiny, out, TuneOptions(methods=("ls",), max_extensions=0, **QUIET))
    store = Store(out / "runs.db", readonly=True)
    cands = store.candidates("tiny", "ls")
    store.close()
    assert sorted(c["hparams"]["loss.alpha"] for c in cands) == [0.05, 0.1]
    assert tuned.counts.done == 3 and tuned.counts.failed == 0  # CE (the reference) and the grid
    (chosen,) = [c["hparams"] for c in cands if c["selected"]]
    assert tuned.selection == {"ls": chosen} and tuned.report.json.is_file()
    assert f"alpha={chosen['loss.alpha']:g}" in tuned.report.text.split("\nLS ", 1)[1].split("\n")[0]
    bench = run_bench(tiny, out, BenchOptions(methods=("ls",), seeds=(0,), tune=True, max_extensions=0,
                                              report=False, **QUIET))
    assert bench.tuning.counts == Counts(done=0, skipped=3, failed=0)  # the selection is reused
    assert bench.preset.loss_for("ls") == f"ls:alpha={chosen['loss.alpha']}"
    assert bench.counts.done == 2 and read_effective(out, "tiny") == bench.preset


def test_the_workers_seam_releases_before_the_first_run_and_counts_runs_by_their_final_state(tiny, tmp_path):
    out, seen = tmp_path / "out", []

    class Peers:  # what LocalProcesses gives the pipeline (calibkit.pipeline.run.Peers)
        def release(self):  # the checks passed and the preset is recorded; no run has started
            seen.append(("release", read_effective(out, "tiny") is not None, _rows(out)))

        def reaper(self):
            seen.append(("reaper",))
            return None

        def join(self, interrupted):
            seen.append(("join", interrupted, sorted(_rows(out))))
            return ["worker worker-1 exited with status 1; see its log"]

    result = run_bench(tiny, out, BenchOptions(seeds=(0,), methods=("ce",), report=False, **QUIET), peers=Peers())
    assert seen == [("release", True, {}), ("reaper",), ("join", False, ["tiny/ce/0"])]
    # the worker failed, but every run of the bench is done: no failed run (the worker is reported)
    assert result.counts == Counts(done=1, skipped=0, failed=0)
    assert result.worker_failures == ["worker worker-1 exited with status 1; see its log"] and result.failures == []
