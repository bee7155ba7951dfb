"""Text through the trainer, the command line and the bench, on a synthetic package index."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from calibkit import rundir
from calibkit.config import TrainConfig
from calibkit.data import load
from calibkit.train import train
from tests.helpers.text_index import write_synthetic_index

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return write_synthetic_index(tmp_path_factory.mktemp("apt") / "lists")


def _cfg(index, **kw):
    values = dict(data="debian", data_dir=str(index), model="gpool_cnn_small", epochs=2, batch_size=32, lr=1e-3,
                  optimizer="adam", weight_decay=0.0,
                  augment=False, device="cpu", num_threads=1, seed=0)
    values.update(kw)
    return TrainConfig(**values)


def cli(args, env, timeout=600):
    return subprocess.run([sys.executable, "-m", "calibkit", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_train_eval_plot_text_run(tmp_path, index, cli_env):
    out = tmp_path / "run"
    r = cli(["train", "--data", "debian", "--data-dir", str(index), "--model", "gpool_cnn_small", "--epochs", "4",
             "--batch-size", "32", "--optimizer", "adam", "--lr", "0.001", "--weight-decay", "0",
             "--loss", "mbls:margin=6", "--no-augment", "--device", "cpu", "--num-threads", "1", "--no-progress",
             "--out", str(out)], cli_env)
    assert r.returncode == 0, r.stderr
    info = rundir.load_info(out)
    bundle = load("debian", data_dir=str(index))
    assert info["modality"] == "text" and info["in_channels"] == len(bundle.vocab)
    assert info["split"]["vocab_checksum"] == bundle.vocab.checksum()
    assert rundir.load_vocab(out) == bundle.vocab  # vocab.json rebuilds the exact encoding
    # the saved test logits are what the saved model gives on the re-encoded test texts
    model, _, _ = rundir.load_run(out)
    logits = rundir.load_logits(out)
    torch.testing.assert_close(rundir.predict_logits(model, bundle.test.images, info), logits["test_logits"])
    acc = (logits["test_logits"].argmax(1) == logits["test_labels"]).double().mean().item()
    assert acc > 3 / 18, f"4 epochs on the synthetic topics should beat chance (1/18) clearly, got {acc:.2%}"
    r = cli(["eval", str(out)], cli_env)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / rundir.METRICS).read_text())["n_test"] == len(bundle.test)
    r = cli(["plot", str(out)], cli_env)
    assert r.returncode == 0, r.stderr
    assert list(out.glob("*.png"))


def test_resumed_text_run_equals_uninterrupted(tmp_path, index):
    cfg = _cfg(index, epochs=2, train_subset=200)
    train(cfg, tmp_path / "a", progress=False, verbose=False)
    train(cfg, tmp_path / "b", progress=False, verbose=False, stop_after_epoch=1)
    train(cfg, tmp_path / "b", progress=False, verbose=False)
    a, b = rundir.read_tensors(tmp_path / "a" / rundir.MODEL), rundir.read_tensors(tmp_path / "b" / rundir.MODEL)
    assert all(torch.equal(a[k], b[k]) for k in a)
    vocab = load("debian", data_dir=str(index), seed=0, train_subset=200).vocab.to_dict()
    assert rundir.read_json(tmp_path / "b" / rundir.VOCAB) == vocab  # what turns text into this run's ids


@pytest.mark.parametrize("change,match", [
    ({"model": "mlp"}, "mlp takes images, but data set debian is text"),
    ({"method": "mixup"}, "text data \\(token ids\\) trains with method standard only"),
    ({"data": "digits", "data_dir": None}, "gpool_cnn_small takes token ids \\(text\\), but data set digits is image"),
])
def test_model_data_and_method_mismatches_are_refused(tmp_path, index, change, match):
    with pytest.raises(ValueError, match=match):
        train(_cfg(index, **change), tmp_path / "run", progress=False, verbose=False)
    assert not (tmp_path / "run" / rundir.MODEL).exists()


def test_token_inputs_check_the_vocabulary(index):
    from calibkit.data.inputs import inputs_for

    bundle = load("debian", data_dir=str(index))
    pipe = inputs_for(bundle)
    x = bundle.test.images[:4]
    assert pipe.eval_batch(x) is x and pipe.train_batch(x, bundle.test.labels[:4])[0] is x
    with pytest.raises(ValueError, match=f"\\[0, {len(bundle.vocab)}\\)"):
        pipe.eval_batch(x + len(bundle.vocab))
    with pytest.raises(ValueError, match="int64"):
        pipe.eval_batch(x.int())


def test_text_ood_sets(index):
    from calibkit.data import debian as D
    from calibkit.data.ood import load_ood

    bundle = load("debian", data_dir=str(index))
    ood = load_ood("debian-heldout", like=bundle, data_dir=str(index))
    assert ood.dtype == torch.int64 and ood.shape == (40 * len(D.OOD_SECTIONS), bundle.vocab.length)
    # held-out sections' topic words are not in the classes' training vocabulary: mostly <unk>
    words = ood[ood > 0]
    assert (words == 1).double().mean() > 0.4
    noise = load_ood("noise", like=bundle)
    assert noise.shape == (2000, bundle.vocab.length) and int(noise.min()) >= 2
    with pytest.raises(ValueError, match="debian-heldout, noise"):
        load_ood("digits", like=bundle)


def test_text_smoke_bench_end_to_end(tmp_path, index, cli_env):
    from calibkit.bench.grid import PRESETS, TEXT_METHODS
    from calibkit.store import Store

    out = tmp_path / "bench"
    r = cli(["bench", "--preset", "text-smoke", "--data-dir", str(index), "--out", str(out)], cli_env, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {row["method"]: row for row in Store(out / "runs.db", readonly=True).runs("text-smoke")}
    assert set(rows) == set(TEXT_METHODS) == set(PRESETS["text-smoke"].methods)
    for method, row in rows.items():
        assert row["status"] == "done", (method, row.get("error"))
        m = row["metrics"]
        assert 0 <= m["before"]["ece"] <= 1 and 0 <= m["after"]["ece"] <= 1 and m["temperature"] > 0
        assert row["ood"]["dataset"] == "debian-heldout" and row["ood"]["n_out"] == 40 * 6
        assert row["robustness"] is None  # no corruptions for text
    for label in ("CE", "LS", "Focal", "MbLS", "FeDLaS-MbLS", "MaC-Cal"):
        assert f"\n{label}" in r.stdout or r.stdout.startswith(label), label
    # image-only methods asked for by name are skipped with a message, not failed
    r = cli(["bench", "--preset", "text-smoke", "--data-dir", str(index), "--out", str(out), "--methods", "csm",
             "mixup", "--no-report"], cli_env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "mixup, csm: skipped (they mix or generate images" in r.stdout


def test_text_presets_select_only_text_methods(tmp_path):
    from calibkit.bench.grid import BENCH_METHODS, IMAGE_ONLY, TEXT_METHODS, get_preset, grid_methods
    from calibkit.bench.tune import Tuner

    preset = get_preset("text")
    assert grid_methods(preset) == (list(TEXT_METHODS), [])
    kept, skipped = grid_methods(preset, ["mixup", "mbls", "csm"])
    assert kept == ["ce", "mbls"] and skipped == ["mixup", "csm"]
    # an image preset keeps everything it is asked for
    assert grid_methods(get_preset("smoke"), ["mixup"]) == (["ce", "mixup"], [])
    # tuning a text preset: its own methods that have a search space, never an image-only one
    tuner = Tuner(preset, tmp_path, num_threads=1, log=lambda *a, **k: None)
    try:
        assert tuner.methods == [m for m in TEXT_METHODS if BENCH_METHODS[m].space]
        assert tuner.unsupported == []
    finally:
        tuner.close()
    tuner = Tuner(preset, tmp_path, methods=list(IMAGE_ONLY) + ["ls"], num_threads=1, log=lambda *a, **k: None)
    try:
        assert tuner.methods == ["ls"] and tuner.unsupported == list(IMAGE_ONLY)
    finally:
        tuner.close()


def test_csm_generator_refuses_text_data(tmp_path, index, cli_env):
    out = tmp_path / "gen"
    r = cli(["csm", "train-generator", "--data", "debian", "--data-dir", str(index), "--steps", "1", "--out", str(out)],
            cli_env)
    assert r.returncode == 1 and "debian is text: CSM's generator is an image diffusion model" in r.stderr, r.stderr
    assert not out.exists()
