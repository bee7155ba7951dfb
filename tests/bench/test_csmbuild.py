"""``bench --csm-build``: CSM on data calibkit ships no generated set for (tiny configuration)."""

from __future__ import annotations

import json

import pytest

from calibkit.bench.grid import PRESETS, Preset
from calibkit.store import Store

pytest.importorskip("diffusers")

def test_build_settings_seeds_and_group_count(tinyc):
    from types import SimpleNamespace

    from calibkit.bench import csmbuild

    cfg = csmbuild.settings(tinyc)
    assert cfg["build_steps"] == 3 and cfg["build_guidance"] == 3.0  # preset override, shipped default
    assert csmbuild.build_seeds(tinyc) == [0, 7] and csmbuild.build_seeds(tinyc, [3, 1]) == [1, 3, 7]
    # as many images as the real ones, in groups of 8, but at least one group per pair of classes
    ten = SimpleNamespace(num_classes=10, train=range(1000))
    assert csmbuild._groups(tinyc, ten, {**cfg, "build_images": None}) == 125
    assert csmbuild._groups(tinyc, ten, {**cfg, "build_images": 100}) == 45
    assert csmbuild._groups(tinyc, SimpleNamespace(num_classes=3, train=range(30)), {**cfg, "build_images": None}) == 4


# A few generator steps and 45 groups of 8 images (one per pair of the 10 classes, the least a
# set may hold) of the 8x8 digits (UNet widths 8, 16), sampled in one batch with 2 Heun steps.
TINYC = Preset(name="tinyc", dataset="digits", model="mlp", seeds=(0,), tune_seed=7, num_threads=1,
               train=dict(epochs=2, batch_size=64, lr=0.05, val_size=200, augment=False), robust_n=40,
               severities=(1,), n_boot=10,
               csm={"build_steps": 3, "build_batch_size": 8, "build_channels": (8, 16), "build_images": 16,
                    "build_sampler_steps": 2, "build_sample_batch": 360})


@pytest.fixture
def tinyc(monkeypatch, one_thread):
    monkeypatch.setitem(PRESETS, "tinyc", TINYC)
    return TINYC


def test_the_cost_line_is_the_build_at_the_measured_speed(tmp_path, tinyc, capsys, monkeypatch):
    from calibkit.bench import csmbuild
    from calibkit.cli import main

    monkeypatch.setattr(csmbuild, "measure", lambda *a, **k: {"step_s": 0.5, "images_per_s": 4.0, "device": "cpu"})
    out = tmp_path / "b"
    assert main(["tune", "--preset", "tinyc", "--methods", "csm", "--out", str(out), "--device", "cpu"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    # 3 steps x 0.5 s + 360 images / 4 per s = 91.5 s = 2 min (rounded)
    assert line == ("calibkit tune: error: csm: no generated set for digits; building one here would take about 2 min "
                    "on cpu (generator: 3 steps x 0.50 s; 360 images at 4.0 images/s; measured just now): add "
                    "--csm-build to build one in --out, pass --csm-store DIR, or leave csm out of --methods")
    assert not out.exists()


@pytest.mark.slow
def test_without_a_set_bench_says_in_one_line_what_a_build_costs(tmp_path, tinyc, capsys, monkeypatch):
    from calibkit.bench import csmbuild
    from calibkit.cli import main

    speeds = []
    real = csmbuild.measure

    def measured(*a, **k):
        speeds.append(real(*a, **k))
        return speeds[-1]

    monkeypatch.setattr(csmbuild, "measure", measured)
    out = tmp_path / "b"
    assert main(["bench", "--preset", "tinyc", "--methods", "csm", "--out", str(out), "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and not out.exists()
    (s,) = speeds  # the figures printed are the ones measured on this device just now
    assert s["step_s"] > 0 and s["images_per_s"] > 0 and s["device"] == "cpu"
    # the build is 3 steps and 360 images (16 asked for, but every one of the 45 pairs needs a group)
    minutes = (3 * s["step_s"] + 360 / s["images_per_s"]) / 60
    assert err[0] == (f"calibkit bench: error: csm: no generated set for digits; building one here would take about "
                      f"{minutes:.0f} min on cpu (generator: 3 steps x {s['step_s']:.2f} s; 360 images at "
                      f"{s['images_per_s']:.1f} images/s; measured just now): add --csm-build to build one in "
                      "--out, pass --csm-store DIR, or leave csm out of --methods")


@pytest.mark.slow
def test_csm_build_trains_generates_and_the_csm_run_uses_the_set(tmp_path, tinyc, capsys):
    from calibkit.bench import csmbuild
    from calibkit.cli import main
    from calibkit.methods.csm.store import load_store

    out = tmp_path / "b"
    args = ["bench", "--preset", "tinyc", "--methods", "csm", "--out", str(out), "--device", "cpu", "--csm-build",
            "--no-report"]
    assert main(args) == 0
    text = capsys.readouterr().out
    root = out / "cache" / "csm-build" / "tinyc" / "seeds-0-7"  # the bench's seed and the selection seed
    assert csmbuild.build_dir(out, tinyc) == root and (root / "build.json").is_file()
    assert "csm build: training the generator for 3 steps on " in text and "step 3/3 " in text and " eta " in text
    assert "csm build: generating 45 groups (360 images)" in text
    gen = json.loads((root / "generator" / "generator.json").read_text())
    # the generator saw no validation image of seed 0 nor of the selection seed 7
    assert gen["split"]["excluded_val_seeds"] == [0, 7] and gen["train"]["steps_done"] == 3
    assert gen["split"]["train_images"] == gen["split"]["official_train"] - gen["split"]["excluded"]
    store = load_store(root / "store")
    assert len(store["images"]) == 360 and tuple(store["images"].shape[1:]) == (1, 28, 28)  # calibkit's digits
    with Store(out / "runs.db", readonly=True) as s:
        runs = {r["method"]: r for r in s.runs("tinyc")}
    assert sorted(runs) == ["ce", "csm"]
    assert runs["csm"]["extra"]["source_store"] == str(root / "store")
    # again: the build is finished and the runs are done; nothing is rebuilt or retrained
    mtime = (root / "build.json").stat().st_mtime_ns
    assert main(args) == 0
    assert "csm build:" not in capsys.readouterr().out and (root / "build.json").stat().st_mtime_ns == mtime


@pytest.mark.slow
def test_an_interrupted_build_resumes(tmp_path, tinyc, monkeypatch):
    import importlib

    from calibkit.bench import csmbuild

    tg = importlib.import_module("calibkit.methods.csm.train_generator")

    def stop(*a, **k):
        raise KeyboardInterrupt

    gen_mod = importlib.import_module("calibkit.methods.csm.generate")  # the package exports a function of that name
    monkeypatch.setattr(gen_mod, "generate_store", stop)
    with pytest.raises(KeyboardInterrupt):
        csmbuild.build(tinyc, tmp_path, log=lambda *a: None)
    root = csmbuild.build_dir(tmp_path, tinyc)
    assert (root / "generator" / tg.STATE_NAME).is_file() and not (root / "build.json").exists()
    monkeypatch.undo()
    monkeypatch.setitem(PRESETS, "tinyc", tinyc)
    lines = []
    csmbuild.build(tinyc, tmp_path, log=lines.append)
    assert (root / "build.json").is_file()
    log = [json.loads(x) for x in (root / "generator" / tg.LOG_NAME).read_text().splitlines()]
    assert log[-1]["step"] == 3 and len([r for r in log if r["step"] == 3]) == 1, "the generator was not retrained"
