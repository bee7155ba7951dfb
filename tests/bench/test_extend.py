"""``calibkit tune`` finishes the job: grid extension at an edge, axes with no effect, the preflight,
``--workers``, and re-tuning in a bench directory."""

from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest
import torch

from calibkit.bench.attempts import Counts
from calibkit.bench.extend import extended_space, meta_key, next_value, no_effect_axes, plan
from calibkit.bench.grid import BENCH_METHODS, BOUNDS, PRESETS, Axis, Bound, Preset, bound_for
from calibkit.bench.producers import RunFactory
from calibkit.bench.space import current_values
from calibkit.store import Store
from tests.conftest import PYTHON, ROOT

# ------------------------------------------------------------------------------ the step rule


def test_next_value_geometric_linear_and_rounded():
    free = Bound()
    # outer ratio 0.2 / 0.1 = 2 >= 1.5: geometric; 0.03 / 0.01 = 3: 0.01 / 3 = 0.00333 (3 digits)
    assert next_value((0.01, 0.03, 0.05, 0.1, 0.2), "high", free) == (0.4, "geometric")
    assert next_value((0.01, 0.03, 0.05, 0.1, 0.2), "low", free) == (0.00333, "geometric")
    # 4 / 3 < 1.5: linear, one more step of 1
    assert next_value((1.0, 2.0, 3.0, 4.0), "high", free) == (5.0, "linear")
    # a grid through zero is never geometric: 2 - (4 - 2) = 0, then 0 - 2 = -2
    assert next_value((0.0, 2.0, 4.0), "low", free) == (-2.0, "linear")
    assert next_value((15.0, 20.0), "high", free) == (25.0, "linear")  # 20 / 15 = 1.33
    assert next_value((5.0,), "high", free) == (None, "fewer than 2 values")


def test_next_value_never_passes_a_bound():
    # closed bound: the step 1 -> 0.5 would pass 0.6, so the bound itself
    assert next_value((1.0, 2.0, 3.0), "low", Bound(0.6)) == (0.6, "bound")
    # open bound: half way from the edge to it
    assert next_value((1.0, 2.0, 3.0), "low", Bound(0.6, low_open=True)) == (0.8, "half-way")
    # LS alpha < 1: 0.3 -> 0.9 (ratio 3), then 2.7 is out, so (0.9 + 1) / 2
    unit = BOUNDS["loss.alpha"]
    assert next_value((0.1, 0.3), "high", unit) == (0.9, "geometric")
    assert next_value((0.3, 0.9), "high", unit) == (0.95, "half-way")
    # an edge on a closed bound does not move: the margin grid starts at 0
    assert next_value(BENCH_METHODS["mbls"].space["loss.margin"].values, "low", BOUNDS["loss.margin"]) == (
        None, "on its bound [0, inf)")
    assert bound_for("maccal.r_min").admits(0.5) and not bound_for("maccal.r_min").admits(1.0)
    assert not bound_for("maccal.r_min").admits(0.0)
    # an address without a declared bound stays positive when its grid is
    assert bound_for("train.lr", Axis((0.01, 0.1), 0.05)) == Bound(0.0, low_open=True)
    assert bound_for("train.lr", Axis((-1.0, 1.0), 0.0)) == Bound()


def test_every_declared_axis_has_a_bound_its_grid_respects():
    for method, spec in BENCH_METHODS.items():
        for address, axis in spec.space.items():
            assert address in BOUNDS, f"{method}: {address} has no hard bound"
            assert all(BOUNDS[address].admits(v) for v in axis.values), (method, address)


def test_plan_adds_one_value_per_edge_axis_at_most_twice():
    space = {"loss.alpha": Axis((0.01, 0.1, 0.3), 0.05), "loss.beta": Axis((1.0, 2.0, 3.0), 2.0)}
    rec, notes = plan(space, None, {"loss.alpha": 0.3, "loss.beta": 2.0})
    assert rec["added"] == {"loss.alpha": [0.9]} and rec["steps"] == {"loss.alpha": ["geometric"]}
    assert rec["base"] == {"loss.alpha": [0.01, 0.1, 0.3], "loss.beta": [1.0, 2.0, 3.0]}
    assert notes == ["alpha: 0.3 is on the high edge; 0.9 added (geometric step)"]
    assert extended_space(space, rec)["loss.alpha"].values == (0.01, 0.1, 0.3, 0.9)
    rec2, _ = plan(space, rec, {"loss.alpha": 0.9, "loss.beta": 1.0})  # both on an edge now
    assert rec2["added"] == {"loss.alpha": [0.9, 0.95], "loss.beta": [0.5]}
    rec3, notes = plan(space, rec2, {"loss.alpha": 0.95, "loss.beta": 2.0})
    assert rec3 is rec2, "the third extension of an axis is refused"
    assert notes == ["alpha=0.95 is on the high edge after 2 extension(s): not extended further"]
    # inside the grid: nothing added, the record is returned as it was
    assert plan(space, None, {"loss.alpha": 0.1, "loss.beta": 2.0}) == (None, [])
    # a record made for another grid is ignored
    other = {"loss.alpha": Axis((0.01, 0.1, 0.2), 0.05), "loss.beta": space["loss.beta"]}
    assert extended_space(other, rec2) == other
    assert plan(space, rec, {"loss.alpha": 0.3, "loss.beta": 2.0}, limit=0)[0] is rec


def _logits_dir(path, logits):
    from calibkit import rundir

    path.mkdir(parents=True, exist_ok=True)
    rundir.write_tensors(path / rundir.LOGITS, {"val_logits": logits, "val_labels": torch.zeros(len(logits)).long(),
                                               "test_logits": torch.full((3, 2), float("nan"))})
    return str(path)


def test_no_effect_means_bit_identical_validation_logits(tmp_path):
    space = {"maccal.eta": Axis((1.0, 2.0), 2.0), "maccal.r_min": Axis((0.05, 0.1, 0.3), 0.1)}
    base = torch.randn(20, 3, generator=torch.Generator().manual_seed(0))
    rows = []
    for eta in (1.0, 2.0):
        for r in (0.05, 0.1, 0.3):  # r_min changes nothing; eta scales the logits
            rows.append({"hparams": {"maccal.eta": eta, "maccal.r_min": r},
                         "run_dir": _logits_dir(tmp_path / f"{eta}-{r}", base * eta)})
    assert no_effect_axes(space, rows) == ["maccal.r_min"]
    # one ulp of difference in one candidate's logits is an effect
    bumped = base * 2.0
    bumped[0, 0] = torch.nextafter(bumped[0, 0], torch.tensor(float("inf")))
    rows[-1]["run_dir"] = _logits_dir(tmp_path / "bumped", bumped)
    assert no_effect_axes(space, rows) == []
    # an unfinished axis (a value without its candidate) gets no verdict
    assert no_effect_axes(space, rows[:2]) == []


# ------------------------------------------------------------------------------ the tuner


TINY = Preset(name="tinyx", dataset="digits", model="mlp", seeds=(0,), tune_seed=7, num_threads=1,
              train=dict(epochs=2, batch_size=64, lr=0.05, val_size=200, augment=False), robust_n=40,
              severities=(1,), n_boot=10)


def fake_train(self, method, seed, run_dir, csm_data=None):
    """No training: validation logits whose confidence grows with LS's alpha (all correct, so
    ECE = 1 - mean confidence falls as alpha grows) and with nothing else."""
    from calibkit import rundir

    alpha = current_values(self.preset, method).get("loss.alpha", 0.0) if method == "ls" else 0.0
    labels = torch.arange(60) % 3
    logits = torch.nn.functional.one_hot(labels, 3).float() * (1.0 + 4.0 * alpha)
    run_dir.mkdir(parents=True, exist_ok=True)
    rundir.write_tensors(run_dir / rundir.LOGITS, {"val_logits": logits, "val_labels": labels})
    return {"run_dir": run_dir, "train_time_s": 0.0}


def test_tune_extends_an_edge_twice_records_it_and_shows_it(tmp_path, monkeypatch, capsys):
    from calibkit.cli import main
    from calibkit.report.tuning import tuning_text

    monkeypatch.setattr(RunFactory, "train", fake_train)
    monkeypatch.setitem(PRESETS, "tinyx", TINY)
    monkeypatch.setitem(BENCH_METHODS, "ls",
                        dataclasses.replace(BENCH_METHODS["ls"], space={"loss.alpha": Axis((0.01, 0.1, 0.3), 0.05)}))
    assert main(["tune", "--preset", "tinyx", "--methods", "ls", "--out", str(tmp_path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    with Store(tmp_path / "runs.db", readonly=True) as s:
        rows = s.candidates("tinyx", "ls")
        record = json.loads(s.get_meta(meta_key("tinyx", 7, "ls")))
    # 0.3 on the edge -> 0.9 (ratio 3); 0.9 on the edge -> 2.7 passes alpha < 1 -> half way, 0.95
    assert sorted(r["hparams"]["loss.alpha"] for r in rows) == [0.01, 0.1, 0.3, 0.9, 0.95]
    assert [r["attempts"] for r in rows] == [1] * 5  # each candidate trained once
    assert [r["hparams"]["loss.alpha"] for r in rows if r["selected"]] == [0.95]
    assert (record["added"] == {"loss.alpha": [0.9, 0.95]}
            and record["steps"] == {"loss.alpha": ["geometric", "half-way"]})
    assert record["no_effect"] == []
    assert record["notes"] == ["alpha=0.95 is on the high edge after 2 extension(s): not extended further"]
    assert "tune ls: alpha: 0.3 is on the high edge; 0.9 added (geometric step)" in out
    assert "tune ls: alpha: 0.9 is on the high edge; 0.95 added (half-way step)" in out
    table = tuning_text(tmp_path, "tinyx")
    assert "alpha +0.9, +0.95" in table and "on the grid edge (loss.alpha)" in table
    # the same command again: nothing retrains, nothing more is added
    assert main(["tune", "--preset", "tinyx", "--methods", "ls", "--out", str(tmp_path), "--device", "cpu"]) == 0
    assert "candidate(s) done here, 6 skipped" in capsys.readouterr().out
    with Store(tmp_path / "runs.db", readonly=True) as s:
        assert len(s.candidates("tinyx", "ls")) == 5
    # --max-extensions 0 in a fresh directory: the declared grid only
    fresh = tmp_path / "fresh"
    assert main(["tune", "--preset", "tinyx", "--methods", "ls", "--out", str(fresh), "--device", "cpu",
                 "--max-extensions", "0"]) == 0
    with Store(fresh / "runs.db", readonly=True) as s:
        assert sorted(r["hparams"]["loss.alpha"] for r in s.candidates("tinyx", "ls")) == [0.01, 0.1, 0.3]


def test_tune_reports_an_axis_with_no_effect(tmp_path, monkeypatch):
    from calibkit.bench.tune import Tuner
    from calibkit.report.tuning import tuning_text

    monkeypatch.setattr(RunFactory, "train", fake_train)
    # focal's gamma does not reach fake_train's logits: every candidate is bit-identical
    monkeypatch.setitem(BENCH_METHODS, "focal", dataclasses.replace(BENCH_METHODS["focal"], space={
        "loss.gamma": Axis((1.0, 2.0, 3.0), 2.0)}))
    tuner = Tuner(TINY, tmp_path, methods=["focal"], num_threads=1, log=lambda *a, **k: None)
    try:
        tuner.run()
    finally:
        tuner.close()
    with Store(tmp_path / "runs.db", readonly=True) as s:
        record = json.loads(s.get_meta(meta_key("tinyx", 7, "focal")))
        chosen = [r["hparams"] for r in s.candidates("tinyx", "focal") if r["selected"]]
    assert record["no_effect"] == ["loss.gamma"] and record["added"] == {}
    assert chosen == [{"loss.gamma": 2.0}]  # all tied: the published value wins, so no edge
    assert "no effect: loss.gamma (bit-identical validation logits)" in tuning_text(tmp_path, "tinyx")


# ------------------------------------------------------------------------------ command line


def test_a_tune_that_cannot_read_its_data_exits_1_and_creates_nothing(tmp_path, cli_env):
    out = tmp_path / "t"
    res = subprocess.run([PYTHON, "-m", "calibkit", "tune", "--preset", "smoke", "--methods", "ls", "--out", str(out),
                          "--data-dir", str(tmp_path / "no-such-folder"), "--workers", "2"],
                         env=cli_env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "no-such-folder" in lines[0], res.stderr
    assert not out.exists() and "Traceback" not in res.stderr


def test_tune_worker_arguments_are_the_same_tuning(tmp_path):
    import argparse

    from calibkit.commands import tune as tune_cmd
    from calibkit.commands.parsers import tune as tune_parser
    from calibkit.commands.presetargs import spec_from_args
    from calibkit.pipeline.executor import worker_argv

    p = argparse.ArgumentParser()
    tune_parser.register(p.add_subparsers())
    args = p.parse_args(["tune", "--preset", "smoke", "--out", str(tmp_path), "--methods", "ls", "mbls", "--seed",
                         "3", "--data-dir", "d", "--keep", "last", "--num-threads", "1", "--max-extensions", "1",
                         "--workers", "3"])
    spec = spec_from_args(args, "tune", lambda: tune_cmd.options_from_args(args))
    spec.write()
    child = p.parse_args(worker_argv(spec))
    assert child.workers == 1 and child.await_start and not args.await_start
    opts = spec_from_args(child, "tune", None).options
    assert opts == spec.options and (opts.methods, opts.seed, opts.data_dir, opts.keep, opts.num_threads,
                                     opts.max_extensions) == (("ls", "mbls"), 3, "d", "last", 1, 1)


@pytest.mark.slow
def test_two_tune_workers_train_each_candidate_once_and_select_as_one(tmp_path, cli_env):
    def tune(out, workers):
        res = subprocess.run([PYTHON, "-m", "calibkit", "tune", "--preset", "smoke", "--methods", "ls", "focal",
                              "--out", str(out), "--workers", str(workers), "--num-threads", "1", "--device", "cpu"],
                             env=cli_env, capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        with Store(out / "runs.db", readonly=True) as s:
            rows = s.candidates("smoke", status=None)
            meta = {m: s.get_meta(meta_key("smoke", 100, m)) for m in ("ls", "focal")}
        return rows, meta

    two, meta2 = tune(tmp_path / "two", 2)
    one, meta1 = tune(tmp_path / "one", 1)
    assert all(r["status"] == "done" and r["attempts"] == 1 for r in two)  # each trained exactly once
    assert len({r["cand_key"] for r in two}) == len(two)
    assert len({r["owner"].rsplit(":", 1)[0] for r in two}) == 2, "both processes trained candidates"
    # the same candidates (extensions included), the same validation numbers, the same selection
    pick = lambda rows: {r["cand_key"]: (r["metrics"], r["selected"]) for r in rows}  # noqa: E731
    assert pick(two) == pick(one) and meta2 == meta1


# ------------------------------------------------------------------------------ re-tuning a bench


def test_a_re_tuned_method_runs_again_and_the_report_shows_only_the_selection(tmp_path, one_thread):
    from calibkit.bench.runner import Bench
    from calibkit.bench.space import apply_values
    from calibkit.bench.tune import Criterion
    from calibkit.report import build_report

    tiny = dataclasses.replace(TINY, name="tiny")

    def bench(preset):
        b = Bench(preset, tmp_path, methods=["ls"], num_threads=1, log=lambda *a, **k: None)
        try:
            return b.run()
        finally:
            b.close()

    assert bench(tiny) == Counts(done=2, skipped=0, failed=0)  # LS at the preset's alpha 0.05
    with Store(tmp_path / "runs.db") as s:
        before = s.get("tiny/ls/0")
        # a tuning in this directory selects alpha 0.2 (on the selection seed 7)
        s.claim("tiny/ls/7/alpha=0.2", table="tuning", preset="tiny", method="ls", seed=7, hparams={"loss.alpha": 0.2})
        s.finish("tiny/ls/7/alpha=0.2", table="tuning", metrics={"acc": 0.9, "ece": 0.01})
        s.select_candidate("tiny", "ls", 7, "tiny/ls/7/alpha=0.2", Criterion().to_dict())
    # a bench at another value than the selection is still refused, and says what was selected
    with pytest.raises(ValueError, match=r"one set of values per bench.*selected \{'loss.alpha': 0.2\}"):
        bench(apply_values(tiny, "ls", {"loss.alpha": 0.1}))
    # at the selection: exactly LS runs again (CE is unchanged), the old run is kept aside
    assert bench(apply_values(tiny, "ls", {"loss.alpha": 0.2})) == Counts(done=1, skipped=1, failed=0)
    with Store(tmp_path / "runs.db", readonly=True) as s:
        old, new = s.get("tiny/ls/0~alpha=0.05"), s.get("tiny/ls/0")
    assert old["metrics"] == before["metrics"] and old["finished_at"] == before["finished_at"]
    assert (old["run_dir"].endswith("seed0~alpha=0.05")
            and (tmp_path / "runs/tiny/ls/seed0~alpha=0.05/config.json").is_file())
    assert new["config"]["hparams"] == {"loss.alpha": 0.2} and new["run_dir"].endswith("ls/seed0")
    rep = build_report(tmp_path, figures=False)
    assert [r["run_key"] for r in rep["summary"]["ls"]["runs"]] == ["tiny/ls/0"]  # one value per method
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| LS | alpha=0.2 | ls:alpha=0.2 | - | tuned here |" in md and "| alpha=0.05 |" not in md
    assert "| runs not shown | 1 run(s) at values other than this directory's selection (kept in runs.db): " \
           "tiny/ls/0~alpha=0.05 |" in md
    # and running it again changes nothing
    assert bench(apply_values(tiny, "ls", {"loss.alpha": 0.2})) == Counts(done=0, skipped=2, failed=0)


def test_provenance_names_the_committed_tuning_only_for_the_shipped_presets_own_runs():
    from calibkit.report.protocol import _provenance

    fmnist = {"dataset": "fmnist", "model": "mlp"}
    assert "docs/tuning/default.json" in _provenance("default", [fmnist, fmnist])
    for preset, recs in (("default", [fmnist, {"dataset": "imagefolder", "model": "mlp"}]), ("mine", [fmnist]),
                         ("smoke", [fmnist])):
        said = _provenance(preset, recs)
        assert "docs/" not in said and "no tuning run in this directory" in said
