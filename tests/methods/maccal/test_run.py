"""MaC-Cal on run directories: the CLI, the saved run through `calibkit eval`, the object vs the CLI
path, and the two-stage `calibkit train --method maccal` (resumable)."""

import json

import pytest
import torch

from calibkit import rundir
from calibkit.cli import main
from calibkit.methods import maccal
from calibkit.methods.maccal import MaCCal, extract_features, load_maccal, run_maccal

pytestmark = pytest.mark.usefixtures("one_thread")

STAGE1 = dict(data="digits", model="mlp", epochs=2, num_threads=1, device="cpu")
STAGE2 = ["--epochs", "3", "--seed", "1", "--mc-samples", "16", "--device", "cpu", "--num-threads", "1"]


def _features(model, info, part):
    from calibkit.data.inputs import inputs_from_info

    prepare = inputs_from_info(info)
    return extract_features(model, (part.images, part.labels), lambda m, x: m.forward_features(prepare.eval_batch(x)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 2-epoch MLP on digits (stage 1) and MaC-Cal on it (3 stage-2 epochs, S = 16) via the CLI."""
    from calibkit.train import load_config, train

    root = tmp_path_factory.mktemp("maccal")
    s1, m = root / "s1", root / "m"
    train(load_config(**STAGE1), s1, progress=False, verbose=False)
    assert main(["maccal", str(s1), "--out", str(m), *STAGE2]) == 0
    return {"s1": s1, "m": m, "root": root}


def test_cli_writes_a_standard_run_that_eval_and_plot_read(runs, capsys):
    m = runs["m"]
    for name in ("config.json", "model.safetensors", "logits.safetensors", "history.json", "maccal.json"):
        assert (m / name).is_file(), name
    info = json.loads((m / "config.json").read_text())
    assert info["method"] == "maccal" and info["config"]["method"] == "maccal" and info["status"] == "done"
    assert info["stage1"]["path"] == str(runs["s1"].resolve()) and info["stage1"]["config"]["method"] == "standard"
    assert info["maccal"]["epochs"] == 3 and info["maccal"]["mc_samples"] == 16 and info["maccal"]["seed"] == 1
    rec = json.loads((m / "maccal.json").read_text())
    assert len(rec["keep_rates"]) == len(rec["val_ece"]) == 3 and len(json.loads((m / "history.json").read_text())) == 4
    assert rec["best_epoch"] == 1 + rec["val_ece"].index(min(rec["val_ece"]))
    assert rec["stage1_val_logits_max_abs_diff"] < 1e-4  # cached features reproduce stage 1's val logits
    # Backbone unchanged, head retrained.
    before, after = rundir.read_tensors(runs["s1"] / "model.safetensors"), rundir.read_tensors(m / "model.safetensors")
    assert before.keys() == after.keys()
    for k in before:
        assert torch.equal(before[k], after[k]) != k.startswith("head."), k
    assert main(["plot", str(m), "--out", str(runs["root"] / "plots")]) == 0
    assert (runs["root"] / "plots" / "reliability.png").is_file()


def test_saved_run_evaluates_to_the_same_numbers_through_calibkit_eval(runs, capsys):
    """Rebuild the deployed predictor from the saved files alone, predict the test images again, and
    compare with what `calibkit eval` reports from the stored logits."""
    from calibkit.data import load
    from calibkit.metrics import evaluate

    m = runs["m"]
    assert main(["eval", str(m)]) == 0
    assert "method maccal" in capsys.readouterr().out
    reported = json.loads((m / "metrics.json").read_text())["before"]
    model, est = load_maccal(m)
    _, _, info = rundir.load_run(m)
    test = load("digits").test
    feats, labels = _features(model, info, test)
    probs = est.predict_proba(feats)
    again = evaluate(probs.double(), labels)
    for key in ("acc", "ece", "aece", "o_ece", "u_ece", "nll"):
        assert again[key] == pytest.approx(reported[key], abs=1e-5), key
    stored = rundir.load_logits(m)["test_logits"]
    torch.testing.assert_close(stored.softmax(1), probs, rtol=1e-4, atol=1e-6)
    # Seeded MC inference is reproducible: again, bit for bit.
    assert torch.equal(est.predict_proba(feats), probs)


def test_object_on_the_runs_features_equals_the_cli_path(runs):
    from calibkit.data import load

    model, _, info = rundir.load_run(runs["s1"])
    bundle = load("digits")
    tr, va, te = (_features(model, info, part) for part in (bundle.train, bundle.val, bundle.test))
    est = MaCCal(model.head, epochs=3, seed=1, mc_samples=16).fit(*tr, *va)
    rec = json.loads((runs["m"] / "maccal.json").read_text())
    assert est.best_epoch_ == rec["best_epoch"] and est.keep_rate_ == rec["best_keep_rate"]
    assert est.history_["keep_rates"] == rec["keep_rates"]
    stored = rundir.load_logits(runs["m"])
    torch.testing.assert_close(est.predict_log_proba(te[0]), stored["test_logits"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(est.predict_log_proba(va[0]), stored["val_logits"], rtol=1e-5, atol=1e-5)


def test_unmasked_option_stores_plain_head_logits(runs, tmp_path):
    from calibkit.data import load

    out = tmp_path / "bare"
    summary = run_maccal(runs["s1"], out, epochs=2, mc_samples=0, device="cpu")
    assert json.loads((out / "maccal.json").read_text())["inference"].startswith("the deterministic unmasked head")
    model, _, info = rundir.load_run(out)
    logits = rundir.predict_logits(model, load("digits").test.images, info)
    torch.testing.assert_close(logits, rundir.load_logits(out)["test_logits"], rtol=1e-5, atol=1e-5)
    assert summary["test_acc"] == pytest.approx(float((logits.argmax(1) == load("digits").test.labels).double().mean()))


def test_quiet_still_says_where_it_wrote(runs, tmp_path, capsys):
    out = tmp_path / "q"
    assert main(["maccal", str(runs["s1"]), "--out", str(out), "--quiet", "--epochs", "1", "--device", "cpu",
                 "--mc-samples", "2", "--num-threads", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and str(out) in lines[0] and "test ECE" in lines[0]
    with pytest.raises(SystemExit) as refused:  # refused while the command line is parsed
        main(["maccal", str(runs["s1"]), "--out", str(tmp_path / "t"), "--num-threads", "0"])
    assert refused.value.code == 2 and not (tmp_path / "t").exists()
    assert "argument --num-threads: must be an integer in [1, 1024], got '0'" in capsys.readouterr().err


def test_bad_stage1_and_out_dirs_give_clear_errors(runs, tmp_path, capsys):
    missing = tmp_path / "nope"
    assert main(["maccal", str(missing), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("calibkit maccal: error:") and "not found" in err and str(missing) in err
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    info = json.loads((runs["s1"] / "config.json").read_text())
    (unfinished / "config.json").write_text(json.dumps({**info, "status": "running"}))
    with pytest.raises(ValueError, match="not a finished run"):
        run_maccal(unfinished, tmp_path / "o")
    with pytest.raises(ValueError, match="itself a MaC-Cal run"):
        run_maccal(runs["m"], tmp_path / "o")
    listing = sorted(p.name for p in runs["m"].iterdir())
    with pytest.raises(ValueError, match="not empty"):
        run_maccal(runs["s1"], runs["m"])  # never overwrites an existing run
    assert sorted(p.name for p in runs["m"].iterdir()) == listing
    with pytest.raises(ValueError, match="stage-1 run itself"):
        run_maccal(runs["s1"], runs["s1"])
    with pytest.raises(ValueError, match="not a MaC-Cal run"):
        load_maccal(runs["s1"])


# ---------------------------------------------------------------------------------------------
# calibkit train --method maccal: both stages, resumable
# ---------------------------------------------------------------------------------------------
def test_parse_stage2_spec():
    from calibkit.commands.maccal import parse_stage2_spec

    assert parse_stage2_spec("eta=2, mc_samples=64,loss=stage1") == {"eta": 2.0, "mc_samples": 64, "loss": "stage1"}
    assert parse_stage2_spec(None) == {} and parse_stage2_spec("") == {}
    with pytest.raises(ValueError, match="unknown key 'etta'"):
        parse_stage2_spec("etta=1")
    with pytest.raises(ValueError, match="epochs expects int"):
        parse_stage2_spec("epochs=2.5")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_stage2_spec("eta")


def test_train_method_maccal_two_stages_resumable(runs, tmp_path, capsys):
    from calibkit.commands.maccal import train_two_stage
    from calibkit.train import load_config, train

    out = tmp_path / "two"
    args = ["train", "--data", "digits", "--model", "mlp", "--epochs", "2", "--num-threads", "1", "--device", "cpu",
            "--method", "maccal", "--maccal", "epochs=3,seed=1,mc_samples=16", "--out", str(out), "--quiet"]
    # An interrupted stage 1 (after epoch 1 of 2) is resumed by the same command.
    train(load_config(**STAGE1), out / "stage1", progress=False, verbose=False, stop_after_epoch=1)
    assert rundir.load_info(out / "stage1")["status"] == "running"
    assert main(args) == 0
    assert str(out) in capsys.readouterr().out
    info = rundir.load_info(out)
    assert info["method"] == "maccal" and info["stage1"]["path"] == str((out / "stage1").resolve())
    # Same stage 1 (the trainer's resume is exact) and same stage 2 as the separate commands.
    for name in ("val_logits", "test_logits"):
        assert torch.equal(rundir.load_logits(out / "stage1")[name], rundir.load_logits(runs["s1"])[name])
        assert torch.equal(rundir.load_logits(out)[name], rundir.load_logits(runs["m"])[name])
    # Finished: a rerun does nothing; other stage-2 settings are refused, the run untouched.
    stamp = (out / "config.json").stat().st_mtime_ns
    assert main(args[:-1]) == 0 and "already finished" in capsys.readouterr().out
    assert main([*args[:-5], "--maccal", "epochs=4", "--out", str(out)]) == 1
    assert "other stage-2 settings (epochs" in capsys.readouterr().err
    assert (out / "config.json").stat().st_mtime_ns == stamp
    # "loss=stage1" names the stage-1 loss (ce here), which the finished run recorded: nothing to do.
    assert main([*args[:-5], "--maccal", "epochs=3,seed=1,mc_samples=16,loss=stage1", "--out", str(out)]) == 0
    assert "already finished" in capsys.readouterr().out
    # An interrupted stage 2 (its files written, config.json not yet) is redone, to the same result.
    before = rundir.load_logits(out)["test_logits"].clone()  # not a view of the file rewritten below
    (out / "config.json").unlink()
    (out / "logits.safetensors").write_bytes(b"partial")
    train_two_stage(load_config(**STAGE1), out, {"epochs": 3, "seed": 1, "mc_samples": 16}, verbose=False)
    assert torch.equal(rundir.load_logits(out)["test_logits"], before)


def test_train_method_maccal_refuses_foreign_directories(tmp_path, capsys):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["train", "--data", "digits", "--model", "mlp", "--epochs", "1", "--method", "maccal",
                 "--out", str(out), "--quiet"]) == 1
    assert "holds no MaC-Cal run" in capsys.readouterr().err and (out / "notes.txt").read_text() == "mine"
    assert main(["train", "--data", "digits", "--maccal", "eta=2", "--out", str(tmp_path / "x")]) == 1
    assert "--maccal is only used with --method maccal" in capsys.readouterr().err


def test_module_exports_are_importable():
    for name in maccal.__all__:
        assert getattr(maccal, name) is not None
