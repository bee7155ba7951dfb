"""End to end on the user's own data: an image folder or a tensors file, the user's own model
module and a preset file, through `calibkit tune`, `calibkit bench` and `calibkit report`."""

import json
import subprocess

import numpy as np
import pytest

from calibkit.bench.grid import MARGINS, PRESETS
from calibkit.bench.presetfile import read_effective
from calibkit.store import Store
from tests.conftest import PYTHON

MODEL = '''
import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self, num_classes, in_channels, flat):
        super().__init__()
        self.flat = flat
        self.body = nn.Sequential(nn.Flatten(), nn.LazyLinear(16) if flat is None else nn.Linear(flat, 16), nn.ReLU())
        self.head = nn.Linear(16, num_classes)

    def forward_features(self, x):
        return self.body(x.float())

    def forward(self, x):
        return self.head(self.forward_features(x))


def images(num_classes, in_channels):
    return Tiny(num_classes, in_channels, in_channels * 8 * 8)


def features(num_classes, in_channels):
    return Tiny(num_classes, in_channels, in_channels)


def headless(num_classes, in_channels):
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * 64, num_classes))
'''


def _cli(args, env, cwd, ok=True):
    res = subprocess.run([PYTHON, "-m", "calibkit", *args], capture_output=True, text=True, env=env, cwd=cwd,
                         timeout=600)
    if ok:
        assert res.returncode == 0, res.stdout + res.stderr
    return res


def _folder(root, n_train=30, n_test=10, k=3):
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("test", n_test)):
        for c in range(k):
            (root / split / f"c{c}").mkdir(parents=True)
            for i in range(n):
                a = (rng.random((8, 8)) * 60).astype(np.uint8)
                a[:, 2 * c: 2 * c + 3] += 150  # a bright stripe whose place is the class
                Image.fromarray(a).save(root / split / f"c{c}" / f"{i}.png")


def _preset(path, dataset, data_dir, model, ood=None, note="mine, tiny"):
    ood_line = f'ood = "{ood}"\n' if ood else ""
    path.write_text(f'''name = "mine"
dataset = "{dataset}"
data_dir = "{data_dir}"
model = "{model}"
seeds = [0]
methods = ["ce", "ls", "mbls"]
{ood_line}severities = [1]
robust_n = 20
n_boot = 50
note = "{note}"

[train]
epochs = 2
batch_size = 16
lr = 0.05
val_size = 0.2
augment = false

[space.ls]
"loss.alpha" = [0.01, 0.1]
''')


def _tune_bench_report(tmp_path, cli_env):
    _cli(["tune", "--preset", "p.toml", "--out", "out"], cli_env, tmp_path)
    _cli(["bench", "--preset", "p.toml", "--out", "out", "--tune", "--no-report"], cli_env, tmp_path)
    rep = _cli(["report", "out", "--preset", "p.toml"], cli_env, tmp_path)
    store = Store(tmp_path / "out" / "runs.db", readonly=True)
    try:
        cands, runs = store.candidates("mine"), {r["method"]: r for r in store.runs("mine")}
    finally:
        store.close()
    # the tuning table holds the file's grid for LS and MbLS's own grid
    grid = {m: sorted(c["hparams"][a] for c in cands if c["method"] == m) for m, a in
            (("ls", "loss.alpha"), ("mbls", "loss.margin"))}
    assert grid == {"ls": [0.01, 0.1], "mbls": sorted(MARGINS)}
    chosen = {c["method"]: c["hparams"] for c in cands if c["selected"]}
    assert set(runs) == {"ce", "ls", "mbls"} and all(r["status"] == "done" for r in runs.values())
    for m in ("ls", "mbls"):  # every bench run at the selection
        assert runs[m]["config"]["hparams"] == chosen[m]
    eff = read_effective(tmp_path / "out", "mine")  # the effective (tuned) preset is recorded
    assert (eff.loss_for("ls") == f"ls:alpha={chosen['ls']['loss.alpha']:g}"
            and eff.space_for("ls").keys() == {"loss.alpha"})
    md = (tmp_path / "out" / "report" / "report.md").read_text()
    assert "## Preset mine" in md and "mine, tiny" in md and "mine, tiny" in rep.stdout
    assert rep.stdout.splitlines()[1].startswith("Runs: 3 methods (ce, ls, mbls), 1 seed (0)")  # the effective settings
    # the recorded preset reruns exactly these runs: nothing left to do
    again = _cli(["bench", "--preset", "out/presets/mine.toml", "--out", "out", "--no-report"], cli_env, tmp_path)
    assert "0 run(s) done, 3 skipped" in again.stdout
    return runs, md


@pytest.mark.slow
def test_image_folder_own_model_preset_file_end_to_end(tmp_path, cli_env):
    _folder(tmp_path / "data")
    (tmp_path / "mymodels.py").write_text(MODEL)
    _preset(tmp_path / "p.toml", "imagefolder", "data", "mymodels:images")
    runs, md = _tune_bench_report(tmp_path, cli_env)
    assert runs["ce"]["config"]["model"] == "mymodels:images" and runs["ce"]["ood"] is None
    assert ("No OOD set" in md
            and "AUROC" not in md.split("## After temperature scaling")[1].split("##")[0].split("\n|")[1])


@pytest.mark.slow
def test_tensors_file_with_an_ood_file_end_to_end(tmp_path, cli_env):
    rng = np.random.default_rng(0)
    y = np.arange(150) % 3
    x = (rng.normal(size=(150, 6)) + 2 * np.eye(3, 6)[y]).astype(np.float32)
    np.savez(tmp_path / "data.npz", x_train=x[:120], y_train=y[:120], x_test=x[120:], y_test=y[120:])
    np.savez(tmp_path / "ood.npz", x=(rng.normal(size=(40, 6)) * 5).astype(np.float32))
    (tmp_path / "mymodels.py").write_text(MODEL)
    _preset(tmp_path / "p.toml", "tensors", "data.npz", "mymodels:features", ood="ood.npz")
    runs, md = _tune_bench_report(tmp_path, cli_env)
    assert runs["ce"]["ood"]["dataset"] == "ood.npz" and runs["ce"]["ood"]["n_out"] == 40
    assert runs["ce"]["robustness"] is None  # no corruptions of features
    assert "against the OOD set `ood.npz`" in md


def test_preflight_names_what_the_model_misses_and_writes_nothing(tmp_path, cli_env):
    _folder(tmp_path / "data", n_train=4, n_test=2)
    (tmp_path / "mymodels.py").write_text(MODEL)
    res = _cli(["bench", "--preset", "default", "--data", "imagefolder", "--data-dir", "data", "--model",
                "mymodels:headless", "--batch-size", "4", "--val-size", "3", "--out", "out"], cli_env, tmp_path,
               ok=False)
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1
    assert "no forward_features(x) method" in res.stderr and "head must be an nn.Linear(D, 3)" in res.stderr
    assert not (tmp_path / "out").exists()
    res = _cli(["bench", "--preset", "nope.toml", "--out", "out"], cli_env, tmp_path, ok=False)
    assert res.returncode == 1 and "preset file nope.toml not found" in res.stderr


@pytest.mark.slow
@pytest.mark.skipif(not __import__("os").path.isdir("/usr/share/datasets/fashion-mnist"), reason="needs Fashion-MNIST")
def test_preset_show_smoke_as_a_file_records_the_same_run_configs(tmp_path, cli_env):
    shown = _cli(["preset", "show", "smoke"], cli_env, tmp_path).stdout
    (tmp_path / "s.toml").write_text(shown)
    assert "is valid" in _cli(["preset", "check", "s.toml"], cli_env, tmp_path).stdout
    for preset, out in (("smoke", "a"), ("s.toml", "b")):
        _cli(["bench", "--preset", preset, "--out", out, "--methods", "ls", "--seeds", "0", "--no-report"],
             cli_env, tmp_path)
    records = {}
    for out in ("a", "b"):
        store = Store(tmp_path / out / "runs.db", readonly=True)
        records[out] = {r["run_key"]: r["config"] for r in store.runs("smoke")}
        store.close()
    assert set(records["a"]) == {"smoke/ce/0", "smoke/ls/0"} and records["a"] == records["b"]
    cfg = json.loads((tmp_path / "b" / "runs" / "smoke" / "ls" / "seed0" / "config.json").read_text())["config"]
    assert cfg["loss"] == PRESETS["smoke"].loss_for("ls") and cfg["epochs"] == PRESETS["smoke"].train["epochs"]
