"""``calibkit.bench.runner``'s loop with training and evaluation stood in: what each run is handed,
what is recorded and logged, the directory's one policy and one set of values, stale runs moved aside.

``RunFactory.train`` is replaced by a writer of fixed logits and ``evaluate_run`` by a function that
returns fixed measurements, so every test here runs in well under a second; the training and the
evaluation themselves are tested in ``tests/train`` and ``tests/bench/test_evaluation*.py``.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from contextlib import closing

import pytest
import torch

from calibkit import rundir
from calibkit.bench import attempts, evaluation, runner
from calibkit.bench.attempts import Counts, Outcome
from calibkit.bench.grid import METHODS, Preset
from calibkit.bench.producers import RunFactory
from calibkit.bench.runner import Bench, train_config
from calibkit.bench.space import apply_values
from calibkit.store import NullStore, Store

TINY = Preset(name="tiny", dataset="digits", model="mlp", seeds=(0, 1), tune_seed=7, num_threads=1,
              train=dict(epochs=4, batch_size=64, lr=0.05, val_size=200, augment=False, milestones=[0.5, 0.75]))
METRICS = {"before": {"acc": 0.875, "ece": 0.1234}, "after": {"ece": 0.0456}}


def quiet(*a, **k):
    pass


@pytest.fixture
def stand_ins(monkeypatch):
    """Training writes fixed logits; evaluation returns METRICS. Returns the calls' log."""
    calls = {"train": [], "eval": [], "fail": set()}

    def fake_train(self, method, seed, run_dir, csm_data=None):
        calls["train"].append((method, seed, run_dir))
        if (method, seed) in calls["fail"]:
            raise RuntimeError(f"{method} diverged")
        run_dir.mkdir(parents=True, exist_ok=True)
        labels = torch.arange(12) % 3
        logits = torch.nn.functional.one_hot(labels, 3).float()
        rundir.write_tensors(run_dir / rundir.LOGITS, {"val_logits": logits, "val_labels": labels,
                                                      "test_logits": logits.clone(), "test_labels": labels.clone()})
        return {"run_dir": run_dir, "train_time_s": 2.5 + seed, "config": {"m": method},
                "extra": {"from": method}, "model": f"model-{method}", "norm": f"norm-{method}"}

    def fake_eval(run_dir, data, model=None, norm=None, device="cpu"):
        calls["eval"].append((run_dir, data, model, norm, device))
        return {"metrics": METRICS, "ood": {"auroc": 0.75}, "robustness": None, "eval_time_s": 0.5,
                "logits_path": str(run_dir / rundir.LOGITS)}

    monkeypatch.setattr(RunFactory, "train", fake_train)
    monkeypatch.setattr(Bench, "eval_data", lambda self, seed: f"data-{seed}")
    monkeypatch.setattr(evaluation, "evaluate_run", fake_eval)
    return calls


def _bench(out, lines=None, preset=TINY, **kw):
    kw.setdefault("methods", ["ls"])
    return Bench(preset, out, num_threads=1, log=(lines.append if lines is not None else quiet), **kw)


def _rows(out):
    with Store(out / "runs.db", readonly=True) as s:
        return {r["run_key"]: r for r in s.runs("tiny", status=None)}


def _recorded(out, key, config):
    """A finished row ``key`` (``preset/method/seed``, maybe with a ``~`` suffix) holding ``config``
    and no results, as an earlier bench would have left it."""
    preset, method, seed = key.split("~")[0].split("/")
    with Store(out / "runs.db") as s:
        s.claim(key, preset=preset, method=method, seed=int(seed), config=config)
        s.finish(key, metrics={})


# ------------------------------------------------------------------------------ train_config


def test_train_config_layers_preset_method_and_runtime_values():
    preset = dataclasses.replace(TINY, train_by_method={"ls": {"lr": 0.2}}, checkpoint_every=3,
                                 losses={"ls": "ls:alpha=0.1"})
    cfg = train_config(preset, "ls", "1", data_dir="/d", device="cpu", num_threads=2, csm_data="/x")
    assert (cfg.data, cfg.model, cfg.epochs, cfg.batch_size, cfg.lr, cfg.val_size) == ("digits", "mlp", 4, 64, 0.2, 200)
    assert (cfg.loss, cfg.method, cfg.seed, cfg.data_dir, cfg.device, cfg.num_threads) == (
        "ls:alpha=0.1", "standard", 1, "/d", "cpu", 2)
    assert cfg.checkpoint_every == 3 and cfg.csm_data is None  # csm_data only for CSM
    assert train_config(preset, "ce", 0).lr == 0.05 and train_config(preset, "ce", 0).device == "auto"
    csm = train_config(preset, "csm", 0, csm_data=rundir.Path("/g"))
    assert csm.csm_data == "/g" and csm.method == METHODS["csm"].method
    with pytest.raises(ValueError, match="csm_data: is required"):  # none given: refused, not "None"
        train_config(preset, "csm", 0)
    with pytest.raises(ValueError):  # validated
        train_config(dataclasses.replace(TINY, train={**TINY.train, "lr": -1.0}), "ce", 0)


# ------------------------------------------------------------------------------ the constructor


def test_constructor_defaults_and_what_it_opens(tmp_path, monkeypatch):
    threads = []
    monkeypatch.setattr(runner.torch, "set_num_threads", threads.append)
    with closing(Bench(dataclasses.replace(TINY, data_dir="/pd", num_threads=3), tmp_path, log=quiet)) as b:
        assert b.seeds == [0, 1] and b.data_dir == "/pd" and b.num_threads == 3 and threads == [3]
        assert b.methods == list(METHODS) and b.skipped == [] and b.device == "auto" and b.csm_store is None
        assert b.out == tmp_path and (tmp_path / "runs.db").is_file() and b.dd.is_main
    with closing(Bench(TINY, str(tmp_path), seeds=("4",), methods=["ls"], data_dir="/mine", device="cpu", num_threads=2,
              csm_store="gen", log=quiet)) as b:
        assert b.seeds == [4] and b.methods == ["ce", "ls"] and b.data_dir == "/mine" and threads == [3, 2]
        assert (b.device, b.csm_store, b.out) == ("cpu", "gen", tmp_path)
    b = Bench(dataclasses.replace(TINY, num_threads=None), tmp_path, log=quiet)
    b.close()
    assert threads == [3, 2] and b.num_threads is None  # no thread count: torch's own left alone


def test_constructor_takes_a_store_object_or_a_path_and_says_what_it_skips(tmp_path):
    store = Store(tmp_path / "elsewhere.db")
    b = Bench(TINY, tmp_path / "b", methods=["ls"], log=quiet, store=store)
    assert b.store is store and not (tmp_path / "b" / "runs.db").exists()
    b.close()
    with pytest.raises(sqlite3.ProgrammingError):  # close() closed it
        store.runs()
    lines = []
    text = dataclasses.replace(TINY, modality="text")
    with closing(Bench(text, tmp_path / "t", methods=["ls", "mixup", "csm"], log=lines.append)) as b:
        assert b.methods == ["ce", "ls"] and b.skipped == ["mixup", "csm"]
        assert lines == ["mixup, csm: skipped (they mix or generate images; preset tiny trains on token ids)"]
    with pytest.raises(ValueError, match="--store: expected a postgresql:// URL"):  # text goes to open_store
        Bench(TINY, tmp_path / "u", log=quiet, store=str(tmp_path / "u.db"))


# ------------------------------------------------------------------------------ produce


def test_produce_sends_each_kind_its_directory(tmp_path, monkeypatch):
    from calibkit.bench import twostage

    seen = []
    monkeypatch.setattr(RunFactory, "train", lambda self, m, seed, d, csm_data=None: seen.append(("train", m, seed, d))
                        or {"k": "train"})
    for name in ("maccal", "csm"):
        monkeypatch.setattr(twostage, f"produce_{name}",
                            lambda bench, seed, d, name=name: seen.append((name, bench, seed, d)) or {"k": name})
    with closing(_bench(tmp_path, methods=None)) as b:
        assert b.produce("focal", 1) == {"k": "train"}
        assert seen[-1] == ("train", "focal", 1, tmp_path / "runs" / "tiny" / "focal" / "seed1")
        assert b.produce("maccal", 0) == {"k": "maccal"}
        assert seen[-1] == ("maccal", b.factory, 0, tmp_path / "runs" / "tiny" / "maccal" / "seed0")
        assert b.produce("csm", 2) == {"k": "csm"}
        assert seen[-1] == ("csm", b.factory, 2, tmp_path / "runs" / "tiny" / "csm" / "seed2")
        monkeypatch.setitem(METHODS, "odd", dataclasses.replace(METHODS["ls"], kind="weird"))
        with pytest.raises(ValueError) as err:
            b.produce("odd", 0)
        assert str(err.value) == "unknown method kind 'weird' for odd"


def test_train_hands_its_config_to_train_and_checks_the_status(tmp_path, monkeypatch):
    import calibkit.train

    got = []

    def fake(cfg, out, progress=None, verbose=None, place=None):
        got.append((cfg, out, progress, verbose, place))
        return {"status": status, "wall_time_s": 12.5}

    monkeypatch.setattr(calibkit.train, "train", fake)
    with closing(_bench(tmp_path, data_dir="/dd", device="cpu")) as b:
        status = "done"
        made = b.factory.train("ls", 1, tmp_path / "r", csm_data="/c")
        cfg, out, progress, verbose, place = got[-1]
        assert cfg == train_config(TINY, "ls", 1, "/dd", "cpu", 1, "/c") and out == tmp_path / "r"
        assert progress is True and verbose is False
        # config.json records its paths relative to the bench directory
        assert place.record({"csm_data": str(tmp_path / "cache" / "set")})["csm_data"] == "cache/set"
        assert made == {"run_dir": tmp_path / "r", "train_time_s": 12.5, "config": cfg.to_dict()}
        status = "stopped"
        with pytest.raises(RuntimeError) as err:
            b.factory.train("ls", 1, tmp_path / "r")
        assert str(err.value) == f"{tmp_path / 'r'}: training ended with status 'stopped'"


# ------------------------------------------------------------------------------ run and run_one


def test_run_trains_evaluates_and_records_every_run_in_seed_order(tmp_path, stand_ins):
    lines = []
    with closing(_bench(tmp_path, lines, device="cpu")) as b:
        assert b.run() == Counts(done=4, skipped=0, failed=0)
    root = tmp_path / "runs" / "tiny"
    assert [c[:2] for c in stand_ins["train"]] == [("ce", 0), ("ls", 0), ("ce", 1), ("ls", 1)]
    assert stand_ins["eval"][1] == (root / "ls" / "seed0", "data-0", "model-ls", "norm-ls", b.dd.device)
    assert stand_ins["eval"][2][1] == "data-1"
    rows = _rows(tmp_path)
    assert list(rows) == ["tiny/ce/0", "tiny/ls/0", "tiny/ce/1", "tiny/ls/1"]
    r = rows["tiny/ls/1"]
    assert (r["status"], r["metrics"], r["ood"], r["robustness"], r["extra"]) == (
        "done", METRICS, {"auroc": 0.75}, None, {"from": "ls"})
    assert (r["train_time_s"], r["eval_time_s"], r["method"], r["seed"]) == (3.5, 0.5, "ls", 1)
    assert r["run_dir"] == str(root / "ls" / "seed1") and r["logits_path"] == str(root / "ls" / "seed1" / rundir.LOGITS)
    assert r["config"]["hparams"] == {"loss.alpha": 0.05} and r["config"]["seed"] == 1
    assert r["git_commit"] == b.factory.env["git_commit"] and r["versions"] == b.factory.env["versions"]
    assert len(lines) == 4 and lines[0].startswith("[1/4] tiny/ce/0: done in 0 s (acc 87.50%, ECE 12.34 -> 4.56 "
                                                   "after TS) | elapsed ")
    assert lines[3].startswith("[4/4] tiny/ls/1: done in ")
    # again: every run finished earlier, nothing trained
    lines.clear()
    with closing(_bench(tmp_path, lines)) as b:
        assert b.run() == Counts(done=0, skipped=4, failed=0)
    assert len(stand_ins["train"]) == 4
    assert [ln.split(" | ")[0] for ln in lines] == [
        f"[{i}/4] {k}: finished earlier; skipped" for i, k in enumerate(rows, 1)]


def test_a_failing_run_is_recorded_and_the_others_go_on(tmp_path, stand_ins):
    stand_ins["fail"].add(("ls", 0))
    lines = []
    with closing(_bench(tmp_path, lines)) as b:
        assert b.run() == Counts(done=3, skipped=0, failed=1)
    rows = _rows(tmp_path)
    assert rows["tiny/ls/0"]["status"] == "failed" and "RuntimeError: ls diverged" in rows["tiny/ls/0"]["error"]
    assert "Traceback" in rows["tiny/ls/0"]["error"] and rows["tiny/ls/1"]["status"] == "done"
    assert lines[1].startswith("[2/4] tiny/ls/0: FAILED: RuntimeError: ls diverged | ")
    stand_ins["fail"].clear()  # the next bench retries it, and only it
    with closing(_bench(tmp_path)) as b:
        assert b.run() == Counts(done=1, skipped=3, failed=0)
    assert stand_ins["train"][-1][:2] == ("ls", 0) and _rows(tmp_path)["tiny/ls/0"]["status"] == "done"


def test_a_run_held_by_another_process_is_waited_for_once(tmp_path, stand_ins, monkeypatch):
    from calibkit.bench import attempts

    other = Store(tmp_path / "runs.db")
    assert other.claim("tiny/ls/0", preset="tiny", method="ls", seed=0)
    sleeps = []

    def sleep(s):  # the other process finishes while this bench waits
        sleeps.append(s)
        if len(sleeps) == 2:
            other.finish("tiny/ls/0", metrics={})

    monkeypatch.setattr(runner, "work_queue", lambda items, ready, attempt: attempts.work_queue(
        items, ready, attempt, sleep=sleep))
    lines = []
    b = _bench(tmp_path, lines)
    try:
        assert b.run() == Counts(done=3, skipped=1, failed=0)
    finally:
        b.close()
        other.close()
    assert sleeps == [attempts.POLL_S, attempts.POLL_S]
    assert lines.count("tiny/ls/0: running in another process; waiting for it") == 1
    assert ("ls", 0) not in [c[:2] for c in stand_ins["train"]]


def test_run_one_runs_exactly_one_run_of_its_grid(tmp_path, stand_ins):
    with closing(_bench(tmp_path)) as b:
        with pytest.raises(ValueError) as err:
            b.run_one(0, "focal")
        assert str(err.value) == "tiny/focal/0 is not a run of this bench (methods ce, ls; seeds [0, 1])"
        with pytest.raises(ValueError, match="tiny/ls/5 is not a run"):
            b.run_one(5, "ls")
        assert b.run_one(1, "ls") == Counts(done=1, skipped=0, failed=0)
        assert [c[:2] for c in stand_ins["train"]] == [("ls", 1)]
        assert b.run_one(1, "ls") == Counts(done=0, skipped=1, failed=0)
        other = Store(tmp_path / "runs.db")
        assert other.claim("tiny/ce/0", preset="tiny", method="ce", seed=0)
        assert b.run_one(0, "ce") == Counts(done=0, skipped=1, failed=0)  # held: skipped, not waited for
        other.close()
        stand_ins["fail"].add(("ls", 0))
        assert b.run_one(0, "ls") == Counts(done=0, skipped=0, failed=1)
    assert list(_rows(tmp_path)) == ["tiny/ls/1", "tiny/ce/0", "tiny/ls/0"]


def test_run_one_refuses_a_directory_of_other_values(tmp_path, stand_ins):
    with closing(_bench(tmp_path)) as b:
        b.run_one(0, "ls")
    with closing(_bench(tmp_path, preset=apply_values(TINY, "ls", {"loss.alpha": 0.2}))) as b:
        with pytest.raises(ValueError, match="was run with"):
            b.run_one(1, "ls")


def test_the_run_factory_of_another_preset_shares_everything_but_the_preset(tmp_path):
    with closing(_bench(tmp_path, data_dir="/dd", device="cpu")) as b:
        other = dataclasses.replace(TINY, robust_n=5)
        f = b.factory.with_preset(other)
        assert f.preset is other and b.preset is TINY and b.factory.preset is TINY
        assert (f.out, f.dd, f.data_dir, f.device, f.num_threads, f.env) == (
            tmp_path, b.dd, "/dd", "cpu", 1, b.factory.env)


# ------------------------------------------------------------------------------ one policy, one set of values


def _finished(out, method="ls", seed=0, preset=TINY, run_dir=True):
    """A finished run of ``preset`` recorded by a bench (its directory made)."""
    with closing(Bench(preset, out, methods=[method], log=quiet)) as b:
        key = f"tiny/{method}/{seed}"
        d = out / "runs" / "tiny" / method / f"seed{seed}"
        assert b.store.claim(key, preset="tiny", method=method, seed=seed, config=b.factory.config_record(method, seed))
        if run_dir:
            d.mkdir(parents=True)
            (d / "marker").write_text(key)
        b.store.finish(key, metrics=METRICS, run_dir=str(d) if run_dir else None,
                       logits_path=str(d / rundir.LOGITS) if run_dir else None)
    return key, d


def _select(out, method, values):
    with Store(out / "runs.db") as s:
        key = f"tiny/{method}/7/x"
        s.claim(key, table="tuning", preset="tiny", method=method, seed=7, hparams=values, config={})
        s.finish(key, table="tuning", metrics={})
        s.select_candidate("tiny", method, 7, key, {"rule": "test"})


def test_check_consistent_refuses_another_policy_naming_both(tmp_path):
    _finished(tmp_path)
    with closing(_bench(tmp_path, preset=dataclasses.replace(TINY, train={**TINY.train, "keep": "last"}))) as b:
        with pytest.raises(ValueError) as err:
            b.check_consistent()
        assert str(err.value) == (f"{tmp_path / 'runs.db'} holds runs of preset tiny made under the checkpoint "
                                  f"policy {TINY.keep!r}; this bench uses 'last'. Choose another --out (one "
                                  "policy per bench)")
    _recorded(tmp_path, "tiny/focal/0", {"train": {"keep": "last"}})  # an older record: the policy under "train"
    with closing(_bench(tmp_path)) as b:
        with pytest.raises(ValueError, match="policy 'last'; this bench uses 'best-acc'"):
            b.check_consistent()


def test_check_consistent_reads_an_old_record_without_a_policy_as_best_acc(tmp_path):
    _recorded(tmp_path, "tiny/ce/0", {})
    _recorded(tmp_path, "tiny/ce/1", {"train": {}})
    for keep, ok in (("best-acc", True), ("last", False)):
        with closing(_bench(tmp_path, preset=dataclasses.replace(TINY, train={**TINY.train, "keep": keep}))) as b:
            if ok:
                assert b.check_consistent() == []
            else:
                with pytest.raises(ValueError, match="policy 'best-acc'"):
                    b.check_consistent()


def test_check_consistent_refuses_other_values_and_names_the_selection(tmp_path):
    key, _ = _finished(tmp_path)
    other = apply_values(TINY, "ls", {"loss.alpha": 0.2})
    with closing(_bench(tmp_path, preset=other)) as b:
        with pytest.raises(ValueError) as err:
            b.check_consistent()
        assert str(err.value) == (f"{tmp_path / 'runs.db'}: {key} was run with {{'loss.alpha': 0.05}}, this bench "
                                  "would use {'loss.alpha': 0.2}. Choose another --out (one set of values per bench)")
    _select(tmp_path, "ls", {"loss.alpha": 0.1})  # a tuning chose a third value
    with closing(_bench(tmp_path, preset=other)) as b:
        with pytest.raises(ValueError) as err:
            b.check_consistent()
        assert str(err.value).endswith("(one set of values per bench); this directory's tuning selected "
                                       "{'loss.alpha': 0.1} (bench --tune runs at the selection)")


def test_check_consistent_ignores_other_methods_old_records_and_retired_runs(tmp_path):
    _finished(tmp_path, "focal")
    _recorded(tmp_path, "tiny/ls/0", {"keep": TINY.keep, "hparams": None})  # a record without values
    _recorded(tmp_path, "tiny/ls/1~alpha=0.2", {"keep": TINY.keep, "hparams": {"loss.alpha": 0.2}})
    # focal is not in this bench, ls/0 has no values, ls/1~... was moved aside
    with closing(_bench(tmp_path)) as b:
        assert b.check_consistent() == []
    with closing(_bench(tmp_path, preset=apply_values(TINY, "focal", {"loss.gamma": 1.0}), methods=["focal"])) as other:
        with pytest.raises(ValueError, match="tiny/focal/0 was run with"):
            other.check_consistent()


def test_recorded_selection_reads_the_selected_candidates_of_the_tune_seed(tmp_path):
    with closing(_bench(tmp_path)) as b:
        assert b.recorded_selection() == {}
        with Store(tmp_path / "runs.db") as s:
            for key, seed, alpha in (("a", 7, 0.1), ("b", 7, 0.2), ("c", 3, 0.3)):
                s.claim(key, table="tuning", preset="tiny", method="ls", seed=seed, hparams={"loss.alpha": alpha},
                                  config={})
                s.finish(key, table="tuning", metrics={})
            s.select_candidate("tiny", "ls", 7, "b", {})
            s.select_candidate("tiny", "ls", 3, "c", {})
        assert b.recorded_selection() == {"ls": {"loss.alpha": 0.2}}


# ------------------------------------------------------------------------------ stale runs moved aside


def test_a_stale_run_is_moved_aside_and_run_again(tmp_path, stand_ins):
    key, d = _finished(tmp_path)
    _select(tmp_path, "ls", {"loss.alpha": 0.1})
    tuned = apply_values(TINY, "ls", {"loss.alpha": 0.1})
    lines = []
    with closing(Bench(tuned, tmp_path, methods=["ls"], seeds=[0], log=lines.append)) as b:
        assert b.check_consistent() == [key]
        assert b.run() == Counts(done=2, skipped=0, failed=0)
    moved = d.with_name("seed0~alpha=0.05")
    assert lines[0] == (f"{key}: run at {{'loss.alpha': 0.05}}, not this directory's selection; kept as "
                        "tiny/ls/0~alpha=0.05 and run again")
    assert (moved / "marker").read_text() == key and (d / rundir.LOGITS).is_file()
    rows = _rows(tmp_path)
    old = rows["tiny/ls/0~alpha=0.05"]
    assert old["status"] == "done" and old["metrics"] == METRICS and old["run_dir"] == str(moved)
    assert old["logits_path"] == str(moved / rundir.LOGITS)
    assert rows[key]["config"]["hparams"] == {"loss.alpha": 0.1} and rows[key]["status"] == "done"


def test_supersede_picks_a_free_key_and_skips_what_is_gone(tmp_path):
    key, d = _finished(tmp_path)
    for taken in ("tiny/ls/0~alpha=0.05", "tiny/ls/0~alpha=0.05~2"):  # two earlier moves of the same values
        _recorded(tmp_path, taken, {})
    lines = []
    with closing(_bench(tmp_path, lines)) as b:
        b.supersede(["tiny/ls/9", key])  # a key with no row: nothing to move, the next one is moved
        assert lines == [f"{key}: run at {{'loss.alpha': 0.05}}, not this directory's selection; kept as "
                         "tiny/ls/0~alpha=0.05~3 and run again"]
        assert (d.with_name("seed0~alpha=0.05~3") / "marker").is_file() and not d.exists()
        b.supersede([key])  # moved already (by another worker): nothing happens
        assert len(lines) == 1
        b.supersede([])
    assert _rows(tmp_path)["tiny/ls/0~alpha=0.05~3"]["status"] == "done" and key not in _rows(tmp_path)


def test_supersede_takes_the_second_key_when_only_the_first_is_taken(tmp_path):
    key, d = _finished(tmp_path)
    _recorded(tmp_path, "tiny/ls/0~alpha=0.05", {})
    with closing(_bench(tmp_path)) as b:
        b.supersede([key])
    assert (d.with_name("seed0~alpha=0.05~2") / "marker").is_file() and "tiny/ls/0~alpha=0.05~2" in _rows(tmp_path)


def test_supersede_of_a_run_without_a_directory_and_a_lost_race(tmp_path, monkeypatch):
    key, _ = _finished(tmp_path, run_dir=False)
    with closing(_bench(tmp_path)) as b:
        b.supersede([key])
        row = b.store.get("tiny/ls/0~alpha=0.05")
        assert row["status"] == "done" and row["run_dir"] is None and row["logits_path"] is None
    key, d = _finished(tmp_path, seed=1)
    lines = []
    with closing(_bench(tmp_path, lines)) as b:
        real = b.store.retire

        def lost(k, *a):
            if k == key:
                raise KeyError("taken")
            return real(k, *a)

        monkeypatch.setattr(b.store, "retire", lost)
        b.supersede([key])
        assert lines == [] and (d / "marker").is_file()  # the other worker's move stands; this one does nothing
        key2, d2 = _finished(tmp_path, seed=2)
        b.supersede([key, key2])  # a lost race does not stop the next key
        assert len(lines) == 1 and lines[0].startswith(f"{key2}: run at") and not d2.exists()


def test_supersede_leaves_a_missing_directory_alone(tmp_path):
    key, d = _finished(tmp_path)
    (d / "marker").unlink()
    d.rmdir()
    with closing(_bench(tmp_path)) as b:
        b.supersede([key])
    assert not d.exists() and not d.with_name("seed0~alpha=0.05").exists()
    assert _rows(tmp_path)["tiny/ls/0~alpha=0.05"]["run_dir"] == str(d.with_name("seed0~alpha=0.05"))


# ------------------------------------------------------------------------------ the record of a run


def test_config_record_holds_what_a_table_must_not_mix(tmp_path):
    preset = dataclasses.replace(TINY, train_by_method={"ls": {"lr": 0.1}}, data_dir="/d", ood="none",
                                 robust_n=30, severities=(1, 3))
    with closing(Bench(preset, tmp_path, methods=None, log=quiet)) as b:
        rec = b.factory.config_record("ls", 1)
        assert rec == {"preset": "tiny", "method": "ls", "kind": "train", "seed": 1, "keep": preset.keep,
                       "hparams": {"loss.alpha": 0.05}, "loss": "ls", "train_method": "standard",
                       "dataset": "digits", "model": "mlp", "train": {**TINY.train, "milestones": [2, 3]},
                       "train_overrides": {"lr": 0.1}, "ood": "none", "robust_n": 30, "severities": [1, 3],
                       "data_dir": "/d"}
        assert preset.train["milestones"] == [0.5, 0.75]  # the preset itself is unchanged
        record = b.factory.config_record
        assert record("maccal", 0)["maccal"] == dict(preset.maccal) and "csm" not in record("maccal", 0)
        assert record("csm", 0)["csm"] == dict(preset.csm) and "maccal" not in record("csm", 0)
        assert "maccal" not in rec and "csm" not in rec
    plain = dataclasses.replace(TINY, train={k: v for k, v in TINY.train.items() if k != "milestones"})
    no_milestones = dataclasses.replace(plain, train={**plain.train, "milestones": None})
    with closing(Bench(no_milestones, tmp_path / "p", log=quiet)) as b:
        assert b.factory.config_record("ce", 0)["train"]["milestones"] is None
    no_epochs = {k: v for k, v in TINY.train.items() if k != "epochs"}
    from calibkit.config import TrainConfig

    # epochs not set by the preset: TrainConfig's default
    with closing(Bench(dataclasses.replace(TINY, train={**no_epochs, "milestones": [0.5]}), tmp_path / "q",
                       log=quiet)) as b:
        assert b.factory.config_record("ce", 0)["train"]["milestones"] == [int(0.5 * TrainConfig.epochs)]


# ------------------------------------------------------------------------------ what each part is handed


def test_eval_data_loads_the_runs_split_and_caches_under_the_bench(tmp_path, monkeypatch):
    import calibkit.data

    loads, made = [], []
    monkeypatch.setattr(calibkit.data, "load", lambda name, **kw: loads.append((name, kw)) or f"bundle-{len(loads)}")
    monkeypatch.setattr(evaluation, "EvalData", lambda *a: made.append(a) or a)
    preset = dataclasses.replace(TINY, train={**TINY.train, "train_subset": 300})
    with closing(Bench(preset, tmp_path, methods=["ls"], data_dir="/dd", log=quiet)) as b:
        first = b.eval_data(1)
        assert loads == [("digits", {"data_dir": "/dd", "seed": 1, "val_size": 200, "train_subset": 300})]
        assert first == (preset, "bundle-1", tmp_path / "cache", "/dd") and b.eval_data(0) is first
        b.eval_data(0, preset=dataclasses.replace(preset, robust_n=7))
        assert len(loads) == 2 and loads[1][1]["seed"] == 0


def test_train_passes_the_generated_set_to_a_csm_run(tmp_path, monkeypatch):
    import calibkit.train

    got = []
    monkeypatch.setattr(calibkit.train, "train", lambda cfg, out, **kw: got.append(cfg) or {"status": "done"})
    with closing(_bench(tmp_path, methods=["csm"])) as b:
        b.factory.train("csm", 0, tmp_path / "r", csm_data=tmp_path / "gen")
    assert got[0].csm_data == str(tmp_path / "gen") and got[0].method == METHODS["csm"].method


class _Progress:
    """A stand-in for RunProgress that records how it is made and called."""

    made = []

    def __init__(self, total, write=None, bar=None):
        self.calls = []
        _Progress.made.append((total, write, bar, self))

    def begin(self, key):
        self.calls.append(("begin", key))

    def end(self, key, text, seconds=None):
        self.calls.append(("end", key, text, seconds))
        self.write_line = text

    def close(self):
        self.calls.append(("close",))


def test_progress_gets_a_bar_only_for_print_on_a_terminal_and_every_runs_duration(tmp_path, stand_ins,
                                                                               monkeypatch):
    monkeypatch.setattr(runner, "RunProgress", _Progress)
    _Progress.made.clear()
    stand_ins["fail"].add(("ls", 1))
    for tty in (True, False):
        monkeypatch.setattr(runner.sys.stderr, "isatty", lambda tty=tty: tty)
        for log in (print, quiet):
            with closing(Bench(TINY, tmp_path / f"{tty}{log is print}", methods=["ls"], log=log)) as b:
                b.run()
                b.run_one(0, "ls")
    bars = [(total, bar) for total, _, bar, _ in _Progress.made]
    assert bars == [(4, True), (1, False), (4, False), (1, False), (4, False), (1, False), (4, False), (1, False)]
    assert all(write is (print if i in (0, 1, 4, 5) else quiet) for i, (_, write, _, _) in enumerate(_Progress.made))
    calls = _Progress.made[0][3].calls
    assert [c[:2] for c in calls] == [("begin", "tiny/ce/0"), ("end", "tiny/ce/0"), ("begin", "tiny/ls/0"),
                                      ("end", "tiny/ls/0"), ("begin", "tiny/ce/1"), ("end", "tiny/ce/1"),
                                      ("begin", "tiny/ls/1"), ("end", "tiny/ls/1"), ("close",)]
    seconds = [c[3] for c in calls if c[0] == "end"]
    assert all(s is not None and 0 <= s < 30 for s in seconds), seconds  # the failed run's too
    assert calls[7][2] == "FAILED: RuntimeError: ls diverged"
    again = _Progress.made[1][3].calls
    assert again == [("end", "tiny/ls/0", "finished earlier; skipped", None), ("close",)]


def test_run_asks_whether_each_method_and_seed_is_ready(tmp_path, stand_ins, monkeypatch):
    asked = []
    monkeypatch.setattr(Bench, "needs_ready", lambda self, method, seed: asked.append((method, seed)) or True)
    with closing(_bench(tmp_path)) as b:
        b.run()
    assert asked == [("ce", 0), ("ls", 0), ("ce", 1), ("ls", 1)]


def test_a_runs_record_names_the_code_it_ran(tmp_path, stand_ins):
    with closing(_bench(tmp_path)) as b:
        b.factory = dataclasses.replace(b.factory, env={"git_commit": "abc123", "versions": {"torch": "x"}})
        b.run_one(0, "ls")
    row = _rows(tmp_path)["tiny/ls/0"]
    assert row["git_commit"] == "abc123" and row["versions"] == {"torch": "x"}


def test_rank_1_of_a_torchrun_bench_trains_but_neither_evaluates_writes_nor_logs(tmp_path, stand_ins, monkeypatch):
    """Under torchrun every rank runs the loop; rank 0 decides and its decisions are broadcast."""
    from calibkit import distributed as D

    monkeypatch.setattr(runner.D, "setup", lambda device: D.Dist(rank=1, world=2))
    monkeypatch.setattr(runner.D, "barrier", lambda dd: None)
    monkeypatch.setattr(runner.D, "teardown", lambda dd: None)
    sent = iter([(None, []), Outcome.CLAIMED, (None, []), Outcome.DONE])  # what rank 0 decided, in order
    monkeypatch.setattr(runner, "broadcast", lambda value, dd: next(sent))
    monkeypatch.setattr(attempts, "broadcast", lambda value, dd: next(sent))
    lines = []
    with closing(_bench(tmp_path, lines)) as b:
        assert isinstance(b.store, NullStore) and not (tmp_path / "runs.db").exists()
        b.log("not shown")
        assert b.run_one(0, "ls") == Counts(done=1, skipped=0, failed=0)
        assert b.run_one(1, "ls") == Counts(done=0, skipped=1, failed=0)
        b.supersede(["tiny/ls/0"])  # rank 0 moves stale runs; this rank only waits for it
    assert [c[:2] for c in stand_ins["train"]] == [("ls", 0)] and stand_ins["eval"] == [] and lines == []


def test_check_consistent_reads_only_this_presets_rows_and_the_top_level_policy(tmp_path):
    _recorded(tmp_path, "other/ls/0", {"keep": "last", "hparams": {"loss.alpha": 0.3}})
    with closing(_bench(tmp_path)) as b:
        assert b.check_consistent() == []
    _recorded(tmp_path, "tiny/ce/0", {"keep": "last", "train": {}})  # its own policy wins over its settings'
    with closing(_bench(tmp_path)) as b:
        with pytest.raises(ValueError, match="policy 'last'"):
            b.check_consistent()


def test_every_stale_run_is_returned(tmp_path):
    keys = [_finished(tmp_path, seed=k)[0] for k in (0, 1)]
    _select(tmp_path, "ls", {"loss.alpha": 0.1})
    with closing(_bench(tmp_path, preset=apply_values(TINY, "ls", {"loss.alpha": 0.1}))) as b:
        assert b.check_consistent() == keys


def test_recorded_selection_ignores_another_presets_tuning(tmp_path):
    with Store(tmp_path / "runs.db") as s:
        s.claim("other/ls/7/x", table="tuning",
                preset="other", method="ls", seed=7, hparams={"loss.alpha": 0.3}, config={})
        s.finish("other/ls/7/x", table="tuning", metrics={})
        s.select_candidate("other", "ls", 7, "other/ls/7/x", {})
    with closing(_bench(tmp_path)) as b:
        assert b.recorded_selection() == {}


def test_config_record_of_a_method_without_overrides(tmp_path):
    with closing(_bench(tmp_path)) as b:
        assert b.factory.config_record("ce", 0)["train_overrides"] == {}
