"""MaC-Cal on run directories, pinned field by field: the summary, maccal.json and config.json
against the files and a recomputation from the stored logits, the progress lines by hand, the
device choice, and every refusal (stage-1 run, output directory, validation split, model)."""

import json

import pytest
import torch

from calibkit import rundir
from calibkit.functional import ece
from calibkit.methods.maccal import load_maccal, run_maccal
from calibkit.methods.maccal import run as run_mod
from calibkit.methods.maccal.masking import MC_SEED_OFFSET

pytestmark = pytest.mark.usefixtures("one_thread")

STAGE1 = dict(data="digits", model="mlp", epochs=1, num_threads=1, device="cpu")
HP = dict(r_init=0.8, eta=0.5, r_min=0.3, epochs=2, lr=0.05, momentum=0.8, weight_decay=1e-4, batch_size=64,
          grad_clip=2.0, n_bins=7, seed=3, mc_samples=4)


@pytest.fixture(scope="module")
def s1(tmp_path_factory):
    from calibkit.train import load_config, train

    path = tmp_path_factory.mktemp("mrun") / "s1"
    train(load_config(**STAGE1), path, progress=False, verbose=False)
    return path


@pytest.fixture
def done(s1, tmp_path):
    """Stage 2 with every hyperparameter away from its default and another loss, into a directory
    that holds the stage-1 run as a subdirectory (allowed), with its progress lines collected.
    Function-scoped: each test makes its own run (a fraction of a second on digits)."""
    out = tmp_path / "m"
    out.mkdir()
    (out / "s1").symlink_to(s1, target_is_directory=True)
    lines = []
    summary = run_maccal(out / "s1", out, device="cpu", log=lines.append, loss="ls:alpha=0.2", **HP)
    return {"out": out, "summary": summary, "lines": lines, "info": rundir.load_info(out),
            "rec": rundir.read_json(out / run_mod.MACCAL_JSON), "hist": rundir.read_json(out / rundir.HISTORY),
            "info1": rundir.load_info(s1)}


def test_summary_and_records_agree_with_a_recomputation_from_the_stored_logits(done):
    s, rec, info, hist = done["summary"], done["rec"], done["info"], done["hist"]
    logits = rundir.load_logits(done["out"])
    y = logits["test_labels"]
    acc = float((logits["test_logits"].argmax(1) == y).double().mean())
    ece7 = float(ece(logits["test_logits"].softmax(1), y, n_bins=7))
    assert ece7 != pytest.approx(float(ece(logits["test_logits"].softmax(1), y, n_bins=15)))  # n_bins matters
    assert s["test_acc"] == pytest.approx(acc, abs=1e-12) and info["test_acc"] == s["test_acc"]
    assert s["test_ece"] == pytest.approx(ece7, abs=1e-12) and info["test_ece"] == s["test_ece"]
    assert s["status"] == "done" and s["out_dir"] == str(done["out"])
    # With mc_samples > 0 the stored logits are log-probabilities of the deployed predictor.
    for name in ("val_logits", "test_logits"):
        torch.testing.assert_close(logits[name].logsumexp(1), torch.zeros(len(logits[name])), rtol=0, atol=1e-5)
    model, est = load_maccal(done["out"])
    from calibkit.data import load
    from calibkit.data.inputs import inputs_from_info
    from calibkit.methods.maccal import extract_features

    prep = inputs_from_info(info)
    test = load("digits").test
    feats, _ = extract_features(model, (test.images, test.labels), lambda m, x: m.forward_features(prep.eval_batch(x)))
    torch.testing.assert_close(est.predict_log_proba(feats), logits["test_logits"], rtol=1e-5, atol=1e-5)
    # Stage 2's choice: the epoch of lowest validation ECE, its keep rate, the keep-rate trajectory.
    val_eces = [r["val_ece"] for r in hist[1:]]
    best = 1 + val_eces.index(min(val_eces))
    assert s["best_epoch"] == rec["best_epoch"] == info["best_epoch"] == best
    assert s["best_keep_rate"] == rec["best_keep_rate"] == hist[best]["keep_rate"]
    assert s["keep_rates"] == rec["keep_rates"] == [r["keep_rate"] for r in hist[1:]]
    assert rec["keep_rates"][0] == HP["r_init"] and len(hist) == HP["epochs"] + 1
    assert s["val_ece"] == rec["best_val_ece"] == min(val_eces) and rec["val_ece"] == val_eces
    assert rec["stage1_val_ece"] == hist[0]["unmasked_val_ece"]
    assert s["wall_time_s"] == rec["stage2_wall_time_s"] == info["wall_time_s"] and 0 < s["wall_time_s"] < 600
    assert s["feature_time_s"] == rec["feature_time_s"] and 0 < s["feature_time_s"] < 600
    assert 0 <= rec["inference_time_s"] < 600
    assert rec["stage1_val_logits_max_abs_diff"] < 1e-4
    assert set(s) == {"status", "out_dir", "best_epoch", "best_keep_rate", "keep_rates", "val_ece", "test_acc",
                      "test_ece", "wall_time_s", "feature_time_s"}


def test_recorded_settings_and_provenance(done, s1):
    rec, info, info1 = done["rec"], done["info"], done["info1"]
    assert rec["hparams"] == {**HP, "loss": "ls:alpha=0.2"} and info["maccal"] == rec["hparams"]
    assert rec["rule"] == run_mod.RULE and "r <- clip(r - eta * (c - a), r_min, 1)" in rec["rule"]
    assert rec["inference"] == (f"probabilities averaged over 4 masked heads at keep rate {rec['best_keep_rate']} "
                                f"(masks from a CPU generator seeded with seed + {MC_SEED_OFFSET}); "
                                "stored as their log")
    assert info["method"] == "maccal" and info["config"] == {**info1["config"], "method": "maccal"}
    assert info["stage1"] == {"path": str((done["out"] / "s1").resolve()), "config": info1["config"],
                              "git_commit": info1.get("git_commit"), "best_epoch": info1["best_epoch"],
                              "wall_time_s": info1["wall_time_s"]}
    assert info1["best_epoch"] == 1 and info1["wall_time_s"] > 0
    assert info["device"] == "cpu" and info["status"] == "done" and info["epochs_done"] == HP["epochs"]
    assert info["best_val_acc"] == done["hist"][info["best_epoch"]]["val_acc"]
    for key in ("git_commit", "git_dirty", "versions", "host"):  # this run's own environment
        assert key in info
    # The stage-1 fields that stage 2 does not redo are carried over (data split, data set, seed).
    assert info["split"] == info1["split"]
    # Files: exactly the stage-2 files next to the stage-1 run, which is left as it was.
    names = {p.name for p in done["out"].iterdir()}
    assert names == set(run_mod.STAGE2_FILES) | {rundir.CONFIG, "s1"}
    assert str(s1.resolve()) == info["stage1"]["path"]


def test_progress_lines_by_hand():
    lines = []
    progress = run_mod._progress_logger(lines.append, 12)
    progress({"epoch": 0, "keep_rate": 0.9, "train_loss": None, "val_acc": 0.5, "val_conf": 0.625,
              "val_ece": 0.12345, "next_keep_rate": 0.9})
    progress({"epoch": 3, "keep_rate": 0.75, "train_loss": 1.23456, "val_acc": 0.8125, "val_conf": 0.9,
              "val_ece": 0.0375, "next_keep_rate": 0.7})
    assert lines == [
        "stage-1 head  r 0.900  val acc 50.00%  conf 62.50%  val ECE 12.35  -> r 0.900",
        "epoch   3/12  r 0.750  loss 1.2346  val acc 81.25%  conf 90.00%  val ECE 3.75  -> r 0.700",
    ]


def test_run_logs_features_every_epoch_and_the_result(done):
    lines, hist, s = done["lines"], done["hist"], done["summary"]
    assert len(lines) == 1 + len(hist) + 1
    n_val, n_test = (len(rundir.load_logits(done["out"])["val_labels"]),
                     len(rundir.load_logits(done["out"])["test_labels"]))
    assert lines[0].startswith("features: train (") and f", val {n_val}, test {n_test} in " in lines[0]
    assert lines[1].startswith("stage-1 head  r 0.800") and lines[2].startswith("epoch   1/2  r 0.800  loss ")
    assert lines[-1] == (f"done: best epoch {s['best_epoch']} (r {s['best_keep_rate']:.3f}, val ECE "
                         f"{100 * s['val_ece']:.2f}), test acc {s['test_acc']:.2%}, test ECE "
                         f"{100 * s['test_ece']:.2f}, "
                         f"stage 2 {s['wall_time_s']:.1f}s")


def test_feature_line_names_the_train_feature_shape(done):
    from calibkit.data import load

    n_train = len(load("digits").train)
    d = rundir.read_tensors(done["out"] / rundir.MODEL)["head.weight"].shape[1]
    assert f"features: train ({n_train}, {d}), val " in done["lines"][0]


def test_load_maccal_rebuilds_the_fitted_estimator(done, tmp_path):
    model, est = load_maccal(done["out"])
    rec = done["rec"]
    assert est.keep_rate_ == rec["best_keep_rate"] and est.best_epoch_ == rec["best_epoch"]
    assert est.history_ == rec and est.loss_ is None
    k, d = model.head.weight.shape
    assert (est.n_classes_, est.n_features_in_) == (k, d) == (10, d)
    assert est.head_ is model.head and not any(p.requires_grad for p in est.head_.parameters())
    assert est.get_params()["mc_samples"] == HP["mc_samples"] and est.get_params()["seed"] == HP["seed"]
    assert est.get_params()["loss"] == "ls:alpha=0.2" and est.get_params()["head"] is model.head
    # A MaC-Cal config.json without its maccal.json is refused.
    (tmp_path / "copy").mkdir()
    for name in (rundir.CONFIG, rundir.MODEL, rundir.LOGITS):
        (tmp_path / "copy" / name).write_bytes((done["out"] / name).read_bytes())
    with pytest.raises(ValueError, match=r"copy is not a MaC-Cal run \(method 'maccal'\)$"):
        load_maccal(tmp_path / "copy")


def test_unmasked_head_gives_the_plain_head_on_stored_logits(s1, tmp_path):
    out = tmp_path / "bare"
    run_maccal(s1, out, epochs=1, mc_samples=0, device="cpu", n_bins=5)
    rec = rundir.read_json(out / run_mod.MACCAL_JSON)
    assert rec["inference"] == "the deterministic unmasked head (mc_samples = 0)"
    model, _, _ = rundir.load_run(out)
    stored = rundir.load_logits(out)
    # Plain logits, not log-probabilities: rows do not log-sum-exp to 0.
    assert stored["test_logits"].logsumexp(1).abs().max() > 1e-3
    assert stored["test_logits"].dtype == torch.float32


def test_device_choice(monkeypatch):
    assert run_mod._device("cpu") == torch.device("cpu")
    for available, want in ((True, "cuda"), (False, "cpu")):  # torch.device("cuda") needs no GPU to be made
        monkeypatch.setattr(torch.cuda, "is_available", lambda available=available: available)
        assert run_mod._device("auto") == torch.device(want)
    monkeypatch.undo()
    assert run_mod._device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert run_mod._device("cuda:1") == torch.device("cuda", 1)


def test_stage1_refusals_name_the_problem(s1, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^stage-1 run directory \S*nope not found; give a folder "
                       r"that `calibkit train --out` wrote$"):
        run_mod.stage1_run(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError,
                       match=r"^stage-1: \S*empty is not a calibkit run directory \(no config.json\)$"):
        run_mod.stage1_run(empty)
    path, info = run_mod.stage1_run(s1)
    assert path == s1 and info == rundir.load_info(s1)
    # status "done" but no weights: not finished either; the message names the status.
    nomodel = tmp_path / "nomodel"
    nomodel.mkdir()
    (nomodel / rundir.CONFIG).write_text((s1 / rundir.CONFIG).read_text())
    with pytest.raises(ValueError, match=r"^stage-1: \S*nomodel is not a finished run \(status 'done'\); finish "
                                         r"training it first \(run the same calibkit train command again\)$"):
        run_mod.stage1_run(nomodel)
    maccal = tmp_path / "mc"
    maccal.mkdir()
    (maccal / rundir.CONFIG).write_text(json.dumps({"method": "maccal", "stage1": {"path": "/x/s1"}}))
    with pytest.raises(ValueError, match=r"^stage-1: \S*mc is itself a MaC-Cal run; pass the stage-1 run it was "
                                         r"made from \(/x/s1\)$"):
        run_mod.stage1_run(maccal)
    (maccal / rundir.CONFIG).write_text(json.dumps({"method": "maccal"}))
    with pytest.raises(ValueError, match=r"^stage-1: \S*mc is itself a MaC-Cal run; pass the stage-1 run it was "
                                         r"made from \(None\)$"):
        run_mod.stage1_run(maccal)


def test_output_directory_refusals(s1, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ValueError, match=r"^out: \S*afile exists and is not a directory$"):
        run_mod._check_out(afile, s1)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    with pytest.raises(ValueError, match=r"^out: \S*busy exists and is not empty; choose another directory "
                                         r"\(a MaC-Cal run is never overwritten\)$"):
        run_mod._check_out(busy, s1)
    with pytest.raises(ValueError, match=r"^out: \S*s1 is the stage-1 run itself; choose another directory$"):
        run_mod._check_out(s1, s1)
    run_mod._check_out(tmp_path / "new", s1)  # a new directory
    holder = tmp_path / "holder"
    (holder / "inner").mkdir(parents=True)
    run_mod._check_out(holder, holder / "inner")  # holds only the stage-1 run
    (holder / "more").mkdir()
    with pytest.raises(ValueError, match="not empty"):
        run_mod._check_out(holder, holder / "inner")
    (tmp_path / "emptydir").mkdir()
    run_mod._check_out(tmp_path / "emptydir", s1)
    assert (afile.read_text(), (busy / "x").read_text()) == ("x", "x")


def test_mc_samples_is_checked_before_any_work(s1, tmp_path):
    with pytest.raises(ValueError, match=r"^mc_samples must be an integer >= 0, got -1$"):
        run_maccal(s1, tmp_path / "o", mc_samples=-1, device="cpu")
    assert not (tmp_path / "o").exists()


def _copy_run_files(src, dst):
    """A copy of run directory ``src``'s files (not its sub-folders) at ``dst``."""
    dst.mkdir()
    for p in src.iterdir():
        if p.is_file():
            (dst / p.name).write_bytes(p.read_bytes())
    return dst


def test_another_validation_split_is_refused(s1, tmp_path):
    """A stage-1 run whose recorded validation checksum differs from the reloaded split."""
    other = _copy_run_files(s1, tmp_path / "other")
    info = json.loads((other / rundir.CONFIG).read_text())
    real = info["split"]["val_checksum"]
    info["split"]["val_checksum"] = "0" * len(real)
    (other / rundir.CONFIG).write_text(json.dumps(info))
    with pytest.raises(ValueError, match=rf"^stage-1: the validation split reloaded for digits differs from the one "
                                         rf"of \S*other \(checksum {real} != {'0' * len(real)}\)$"):
        run_maccal(other, tmp_path / "o", device="cpu", epochs=1)
    assert not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def s1_split(tmp_path_factory):
    """A stage-1 run with its own data_dir (which digits does not read), val_size and train_subset."""
    from calibkit.train import load_config, train

    path = tmp_path_factory.mktemp("mrun_split") / "s1"
    train(load_config(**STAGE1, data_dir="/nonexistent/digits", val_size=150, train_subset=400), path,
          progress=False, verbose=False)
    return path


@pytest.fixture
def load_calls(monkeypatch):
    import calibkit.data as data_pkg

    seen = []
    real = data_pkg.load

    def spy(name, **kw):
        seen.append(kw)
        return real(name, **kw)

    monkeypatch.setattr(data_pkg, "load", spy)
    return seen


def test_the_stage1_split_is_reloaded_with_its_settings(s1_split, tmp_path, load_calls):
    """The stage-1 run's data_dir (unless given), seed, val_size and train_subset reach the loader."""
    run_maccal(s1_split, tmp_path / "a", epochs=1, mc_samples=2, device="cpu")
    run_maccal(s1_split, tmp_path / "b", epochs=1, mc_samples=2, device="cpu", data_dir=str(tmp_path))
    assert load_calls == [{"data_dir": "/nonexistent/digits", "seed": 0, "val_size": 150, "train_subset": 400},
                          {"data_dir": str(tmp_path), "seed": 0, "val_size": 150, "train_subset": 400}]
    stored = rundir.load_logits(tmp_path / "a")
    assert len(stored["val_labels"]) == 150
    assert (rundir.read_tensors(tmp_path / "a" / rundir.MODEL).keys()
            == rundir.read_tensors(s1_split / rundir.MODEL).keys())
    assert "features: train (400, " in _lines_of(s1_split, tmp_path / "c")[0]


def _lines_of(s1, out, **kw):
    lines = []
    run_maccal(s1, out, epochs=1, mc_samples=2, device="cpu", log=lines.append, **kw)
    return lines


def test_features_of_every_split_in_eval_mode(s1):
    model, cfg, bundle, feats, _ = run_mod._stage1_features(s1, rundir.load_info(s1), None, "cpu", 1000)
    assert [len(feats[k][1]) for k in ("train", "val", "test")] == [len(bundle.train), len(bundle.val),
                                                                    len(bundle.test)]
    stored = rundir.load_logits(s1)
    for k in ("val", "test"):  # head(features) reproduces stage 1's stored logits
        assert torch.equal(feats[k][1], stored[f"{k}_labels"])
        torch.testing.assert_close(model.head(feats[k][0]), stored[f"{k}_logits"], rtol=1e-4, atol=1e-4)
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    # A run that recorded no split (an older run) is not checked.
    info = {k: v for k, v in rundir.load_info(s1).items() if k != "split"}
    assert len(run_mod._stage1_features(s1, info, None, "cpu", 1000)[3]["val"][1]) == len(bundle.val)


# By default the CPU batch of calibkit.distributed.eval_batch_size (128): 9 full batches of the 1237
# training images and 1237 - 9 * 128 = 85 left.
@pytest.mark.parametrize("eval_batch_size, train_batches", [(None, [128] * 9 + [85]), (500, [500, 500, 237])])
def test_features_are_computed_in_batches_of_eval_batch_size(s1, tmp_path, monkeypatch, eval_batch_size,
                                                             train_batches):
    from calibkit.models.small import MLP

    sizes = []
    real = MLP.forward_features

    def counting(self, x):
        sizes.append(len(x))
        return real(self, x)

    monkeypatch.setattr(MLP, "forward_features", counting)
    kw = {} if eval_batch_size is None else {"eval_batch_size": eval_batch_size}
    run_maccal(s1, tmp_path / "o", epochs=1, mc_samples=2, device="cpu", **kw)
    assert sizes[:len(train_batches)] == train_batches


def test_default_device_and_a_nested_new_output_directory(s1, tmp_path):
    out = tmp_path / "a" / "b" / "c"
    summary = run_maccal(s1, out, epochs=1, mc_samples=2)
    assert summary["out_dir"] == str(out) and (out / rundir.CONFIG).is_file()
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert rundir.load_info(out)["device"] == want


def test_model_without_a_linear_head_is_refused(s1, monkeypatch):
    real = rundir.load_run

    def headless(path):
        model, cfg, info = real(path)
        model.head = torch.nn.Sequential(model.head)
        return model, cfg, info

    monkeypatch.setattr(rundir, "load_run", headless)
    with pytest.raises(ValueError, match=r"^stage-1 model 'mlp' has no linear `head` / `forward_features`$"):
        run_mod._stage1_features(s1, rundir.load_info(s1), None, "cpu", 1000)


def test_stage2_fields_replace_the_stage1_ones(s1, tmp_path):
    """A stage-1 run recorded elsewhere (another checkout, a GPU, another best epoch): config.json
    of stage 2 keeps those values under "stage1" only and records its own at the top level.
    (Its status cannot differ: only a finished stage-1 run is accepted.)"""
    other = _copy_run_files(s1, tmp_path / "elsewhere")
    info1 = json.loads((other / rundir.CONFIG).read_text())
    info1.update(git_commit="0123456789abcdef", device="cuda:7", best_epoch=9, wall_time_s=1234.5)
    (other / rundir.CONFIG).write_text(json.dumps(info1))
    summary = run_maccal(other, tmp_path / "o", epochs=2, mc_samples=2, device="cpu")
    info = rundir.load_info(tmp_path / "o")
    assert info["stage1"]["git_commit"] == "0123456789abcdef" and info["stage1"]["best_epoch"] == 9
    assert info["stage1"]["wall_time_s"] == 1234.5
    assert info["device"] == "cpu" and info["best_epoch"] == summary["best_epoch"] in (1, 2)
    assert info["git_commit"] == rundir.environment()["git_commit"] != "0123456789abcdef"
    assert info["wall_time_s"] == summary["wall_time_s"] != 1234.5
