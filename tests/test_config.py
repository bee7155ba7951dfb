"""``calibkit.config``: numbers checked where they enter, milestones as fractions of the epochs, and the
data-dependent sizes (training subset, validation split) checked against the class count."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import warnings

import pytest

from calibkit.config import CONFIG_DIR, DEFAULT_MILESTONES, TrainConfig, load_config, resolve_milestones
from tests.conftest import PYTHON

FLOAT_FIELDS = [f.name for f in dataclasses.fields(TrainConfig) if "float" in f.type and f.name != "val_size"]


def test_resolve_milestones_by_hand():
    assert resolve_milestones([0.5, 0.75], 30) == [15, 22]  # floor(15.0), floor(22.5)
    assert resolve_milestones([0.5, 0.7667], 30) == [15, 23]  # floor(23.001)
    assert resolve_milestones([0.4286, 0.7143], 350) == [150, 250]  # floor(150.01), floor(250.0050)
    assert resolve_milestones([0.5, 0.75], 2) == [1]  # floor(1.0), floor(1.5): merged
    assert resolve_milestones([0.25], 3) == []  # floor(0.75) = 0: no drop inside the run
    # the decimal as written: 0.29 of 100 epochs is 29, although binary floating point says 28.99...
    assert math.floor(0.29 * 100) == 28 and resolve_milestones([0.29], 100) == [29]
    assert resolve_milestones([150, 250], 350) == [150, 250] and resolve_milestones([], 5) == []
    for bad, match in (([10, 0.5], "not both"), ([1.0], "strictly between 0 and 1"), ([0.0], "strictly"),
                       ([True], "integers"), (["1"], "integers")):
        with pytest.raises(ValueError, match=match):
            resolve_milestones(bad, 10)


def test_the_default_milestones_are_the_old_rule_for_every_epoch_count():
    assert DEFAULT_MILESTONES == (0.5, 0.75)
    for epochs in range(1, 401):
        old = sorted({m for m in (epochs // 2, (3 * epochs) // 4) if m > 0})
        assert TrainConfig(epochs=epochs).resolved_milestones() == old


def test_fractions_are_resolved_when_the_config_is_built():
    cfg = TrainConfig.from_dict({"epochs": 40, "milestones": [0.5, 0.75]})
    assert cfg.milestones == [20, 30] and cfg.to_dict()["milestones"] == [20, 30]
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg  # the record reads back as the same config
    with pytest.raises(ValueError, match="milestones: expected list"):
        TrainConfig.from_dict({"milestones": 0.5})


def test_shipped_presets_resolve_to_their_protocols_and_follow_epochs():
    protocols = {"cifar10": [150, 250], "cifar100": [150, 250], "fmnist": [15, 23], "tinyimagenet": [40, 60]}
    assert sorted(p.stem for p in CONFIG_DIR.glob("*.toml")) == sorted(protocols)
    for name, milestones in protocols.items():
        assert load_config(name).milestones == milestones
        cfg = load_config(name, epochs=2)  # failed before: "milestones ... got [15, 23]"
        assert cfg.epochs == 2 and cfg.milestones == [1]
        assert load_config(name, epochs=20, milestones=[5]).milestones == [5]  # an explicit list wins


def test_bench_paper_presets_resolve_to_their_protocols():
    from calibkit.bench.grid import PRESETS
    from calibkit.bench.runner import train_config

    for name, milestones in (("cifar10", [150, 250]), ("cifar100", [150, 250]), ("tinyimagenet", [40, 60])):
        assert train_config(PRESETS[name], "ce", 0).milestones == milestones
        short = dataclasses.replace(PRESETS[name], train={**PRESETS[name].train, "epochs": 10})
        assert train_config(short, "ce", 0).milestones == resolve_milestones(PRESETS[name].train["milestones"], 10)


@pytest.mark.parametrize("name", FLOAT_FIELDS)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_every_float_field_must_be_finite(name, value):
    with pytest.raises(ValueError, match=f"^{name}: must be (a finite number|> 0|in )"):
        TrainConfig(**{name: value}).validate()
    if value == math.inf:  # the message says what is wrong with it
        with pytest.raises(ValueError, match=f"^{name}: must be a finite number, got inf$"):
            TrainConfig(**{name: value}).validate()



@pytest.mark.parametrize("name", FLOAT_FIELDS)
def test_every_float_field_must_fit_in_float32(name):
    with pytest.raises(ValueError) as err:
        TrainConfig(**{name: 1e308}).validate()
    assert str(err.value) == (f"{name}: must be at most 3.403e+38 in size (float32, what training computes in), "
                              "got 1e+308")
    try:  # below the bound only the field's own rule applies (momentum < 1, ...)
        TrainConfig(**{name: 3e38}).validate()
    except ValueError as exc:
        assert "float32" not in str(exc)


def test_lr_inf_on_the_command_line_writes_nothing(tmp_path, cli_env):
    res = subprocess.run([PYTHON, "-m", "calibkit", "train", "--data", "digits", "--model", "mlp", "--lr", "inf",
                          "--out", str(tmp_path / "run")], capture_output=True, text=True, env=cli_env, timeout=120)
    assert res.returncode == 2  # refused while the command line is parsed (the config refuses it too, above)
    want = "calibkit train: error: argument --lr: must be a number in (0, 100], got 'inf'"
    assert res.stderr.splitlines()[-1] == want
    assert not (tmp_path / "run").exists()


def test_a_training_subset_must_hold_every_class(tmp_path, cli_env):
    from calibkit.data import load

    with pytest.raises(ValueError, match="train_subset: 9 images cannot hold one image of each of the 10 classes"):
        load("digits", seed=0, train_subset=9)
    assert len(load("digits", seed=0, train_subset=10).train) == 10
    res = subprocess.run([PYTHON, "-m", "calibkit", "train", "--data", "digits", "--model", "mlp", "--train-subset",
                          "5", "--out", str(tmp_path / "run")],
                         capture_output=True, text=True, env=cli_env, timeout=120)
    assert res.returncode == 1 and not (tmp_path / "run").exists()
    assert res.stderr == ("calibkit train: error: train_subset: 5 images cannot hold one image of each of the 10 "
                          "classes of digits; use at least 10\n")


def test_a_validation_split_missing_classes_warns():
    from calibkit.data import load

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        b = load("digits", seed=0, val_size=3)
    missing = 10 - len(set(b.val.labels.tolist()))
    assert missing == 7
    assert [str(w.message) for w in caught] == [
        "val_size: the validation split of 3 images holds no image of 7 of the 10 classes of digits; model "
        "selection and calibration see only the others (at least 10 images give every class one)"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(set(load("digits", seed=0, val_size=10).val.labels.tolist())) == 10  # no warning


def test_the_warning_is_one_line_on_the_command_line(tmp_path, cli_env):
    res = subprocess.run([PYTHON, "-m", "calibkit", "train", "--data", "digits", "--model", "mlp", "--val-size", "3",
                          "--epochs", "1", "--train-subset", "300", "--quiet", "--out", str(tmp_path / "run")],
                         capture_output=True, text=True, env=cli_env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stderr.startswith("calibkit train: warning: val_size: the validation split of 3 images holds no image")
    assert len(res.stderr.strip().splitlines()) == 1


def _tiny(**kw) -> TrainConfig:
    base = dict(data="digits", model="mlp", epochs=1, batch_size=64, train_subset=256, val_size=100, num_threads=1,
                device="cpu")
    return TrainConfig(**{**base, **kw})


def test_a_run_that_completed_no_epoch_restarts_with_a_new_config(tmp_path, capsys):
    from calibkit.train import train

    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="loss is .* at epoch 1"):  # diverges in its first epoch
        train(_tiny(lr=1e12, grad_clip=0.0), out, progress=False, verbose=False)
    assert json.loads((out / "config.json").read_text())["config"]["lr"] == 1e12
    capsys.readouterr()
    summary = train(_tiny(lr=0.05), out, progress=False, verbose=False)
    assert summary["status"] == "done"
    assert "ended before completing an epoch; starting it again with this config" in capsys.readouterr().err
    assert json.loads((out / "config.json").read_text())["config"]["lr"] == 0.05
    # Once an epoch is complete the run is kept: another config is refused, and the message says when it is not.
    with pytest.raises(ValueError, match="differs in: lr.*has completed at least one epoch.*a run that has not "
                                         "completed an epoch may be restarted with a new config"):
        train(_tiny(lr=0.01), out, progress=False, verbose=False)
