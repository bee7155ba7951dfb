"""``calibkit.bench.preflight``: what a bench checks before it writes anything, each check alone
(``calibkit.data.load`` and the other checks replaced by recorders where the check only passes
its arguments on; tests/commands/test_errors.py runs the whole command on bad input)."""

import dataclasses
from types import SimpleNamespace

import pytest

from calibkit.bench import preflight as P
from calibkit.bench.grid import PRESETS

SMOKE = dataclasses.replace(PRESETS["smoke"], dataset="digits", ood="none", seeds=(3, 4), data_dir="pdir")


def _bundle(n=1000, modality="image", name="digits"):
    return SimpleNamespace(train=[0] * n, modality=modality, name=name, num_classes=10, in_channels=1)


@pytest.fixture
def rec(monkeypatch):
    """Records the data loads, store checks, OOD loads and CSM checks of check_bench."""
    import calibkit.data
    import calibkit.data.ood
    import calibkit.store

    calls = {"load": [], "store": [], "ood": [], "csm": []}
    bundle = {"value": _bundle()}
    monkeypatch.setattr(calibkit.data, "load", lambda name, **kw: calls["load"].append((name, kw)) or bundle["value"])
    monkeypatch.setattr(calibkit.store, "check_store", lambda out, store: calls["store"].append((out, store)))
    monkeypatch.setattr(calibkit.data.ood, "load_ood", lambda name, like, data_dir: calls["ood"].append(
        (name, like, data_dir)))
    monkeypatch.setattr(P, "_check_csm_store", lambda *a: calls["csm"].append(a))
    calls["bundle"] = bundle
    return calls


def test_the_first_seeds_split_is_loaded_with_the_runs_settings(rec, tmp_path):
    P.check_bench(SMOKE, tmp_path / "out", methods=["ls"])
    assert rec["load"] == [("digits", {"data_dir": "pdir", "seed": 3, "val_size": 500, "train_subset": 1000})]
    assert rec["store"] == [(tmp_path / "out", None)] and rec["ood"] == [] and rec["csm"] == []
    P.check_bench(SMOKE, tmp_path / "out", seeds=[7], methods=["ls"], data_dir="given", store="postgresql://h/db")
    assert rec["load"][1] == ("digits", {"data_dir": "given", "seed": 7, "val_size": 500, "train_subset": 1000})
    assert rec["store"][1] == (tmp_path / "out", "postgresql://h/db")
    assert not (tmp_path / "out").exists()  # checked, not created


@pytest.mark.parametrize("seeds,message", [
    ([], "--seeds: give at least one seed"),
    ([0, -1], "--seeds: every seed must be an integer >= 0, got -1"),
    ([True], "--seeds: every seed must be an integer >= 0, got True"),
    ([1.5], "--seeds: every seed must be an integer >= 0, got 1.5"),
    ([2, 2], "--seeds: repeated seed in [2, 2]"),
])
def test_bad_seeds_are_named(rec, tmp_path, seeds, message):
    with pytest.raises(ValueError) as err:
        P.check_bench(SMOKE, tmp_path, seeds=seeds)
    assert str(err.value) == message and rec["load"] == []


def test_an_unknown_data_set_lists_the_valid_ones(rec, tmp_path):
    from calibkit.data import DATASETS

    with pytest.raises(ValueError) as err:
        P.check_bench(dataclasses.replace(SMOKE, dataset="digitz"), tmp_path)
    assert str(err.value).startswith("preset smoke: dataset: unknown data set 'digitz' (nearest valid name: digits)")
    assert str(err.value).endswith(f"; valid: {', '.join(DATASETS)}")


def test_a_batch_larger_than_the_training_split_is_refused(rec, tmp_path):
    rec["bundle"]["value"] = _bundle(n=127)
    with pytest.raises(ValueError) as err:
        P.check_bench(SMOKE, tmp_path, methods=["ls"])
    assert str(err.value) == "batch_size 128 exceeds the 127 training images of digits; lower it (--batch-size)"
    rec["bundle"]["value"] = _bundle(n=128)
    P.check_bench(SMOKE, tmp_path, methods=["ls"])  # exactly one batch is enough


def test_a_validation_split_that_rounds_to_no_row_is_refused(rec, tmp_path):
    rec["bundle"]["value"] = SimpleNamespace(**vars(_bundle(n=999)), val=[])
    with pytest.raises(ValueError) as err:
        P.check_bench(dataclasses.replace(SMOKE, train={**SMOKE.train, "val_size": 0.0001}), tmp_path / "out",
                      methods=["ls"])
    assert str(err.value) == ("val_size 0.0001: the validation split of digits holds 0 of its 999 training images; "
                              "model selection needs at least one: raise it (--val-size)")
    assert not (tmp_path / "out").exists()
    rec["bundle"]["value"] = SimpleNamespace(**vars(_bundle(n=999)), val=[0])
    P.check_bench(SMOKE, tmp_path / "out", methods=["ls"])  # one row is enough


def test_image_mixing_methods_on_text_or_features_are_refused(rec, tmp_path):
    for modality in ("text", "features"):
        rec["bundle"]["value"] = _bundle(modality=modality)
        with pytest.raises(ValueError) as err:
            P.check_bench(SMOKE, tmp_path, methods=["ls", "mixup", "regmixup"])
        assert str(err.value) == (f"digits holds {modality}, not images: mixup, regmixup mix or generate images; set "
                                  f"modality = \"{modality}\" in the preset (they are skipped then), or leave them "
                                  "out of the methods")
    P.check_bench(SMOKE, tmp_path, methods=["ls"])  # no mixing method: fine
    rec["bundle"]["value"] = _bundle(modality="image")
    P.check_bench(SMOKE, tmp_path, methods=["mixup"])


def test_only_ood_sets_that_need_files_are_loaded(rec, tmp_path):
    for ood in ("none", "digits", "noise"):  # built in (or none): nothing to load for image data
        P.check_bench(dataclasses.replace(SMOKE, ood=ood), tmp_path, methods=["ls"])
    assert rec["ood"] == []
    mine = tmp_path / "my_ood"
    mine.mkdir()
    P.check_bench(dataclasses.replace(SMOKE, ood=str(mine)), tmp_path, methods=["ls"], data_dir="d")
    assert rec["ood"] == [(str(mine), rec["bundle"]["value"], "d")]
    rec["bundle"]["value"] = text = _bundle(modality="text")
    P.check_bench(dataclasses.replace(SMOKE, ood="noise"), tmp_path, methods=["ls"])  # text noise: built from data
    assert rec["ood"][-1] == ("noise", text, "pdir")
    P.check_bench(SMOKE, tmp_path, methods=["ls"])  # none is never loaded
    assert len(rec["ood"]) == 2


def test_the_csm_check_gets_the_bench_arguments(rec, tmp_path):
    P.check_bench(SMOKE, tmp_path, methods=["csm"])
    assert rec["csm"] == [(SMOKE, None, rec["bundle"]["value"], [3, 4], False, "auto")]
    (tmp_path / "s").mkdir()
    store = str(tmp_path / "s")
    P.check_bench(SMOKE, tmp_path, seeds=[5], methods=["csm"], csm_store=store, csm_build=True, device="cuda:1")
    assert rec["csm"][1] == (SMOKE, store, rec["bundle"]["value"], [5], True, "cuda:1")


def test_a_csm_store_given_by_hand_must_exist_whatever_the_methods(rec, tmp_path):
    (tmp_path / "afile").write_text("x")
    for store, kind, message in (
            (str(tmp_path / "nostore"), FileNotFoundError,
             f"--csm-store {tmp_path / 'nostore'}: no such folder (make a "
             "generated set with `calibkit csm generate`, or leave --csm-store out)"),
            (str(tmp_path / "afile"), ValueError, f"--csm-store {tmp_path / 'afile'}: is a file, not a folder (a "
             "generated set is a folder)"),
            ("", ValueError, "--csm-store: empty path ''; give the generated set's folder")):
        with pytest.raises(kind) as err:
            P.check_bench(SMOKE, tmp_path / "out", methods=["ce"], csm_store=store)
        assert str(err.value) == message
    assert rec["load"] == [] and rec["csm"] == [] and not (tmp_path / "out").exists()
    with pytest.raises(FileNotFoundError, match=r"or leave --csm-store out and pass --csm-build\)$"):
        P.check_bench(SMOKE, tmp_path / "out", methods=["csm"], csm_store=str(tmp_path / "nostore"))


def test_tune_checks_the_bench_on_its_selection_seed(monkeypatch):
    seen = []
    monkeypatch.setattr(P, "check_bench", lambda preset, out, **kw: seen.append((preset, out, kw)))
    P.check_tune(SMOKE, "o")
    P.check_tune(SMOKE, "o", methods=["ls"], seed=9, data_dir="d", csm_store="c", store="u", csm_build=True,
                 device="cpu")
    assert seen == [(SMOKE, "o", {"seeds": [100], "methods": None, "data_dir": None, "csm_store": None, "store": None,
                                  "csm_build": False, "device": "auto", "seeds_flag": "tune_seed"}),
                    (SMOKE, "o", {"seeds": [9], "methods": ["ls"], "data_dir": "d", "csm_store": "c", "store": "u",
                                  "csm_build": True, "device": "cpu", "seeds_flag": "--seed"})]



def test_tune_refuses_methods_without_a_search_space_before_loading(rec, tmp_path):
    from calibkit.bench.grid import METHODS

    tunable = ", ".join(m for m, spec in METHODS.items() if spec.space)
    with pytest.raises(ValueError) as err:
        P.check_tune(SMOKE, tmp_path / "o", methods=["ce"])
    assert str(err.value) == f"--methods ce: nothing to tune (ce has no search space); methods with one: {tunable}"
    assert rec["load"] == [] and not (tmp_path / "o").exists()
    with pytest.raises(ValueError) as err:  # the preset's own list, named as such
        P.check_tune(dataclasses.replace(SMOKE, methods=("ce",)), tmp_path / "o")
    assert str(err.value).startswith("preset smoke: methods ce: nothing to tune")
    with pytest.raises(ValueError) as err:  # on token ids, only the methods that can run them are offered
        P.check_tune(dataclasses.replace(SMOKE, modality="text"), tmp_path / "o", methods=["ce"])
    offered = str(err.value).rpartition("methods with one: ")[2].split(", ")
    assert "ls" in offered and not {"mixup", "regmixup", "csm"} & set(offered)
    P.check_tune(SMOKE, tmp_path / "o", methods=["ce", "ls"])  # with a tunable one: CE is its reference


def test_a_tune_seed_among_the_evaluation_seeds_is_warned(rec, tmp_path):
    with pytest.warns(UserWarning) as seen:
        P.check_tune(SMOKE, tmp_path, methods=["ls"], seed=4)
    assert [str(w.message) for w in seen] == [
        "--seed 4 is also an evaluation seed of preset smoke (seeds 3, 4): the selection sees the randomness of a "
        "run whose test numbers are reported; choose a seed outside them (the shipped presets tune on 100)"]
    with pytest.warns(UserWarning, match=r"^tune_seed 3 is also an evaluation seed of preset smoke"):
        P.check_tune(dataclasses.replace(SMOKE, tune_seed=3), tmp_path, methods=["ls"])
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        P.check_tune(SMOKE, tmp_path, methods=["ls"], seed=5)  # outside the evaluation seeds: silent


def test_out_must_be_a_folder_no_training_run_owns(tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(FileExistsError) as err:
        P.check_out(tmp_path / "afile")
    assert str(err.value) == (f"--out {tmp_path / 'afile'} is an existing file; the bench writes a folder there: "
                              "choose another path")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    with pytest.raises(ValueError) as err:
        P.check_out(run)
    assert str(err.value).startswith(f"--out {run} is ") and str(err.value).endswith(
        "; a bench writes runs.db, runs/ and report/ into its own directory: choose another path")
    P.check_out(tmp_path / "new")  # absent: fine
    P.check_out(tmp_path)  # a plain folder: fine


def test_a_user_model_that_cannot_be_built_is_named(tmp_path, monkeypatch):
    import sys

    (tmp_path / "mymodels.py").write_text("def broken(num_classes, in_channels):\n    raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mymodels", raising=False)
    with pytest.raises(ValueError) as err:
        P.check_model("mymodels:broken", _bundle())
    assert str(err.value) == ("model 'mymodels:broken': factory(num_classes=10, in_channels=1) failed "
                              "(RuntimeError: boom)")
    P.check_model("mlp", _bundle())  # a shipped model on a shipped data set: resolved only, not built


def test_a_missing_generated_set_names_the_fix(monkeypatch):
    import calibkit.bench.csmbuild as csmbuild
    import calibkit.extras

    monkeypatch.setattr(csmbuild, "cost_line",
                        lambda *a: f"cost of {a[0].name} on {a[1].name} for seeds {a[2]} on {a[3]}")
    required = []
    monkeypatch.setattr(calibkit.extras, "require", lambda *a: required.append(a))
    with pytest.raises(FileNotFoundError) as err:
        P._check_csm_store(SMOKE, "/nowhere", _bundle(), [3])
    assert str(err.value) == ("--csm-store /nowhere: no such folder (make a generated set with `calibkit csm "
                              "generate`, or leave --csm-store out and pass --csm-build)")
    with pytest.raises(ValueError) as err:
        P._check_csm_store(SMOKE, None, _bundle(modality="text"), [3])
    assert str(err.value) == "csm: digits is text, not images; CSM does not apply: leave csm out of --methods"
    with pytest.raises(FileNotFoundError) as err:
        P._check_csm_store(SMOKE, None, _bundle(), [3, 4])
    assert str(err.value) == "cost of smoke on digits for seeds [3, 4] on auto" and required == []
    P._check_csm_store(SMOKE, None, _bundle(), [3], csm_build=True, device="cpu")
    assert required == [("diffusers", "building a CSM generated set (--csm-build)")]


def test_the_extra_a_data_set_needs_is_named_before_it_is_read(rec, tmp_path, monkeypatch):
    import calibkit.extras as extras

    real = extras.available
    monkeypatch.setattr(extras, "available", lambda m: False if m == "scipy" else real(m))
    with pytest.raises(extras.MissingExtra, match="scipy"):
        P.check_bench(dataclasses.replace(SMOKE, dataset="svhn"), tmp_path, methods=["ls"])
    with pytest.raises(extras.MissingExtra, match="scipy"):  # the OOD set's too
        P.check_bench(dataclasses.replace(SMOKE, ood="svhn"), tmp_path, methods=["ls"])
    assert rec["load"] == []
