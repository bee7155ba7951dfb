"""``calibkit tune``: search spaces, the selection rule, no test data, resume."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest
import torch

from calibkit.bench import grid, tune
from calibkit.bench.attempts import Counts
from calibkit.bench.grid import KEEP_POLICIES, MARGINS, METHODS, PRESETS, TARGETS, Axis, Preset, with_keep
from calibkit.bench.producers import RunFactory
from calibkit.bench.space import apply_values, at_edge, candidates, current_values, with_loss_params
from calibkit.bench.tune import Criterion, Tuner, cand_key, select, slug, val_metrics
from calibkit.store import Store

# The starting grids of the tuning protocol (spec: methods.md section 6), written out once more so
# that a change of a grid in calibkit/bench/grid.py is a deliberate one: a grid may be widened
# (a selection landed on its edge), never narrowed.
SPEC_GRIDS = {
    ("ls", "loss.alpha"): (0.01, 0.03, 0.05, 0.1, 0.2),
    ("focal", "loss.gamma"): (1, 2, 3, 4),
    ("dfl", "loss.gamma"): (1, 2, 3, 5),
    ("ecp", "loss.beta"): (0.05, 0.1, 0.2, 0.5),
    ("mbls", "loss.margin"): (0, 2, 4, 6, 8, 10, 15, 20),
    ("fedlas_mbls", "loss.margin"): (0, 2, 4, 6, 8, 10, 15, 20),
    ("acls", "loss.margin"): (4, 6, 10),
    ("fedlas_ls", "loss.alpha"): (0.025, 0.05, 0.1),
    ("fedlas_ls", "loss.beta"): (0.5, 1, 4),
    ("mixup", "train.mix_alpha"): (0.1, 0.2, 0.4, 1.0),
    ("regmixup", "train.mix_alpha"): (5, 10, 20),
    # CSM: the starting grid's 8 was left out of the searched grid: the seed-0 ablation
    # (docs/csm.md, validation only) had it the worst of 1, 2.3, 4, 8, and 0.5 was added below 1.
    ("csm", "csm.sharpness"): (1, 2.3, 4),
    ("csm", "train.csm_weight"): (1,),
}


# ------------------------------------------------------------------------------ search spaces


def _param(loss, name):
    """A loss module's hyperparameter, whether a plain attribute or in its ``hparams``."""
    hp = getattr(loss, "hparams", None)
    return float(hp[name]) if isinstance(hp, dict) and name in hp else float(getattr(loss, name))


@pytest.mark.parametrize("method", list(METHODS))
def test_search_space_is_a_valid_literal(method):
    from calibkit.config import TrainConfig
    from calibkit.losses import build

    spec = METHODS[method]
    if method in ("ce", "flsd", "adafocal"):
        assert spec.space == {}, f"{method} has nothing to tune"
        return
    assert spec.space, f"{method} declares no search space"
    for address, axis in spec.space.items():
        target, _, name = address.partition(".")
        assert target in TARGETS and name
        values = [float(v) for v in axis.values]
        assert values == sorted(set(values)) and len(values) >= 2, "a grid is ascending, without repeats"
        assert min(values) <= axis.default <= max(values), "the published value lies inside the grid"
        if (method, address) in SPEC_GRIDS:
            assert {float(v) for v in SPEC_GRIDS[method, address]} <= set(values)
        if target == "loss":
            # the published value is the loss's own default, so current_values() tells the truth
            assert _param(build(spec.loss, num_classes=10), name) == pytest.approx(axis.default)
            for v in values:  # every candidate is a loss calibkit can build, with that value
                assert _param(build(with_loss_params(spec.loss, {name: v}), num_classes=10), name) == pytest.approx(v)
        elif target == "train":
            assert name in {f.name for f in dataclasses.fields(TrainConfig)}
        elif target == "maccal":
            from calibkit.methods.maccal import run_maccal

            param = inspect.signature(run_maccal).parameters[name]
            assert param.default == pytest.approx(axis.default)
        else:
            assert name == "sharpness" and axis.default == 4.0  # the paper's value for 10 classes


def test_mbls_and_fedlas_mbls_search_one_margin_grid_with_lambda_fixed():
    from calibkit.losses import build

    assert METHODS["mbls"].space["loss.margin"].values is MARGINS
    assert METHODS["fedlas_mbls"].space["loss.margin"].values is MARGINS
    assert list(METHODS["mbls"].space) == ["loss.margin"]  # lambda is not searched
    for m in MARGINS:
        loss = build(with_loss_params(METHODS["mbls"].loss, {"margin": m}))
        assert _param(loss, "lam") == 0.1 and _param(loss, "margin") == m


def test_candidates_apply_values_and_current_values():
    assert candidates("ce") == [{}]
    fed = candidates("fedlas_ls")
    assert len(fed) == 15 and fed[0] == {"loss.alpha": 0.025, "loss.beta": 0.1}
    assert fed[-1] == {"loss.alpha": 0.1, "loss.beta": 4.0}
    p = PRESETS["cifar10"]
    q = apply_values(p, "fedlas_mbls", {"loss.margin": 15.0})
    assert q.losses["fedlas_mbls"] == "fedlas_mbls:alpha=0.1,beta=0.5,margin=15,theta=0.95"
    assert p.losses["fedlas_mbls"].endswith("margin=6,theta=0.95"), "the preset itself is unchanged"
    q = apply_values(q, "regmixup", {"train.mix_alpha": 5.0})
    assert q.train_by_method["regmixup"] == {"mix_alpha": 5.0} and p.train_by_method["regmixup"] == {"mix_alpha": 20.0}
    q = apply_values(q, "maccal", {"maccal.eta": 4.0, "maccal.r_min": 0.3})
    assert q.maccal == {"eta": 4.0, "r_min": 0.3}
    assert current_values(q, "fedlas_mbls") == {"loss.margin": 15.0}
    assert current_values(q, "maccal") == {"maccal.eta": 4.0, "maccal.r_min": 0.3}
    # the published defaults
    assert current_values(PRESETS["smoke"], "csm") == {"csm.sharpness": 4.0, "train.csm_weight": 1.0}
    with pytest.raises(ValueError, match="bad search-space address"):
        apply_values(p, "ls", {"alpha": 0.1})
    assert slug({"loss.beta": 4.0, "loss.alpha": 0.025}) == "alpha=0.025,beta=4" and slug({}) == "default"
    assert cand_key("default", "mbls", 100, {"loss.margin": 6.0}) == "default/mbls/100/margin=6"


def test_every_preset_holds_one_checkpoint_policy():
    for preset in PRESETS.values():
        assert preset.keep in KEEP_POLICIES
        assert not any("keep" in t for t in preset.train_by_method.values())
        assert preset.tune_seed not in preset.seeds, "selection runs are none of the evaluated runs"
        for method, t in preset.train_by_method.items():  # every method has CE's training budget
            budget = {"epochs", "milestones", "train_subset", "val_size", "batch_size", "data", "model"}
            assert not budget & set(t), f"{preset.name}: {method} changes the training budget"
    assert with_keep(PRESETS["smoke"], "last").train["keep"] == "last"
    with pytest.raises(ValueError, match="unknown checkpoint policy"):
        with_keep(PRESETS["smoke"], "best")


# ------------------------------------------------------------------------------ the selection rule


def _c(values, acc, ece):
    return {"hparams": values, "metrics": {"acc": acc, "ece": ece}}


def test_selection_is_the_argmin_among_accurate_candidates():
    space = {"loss.margin": Axis((0.0, 5.0, 10.0, 20.0), 10.0)}
    cands = [_c({"loss.margin": 0.0}, 0.900, 0.050),
             _c({"loss.margin": 5.0}, 0.885, 0.010),   # lowest ECE, but 1.5 points below 0.900: excluded
             _c({"loss.margin": 10.0}, 0.8915, 0.030),  # 0.85 points below: eligible
             _c({"loss.margin": 20.0}, 0.895, 0.020)]  # the argmin of the eligible ones
    assert select(cands, space) == 3
    # without the exclusion the lowest ECE wins
    assert select(cands, space, Criterion(max_acc_drop=1.0)) == 1
    # exactly 1 point below the best is still eligible
    cands[1]["metrics"]["acc"] = 0.890
    assert select(cands, space) == 1
    # selecting by another validation metric
    nll = [dict(c, metrics={**c["metrics"], "nll": n}) for c, n in zip(cands, (0.3, 0.5, 0.2, 0.4))]
    assert select(nll, space, Criterion(metric="nll")) == 2


def test_ties_go_to_the_value_nearest_the_published_default():
    space = {"loss.alpha": Axis((0.01, 0.05, 0.1, 0.2), 0.05)}
    tied = [_c({"loss.alpha": a}, 0.9, e) for a, e in ((0.01, 0.02), (0.05, 0.03), (0.1, 0.02), (0.2, 0.02))]
    # 0.01, 0.1 and 0.2 tie at 0.02; distances to 0.05 are 0.04, 0.05, 0.15 -> 0.01 wins
    assert select(tied, space) == 0
    # within the tie tolerance (1e-4) counts as tied: 0.1 at 0.02005 still ties, 0.01 at 0.0202 does not
    tied[0]["metrics"]["ece"] = 0.0202
    tied[2]["metrics"]["ece"] = 0.02005
    assert select(tied, space) == 2
    # two axes: the distance sums over axes in grid-range units
    space2 = {"loss.alpha": Axis((0.0, 1.0), 0.0), "loss.beta": Axis((0.0, 4.0), 4.0)}
    two = [_c({"loss.alpha": 1.0, "loss.beta": 4.0}, 0.9, 0.01), _c({"loss.alpha": 0.0, "loss.beta": 0.0}, 0.9, 0.01)]
    assert select(two, space2) == 0  # distances 1.0 + 0.0 vs 0.0 + 1.0: equal, so grid order decides
    two[0]["hparams"]["loss.beta"] = 0.0
    assert select(two, space2) == 1  # 1.0 + 1.0 vs 0.0 + 1.0
    with pytest.raises(ValueError, match="no finished candidates"):
        select([], space)


def test_edge_detection():
    space = {"loss.margin": Axis((0.0, 2.0, 4.0), 2.0), "loss.beta": Axis((1.0, 2.0), 1.0)}
    assert at_edge({"loss.margin": 4.0, "loss.beta": 1.0}, space) == ["loss.margin"]  # 2-value grids: no edge
    assert at_edge({"loss.margin": 2.0, "loss.beta": 2.0}, space) == []


# ------------------------------------------------------------------------------ tuning runs


TINY = Preset(name="tiny", dataset="digits", model="mlp", seeds=(0,), tune_seed=7, num_threads=1,
              train=dict(epochs=3, batch_size=64, lr=0.05, val_size=200, augment=False))


@pytest.fixture
def small_spaces(monkeypatch, one_thread):
    """Two small spaces (the real grids take minutes on the digits set)."""
    monkeypatch.setitem(METHODS, "ls", dataclasses.replace(METHODS["ls"], space={
        "loss.alpha": Axis((0.01, 0.1, 0.3), 0.05)}))
    monkeypatch.setitem(METHODS, "mbls", dataclasses.replace(METHODS["mbls"], space={
        "loss.margin": Axis((2.0, 6.0), 10.0)}))


def _tune(out, **kw):
    kw.setdefault("max_extensions", 0)  # these tests count the declared grid's candidates
    tuner = Tuner(TINY, out, methods=["ls", "mbls"], num_threads=1, log=lambda *a, **k: None, **kw)
    try:
        counts = tuner.run()
        return counts, tuner.selection()
    finally:
        tuner.close()


def _rows(out):
    with Store(out / "runs.db", readonly=True) as s:
        return {r["cand_key"]: r for r in s.candidates("tiny", status=None)}


def test_selection_never_reads_the_test_split(tmp_path, small_spaces, monkeypatch):
    import calibkit.data
    from calibkit import rundir

    counts, clean = _tune(tmp_path / "clean")
    assert counts == Counts(done=6, skipped=0, failed=0) and set(clean) == {"ls", "mbls"}

    real_load = calibkit.data.load

    def poisoned(*args, **kwargs):
        b = real_load(*args, **kwargs)
        wrong = (b.test.labels + 1 + torch.arange(len(b.test)) % 3) % b.num_classes  # never the true label
        return dataclasses.replace(b, test=dataclasses.replace(b.test, labels=wrong))

    monkeypatch.setattr(calibkit.data, "load", poisoned)
    counts, dirty = _tune(tmp_path / "poisoned")
    assert counts.done == 6
    # the poison reached the runs (their test labels are all wrong) ...
    ce = rundir.load_logits(tmp_path / "poisoned" / "runs" / "tiny" / "ce" / "seed7")
    ce_clean = rundir.load_logits(tmp_path / "clean" / "runs" / "tiny" / "ce" / "seed7")
    assert (ce["test_labels"] != ce_clean["test_labels"]).all()
    # ... but neither the selection nor any validation number moved
    assert dirty == clean
    a, b = _rows(tmp_path / "clean"), _rows(tmp_path / "poisoned")
    assert a.keys() == b.keys()
    for key in a:
        assert a[key]["metrics"] == b[key]["metrics"] and a[key]["selected"] == b[key]["selected"]
        assert not any("test" in k for k in a[key]["metrics"]), "the tuning table holds validation numbers only"
    # the recorded selection is the rule applied to the recorded validation numbers
    for method in ("ls", "mbls"):
        rows = [r for r in a.values() if r["method"] == method]
        rows.sort(key=lambda r: list(r["hparams"].values()))
        win = rows[select(rows, METHODS[method].space)]
        assert win["selected"] == 1 and clean[method] == win["hparams"]
        assert sum(r["selected"] for r in rows) == 1


def test_val_metrics_read_only_the_validation_tensors(tmp_path):
    from calibkit import rundir
    from calibkit.functional import accuracy, ece

    g = torch.Generator().manual_seed(0)
    val = torch.randn(50, 4, generator=g) * 3
    labels = torch.randint(0, 4, (50,), generator=g)
    # test tensors of another shape and full of NaN: a reader that touched them would fail
    rundir.write_tensors(tmp_path / rundir.LOGITS, {"val_logits": val, "val_labels": labels,
                                                    "test_logits": torch.full((7, 3), float("nan")),
                                                    "test_labels": torch.zeros(9, dtype=torch.long)})
    m = val_metrics(tmp_path)
    p = val.double().softmax(1)
    assert m["n"] == 50
    assert m["ece"] == pytest.approx(float(ece(p, labels)), abs=1e-12)
    assert m["acc"] == pytest.approx(float(accuracy(p, labels)), abs=1e-12)


def test_interrupted_tune_resumes_without_retraining(tmp_path, small_spaces, monkeypatch):

    trained, interrupt = [], [True]
    real_train = RunFactory.train

    def counting(self, method, seed, run_dir, csm_data=None):
        trained.append(run_dir.name if method != "ce" else "ce")
        if len(trained) == 3 and interrupt:
            interrupt.clear()
            raise KeyboardInterrupt  # Ctrl-C during the third candidate, once
        return real_train(self, method, seed, run_dir, csm_data)

    monkeypatch.setattr(RunFactory, "train", counting)
    with pytest.raises(KeyboardInterrupt):
        _tune(tmp_path)
    first = _rows(tmp_path)
    done = {k for k, r in first.items() if r["status"] == "done"}
    assert done == {"tiny/ce/7/default", "tiny/ls/7/alpha=0.01"}
    assert first["tiny/ls/7/alpha=0.1"]["status"] == "failed"  # the interrupted one: retried next time

    trained.clear()
    counts, chosen = _tune(tmp_path)
    assert trained == ["alpha=0.1", "alpha=0.3", "margin=2", "margin=6"], "finished candidates never retrain"
    assert counts == Counts(done=4, skipped=2, failed=0) and set(chosen) == {"ls", "mbls"}
    again = _rows(tmp_path)
    for key in done:  # their rows were not rewritten
        assert again[key]["finished_at"] == first[key]["finished_at"] and again[key]["attempts"] == 1
    trained.clear()
    assert _tune(tmp_path)[0] == Counts(done=0, skipped=6, failed=0) and trained == []


def test_tune_refuses_a_directory_trained_with_other_settings(tmp_path, small_spaces, monkeypatch):
    monkeypatch.setitem(METHODS, "ls",
                        dataclasses.replace(METHODS["ls"], space={"loss.alpha": Axis((0.01, 0.1), 0.05)}))
    monkeypatch.setitem(METHODS, "mbls", dataclasses.replace(METHODS["mbls"], space={}))
    _tune(tmp_path)
    other = dataclasses.replace(TINY, train={**TINY.train, "epochs": 2})
    tuner = Tuner(other, tmp_path, methods=["ls"], num_threads=1, log=lambda *a, **k: None)
    try:
        with pytest.raises(ValueError, match="trained with other settings.*train"):
            tuner.run()
    finally:
        tuner.close()


def test_tuned_preset_carries_the_selection(tmp_path, small_spaces):
    tuner = Tuner(TINY, tmp_path, methods=["ls", "mbls", "flsd"], num_threads=1, log=lambda *a, **k: None)
    try:
        assert tuner.skipped == ["flsd"] and tuner.methods == ["ls", "mbls"]
        tuner.run()
        chosen = tuner.selection()
        tuned = tuner.tuned_preset()
    finally:
        tuner.close()
    assert tuned.losses["ls"] == f"ls:alpha={chosen['ls']['loss.alpha']:g}"
    assert current_values(tuned, "mbls") == chosen["mbls"]
    assert grid.METHODS["ls"].space["loss.alpha"].values == (0.01, 0.1, 0.3)


# ------------------------------------------------------------------------------ bench protocol


def test_bench_waits_for_a_needed_run_held_by_another_bench(tmp_path):
    from calibkit.bench.runner import Bench

    bench = Bench(TINY, tmp_path, methods=["maccal"], num_threads=1, log=lambda *a, **k: None)
    other = Store(tmp_path / "runs.db")  # another bench: its own owner token, a live process
    try:
        assert bench.needs_ready("maccal", 0) and bench.needs_ready("ls", 0)
        assert other.claim("tiny/ce/0", preset="tiny", method="ce", seed=0)
        assert not bench.needs_ready("maccal", 0), "MaC-Cal waits while another bench trains its CE run"
        assert bench.needs_ready("ls", 0)
        other.finish("tiny/ce/0", metrics={})
        assert bench.needs_ready("maccal", 0)
    finally:
        other.close()
        bench.close()


def test_bench_refuses_to_mix_hyperparameters_or_policies(tmp_path, one_thread):
    from calibkit.bench.runner import Bench

    small = dataclasses.replace(TINY, robust_n=40, severities=(1,), n_boot=10)
    bench = Bench(small, tmp_path, methods=["ls"], num_threads=1, log=lambda *a, **k: None)
    try:
        assert bench.run() == Counts(done=2, skipped=0, failed=0)
    finally:
        bench.close()
    with Store(tmp_path / "runs.db", readonly=True) as s:
        rec = s.get("tiny/ls/0")["config"]
    assert rec["hparams"] == {"loss.alpha": 0.05} and rec["keep"] == small.keep
    # the report states the protocol: splits with their checksums, the one policy, the budget, the values
    from calibkit import rundir
    from calibkit.report import build_report

    rep = build_report(tmp_path, figures=False)
    md = (tmp_path / "report" / "report.md").read_text()
    split = rundir.load_info(tmp_path / "runs" / "tiny" / "ce" / "seed0")["split"]
    assert f"checksum {split['val_checksum']}" in md and "class-stratified" in md
    assert f"| checkpoint policy | {small.keep} (one policy for every run) |" in md
    assert "every method trains with the same budget as CE" in md and "same budget as CE" in rep["text"]
    assert "| LS | alpha=0.05 | ls |" in md
    for changed, message in ((apply_values(small, "ls", {"loss.alpha": 0.2}), "was run with"),
                             (dataclasses.replace(small, train={**small.train, "keep": "last"}), "checkpoint policy")):
        bench = Bench(changed, tmp_path, methods=["ls"], num_threads=1, log=lambda *a, **k: None)
        try:
            with pytest.raises(ValueError, match=message):
                bench.run()
        finally:
            bench.close()
    # the refused benches wrote nothing
    with Store(tmp_path / "runs.db", readonly=True) as s:
        assert [r["run_key"] for r in s.runs("tiny", status=None)] == ["tiny/ce/0", "tiny/ls/0"]


def test_tune_under_torchrun_two_processes(tmp_path, cli_env):
    import json
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "t"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
           "-m", "calibkit", "tune", "--preset", "smoke", "--methods", "acls", "--device", "cpu",
           "--num-threads", "1", "--out", str(out)]
    proc = subprocess.run(cmd, env=cli_env, capture_output=True, text=True, timeout=400,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.count("tune smoke/acls/100/margin=4: running") == 1, "only rank 0 logs"
    rows = _rows_of(out, "smoke")
    from calibkit.bench.extend import extended_space, meta_key

    with Store(out / "runs.db", readonly=True) as s:  # the grid as rank 0 extended it at an edge, if it did
        space = extended_space(METHODS["acls"].space, json.loads(s.get_meta(meta_key("smoke", 100, "acls"))))
    margins = space["loss.margin"].values
    assert set(METHODS["acls"].space["loss.margin"].values) <= set(margins)
    assert sorted(rows) == sorted([f"smoke/acls/100/margin={m:g}" for m in margins] + ["smoke/ce/100/default"])
    assert all(r["status"] == "done" and r["attempts"] == 1 for r in rows.values())
    acls = [rows[f"smoke/acls/100/margin={m:g}"] for m in margins]
    assert [r["selected"] for r in acls] == [int(i == select(acls, space)) for i in range(len(margins))]
    info = json.loads((out / "tune" / "smoke" / "acls" / "margin=6" / "config.json").read_text())
    assert info["world_size"] == 2 and info["config"]["loss"] == "acls:margin=6"


def _rows_of(out, preset):
    with Store(out / "runs.db", readonly=True) as s:
        return {r["cand_key"]: r for r in s.candidates(preset, status=None)}


def test_bench_tune_runs_the_grid_at_the_selected_values(tmp_path, small_spaces, monkeypatch, capsys):
    from calibkit.cli import main

    monkeypatch.setitem(PRESETS, "tiny", dataclasses.replace(TINY, robust_n=40, severities=(1,), n_boot=10))
    assert main(["bench", "--preset", "tiny", "--tune", "--methods", "ls", "flsd", "--out", str(tmp_path),
                 "--device", "cpu", "--num-threads", "1"]) == 0
    with Store(tmp_path / "runs.db", readonly=True) as s:
        chosen = [r for r in s.candidates("tiny", "ls") if r["selected"]]
        runs = {r["method"]: r for r in s.runs("tiny")}
    assert len(chosen) == 1 and sorted(runs) == ["ce", "flsd", "ls"]
    alpha = chosen[0]["hparams"]["loss.alpha"]
    assert runs["ls"]["config"]["hparams"] == {"loss.alpha": alpha}
    assert runs["ls"]["config"]["loss"] == f"ls:alpha={alpha:g}" and runs["flsd"]["config"]["hparams"] == {}
    md = (tmp_path / "report" / "report.md").read_text()
    assert f"| LS | alpha={alpha:g} | ls:alpha={alpha:g} | - | tuned here |" in md
    assert "figures/tuning.png" in md and (tmp_path / "report" / "figures" / "tuning.png").is_file()
    out = capsys.readouterr().out
    assert "tune flsd: no search space" in out


def test_default_preset_values_are_the_committed_selection():
    """docs/tuning/default.json holds every candidate of the tuning run that chose the default
    preset's values: the rule recorded with it (the fixed 1-point window, made before the noise
    term existed) applied to it gives back exactly the values the preset records."""
    import json
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parents[2] / "docs" / "tuning" / "default.json").read_text())
    preset = PRESETS["default"]
    assert doc["preset"] == "default" and doc["seed"] == [preset.tune_seed]
    assert doc["criterion"] == {"metric": "ece", "n_bins": 15, "max_acc_drop": 0.01, "tie": 1e-4}
    recorded = Criterion.from_dict(doc["criterion"])
    assert recorded == Criterion(acc_z=0.0)
    tuned = sorted({c["method"] for c in doc["candidates"]} - {"ce"})
    assert tuned == sorted(m for m in METHODS if METHODS[m].space)
    for method in tuned:
        by_slug = {slug(c["hparams"]): c for c in doc["candidates"] if c["method"] == method}
        rows = [by_slug[slug(v)] for v in candidates(method)]  # the whole current grid, in grid order
        assert all(c["keep"] == preset.keep for c in rows)
        win = rows[select(rows, METHODS[method].space, recorded)]
        assert win["selected"], method
        assert current_values(preset, method) == win["hparams"], method
        assert not at_edge(win["hparams"], METHODS[method].space), f"{method}: widen its grid"


# ------------------------------------------------------------------------------ the tuner, no training


def _fake_train(fail=()):
    """``RunFactory.train`` without training: validation logits whose confidence grows with LS's alpha
    (all correct, so ECE = 1 - mean confidence falls as alpha grows); values in ``fail`` raise."""

    def train(self, method, seed, run_dir, csm_data=None):
        from calibkit import rundir

        alpha = current_values(self.preset, method).get("loss.alpha", 0.0) if method == "ls" else 0.0
        if alpha in fail:
            raise RuntimeError(f"alpha {alpha} diverged")
        labels = torch.arange(60) % 3
        logits = torch.nn.functional.one_hot(labels, 3).float() * (1.0 + 4.0 * alpha)
        run_dir.mkdir(parents=True, exist_ok=True)
        rundir.write_tensors(run_dir / rundir.LOGITS, {"val_logits": logits, "val_labels": labels})
        return {"run_dir": run_dir, "train_time_s": 1.5}

    return train


@pytest.fixture
def no_training(monkeypatch):

    monkeypatch.setattr(RunFactory, "train", _fake_train())
    monkeypatch.setitem(METHODS, "ls", dataclasses.replace(METHODS["ls"], space={
        "loss.alpha": Axis((0.01, 0.1, 0.3), 0.05)}))
    return lambda fail: monkeypatch.setattr(RunFactory, "train", _fake_train(fail))


def _tuner(out, lines=None, **kw):
    kw.setdefault("methods", ["ls"])
    kw.setdefault("max_extensions", 0)
    return Tuner(TINY, out, num_threads=1, log=(lines.append if lines is not None else lambda *a, **k: None), **kw)


def test_tuner_arguments_methods_and_seed(tmp_path, no_training):
    with pytest.raises(ValueError) as err:
        Tuner(TINY, tmp_path, methods=["ls", "nope", "bad"])
    assert str(err.value) == f"unknown method(s) nope, bad; valid methods: {', '.join(METHODS)}"
    with pytest.raises(ValueError) as err:
        Tuner(TINY, tmp_path, methods=["ls"], max_extensions=-1)
    assert str(err.value) == "max_extensions must be >= 0, got -1"
    assert not (tmp_path / "runs.db").exists()  # refused before anything is created
    tuner = _tuner(tmp_path, methods=["ce", "flsd", "ls", "mixup"], max_extensions=0)
    try:  # CE is trained but not listed; FLSD has nothing to tune
        assert (tuner.methods, tuner.skipped, tuner.unsupported) == (["ls", "mixup"], ["flsd"], [])
        assert tuner.seed == 7 and tuner.max_extensions == 0
        mixup_alphas = METHODS["mixup"].space["train.mix_alpha"].values
        assert tuner.items() == [("ce", {}), ("ls", {"loss.alpha": 0.01}), ("ls", {"loss.alpha": 0.1}),
                                 ("ls", {"loss.alpha": 0.3})] + [("mixup", {"train.mix_alpha": a})
                                                                 for a in mixup_alphas]
        assert tuner.key("ls", {"loss.alpha": 0.1}) == cand_key("tiny", "ls", 7, {"loss.alpha": 0.1}) \
            == "tiny/ls/7/alpha=0.1"
        assert tuner.run_dir("ls", {"loss.alpha": 0.1}) == tmp_path / "tune" / "tiny" / "ls" / "alpha=0.1"
    finally:
        tuner.close()
    text = dataclasses.replace(TINY, modality="text", methods=("ls", "mixup", "focal"))
    tuner = Tuner(text, tmp_path / "t", seed=3, max_extensions=2, num_threads=1, log=lambda *a, **k: None)
    try:  # the preset's own list by default; mixing images is not for text
        assert ((tuner.methods, tuner.unsupported, tuner.seed, tuner.max_extensions)
                == (["ls", "focal"], ["mixup"], 3, 2))
    finally:
        tuner.close()


def test_tuner_trains_scores_selects_and_logs_each_candidate(tmp_path, no_training):
    lines = []
    tuner = _tuner(tmp_path, lines)
    try:
        assert tuner.run() == Counts(done=4, skipped=0, failed=0)
        assert tuner.selection() == {"ls": {"loss.alpha": 0.3}}  # the most confident: all correct, lowest ECE
        tuned = tuner.tuned_preset()
        rec = tuner.record("ls", {"loss.alpha": 0.3})
    finally:
        tuner.close()
    assert tuned.losses["ls"] == "ls:alpha=0.3" and "data_dir" not in rec
    rows = _rows(tmp_path)
    assert set(rows) == {"tiny/ce/7/default", "tiny/ls/7/alpha=0.01", "tiny/ls/7/alpha=0.1", "tiny/ls/7/alpha=0.3"}
    best = rows["tiny/ls/7/alpha=0.3"]
    assert (best["selected"] and best["train_time_s"] == 1.5
            and best["run_dir"] == str(tuner.run_dir("ls", {"loss.alpha": 0.3})))
    assert best["metrics"] == val_metrics(best["run_dir"]) and best["config"] == rec
    assert best["criterion"] == Criterion().to_dict() == {"metric": "ece", "n_bins": 15, "max_acc_drop": 0.01,
                                                          "acc_z": 1.96, "tie": 1e-4}
    starts = [line for line in lines if line.endswith(": running")]
    assert starts == ["[1/4] tune tiny/ce/7/default: running", "[2/4] tune tiny/ls/7/alpha=0.01: running",
                      "[3/4] tune tiny/ls/7/alpha=0.1: running", "[4/4] tune tiny/ls/7/alpha=0.3: running"]
    m = best["metrics"]
    assert re.fullmatch(rf"\[4/4\] tune tiny/ls/7/alpha=0\.3: done in \d+ s \(val acc {m['acc']:.2%}, "
                        rf"val ECE {m['ece'] * 100:.2f}\)", lines[lines.index(starts[3]) + 1])
    lines.clear()
    tuner = _tuner(tmp_path, lines)
    try:
        assert tuner.run() == Counts(done=0, skipped=4, failed=0)
    finally:
        tuner.close()
    assert lines[0] == "[1/4] tune tiny/ce/7/default: finished earlier; skipped"


def test_val_metrics_of_a_missing_run_and_other_bins(tmp_path):
    from calibkit import rundir
    from calibkit.metrics import evaluate

    with pytest.raises(FileNotFoundError) as err:
        val_metrics(tmp_path)
    assert str(err.value) == f"{tmp_path / rundir.LOGITS} not found: the candidate's run did not finish"
    g = torch.Generator().manual_seed(1)
    val, labels = torch.randn(40, 3, generator=g) * 2, torch.randint(0, 3, (40,), generator=g)
    rundir.write_tensors(tmp_path / rundir.LOGITS, {"val_logits": val, "val_labels": labels})
    want = evaluate(val.double().softmax(1), labels, n_bins=4)
    got = val_metrics(tmp_path, n_bins=4)
    assert got == {**{k: float(v) for k, v in want.items()}, "n": 40}
    assert got["ece"] != pytest.approx(val_metrics(tmp_path)["ece"], abs=1e-9)  # the bins matter here


def test_a_failed_candidate_leaves_no_selection_and_says_so(tmp_path, no_training):
    no_training((0.1,))
    lines = []
    tuner = _tuner(tmp_path, lines)
    try:
        assert tuner.run() == Counts(done=3, skipped=0, failed=1)
        assert "tune ls: 2 of 3 candidates finished; no selection yet (run the same command again)" in lines
        assert tuner.selection() == {}
        with pytest.raises(RuntimeError) as err:
            tuner.tuned_preset()
        assert str(err.value) == f"no selection for ls (failed candidates; see {tmp_path}/runs.db)"
    finally:
        tuner.close()
    assert _rows(tmp_path)["tiny/ls/7/alpha=0.1"]["status"] == "failed"



def test_the_tune_command_refuses_ce_alone_and_names_a_failed_candidate_on_stderr(tmp_path, no_training,
                                                                                  monkeypatch, capsys, one_thread):
    import calibkit.report.tuning
    from calibkit.cli import main

    monkeypatch.setitem(PRESETS, "tiny", TINY)
    monkeypatch.setattr(calibkit.report.tuning, "write_tuning_figure", lambda *a, **k: None)  # matplotlib: slow
    out = tmp_path / "t"
    argv = ["tune", "--preset", "tiny", "--out", str(out), "--device", "cpu", "--num-threads", "1", "--methods"]
    assert main([*argv, "ce"]) == 1
    tunable = ", ".join(m for m, spec in METHODS.items() if spec.space)
    assert capsys.readouterr().err.splitlines() == [
        f"calibkit tune: error: --methods ce: nothing to tune (ce has no search space); methods with one: {tunable}"]
    assert not out.exists()  # refused before anything was trained or written
    no_training((0.1,))
    assert main([*argv, "ce", "ls"]) == 1
    captured = capsys.readouterr()
    assert ("tune ce: no search space (nothing to tune); it is trained on the selection seed only as the reference "
            "(and the base of MaC-Cal and CSM)") in captured.out.splitlines()
    assert captured.err.splitlines() == [
        "calibkit tune: error: candidate tiny/ls/7/alpha=0.1 (method ls, seed 7) failed: RuntimeError: alpha 0.1 "
        f"diverged; recorded in {out / 'runs.db'}; run the same command again to retry it"]



def test_bench_tune_warns_of_a_tune_seed_it_evaluates_and_names_the_first_failed_candidate(
        tmp_path, no_training, monkeypatch, capsys, one_thread):
    from calibkit.cli import main

    monkeypatch.setitem(PRESETS, "tiny", TINY)
    no_training((0.1,))
    out = tmp_path / "b"
    assert main(["bench", "--preset", "tiny", "--tune", "--methods", "ls", "--seeds", "0", "7", "--out", str(out),
                 "--device", "cpu", "--num-threads", "1"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "calibkit bench: warning: tune_seed 7 is also an evaluation seed of preset tiny (seeds 0, 7): the selection "
        "sees the randomness of a run whose test numbers are reported; choose a seed outside them (the shipped "
        "presets tune on 100)",
        "calibkit bench: error: 1 tuning candidate(s) failed (first: candidate tiny/ls/7/alpha=0.1 (method ls, seed "
        f"7) failed: RuntimeError: alpha 0.1 diverged); see {out / 'runs.db'} (run the same command again to retry "
        "them)"]


def test_run_one_trains_one_named_candidate(tmp_path, no_training):
    tuner = _tuner(tmp_path)
    try:
        with pytest.raises(ValueError) as err:
            tuner.run_one("tiny/ls/7/alpha=0.2")
        assert str(err.value) == "tiny/ls/7/alpha=0.2 is not a candidate of this tuning (4 candidates of ce, ls)"
        assert tuner.run_one("tiny/ls/7/alpha=0.1") == Counts(done=1, skipped=0, failed=0)
        assert tuner.run_one("tiny/ls/7/alpha=0.1") == Counts(done=0, skipped=1, failed=0)
    finally:
        tuner.close()
    rows = _rows(tmp_path)
    assert list(rows) == ["tiny/ls/7/alpha=0.1"] and not rows["tiny/ls/7/alpha=0.1"]["selected"]  # no selection


def test_check_consistent_names_the_differing_settings(tmp_path, no_training):
    tuner = _tuner(tmp_path)
    try:
        tuner.run_one("tiny/ls/7/alpha=0.1")
        tuner.check_consistent()  # the same settings: fine
    finally:
        tuner.close()
    other = dataclasses.replace(TINY, train={**TINY.train, "epochs": 2, "lr": 0.1})
    tuner = Tuner(other, tmp_path, methods=["ls"], num_threads=1, log=lambda *a, **k: None)
    try:
        with pytest.raises(ValueError) as err:
            tuner.check_consistent()
        assert str(err.value) == (f"{tmp_path / 'runs.db'}: candidate tiny/ls/7/alpha=0.1 was trained with other "
                                  "settings (train); choose another --out")
    finally:
        tuner.close()
    with Store(tmp_path / "runs.db") as s:  # a method no longer in the grid is ignored
        s.claim("tiny/zz/7/x=1", table="tuning",
                preset="tiny", method="zz", seed=7, hparams={"x.y": 1.0}, config={"a": 1})
    tuner = _tuner(tmp_path)
    try:
        tuner.check_consistent()
    finally:
        tuner.close()


def test_the_tuners_run_factory_trains_ce_on_the_selection_seed_with_its_settings(tmp_path, no_training):
    store = Store(tmp_path / "mine.db")
    logged = []
    tuner = Tuner(TINY, tmp_path, methods=["ls"], data_dir="somewhere", device="cpu", num_threads=1,
                  csm_store="gen", log=logged.append, store=store)
    try:
        f = tuner.factory
        assert (tuner.seed, f.preset, f.data_dir, f.device, f.num_threads, f.csm_store, f.out) == (
            7, TINY, "somewhere", "cpu", 1, "gen", tmp_path)
        assert tuner.store is store and tuner.dd is f.dd and tuner.out == tmp_path
        tuner.log("x")
        assert logged == ["x"]
        rec = tuner.record("ls", {"loss.alpha": 0.1})
        assert rec["seed"] == 7 and rec["hparams"] == {"loss.alpha": 0.1} and rec["loss"] == "ls:alpha=0.1"
        assert "data_dir" not in rec and list(rec) == sorted(rec)  # JSON-normalised: sorted keys
    finally:
        tuner.close()
    store.close()


def test_produce_hands_each_kind_its_view_seed_and_directory(tmp_path, no_training, monkeypatch):
    from calibkit.bench import twostage

    seen = []
    monkeypatch.setattr(RunFactory, "train", lambda self, m, seed, d, csm_data=None: seen.append(
        ("train", current_values(self.preset, m), seed, d)) or {"run_dir": d})
    for name in ("maccal", "csm"):
        monkeypatch.setattr(twostage, f"produce_{name}", lambda view, seed, d, name=name: seen.append(
            (name, current_values(view.preset, name), seed, d)) or {"run_dir": d})
    tuner = _tuner(tmp_path, methods=["ls", "maccal", "csm"])
    try:
        for method, values in (("ls", {"loss.alpha": 0.1}), ("maccal", {"maccal.eta": 4.0, "maccal.r_min": 0.3}),
                               ("csm", {"csm.sharpness": 1.0, "train.csm_weight": 4.0})):
            d = tmp_path / method
            monkeypatch.setattr(tuner, "run_dir", lambda m, v, d=d: d)
            assert tuner.produce(method, values) == {"run_dir": d}
            assert seen[-1] == ({"ls": "train"}.get(method, method), values, 7, d)
    finally:
        tuner.close()


def test_wait_for_others_waits_while_another_process_trains_a_candidate_of_this_tuning(tmp_path, no_training,
                                                                                       monkeypatch):
    from calibkit.bench import tune

    tuner = _tuner(tmp_path)
    other = Store(tmp_path / "runs.db")  # another tuner: its own owner, a live process
    sleeps = []
    try:
        # running elsewhere, but of another selection seed or preset, or finished: no wait
        assert other.claim("tiny/ls/8/alpha=0.1", table="tuning", preset="tiny", method="ls", seed=8, hparams={})
        assert other.claim("tinz/ls/7/alpha=0.1", table="tuning", preset="tinz", method="ls", seed=7, hparams={})
        assert other.claim("tiny/ls/7/alpha=0.3", table="tuning", preset="tiny", method="ls", seed=7, hparams={})
        other.finish("tiny/ls/7/alpha=0.3", table="tuning", metrics={})
        def no_wait(s):
            raise AssertionError("waited for a candidate of another tuning or a finished one")

        monkeypatch.setattr(tune.time, "sleep", no_wait)
        tuner.wait_for_others()
        assert other.claim("tiny/ls/7/alpha=0.1", table="tuning", preset="tiny", method="ls", seed=7, hparams={})

        def sleep(s):  # the other process finishes while this one waits
            sleeps.append(s)
            other.finish("tiny/ls/7/alpha=0.1", table="tuning", metrics={})

        monkeypatch.setattr(tune.time, "sleep", sleep)
        tuner.wait_for_others(poll_s=0.25)
        assert sleeps == [0.25]
    finally:
        other.close()
        tuner.close()


def test_check_consistent_reads_this_tunings_rows_only(tmp_path, no_training):
    tuner = _tuner(tmp_path)
    a, b = {"loss.alpha": 0.1}, {"loss.alpha": 0.3}
    try:
        mine_a, mine_b = tuner.record("ls", a), tuner.record("ls", b)
    finally:
        tuner.close()
    with Store(tmp_path / "runs.db") as s:
        # another preset's and another seed's candidates, trained otherwise: not this tuning's business
        for key, preset, seed in (("tinz/ls/7/alpha=0.1", "tinz", 7), ("tiny/ls/8/alpha=0.1", "tiny", 8)):
            s.claim(key, table="tuning", preset=preset, method="ls", seed=seed, hparams=a, config={**mine_a, "lr": 9})
            s.finish(key, table="tuning", metrics={})
        # a method no longer in the grid (listed first), and this tuning's candidate with its data elsewhere
        s.claim("tiny/zz/7/x=1", table="tuning", preset="tiny", method="zz", seed=7, hparams={"x.y": 1.0}, config={})
        s.claim("tiny/ls/7/alpha=0.1", table="tuning", preset="tiny", method="ls", seed=7, hparams=a,
                          config={**mine_a, "data_dir": "/elsewhere"})
        for key in ("tiny/zz/7/x=1", "tiny/ls/7/alpha=0.1"):  # only finished candidates are compared
            s.finish(key, table="tuning", metrics={})
    tuner = _tuner(tmp_path)
    try:
        tuner.check_consistent()  # the same data under another path is the same candidate
        with Store(tmp_path / "runs.db") as s:
            s.claim("tiny/ls/7/alpha=0.3", table="tuning", preset="tiny", method="ls", seed=7, hparams=b,
                              config={**mine_b, "extra": 1})
            s.finish("tiny/ls/7/alpha=0.3", table="tuning", metrics={})
        with pytest.raises(ValueError, match=r"alpha=0\.3 was trained with other settings \(extra\)"):
            tuner.check_consistent()  # a setting only the recorded candidate has is a difference too
    finally:
        tuner.close()


def test_a_candidate_that_builds_on_ce_waits_while_another_process_trains_ce(tmp_path, no_training, monkeypatch):
    from calibkit.bench import tune

    captured = []
    monkeypatch.setattr(tune, "work_queue", lambda items, ready, attempt: captured.append((items, ready)))
    tuner = _tuner(tmp_path, methods=["ls", "maccal"])
    other = Store(tmp_path / "runs.db")
    try:
        tuner.refresh()
        tuner._round(tuner.items(), Counts(done=0, skipped=0, failed=0))
        (items, ready), = captured
        maccal, ls = ("maccal", {"maccal.eta": 1.0, "maccal.r_min": 0.05}), ("ls", {"loss.alpha": 0.1})
        assert maccal in items and ready(maccal) is True and ready(ls) is True
        # CE of another seed or preset held elsewhere: no reason to wait
        for key, preset, seed in (("tiny/ce/8/default", "tiny", 8), ("tinz/ce/7/default", "tinz", 7)):
            assert other.claim(key, table="tuning", preset=preset, method="ce", seed=seed, hparams={})
        assert ready(maccal) is True
        assert other.claim("tiny/ce/7/default", table="tuning", preset="tiny", method="ce", seed=7, hparams={})
        assert ready(maccal) is False and ready(ls) is True  # only what builds on CE waits
        other.finish("tiny/ce/7/default", table="tuning", metrics={})
        assert ready(maccal) is True
    finally:
        other.close()
        tuner.close()


def test_a_candidate_held_by_another_process_is_waited_for_or_skipped(tmp_path, no_training):
    lines = []
    tuner = _tuner(tmp_path, lines)
    other = Store(tmp_path / "runs.db")
    try:
        assert other.claim("tiny/ls/7/alpha=0.1", table="tuning", preset="tiny", method="ls", seed=7, hparams={})
        item, counts, waiting = ("ls", {"loss.alpha": 0.1}), Counts(done=0, skipped=0, failed=0), set()
        report = tune._Report(tuner.log, "[3/4]", waiting)
        assert tuner._attempt(item, counts, report) is False  # the queue retries it later
        assert tuner._attempt(item, counts, report) is False
        assert waiting == {"tiny/ls/7/alpha=0.1"} and counts == Counts(done=0, skipped=0, failed=0)
        assert lines == ["[3/4] tune tiny/ls/7/alpha=0.1: running in another process; waiting for it"]  # said once
        lines.clear()
        assert tuner.run_one("tiny/ls/7/alpha=0.1") == Counts(done=0, skipped=1, failed=0)  # nothing to wait in
        assert lines == ["[1/1] tune tiny/ls/7/alpha=0.1: running in another process; skipped"]
        lines.clear()
        assert tuner.run_one("tiny/ls/7/alpha=0.3") == Counts(done=1, skipped=0, failed=0)
        assert lines[0] == "[1/1] tune tiny/ls/7/alpha=0.3: running"
        assert tuner.run_one("tiny/ls/7/alpha=0.3") == Counts(done=0, skipped=1, failed=0)
        assert lines[-1] == "[1/1] tune tiny/ls/7/alpha=0.3: finished earlier; skipped"
        row = _rows(tmp_path)["tiny/ls/7/alpha=0.3"]
        assert row["git_commit"] == tuner.factory.env["git_commit"] and row["train_time_s"] == 1.5
    finally:
        other.close()
        tuner.close()


def test_a_failure_is_recorded_with_its_message(tmp_path, no_training):
    no_training((0.1,))
    lines = []
    tuner = _tuner(tmp_path, lines)
    try:
        assert tuner.run_one("tiny/ls/7/alpha=0.1") == Counts(done=0, skipped=0, failed=1)
        assert tuner.run_one("tiny/ls/7/alpha=0.1") == Counts(done=0, skipped=0, failed=1)  # retried
    finally:
        tuner.close()
    row = _rows(tmp_path)["tiny/ls/7/alpha=0.1"]
    assert row["status"] == "failed" and "alpha 0.1 diverged" in row["error"] and row["attempts"] == 2
    assert any(line.startswith("[1/1] tune tiny/ls/7/alpha=0.1: ") and "alpha 0.1 diverged" in line for line in lines)


def test_the_criterion_scores_selects_and_is_recorded(tmp_path, no_training):
    import json

    from calibkit.bench.extend import meta_key

    crit = Criterion(n_bins=4, tie=1.0)  # every candidate tied: the one nearest the published 0.05 wins
    tuner = _tuner(tmp_path, criterion=crit)
    try:
        tuner.run()
        assert tuner.selection() == {"ls": {"loss.alpha": 0.01}}
    finally:
        tuner.close()
    rows = _rows(tmp_path)
    for r in rows.values():
        assert r["metrics"] == val_metrics(r["run_dir"], n_bins=4)
    assert rows["tiny/ls/7/alpha=0.01"]["criterion"] == crit.to_dict()
    with Store(tmp_path / "runs.db", readonly=True) as s:
        text = s.get_meta(meta_key("tiny", 7, "ls"))
    record = json.loads(text)
    assert text == json.dumps(record, sort_keys=True)
    assert (record["added"], record["steps"], record["no_effect"]) == ({}, {}, [])


def test_select_all_selects_each_complete_method_on_this_tunings_rows(tmp_path, no_training, monkeypatch):
    monkeypatch.setitem(METHODS, "focal", dataclasses.replace(METHODS["focal"], space={
        "loss.gamma": Axis((1.0, 2.0, 3.0), 2.0)}))
    lines = []
    tuner = _tuner(tmp_path, lines, methods=["ls", "focal"])
    other = Store(tmp_path / "runs.db")
    try:
        for m, v in [("focal", {"loss.gamma": g}) for g in (1.0, 2.0, 3.0)] + [("ls", {"loss.alpha": 0.01})]:
            tuner.run_one(tuner.key(m, v))
        # ls: 0.1 running elsewhere, 0.3 missing; the failures of other tunings and methods are not its own
        assert other.claim("tiny/ls/7/alpha=0.1", table="tuning", preset="tiny", method="ls", seed=7,
                                     hparams={"loss.alpha": 0.1})
        for key, preset, method, seed in (("tinz/ls/7/alpha=0.3", "tinz", "ls", 7),
                                          ("tiny/ls/8/alpha=0.3", "tiny", "ls", 8),
                                          ("tiny/mbls/7/alpha=0.3", "tiny", "mbls", 7)):
            other.claim(key, table="tuning", preset=preset, method=method, seed=seed, hparams={"loss.alpha": 0.3})
            other.fail(key, "boom", table="tuning")
            other.claim(key.replace("0.3", "0.1"), table="tuning", preset=preset, method=method, seed=seed,
                                  hparams={"loss.alpha": 0.1})
            other.finish(key.replace("0.3", "0.1"), table="tuning", metrics={"acc": 1.0, "ece": 0.0})
        lines.clear()
        tuner.refresh()
        assert [r["cand_key"] for r in tuner.finished("ls")] == ["tiny/ls/7/alpha=0.01"]
        # ls has nothing to select yet (and nothing of its own failed: no message); focal is selected
        assert tuner.select_all() == {"focal": {"loss.gamma": 2.0}}
        assert lines == ["tune focal: gamma had no effect (its values gave bit-identical validation logits)"]
    finally:
        other.close()
        tuner.close()


def test_a_presets_own_spaces_replace_the_methods(tmp_path, no_training):
    own = dataclasses.replace(TINY, spaces={"ls": {"loss.alpha": Axis((0.2, 0.4), 0.2)}, "focal": {}})
    tuner = Tuner(own, tmp_path, methods=["ls", "focal"], max_extensions=0, num_threads=1, log=lambda *a, **k: None)
    try:
        assert tuner.methods == ["ls"] and tuner.skipped == ["focal"]
        assert tuner.items() == [("ce", {}), ("ls", {"loss.alpha": 0.2}), ("ls", {"loss.alpha": 0.4})]
        assert tuner.run_dir("ce", {}) == tmp_path / "runs" / "tiny" / "ce" / "seed7"
        tuner.run()
        assert tuner.selection() == {"ls": {"loss.alpha": 0.4}}
        assert tuner.tuned_preset().losses["ls"] == "ls:alpha=0.4"
    finally:
        tuner.close()


def test_select_exact_edges_of_the_accuracy_rule_and_the_tie():
    space = {"loss.alpha": Axis((0.0, 1.0), 1.0)}
    edge = 0.9 - Criterion().max_acc_drop - 1e-12  # the rule's own threshold: still eligible
    assert select([_c({"loss.alpha": 0.0}, 0.9, 0.05), _c({"loss.alpha": 0.5}, edge, 0.01)], space) == 1
    tie = 0.02 + Criterion().tie  # exactly the tie tolerance above the best: tied, nearer the default wins
    assert select([_c({"loss.alpha": 0.0}, 0.9, 0.02), _c({"loss.alpha": 1.0}, 0.9, tie)], space) == 1
    with pytest.raises(ValueError) as err:
        select([], space)
    assert str(err.value) == "no finished candidates to select from"


def test_the_distance_to_the_published_values_is_in_grid_range_units():
    # a: range 1 (1..2), b: range 10 (0..10). (a=2, b=0) is 1 range away, (a=1, b=6) 0.6
    space = {"loss.a": Axis((1.0, 2.0), 1.0), "loss.b": Axis((0.0, 10.0), 0.0)}
    cands = [_c({"loss.a": 2.0, "loss.b": 0.0}, 0.9, 0.02), _c({"loss.a": 1.0, "loss.b": 6.0}, 0.9, 0.02)]
    assert select(cands, space) == 1
    cands[1]["hparams"]["loss.b"] = 10.0  # now 1 range away too: a tie, and grid order decides
    assert select(cands, space) == 0
