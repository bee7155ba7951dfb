"""The trainer: config precedence, schedules, resume equivalence, bad files, method paths, DDP.

Every run is tiny (digits, a few hundred images, the MLP or small CNN, 1-3 epochs) so the whole
file runs in well under a minute on two cores.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import calibkit.functional as F_
import calibkit.losses as losses_mod
from calibkit import distributed as D
from calibkit import rundir
from calibkit.config import CONFIG_DIR, TrainConfig, load_config
from calibkit.train import learning_rate, load_logits, load_run, predict_logits, train
from tests.helpers.ports import free_port as _free_port

ROOT = Path(__file__).resolve().parents[2]


def tiny(**kw) -> TrainConfig:
    """A run of a few seconds: 256 digits, MLP, batch 64 (4 steps per epoch)."""
    base = dict(data="digits", model="mlp", epochs=2, batch_size=64, lr=0.05, train_subset=256,
                val_size=100, num_threads=1, device="cpu")
    base.update(kw)
    return TrainConfig(**base)


def run_quiet(cfg, out, **kw):
    return train(cfg, out, progress=False, verbose=False, **kw)


# ----------------------------------------------------------------------------- config
def test_config_precedence_defaults_file_cli(tmp_path):
    preset = tmp_path / "p.toml"
    preset.write_text('model = "cnn"\nepochs = 7\nlr = 0.2\nmilestones = [3, 5]\n[bench]\nseeds = 3\n')
    cfg = load_config(str(preset), epochs=3, lr=None, loss="mbls:margin=6", milestones=[1, 2])
    assert cfg.epochs == 3  # command line beats the file
    assert cfg.lr == 0.2  # an option not given (None) leaves the file's value
    assert cfg.model == "cnn" and cfg.loss == "mbls:margin=6" and cfg.milestones == [1, 2]
    assert cfg.momentum == TrainConfig().momentum  # neither: the default
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg  # JSON round trip


def test_config_errors_name_the_problem(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("epoch = 3\n")
    with pytest.raises(ValueError, match="unknown config key.*epoch.*valid"):
        load_config(str(bad))
    bad.write_text('epochs = "ten"\n')
    with pytest.raises(ValueError, match="epochs: expected int"):
        load_config(str(bad))
    bad.write_text("epochs = [\n")
    with pytest.raises(ValueError, match="invalid TOML"):
        load_config(str(bad))
    with pytest.raises(FileNotFoundError, match="not found.*cifar10"):
        load_config(str(tmp_path / "missing.toml"))
    for kw, field in [({"method": "cutmix"}, "method"), ({"schedule": "step"}, "schedule"),
                      ({"epochs": 10, "milestones": [5, 10]}, "milestones"), ({"method": "csm"}, "csm_data")]:
        with pytest.raises(ValueError, match=f"^{field}:"):
            load_config(None, **kw)

    with pytest.raises(ValueError, match="^eval_batch_size: must be >= 1, got 0"):
        load_config(None, eval_batch_size=0)


def test_eval_batch_size_by_device_and_invariance():
    from calibkit.distributed import eval_batch_size

    assert load_config(None).eval_batch_size is None  # chosen by device at run time
    assert (eval_batch_size("cpu"), eval_batch_size(torch.device("cpu"))) == (128, 128)
    assert (eval_batch_size("cuda"), eval_batch_size("cuda:1"), eval_batch_size("mps")) == (1024, 1024, 1024)
    assert (eval_batch_size("cpu", 7), eval_batch_size("cuda", 3)) == (7, 3)
    # The batch size changes the speed, and the logits only by rounding (a small last batch may take
    # another matrix-multiply kernel): 300 inputs in one pass, in passes of the CPU default (128:
    # three passes, the last of 44), or of 7, against the network computed by hand.
    torch.manual_seed(0)
    from calibkit.models import mlp

    model, x = mlp(10, 1, 8), torch.randint(0, 256, (300, 1, 8, 8), dtype=torch.uint8)
    norm = (0.5, 0.25)
    one = predict_logits(model, x, norm, batch_size=300)
    xf = (x.float() / 255 - 0.5) / 0.25
    w = [(layer.weight.detach().double(), layer.bias.detach().double()) for layer in (model.fc1, model.fc2, model.head)]
    h = xf.flatten(1).double()
    for i, (weight, bias) in enumerate(w):
        h = h @ weight.T + bias
        h = h.clamp_min(0) if i < 2 else h
    for got in (one, predict_logits(model, x, norm), predict_logits(model, x, norm, 7)):
        assert got.shape == (300, 10) and got.dtype == torch.float32
        torch.testing.assert_close(got.double(), h, rtol=1e-5, atol=1e-6)


def test_presets_follow_the_protocols():
    names = sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))
    assert names == ["cifar10", "cifar100", "fmnist", "tinyimagenet"]
    for name in names:
        load_config(name)  # every preset parses and validates
    c10, tiny_in = load_config("cifar10").to_dict(), load_config("tinyimagenet").to_dict()  # milestones resolved
    assert ((c10["model"], c10["epochs"], c10["milestones"], c10["batch_size"], c10["lr"])
            == ("resnet50", 350, [150, 250], 128, 0.1))
    assert (tiny_in["epochs"], tiny_in["milestones"], tiny_in["batch_size"]) == (100, [40, 60], 64)


def test_learning_rate_schedules():
    cfg = TrainConfig(epochs=10, lr=0.1, milestones=[4, 8], gamma=0.1)
    assert ([round(learning_rate(cfg, t), 6) for t in (0, 3.99, 4.0, 7.5, 8.0, 9.9)]
            == [0.1, 0.1, 0.01, 0.01, 0.001, 0.001])
    cos = TrainConfig(epochs=10, lr=0.1, schedule="cosine")
    assert learning_rate(cos, 0) == pytest.approx(0.1) and learning_rate(cos, 5) == pytest.approx(0.05)
    one = TrainConfig(epochs=10, lr=0.1, schedule="onecycle")
    assert learning_rate(one, 0) == pytest.approx(0.004) and learning_rate(one, 2.5) == pytest.approx(0.1)
    assert learning_rate(one, 9.99) < 1e-4
    # inside the warm-up (lr (0.04 + 0.96 frac / 0.25)) and inside the decay (half-way: lr / 2)
    assert learning_rate(one, 1.25) == pytest.approx(0.1 * (0.04 + 0.96 * 0.5), rel=1e-12)
    assert learning_rate(one, 0.5) == pytest.approx(0.1 * (0.04 + 0.96 * 0.2), rel=1e-12)
    assert learning_rate(one, 6.25) == pytest.approx(0.05, rel=1e-12)


# ----------------------------------------------------------------------------- sharding helpers
def test_shards_cover_every_sample_once_and_gather_restores_order():
    n, world = 11, 3
    g = lambda: torch.Generator().manual_seed(5)  # noqa: E731 - same seed on every rank
    shards = [D.train_shard(n, g(), D.Dist(r, world)) for r in range(world)]
    assert len({len(s) for s in shards}) == 1  # equal work per rank
    assert sorted(set(torch.cat(shards).tolist())) == list(range(n))
    chunks = [D.eval_shard(n, D.Dist(r, world))[0] for r in range(world)]
    # concatenating the chunks in rank order and trimming = every index once, in order
    assert torch.cat(chunks)[:n].tolist() == list(range(n))


# ----------------------------------------------------------------------------- full runs
def test_run_directory_and_helpers(tmp_path):
    out = tmp_path / "run"
    summary = run_quiet(tiny(), out)
    assert summary["status"] == "done" and summary["epochs_done"] == 2
    for name in (rundir.CONFIG, rundir.MODEL, rundir.CHECKPOINT, rundir.LOGITS, rundir.HISTORY):
        assert (out / name).is_file()
    info = json.loads((out / rundir.CONFIG).read_text())
    assert info["status"] == "done" and info["config"]["seed"] == 0 and info["split"]["val"] == 100
    assert info["versions"]["torch"] == torch.__version__ and "git_commit" in info
    history = json.loads((out / rundir.HISTORY).read_text())
    assert [h["epoch"] for h in history] == [1, 2]
    assert summary["best_epoch"] == max(history, key=lambda h: h["val_acc"])["epoch"]

    model, cfg, info = load_run(out)
    assert cfg == tiny() and not model.training
    logits = load_logits(out)
    from calibkit.data import load

    bundle = load("digits", seed=0, val_size=100, train_subset=256)
    again = predict_logits(model, bundle.test.images, info)
    assert again.dtype == torch.float32 and again.shape == (len(bundle.test), 10)
    torch.testing.assert_close(again, logits["test_logits"])  # the saved logits are the best weights'
    assert torch.equal(logits["test_labels"], bundle.test.labels)
    val_acc = (logits["val_logits"].argmax(1) == logits["val_labels"]).double().mean().item()
    assert val_acc == pytest.approx(summary["best_val_acc"])

    # a finished run is not retrained; a different config or a foreign directory is refused
    mtime = (out / rundir.MODEL).stat().st_mtime_ns
    assert run_quiet(tiny(), out)["status"] == "done" and (out / rundir.MODEL).stat().st_mtime_ns == mtime
    with pytest.raises(ValueError, match="different config.*lr"):
        run_quiet(tiny(lr=0.01), out)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="holds no calibkit run"):
        run_quiet(tiny(), tmp_path / "other")


@pytest.mark.parametrize("loss,method", [("fedlas_ls", "standard"), ("adafocal", "regmixup")])
def test_resumed_run_equals_uninterrupted_run(tmp_path, loss, method):
    cfg = tiny(epochs=3, loss=loss, method=method)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_quiet(cfg, straight)
    partial = run_quiet(cfg, resumed, stop_after_epoch=1)  # as if killed after epoch 1
    assert partial["status"] == "running" and not (resumed / rundir.LOGITS).exists()
    assert json.loads((resumed / rundir.CONFIG).read_text())["status"] == "running"
    run_quiet(cfg, resumed)
    for name in (rundir.MODEL, rundir.LOGITS):
        a, b = rundir.read_tensors(straight / name), rundir.read_tensors(resumed / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    ca, cb = (rundir.read_checkpoint(d / rundir.CHECKPOINT) for d in (straight, resumed))
    for part in ("model", "loss"):  # last-epoch weights and the loss's state (gate, buffers, gammas)
        assert all(torch.equal(ca[part][k], cb[part][k]) for k in ca[part]), part
    assert ca["history"][-1]["val_acc"] == cb["history"][-1]["val_acc"]


def test_corrupt_files_give_clear_errors_and_keep_results(tmp_path):
    out = tmp_path / "run"
    run_quiet(tiny(), out, stop_after_epoch=1)
    ckpt = out / rundir.CHECKPOINT
    ckpt.write_bytes(ckpt.read_bytes()[:1000])  # truncated, as after a full disk
    config_before = (out / rundir.CONFIG).read_bytes()
    with pytest.raises(ValueError, match=r"checkpoint\.pt is corrupt or truncated.*new --out"):
        run_quiet(tiny(), out)
    assert (out / rundir.CONFIG).read_bytes() == config_before and (out / rundir.MODEL).is_file()

    done = tmp_path / "done"
    run_quiet(tiny(epochs=1), done)
    (done / rundir.MODEL).write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match=r"model\.safetensors: corrupt or truncated"):
        load_run(done)
    (done / rundir.LOGITS).write_bytes(b"{}")
    with pytest.raises(ValueError, match=r"logits\.safetensors"):
        load_logits(done)
    with pytest.raises(FileNotFoundError, match="not found"):
        load_run(tmp_path / "missing")


def _spy_build(monkeypatch, store):
    """Record the loss module the trainer builds, with a copy of its initial parameters."""
    real = losses_mod.build

    def build(spec, num_classes=None):
        loss = real(spec, num_classes=num_classes)
        store["loss"] = loss
        store["init"] = {k: v.detach().clone() for k, v in loss.named_parameters()}
        return loss

    monkeypatch.setattr(losses_mod, "build", build)


def test_fedlas_gate_is_trained_and_only_model_gradients_are_clipped(tmp_path, monkeypatch):
    seen, clips = {}, []
    _spy_build(monkeypatch, seen)
    real_clip = torch.nn.utils.clip_grad_norm_

    def clip(params, max_norm, *a, **kw):
        params = list(params)
        clips.append((len(params), max_norm))
        return real_clip(params, max_norm, *a, **kw)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    run_quiet(tiny(epochs=1, loss="fedlas_ls"), tmp_path / "run")
    loss = seen["loss"]
    assert loss.needs_features and seen["init"]  # the gate has parameters
    changed = [k for k, v in loss.named_parameters() if not torch.equal(v.detach(), seen["init"][k])]
    assert changed, "the FeDLaS gate parameters were not updated by the optimizer"
    n_model = len(rundir.read_tensors(tmp_path / "run" / rundir.MODEL))  # mlp: no buffers, one entry per parameter
    assert clips == [(n_model, 2.0)] * 4  # every step, global norm 2, the model's parameters only


def test_amp_bfloat16_trains(tmp_path):
    summary = run_quiet(tiny(epochs=1, amp=True), tmp_path / "run")
    history = json.loads((tmp_path / "run" / rundir.HISTORY).read_text())
    assert summary["status"] == "done" and history[0]["train_loss"] == history[0]["train_loss"]  # not NaN
    logits = load_logits(tmp_path / "run")["test_logits"]
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()



def test_channels_last_computes_the_same_run(tmp_path, monkeypatch):
    import calibkit.train.loop as loop

    layouts = []
    build = loop.build_run

    def spy(cfg, *a, **k):
        run = build(cfg, *a, **k)
        layouts.append(run.model.conv2.weight.is_contiguous(memory_format=torch.channels_last))
        return run

    monkeypatch.setattr(loop, "build_run", spy)
    runs = {}
    for cl in (False, True):
        out = tmp_path / f"cl{int(cl)}"
        assert run_quiet(tiny(model="cnn", epochs=2, channels_last=cl), out)["status"] == "done"
        runs[cl] = (json.loads((out / rundir.HISTORY).read_text()), load_logits(out), load_run(out)[0])
    assert layouts == [False, True]  # the flag reaches the model (a weight of 64 x 32 x 3 x 3)
    # Same function, other kernels: the losses and logits agree to rounding, and the saved weights load.
    (h0, l0, m0), (h1, l1, m1) = runs[False], runs[True]
    for a, b in zip(h0, h1):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
    torch.testing.assert_close(l1["test_logits"], l0["test_logits"], rtol=1e-4, atol=1e-4)
    for (name, p0), (_, p1) in zip(m0.state_dict().items(), m1.state_dict().items()):
        torch.testing.assert_close(p1, p0, rtol=1e-4, atol=1e-5, msg=name)
    # a runtime field: a finished run is not retrained when only the layout changes
    assert run_quiet(tiny(model="cnn", epochs=2, channels_last=False), tmp_path / "cl1")["status"] == "done"
    assert len(layouts) == 2

def test_adafocal_is_updated_on_validation_every_epoch(tmp_path, monkeypatch):
    seen, calls = {}, []
    _spy_build(monkeypatch, seen)
    real_update = losses_mod.AdaFocal.update

    def update(self, val_logits, val_labels):
        calls.append((val_logits.shape, val_labels.shape))
        return real_update(self, val_logits, val_labels)

    monkeypatch.setattr(losses_mod.AdaFocal, "update", update)
    out = tmp_path / "run"
    run_quiet(tiny(epochs=2, loss="adafocal"), out)
    assert calls == [((100, 10), (100,))] * 2
    saved = rundir.read_checkpoint(out / rundir.CHECKPOINT)["loss"]
    fresh = losses_mod.build("adafocal", num_classes=10).state_dict()
    assert any(not torch.equal(saved[k], fresh[k]) for k in fresh), "AdaFocal state did not move"


@pytest.mark.parametrize("method", ["mixup", "regmixup"])
def test_mixup_paths_use_soft_cross_entropy(tmp_path, monkeypatch, method):
    rows = []
    real = F_.soft_cross_entropy

    def spy(logits, soft):
        rows.append((logits.shape[0], bool(((soft > 0) & (soft < 1)).any())))
        return real(logits, soft)

    monkeypatch.setattr(F_, "soft_cross_entropy", spy)
    summary = run_quiet(tiny(epochs=1, method=method, mix_alpha=1.0), tmp_path / "run")
    assert summary["status"] == "done"
    # 256 images / batch 64 = 4 steps; soft CE on exactly the mixed half (64 rows), which has mixed labels
    assert len(rows) == 4 and all(n == 64 for n, _ in rows) and any(mixed for _, mixed in rows)
    if method == "mixup":
        with pytest.raises(ValueError, match="loss must be 'ce'"):
            run_quiet(tiny(epochs=1, method="mixup", loss="mbls"), tmp_path / "bad")


def test_csm_path_adds_soft_l2_on_two_generated_images_per_real_one(tmp_path, monkeypatch):
    import calibkit.methods.csm.dataset as csm_dataset

    draws, rows = [], []

    class FakeCompanion:  # stands in for a generated store: random images, half-half soft labels
        def __init__(self, store_dir, num_classes, seed=0):
            assert store_dir == str(tmp_path / "store") and num_classes == 10

        def draw(self, labels, generator=None, per_real=2):
            draws.append((labels.device.type, len(labels)))
            b = len(labels)
            images = torch.randint(0, 256, (2 * b, 1, 28, 28), dtype=torch.uint8, generator=generator)
            soft = torch.zeros(2 * b, 10)
            soft[torch.arange(2 * b), torch.cat([labels, labels])] += 0.5
            soft[torch.arange(2 * b), torch.cat([labels, (labels + 1) % 10])] += 0.5
            return images, soft

    real = F_.soft_l2

    def spy(logits, soft):
        rows.append(logits.shape[0])
        return real(logits, soft)

    monkeypatch.setattr(csm_dataset, "CSMCompanion", FakeCompanion)
    monkeypatch.setattr(F_, "soft_l2", spy)
    run_quiet(tiny(epochs=1, method="csm", csm_data=str(tmp_path / "store")), tmp_path / "run")
    assert draws == [("cpu", 64)] * 4 and rows == [128] * 4  # 2 generated per real image, every step


@pytest.mark.parametrize("augment,expected", [(True, {(2, False)}), (False, set())])
def test_augment_switch(tmp_path, monkeypatch, augment, expected):
    import calibkit.data.inputs as data_mod  # the image input pipeline calls augment

    seen = set()
    real = data_mod.augment

    def spy(x, crop_pad, hflip, generator=None):
        seen.add((crop_pad, hflip))
        return real(x, crop_pad, hflip, generator)

    monkeypatch.setattr(data_mod, "augment", spy)
    run_quiet(tiny(epochs=1, augment=augment), tmp_path / "run")
    # digits: crop with padding 2, never flipped (digits are not symmetric); without augmentation
    # the pipeline does not call augment at all
    assert seen == expected


# ----------------------------------------------------------------------------- distributed
def test_two_process_ddp_matches_single_process_evaluation(tmp_path, cli_env):
    out = tmp_path / "ddp"
    # 360 test and 101 validation images: odd sizes, so the last rank's shard is padded
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(_free_port()), "-m", "calibkit", "train", "--data", "digits", "--model", "mlp", "--epochs", "2",
           "--batch-size", "64", "--lr", "0.05", "--train-subset", "256", "--val-size", "101", "--device", "cpu",
           "--num-threads", "1", "--no-progress", "--out", str(out)]
    proc = subprocess.run(cmd, env=cli_env, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.count("epoch   1/2") == 1  # only rank 0 prints
    info = json.loads((out / rundir.CONFIG).read_text())
    assert info["world_size"] == 2 and info["status"] == "done"
    assert len(json.loads((out / rundir.HISTORY).read_text())) == 2

    model, cfg, info = load_run(out)
    from calibkit.data import load

    bundle = load("digits", seed=0, val_size=101, train_subset=256)
    saved = load_logits(out)
    for split in ("val", "test"):
        single = predict_logits(model, getattr(bundle, split).images, info)
        torch.testing.assert_close(saved[f"{split}_logits"], single, rtol=1e-5, atol=1e-5)
        assert torch.equal(saved[f"{split}_labels"], getattr(bundle, split).labels)


def test_checkpoint_every_writes_every_k_epochs_and_after_the_last(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="checkpoint_every: must be >= 1"):
        tiny(checkpoint_every=0).validate()
    straight, sparse = tmp_path / "straight", tmp_path / "sparse"
    run_quiet(tiny(epochs=5, keep="last"), straight)
    writes = []  # (file, epoch of the checkpoint or the kept weights' epoch)
    real_ckpt, real_tensors = rundir.write_checkpoint, rundir.write_tensors

    def spy_ckpt(path, state):
        writes.append(("checkpoint", state["epoch"], state["keep"]["epoch"]))
        real_ckpt(path, state)

    def spy_tensors(path, tensors):
        writes.append((Path(path).name, None, None))
        real_tensors(path, tensors)

    monkeypatch.setattr(rundir, "write_checkpoint", spy_ckpt)
    monkeypatch.setattr(rundir, "write_tensors", spy_tensors)
    cfg = tiny(epochs=5, keep="last", checkpoint_every=2)
    run_quiet(cfg, sparse, stop_after_epoch=3)  # as if killed after epoch 3: the last checkpoint is epoch 2
    assert writes == [(rundir.MODEL, None, None), ("checkpoint", 2, 2)]
    assert len(json.loads((sparse / rundir.HISTORY).read_text())) == 3  # history.json every epoch
    writes.clear()
    run_quiet(tiny(epochs=5, keep="last", checkpoint_every=3), sparse)  # a runtime field: resumes
    # epochs 3, 4, 5 again: a checkpoint after epoch 3 (3 % 3 == 0) and after the last, each with
    # the kept weights (policy "last": every epoch is kept) written just before it
    assert writes == [(rundir.MODEL, None, None), ("checkpoint", 3, 3), (rundir.MODEL, None, None),
                      ("checkpoint", 5, 5), (rundir.LOGITS, None, None)]
    for name in (rundir.MODEL, rundir.LOGITS):  # the repeated epochs end where a straight run does
        a, b = rundir.read_tensors(straight / name), rundir.read_tensors(sparse / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    assert json.loads((sparse / rundir.HISTORY).read_text())[-1]["val_acc"] == \
        json.loads((straight / rundir.HISTORY).read_text())[-1]["val_acc"]


def test_kept_weights_wait_in_memory_for_the_next_checkpoint(tmp_path, monkeypatch):
    # best-acc keeps some epochs and not others; whatever it keeps between two checkpoints is
    # written once, with the checkpoint, and is the weights of the epoch that checkpoint names
    out = tmp_path / "run"
    seen = []
    real_ckpt = rundir.write_checkpoint

    def spy_ckpt(path, state):
        seen.append((state["epoch"], state["best_epoch"], rundir.read_tensors(out / rundir.MODEL)))
        real_ckpt(path, state)

    monkeypatch.setattr(rundir, "write_checkpoint", spy_ckpt)
    run_quiet(tiny(epochs=4, checkpoint_every=2), out)
    assert [e for e, _, _ in seen] == [2, 4]
    monkeypatch.undo()
    for epoch, best, weights in seen:  # a straight run stopped after the best epoch has those weights
        ref = tmp_path / f"ref{epoch}"
        run_quiet(tiny(epochs=4, keep="last"), ref, stop_after_epoch=best)
        ckpt = rundir.read_checkpoint(ref / rundir.CHECKPOINT)
        assert ckpt["epoch"] == best and all(torch.equal(weights[k], ckpt["model"][k]) for k in weights)


def test_kept_validation_logits_are_reused_and_equal_a_fresh_pass(tmp_path, monkeypatch):
    import calibkit.train.evaluate as evaluate
    from calibkit.data import load
    from calibkit.train.keep import Keeper

    passes = []
    real = evaluate.split_logits

    def spy(run, split):
        passes.append(len(split))
        return real(run, split)

    monkeypatch.setattr(evaluate, "split_logits", spy)
    bundle = load("digits", seed=0, val_size=100, train_subset=256)
    n_val, n_test = len(bundle.val), len(bundle.test)

    def fresh_val_logits(out):
        model, _, info = load_run(out)
        return predict_logits(model, bundle.val.images, info)

    out = tmp_path / "run"
    run_quiet(tiny(epochs=3), out)
    # one validation pass per epoch and one test pass: the kept epoch's validation logits are reused
    assert passes == [n_val, n_val, n_val, n_test]
    assert torch.equal(rundir.read_tensors(out / rundir.LOGITS)["val_logits"], fresh_val_logits(out))

    # kept before a resume and nothing kept after it: the logits are not in memory, so finish
    # makes the pass again, and they are still the kept weights'
    resumed = tmp_path / "resumed"
    run_quiet(tiny(epochs=3), resumed, stop_after_epoch=2)
    passes.clear()
    monkeypatch.setattr(Keeper, "offer", lambda self, epoch, record: False)
    run_quiet(tiny(epochs=3), resumed)
    assert passes == [n_val, n_val, n_test]
    assert json.loads((resumed / rundir.CONFIG).read_text())["best_epoch"] <= 2
    assert torch.equal(rundir.read_tensors(resumed / rundir.LOGITS)["val_logits"], fresh_val_logits(resumed))


def test_each_epoch_draws_from_its_own_augmentation_and_draw_streams(tmp_path, monkeypatch):
    """Stream 1 (augmentation, mixing) and stream 2 (CSM's companion draws) of SeedSequence([seed,
    epoch, rank, stream]) are distinct generators, so drawing companions never shifts the augmentation."""
    import numpy as np

    import calibkit.train.loop as loop
    from calibkit.train.steps import EpochGenerators

    seen = []

    def record(aug, draw):
        seen.append((aug.get_state().clone(), draw.get_state().clone()))
        return EpochGenerators(aug=aug, draw=draw)

    def expected(seed, epoch, stream):
        state = np.random.SeedSequence([seed, epoch, 0, stream]).generate_state(1, dtype=np.uint64)[0]
        return torch.Generator().manual_seed(int(state) & (2**63 - 1)).get_state()

    monkeypatch.setattr(loop, "EpochGenerators", record)
    train(tiny(epochs=2, seed=4), tmp_path / "run", progress=False, verbose=False)
    assert len(seen) == 2
    for epoch, (aug, draw) in enumerate(seen):
        assert torch.equal(aug, expected(4, epoch, 1)) and torch.equal(draw, expected(4, epoch, 2))
        assert not torch.equal(aug, draw)
