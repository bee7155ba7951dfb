"""The command line end to end: train -> eval -> plot on digits, help texts, one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from calibkit import rundir
from calibkit.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def cli(args, env, timeout=180):
    return subprocess.run([sys.executable, "-m", "calibkit", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_train_eval_plot_end_to_end(tmp_path, cli_env):
    out = tmp_path / "run"
    preset = tmp_path / "tiny.toml"
    # the preset says 5 epochs; the command line's --epochs 2 wins
    preset.write_text('data = "digits"\nmodel = "mlp"\nepochs = 5\nbatch_size = 64\nlr = 0.05\ntrain_subset = 384\n')
    r = cli(["train", "--config", str(preset), "--epochs", "2", "--loss", "mbls:margin=6", "--seed", "3",
             "--device", "cpu", "--num-threads", "1", "--no-progress", "--out", str(out)], cli_env)
    assert r.returncode == 0, r.stderr
    assert "epoch   2/2" in r.stdout and "epoch   3/" not in r.stdout
    info = json.loads((out / rundir.CONFIG).read_text())
    assert info["config"]["epochs"] == 2 and info["config"]["loss"] == "mbls:margin=6" and info["config"]["seed"] == 3

    r = cli(["eval", str(out)], cli_env)
    assert r.returncode == 0, r.stderr
    metrics = json.loads((out / rundir.METRICS).read_text())
    assert metrics["temperature"] > 0 and metrics["n_test"] == 360
    assert metrics["before"].keys() == metrics["after"].keys() and "ece" in metrics["before"]
    # the table prints the same numbers as the JSON (ECE x100, 3 decimals)
    assert f"{100 * metrics['before']['ece']:.3f}" in r.stdout and f"{100 * metrics['after']['ece']:.3f}" in r.stdout
    logits = rundir.load_logits(out)
    acc = (logits["test_logits"].argmax(1) == logits["test_labels"]).double().mean().item()
    assert metrics["before"]["acc"] == pytest.approx(acc) and metrics["after"]["acc"] == pytest.approx(acc)

    r = cli(["plot", str(out), "--out", str(tmp_path / "figs")], cli_env)
    assert r.returncode == 0, r.stderr
    for name in ("reliability", "reliability_ts", "confidence", "confidence_ts"):
        png = tmp_path / "figs" / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 5000, name


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert f"usage: calibkit {command}" in capsys.readouterr().out


def test_train_help_lists_every_config_field(capsys):
    from calibkit.commands.train import FIELDS
    from calibkit.config import TrainConfig

    assert sorted(FIELDS) == sorted(TrainConfig().to_dict())  # no field unreachable from the command line
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    for name in FIELDS:
        assert "--" + name.replace("_", "-") in text


@pytest.mark.parametrize("argv,message", [
    (["train", "--data", "digits", "--model", "resnet9000", "--epochs", "1"], "unknown model 'resnet9000'"),
    (["train", "--data", "digits", "--model", "mlp", "--loss", "nosuchloss", "--epochs", "1"], "nosuchloss"),
    (["train", "--data", "digits", "--method", "cutmix"], "method: must be one of"),
    (["train", "--config", "no_such_preset"], "config 'no_such_preset' not found"),
    (["train", "--data", "nosuchdata", "--epochs", "1"], "nosuchdata"),
    (["eval", "{tmp}/missing"], "not found"),
    (["plot", "{tmp}/missing"], "not found"),
])
def test_bad_arguments_give_one_line_errors(tmp_path, capsys, argv, message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if argv[0] == "train":
        argv += ["--out", str(tmp_path / "out"), "--device", "cpu", "--no-progress"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"calibkit {argv[0]}: error:") and message in err and "\n" not in err


def test_eval_of_unfinished_run_says_so(tmp_path, capsys):
    from calibkit.train import TrainConfig, train

    cfg = TrainConfig(data="digits", model="mlp", epochs=2, batch_size=64, train_subset=128, device="cpu")
    train(cfg, tmp_path / "run", progress=False, verbose=False, stop_after_epoch=1)
    assert main(["eval", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert "logits.safetensors not found" in err and "running" in err
    assert not (tmp_path / "run" / rundir.METRICS).exists()
    # the interrupted run continues from the command line and finishes
    assert main(["train", "--data", "digits", "--model", "mlp", "--epochs", "2", "--batch-size", "64",
                 "--train-subset", "128", "--device", "cpu", "--quiet", "--out", str(tmp_path / "run")]) == 0
    assert json.loads((tmp_path / "run" / rundir.CONFIG).read_text())["status"] == "done"
    assert len(rundir.load_logits(tmp_path / "run")["test_logits"]) == 360
    assert torch.isfinite(rundir.load_logits(tmp_path / "run")["val_logits"]).all()


def test_interrupted_training_says_how_to_resume(tmp_path, capsys, monkeypatch):
    import calibkit.train as train_mod

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_mod, "train", killed)
    assert main(["train", "--data", "digits", "--out", str(tmp_path / "run")]) == 130
    assert "run the same command again to resume" in capsys.readouterr().err
