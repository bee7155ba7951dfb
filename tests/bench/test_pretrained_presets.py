"""The presets of the pretrained backbones: declared as documented, and their smoke twins end to end.

The smoke twins are checked through their recorded runs (``--no-report``): the report reads only
the saved logits, which every other bench test's report covers; what is particular to these
presets is the training and evaluation of the pretrained backbones."""

import subprocess
import sys

import pytest

from calibkit.bench.grid import BENCH_METHODS, IMAGE_ONLY, PRESETS, TEXT_METHODS, grid_methods
from tests.helpers.text_index import write_synthetic_index
from tests.models.pretrained_skip import needs_efficientnet, needs_minilm


def _bench(args, env, timeout=900):
    return subprocess.run([sys.executable, "-m", "calibkit", "bench", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


@pytest.mark.parametrize("name", ["text-pretrained", "fmnist-pretrained"])
def test_full_and_smoke_presets_share_their_settings(name):
    full, smoke = PRESETS[name], PRESETS[f"{name}-smoke"]
    assert full.seeds == (0, 1) and smoke.train["epochs"] == 1
    assert full.model == smoke.model and full.train["finetune"] == smoke.train["finetune"]
    assert full.train["finetune"] == ("last:2" if name.startswith("text") else "last:3")
    keys = set(full.train) - {"epochs", "train_subset", "val_size"}
    assert {k: full.train[k] for k in keys} == {k: smoke.train[k] for k in keys}
    if name.startswith("text"):  # every text method
        assert full.dataset == "debian-minilm" and grid_methods(full) == (list(TEXT_METHODS), [])
    else:  # every image method
        assert full.dataset == "fmnist" and grid_methods(full) == (list(BENCH_METHODS), [])
        # the smoke twin runs on digits, for which no CSM generated set ships: every other method
        assert grid_methods(smoke) == ([m for m in BENCH_METHODS if m != "csm"], [])
        assert set(IMAGE_ONLY) - {"csm"} <= set(smoke.methods)


def test_the_gpu_sized_image_preset_differs_only_in_size_and_what_is_trained():
    cpu, gpu = PRESETS["fmnist-pretrained"], PRESETS["fmnist-pretrained-full"]
    assert gpu.train["finetune"] == "all" and cpu.train["finetune"] == "last:3"
    assert (gpu.train["train_subset"], gpu.train["val_size"], gpu.train["epochs"]) == (2000, 1000, 12)
    assert (cpu.train["train_subset"], cpu.train["val_size"], cpu.train["epochs"]) == (1000, 500, 6)
    size = {"finetune", "train_subset", "val_size", "epochs"}
    rest = [{k: v for k, v in p.train.items() if k not in size} for p in (gpu, cpu)]
    assert rest[0] == rest[1]
    assert grid_methods(gpu) == grid_methods(cpu) and gpu.seeds == cpu.seeds and gpu.dataset == cpu.dataset


def _check_rows(out, preset, methods):
    from calibkit.store import Store

    rows = {row["method"]: row for row in Store(out / "runs.db", readonly=True).runs(preset)}
    assert set(rows) == set(methods)
    for method, row in rows.items():
        assert row["status"] == "done", (method, row.get("error"))
        m = row["metrics"]
        assert 0 <= m["before"]["ece"] <= 1 and 0 <= m["after"]["ece"] <= 1 and m["temperature"] > 0


@needs_minilm
@pytest.mark.slow
def test_text_pretrained_smoke_end_to_end(tmp_path, cli_env):
    index = write_synthetic_index(tmp_path / "lists", per_section=10)
    out = tmp_path / "bench"
    r = _bench(["--preset", "text-pretrained-smoke", "--data-dir", str(index), "--out", str(out), "--no-report"],
               cli_env)
    assert r.returncode == 0, r.stdout + r.stderr
    _check_rows(out, "text-pretrained-smoke", TEXT_METHODS)


@needs_efficientnet
@pytest.mark.slow
def test_fmnist_pretrained_smoke_end_to_end(tmp_path, cli_env):
    out = tmp_path / "bench"
    r = _bench(["--preset", "fmnist-pretrained-smoke", "--out", str(out), "--no-report"], cli_env)
    assert r.returncode == 0, r.stdout + r.stderr
    _check_rows(out, "fmnist-pretrained-smoke", [m for m in BENCH_METHODS if m != "csm"])
