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
    # (a number out of its option's range stops at argparse: tests/commands/test_numeric_options.py)
    (["train", "--data", "digits", "--csm-per-real", "3"], "csm_per_real: must be an even number >= 2"),
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
    err = capsys.readouterr().err.strip()
    assert err == f"calibkit train: error: interrupted; nothing was written to {tmp_path / 'run'} yet"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")  # a run that had started: its epochs are kept
    assert main(["train", "--data", "digits", "--out", str(tmp_path / "run")]) == 130
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"interrupted; every epoch completed up to the last checkpoint is kept; run the same "
                        f"command again to resume {tmp_path / 'run'}") and len(err.splitlines()) == 1


def _class_sorted_folder(root, counts, seed=0):
    """train/<class>/ and test/<class>/ PNG folders, stored class by class as users keep them.

    The pixel at (0, 0) holds the image's own number (unique over train and test) and the pixel at
    (0, 1) its class, so any image can be traced back to its file.
    """
    import numpy as np
    from PIL import Image

    serial = 0
    for part, per_class in (("train", counts), ("test", [3] * len(counts))):
        for k, n in enumerate(per_class):
            d = root / part / f"class{k}"
            d.mkdir(parents=True)
            for i in range(n):
                arr = np.zeros((6, 6), np.uint8)
                arr[0, 0], arr[0, 1] = serial, k
                serial += 1
                Image.fromarray(arr).save(d / f"{i:03d}.png")


def test_train_subset_of_a_class_sorted_folder_keeps_every_class(tmp_path, cli_env):
    from calibkit.data import load

    counts = [40, 30, 20, 10]  # 100 training images on disk, sorted by class
    _class_sorted_folder(tmp_path / "data", counts)
    out = tmp_path / "run"
    # --val-size as a fraction: round(0.1 * 100) = 10 images, 4/3/2/1 per class; the subset of 50 of
    # the 90 left (36/27/18/9) keeps each class's share exactly: 20/15/10/5.
    r = cli(["train", "--data", "imagefolder", "--data-dir", str(tmp_path / "data"), "--model", "mlp",
             "--val-size", "0.1", "--train-subset", "50", "--epochs", "1", "--batch-size", "10",
             "--device", "cpu", "--num-threads", "1", "--quiet", "--out", str(out)], cli_env)
    assert r.returncode == 0, r.stderr
    info = json.loads((out / rundir.CONFIG).read_text())
    assert info["config"]["val_size"] == 0.1
    split = info["split"]
    assert (split["train"], split["val"], split["test"], split["train_subset"]) == (50, 10, 12, 50)
    assert split["train_checksum"] and split["val_checksum"]

    b = load("imagefolder", data_dir=str(tmp_path / "data"), seed=0, val_size=0.1, train_subset=50)
    assert b.split == split, "the run used exactly the split load() draws for its seed"
    assert torch.bincount(b.val.labels, minlength=4).tolist() == [4, 3, 2, 1]
    assert torch.bincount(b.train.labels, minlength=4).tolist() == [20, 15, 10, 5]
    ids = {s: set(getattr(b, s).images[:, 0, 0, 0].tolist()) for s in ("train", "val", "test")}
    assert not ids["train"] & ids["val"] and not ids["train"] & ids["test"] and not ids["val"] & ids["test"]
    for s in ("train", "val", "test"):  # labels still belong to their images
        assert torch.equal(getattr(b, s).images[:, 0, 0, 1].long(), getattr(b, s).labels)
    assert len(ids["test"]) == 12 and min(ids["test"]) == 100, "the test split is the test folder, whole"
    # deterministic per seed, different for another seed, same class counts either way
    again, other = load("imagefolder", data_dir=str(tmp_path / "data"), seed=0, val_size=0.1, train_subset=50), \
        load("imagefolder", data_dir=str(tmp_path / "data"), seed=1, val_size=0.1, train_subset=50)
    assert torch.equal(again.train.images, b.train.images) and torch.equal(again.val.images, b.val.images)
    assert set(other.train.images[:, 0, 0, 0].tolist()) != ids["train"]
    assert torch.bincount(other.train.labels, minlength=4).tolist() == [20, 15, 10, 5]


@pytest.mark.parametrize("value,ok", [("0.1", 0.1), ("500", 500), ("1.5", None), ("0", None), ("-3", None),
                                      ("1.0", None), ("ten", None)])
def test_val_size_is_a_count_or_a_fraction(value, ok, tmp_path, capsys):
    from calibkit.config import TrainConfig, parse_count_or_fraction

    if ok is None:
        with pytest.raises(ValueError, match="count .* or a fraction"):
            parse_count_or_fraction(value)
        with pytest.raises(SystemExit) as exc:
            main(["train", "--data", "digits", "--val-size", value, "--out", str(tmp_path)])
        assert exc.value.code == 2 and "--val-size" in capsys.readouterr().err
    else:
        assert parse_count_or_fraction(value) == ok and type(parse_count_or_fraction(value)) is type(ok)
        assert TrainConfig.from_dict({"val_size": ok}).validate().val_size == ok
    # JSON round trips: an integral float is a count again, a fraction stays a fraction
    assert TrainConfig.from_dict({"val_size": 5000.0}).val_size == 5000
    with pytest.raises(ValueError, match="val_size"):
        TrainConfig.from_dict({"val_size": 1.5}).validate()


# Commands that compute something (train, evaluate, draw, bench, tune): each takes --num-threads.
COMPUTING = ("train", "eval", "plot", "bench", "report", "tune", "csm")


@pytest.mark.parametrize("command", COMPUTING)
def test_every_computing_command_takes_num_threads(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    if command == "csm":  # a command group: its computing subcommands carry the option
        for sub in ("train-generator", "generate"):
            with pytest.raises(SystemExit):
                main([command, sub, "--help"])
            assert "--num-threads" in capsys.readouterr().out, sub
        return
    assert "--num-threads" in text


def test_num_threads_is_applied_and_checked(tmp_path, capsys):
    before = torch.get_num_threads()
    try:
        assert main(["report", str(tmp_path), "--num-threads", "1"]) == 1  # no runs.db: a clean error ...
        assert torch.get_num_threads() == 1  # ... after the thread count was set
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:  # refused while parsing (a bounded type) ...
            main(["eval", str(tmp_path), "--num-threads", "0"])
        assert exc.value.code == 2 and "argument --num-threads: must be an integer in [1, " in capsys.readouterr().err
        from argparse import Namespace

        from calibkit.commands import apply_num_threads
        from calibkit.errors import UserError

        with pytest.raises(UserError, match="--num-threads must be >= 1"):  # ... and by the step that applies it
            apply_num_threads(Namespace(num_threads=0))
    finally:
        torch.set_num_threads(before)
