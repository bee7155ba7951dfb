"""``calibkit.train.loop`` part by part: its helpers, its messages, what each epoch hands on (seeds,
generators, learning rates, input checks, clipping), what a run writes and prints.

Every run here is a few steps on the digits set with the MLP (well under a second each); the
equivalence of a resumed and an uninterrupted run, the methods' paths and DDP are tested in
``tests/train/test_loop.py``.
"""

from __future__ import annotations

import dataclasses
import random
import sys

import numpy as np
import pytest
import torch

from calibkit import distributed as D
from calibkit import rundir
from calibkit.config import TrainConfig
from calibkit.data import load
from calibkit.data.bundle import Split
from calibkit.functional import ece
from calibkit.train import evaluate, loop, preempt
from calibkit.train import run as run_mod
from calibkit.train.keep import Keeper
from calibkit.train.schedule import learning_rate


def tiny(**kw) -> TrainConfig:
    """4 steps of 32 digits per epoch, 60 validation images."""
    base = dict(data="digits", model="mlp", epochs=2, batch_size=32, lr=0.05, train_subset=128, val_size=60,
                num_threads=1, device="cpu", checkpoint_every=1)
    base.update(kw)
    return TrainConfig(**base)


def quiet(cfg, out, **kw):
    return loop.train(cfg, out, progress=False, verbose=False, **kw)


class _FirstOnly(Keeper):
    """The checkpoint policy, but keeping the first epoch only (later epochs are never kept)."""

    def offer(self, epoch, record):
        return super().offer(epoch, record) if epoch == 1 else False


@pytest.fixture
def steps(monkeypatch):
    """Wrap the method's step: record each step's loss, batch size and correct count; ``nan_at``
    (1-based call numbers) makes those steps' losses NaN."""
    seen = {"loss": [], "n": [], "correct": [], "nan_at": set(), "calls": 0}
    real = run_mod.build_step

    def build(*a, **k):
        step = real(*a, **k)

        def wrapped(*args):
            loss, logits, target = step(*args)
            seen["calls"] += 1
            if seen["calls"] in seen["nan_at"]:
                loss = loss * float("nan")
            seen["loss"].append(float(loss.detach().float()))
            seen["n"].append(len(target))
            seen["correct"].append(int((logits.argmax(1) == target).sum()))
            return loss, logits, target

        return wrapped

    monkeypatch.setattr(run_mod, "build_step", build)
    return seen


# ------------------------------------------------------------------------------ helpers


def test_epoch_rng_seeds_from_the_seed_sequence_of_its_four_numbers():
    for key in ((0, 0, 0, 0), (3, 7, 1, 2), (2**40, 5, 0, 1)):
        state = np.random.SeedSequence(list(key)).generate_state(1, dtype=np.uint64)[0]
        g = loop._epoch_rng(*key)
        assert g.initial_seed() == int(state) & (2**63 - 1) and g.device == torch.device("cpu")
    assert loop._epoch_rng(1, 2, 3, 4, device="cpu").initial_seed() == loop._epoch_rng(1, 2, 3, 4).initial_seed()


def test_reseed_globals_seeds_python_numpy_and_torch():
    for seed in (0, 12345, 2**32 + 7, 3 * 2**32 + 1):
        run_mod.reseed_globals(seed)
        got = (random.random(), float(np.random.random_sample()), float(torch.rand(())))
        want_np = np.random.RandomState(seed % 2**32).random_sample()
        want_torch = float(torch.rand((), generator=torch.Generator().manual_seed(seed)))
        assert got == (random.Random(seed).random(), want_np, want_torch), seed


def test_summary_holds_exactly_its_seven_keys():
    info = {k: i for i, k in enumerate(("status", "epochs_done", "best_epoch", "best_val_acc", "test_acc", "test_ece",
                                        "wall_time_s", "config"))}
    assert evaluate.summary(info) == {k: v for k, v in info.items() if k != "config"}
    assert evaluate.summary({}) == dict.fromkeys(("status", "epochs_done", "best_epoch", "best_val_acc", "test_acc",
                                               "test_ece", "wall_time_s"))


def test_check_modality_messages():
    cfg = tiny(model="mlp", data="digits")
    run_mod.check_modality(cfg, "image", "images")
    run_mod.check_modality(dataclasses.replace(cfg, method="standard"), "text", "tokens")
    with pytest.raises(ValueError) as err:
        run_mod.check_modality(cfg, "text", "images")
    assert str(err.value) == "model: mlp takes images, but data set digits is text; choose a text model"
    with pytest.raises(ValueError) as err:
        run_mod.check_modality(dataclasses.replace(cfg, model="gpool_cnn_small"), "image", "tokens")
    assert str(err.value) == ("model: gpool_cnn_small takes token ids (text), but data set digits is image; "
                              "choose a image model")
    with pytest.raises(ValueError) as err:
        run_mod.check_modality(dataclasses.replace(cfg, method="mixup"), "text", "tokens")
    assert str(err.value) == ("method: mixup mixes or generates input images; text data (token ids) trains with "
                              "method standard only")


# ------------------------------------------------------------------------------ _prepare_run_dir


def test_prepare_run_dir_states(tmp_path):
    cfg = tiny()
    assert loop._prepare_run_dir(tmp_path / "new", cfg) == ("fresh", None)
    (tmp_path / "empty").mkdir()
    assert loop._prepare_run_dir(tmp_path / "empty", cfg) == ("fresh", None)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError) as err:
        loop._prepare_run_dir(tmp_path / "file", cfg)
    assert str(err.value) == f"out: {tmp_path / 'file'} exists and is not a directory"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("x")
    with pytest.raises(ValueError) as err:
        loop._prepare_run_dir(tmp_path / "other", cfg)
    assert str(err.value) == (f"out: {tmp_path / 'other'} is not empty and holds no calibkit run; "
                              "choose another directory")
    run = tmp_path / "run"
    run.mkdir()
    rundir.write_json(run / rundir.CONFIG, {"config": cfg.to_dict(), "status": "done"})
    assert loop._prepare_run_dir(run, cfg) == ("fresh", None)  # "done" without its logits: not finished
    rundir.write_json(run / rundir.CONFIG, {"config": cfg.to_dict(), "status": "running"})
    (run / rundir.LOGITS).write_bytes(b"")
    assert loop._prepare_run_dir(run, cfg) == ("fresh", None)  # logits without "done": not finished either
    rundir.write_json(run / rundir.CONFIG, {"config": cfg.to_dict(), "status": "done", "epochs_done": 2})
    assert loop._prepare_run_dir(run, cfg) == ("done", {"config": cfg.to_dict(), "status": "done", "epochs_done": 2})


def test_prepare_run_dir_of_a_record_without_its_config_compares_with_the_defaults(tmp_path):
    rundir.write_json(tmp_path / rundir.CONFIG, {"status": "running"})
    assert loop._prepare_run_dir(tmp_path, TrainConfig()) == ("fresh", None)


def test_prepare_run_dir_restarts_a_run_of_another_config_that_never_ended_an_epoch(tmp_path, capsys):
    rundir.write_json(tmp_path / rundir.CONFIG, {"config": tiny(lr=1e9, seed=4).to_dict(), "status": "running"})
    assert loop._prepare_run_dir(tmp_path, tiny()) == ("fresh", None)
    err = capsys.readouterr().err
    assert err == (f"{tmp_path}: the run there (config differs in: lr, seed) ended before completing an epoch; "
                   "starting it again with this config\n")
    rundir.write_json(tmp_path / rundir.CONFIG, {"config": tiny(lr=1e9, epochs=3).to_dict(), "status": "running"})
    assert loop._prepare_run_dir(tmp_path, tiny(), main=False) == ("fresh", None)
    assert capsys.readouterr().err == ""  # one line, from rank 0 only
    for name in (rundir.HISTORY, rundir.CHECKPOINT, rundir.MODEL):
        (tmp_path / name).write_bytes(b"")
        with pytest.raises(ValueError) as exc:
            loop._prepare_run_dir(tmp_path, tiny())
        assert str(exc.value) == (f"out: {tmp_path} holds a run with a different config (differs in: epochs, lr) "
                                  "that has completed at least one epoch; choose another directory (a run that has "
                                  "not completed an epoch may be restarted with a new config)")
        (tmp_path / name).unlink()


def test_prepare_run_dir_flushes_its_line(tmp_path, monkeypatch):
    said = []
    monkeypatch.setattr(loop, "print", lambda *a, **k: said.append((a, k)), raising=False)
    rundir.write_json(tmp_path / rundir.CONFIG, {"config": tiny(lr=1e9).to_dict(), "status": "running"})
    loop._prepare_run_dir(tmp_path, tiny())
    assert len(said) == 1 and said[0][1] == {"file": sys.stderr, "flush": True}


# ------------------------------------------------------------------------------ _build


def _head(split, n):
    """The first ``n`` samples of a split."""
    return Split(split.images[:n], split.labels[:n])


def _bundle_with(monkeypatch, change):
    """``calibkit.data.load`` returning the real bundle changed by ``change(bundle)``."""
    import calibkit.data

    real = calibkit.data.load
    monkeypatch.setattr(calibkit.data, "load", lambda *a, **k: change(real(*a, **k)))


def test_build_loads_the_configs_split_and_names_its_errors(tmp_path, monkeypatch):
    cfg = tiny(seed=3)
    made = []
    real_step = run_mod.build_step
    monkeypatch.setattr(run_mod, "build_step", lambda *a: made.append(a) or real_step(*a))
    run = run_mod.build_run(cfg, D.Dist(), None, tmp_path, print)
    assert made == [(cfg, run.loss_fn, 10, run.inputs, 3)]  # the seed of CSM's companion draws
    want = load("digits", seed=3, val_size=60, train_subset=128)
    assert run.bundle.split == want.split and torch.equal(run.train_x, want.train.images)
    with pytest.raises(ValueError) as err:
        run_mod.build_run(tiny(model="no_such_model"), D.Dist(), None, tmp_path, print)
    assert str(err.value).startswith("model: ") and "no_such_model" in str(err.value)
    with pytest.raises(ValueError) as err:
        run_mod.build_run(tiny(batch_size=129), D.Dist(), None, tmp_path, print)
    assert str(err.value) == "batch_size 129 exceeds the 128 training images"
    assert run_mod.build_run(tiny(batch_size=128), D.Dist(), None, tmp_path, print).model is not None  # one batch: fine
    _bundle_with(monkeypatch, lambda b: dataclasses.replace(b, val=_head(b.val, 1)))
    assert len(run_mod.build_run(cfg, D.Dist(), None, tmp_path, print).bundle.val) == 1  # one image is enough
    _bundle_with(monkeypatch, lambda b: dataclasses.replace(b, val=_head(b.val, 0)))
    with pytest.raises(ValueError) as err:
        run_mod.build_run(cfg, D.Dist(), None, tmp_path, print)
    assert str(err.value) == "val_size: the validation split is empty; model selection needs one"


def test_build_makes_the_model_for_the_datas_classes_and_channels(tmp_path, monkeypatch):
    def three(b):
        keep_tr, keep_va = b.train.labels < 3, b.val.labels < 3
        def rgb(s, k):
            return Split(s.images[k].repeat(1, 3, 1, 1), s.labels[k])

        return dataclasses.replace(b, train=rgb(b.train, keep_tr), val=rgb(b.val, keep_va),
                                   test=rgb(b.test, b.test.labels < 3),
                                   num_classes=3, in_channels=3, mean=[b.mean[0]] * 3, std=[b.std[0]] * 3,
                                   class_names=b.class_names[:3])

    _bundle_with(monkeypatch, three)
    run = run_mod.build_run(tiny(train_subset=None, batch_size=32), D.Dist(), None, tmp_path, print)
    out = run.model(run.inputs.eval_batch(run.train_x[:2]))
    assert out.shape == (2, 3)


def test_build_refuses_a_dense_model_on_class_labels_and_a_classifier_on_masks(tmp_path):
    from calibkit.models import DENSE_MODELS

    names = ", ".join(sorted(DENSE_MODELS))
    with pytest.raises(ValueError) as err:
        run_mod.build_run(tiny(model="unet", batch_size=8), D.Dist(), None, tmp_path, print)
    assert str(err.value) == (f"model: 'unet' does not fit data 'digits': image data needs a classifier, not a "
                              f"dense model (dense models: {names})")
    from tests.helpers.formats import fake_fmnist

    (tmp_path / "f").mkdir()
    fake_fmnist(str(tmp_path / "f"), n_train=60, n_test=12)
    scenes = dict(data="scenes", data_dir=str(tmp_path / "f"), batch_size=4, train_subset=8, val_size=4)
    with pytest.raises(ValueError) as err:
        run_mod.build_run(tiny(model="resnet8", **scenes), D.Dist(), None, tmp_path, print)
    assert str(err.value) == (f"model: 'resnet8' does not fit data 'scenes': segmentation data needs a dense model "
                              f"(dense models: {names})")
    run = run_mod.build_run(tiny(model="unet", **scenes), D.Dist(), None, tmp_path, print)
    assert run.bundle.modality == "segmentation" and run.model.dense


def test_build_sets_the_optimizers_values(tmp_path):
    run = run_mod.build_run(tiny(lr=0.07, momentum=0.8, weight_decay=3e-4), D.Dist(), None, tmp_path, print)
    g = run.optimizer.param_groups[0]
    assert isinstance(run.optimizer, torch.optim.SGD)
    assert (g["lr"], g["momentum"], g["weight_decay"]) == (0.07, 0.8, 3e-4)
    run = run_mod.build_run(tiny(optimizer="adam", lr=0.002, weight_decay=1e-5), D.Dist(), None, tmp_path, print)
    g = run.optimizer.param_groups[0]
    assert isinstance(run.optimizer, torch.optim.Adam) and (g["lr"], g["weight_decay"]) == (0.002, 1e-5)


def test_build_compiles_the_wrapped_model_when_asked(tmp_path, monkeypatch):
    got = []
    monkeypatch.setattr(loop.torch, "compile", lambda net: got.append(net) or net)
    run = run_mod.build_run(tiny(compile=True), D.Dist(), None, tmp_path, print)
    assert got == [run.net] and isinstance(run.net, run_mod.WithFeatures) and run.net.model is run.model
    assert run_mod.build_run(tiny(), D.Dist(), None, tmp_path, print) and len(got) == 1


def test_build_names_a_checkpoint_of_another_model(tmp_path):
    quiet(tiny(epochs=3), tmp_path, stop_after_epoch=1)
    ck = rundir.read_checkpoint(tmp_path / rundir.CHECKPOINT)
    ck["model"] = {k: v[:1] for k, v in ck["model"].items()}
    with pytest.raises(ValueError) as err:
        run_mod.build_run(tiny(epochs=3), D.Dist(), ck, tmp_path, print)
    assert str(err.value).startswith(f"{tmp_path / rundir.CHECKPOINT}: does not match this config (")


def test_resume_reads_the_policys_state_and_an_old_checkpoints_best_epoch(tmp_path, capsys):
    cfg = tiny(epochs=3, keep="best-nll")
    quiet(cfg, tmp_path, stop_after_epoch=2)
    ck = rundir.read_checkpoint(tmp_path / rundir.CHECKPOINT)
    lines = []
    run = run_mod.build_run(cfg, D.Dist(), ck, tmp_path, lines.append)
    assert (run.keeper.score, run.keeper.epoch) == (ck["keep"]["score"], ck["keep"]["epoch"])
    assert run.keeper.score == -ck["history"][run.keeper.epoch - 1]["val_loss"]  # not the accuracy
    assert lines == [f"{tmp_path}: resuming after epoch 2/3 (kept: epoch {run.keeper.epoch}, policy best-nll)"]
    assert (run.start_epoch, run.history, run.elapsed) == (2, ck["history"], ck["elapsed_s"])
    old = {k: v for k, v in ck.items() if k != "keep"}  # written before the policy was recorded
    old.update(best_val_acc=0.25, best_epoch=1)
    run = run_mod.build_run(tiny(epochs=3), D.Dist(), old, tmp_path, lines.append)
    assert (run.keeper.score, run.keeper.epoch) == (0.25, 1)


# ------------------------------------------------------------------------------ one epoch


def test_each_epoch_reseeds_and_draws_from_its_own_streams(tmp_path, monkeypatch):
    seeds, rngs, batches = [], [], []
    real_rng, real_batch = loop._epoch_rng, None
    for module in (run_mod, loop):  # seeded when the run is built, then at the start of every epoch
        monkeypatch.setattr(module, "reseed_globals", lambda s: seeds.append(s))

    def rng(*args, **kw):
        g = real_rng(*args, **kw)
        rngs.append((args, kw, g))
        return g

    monkeypatch.setattr(loop, "_epoch_rng", rng)
    from calibkit.data.inputs import ImageInputs

    real_batch = ImageInputs.train_batch
    monkeypatch.setattr(ImageInputs, "train_batch",
                        lambda self, x, y, g=None: batches.append(g) or real_batch(self, x, y, g))
    quiet(tiny(seed=5), tmp_path)
    assert seeds == [5, 5 * 100_003 + 0 * 101 + 0, 5 * 100_003 + 1 * 101 + 0]
    per_epoch = [[(a, kw) for a, kw, _ in rngs[i:i + 3]] for i in (0, 3)]
    for e, calls in enumerate(per_epoch):
        assert calls == [((5, e, 0, 0), {}), ((5, e, 0, 1, torch.device("cpu")), {}), ((5, e, 0, 2), {})]
    assert len(batches) == 8 and all(g is rngs[1][2] for g in batches[:4]) and all(g is rngs[4][2] for g in batches[4:])


def test_learning_rate_is_set_per_step_and_the_record_is_the_epochs_sums(tmp_path, steps, monkeypatch):
    times = []
    monkeypatch.setattr(loop, "learning_rate", lambda cfg, t: times.append(t) or learning_rate(cfg, t))
    cfg = tiny(schedule="cosine")
    run = {}
    real_build = loop.build_run
    monkeypatch.setattr(loop, "build_run", lambda *a: run.setdefault("run", real_build(*a)))
    quiet(cfg, tmp_path)
    assert times == [e + s / 4 for e in range(2) for s in range(4)]
    assert run["run"].optimizer.param_groups[0]["lr"] == learning_rate(cfg, 1.75)
    history = rundir.read_json(tmp_path / rundir.HISTORY)
    for e in range(2):
        sl = slice(4 * e, 4 * e + 4)
        loss = sum(np.float32(v) * n for v, n in zip(steps["loss"][sl], steps["n"][sl]))
        assert history[e]["train_loss"] == pytest.approx(loss / 128, rel=1e-12)
        assert history[e]["train_acc"] == sum(steps["correct"][sl]) / 128
        assert history[e]["lr"] == learning_rate(cfg, e + 0.75)


def test_input_checks_run_on_the_first_step_of_each_epoch_only(tmp_path, monkeypatch):
    import contextlib

    trusted = []

    @contextlib.contextmanager
    def counting():
        trusted.append(1)
        yield

    monkeypatch.setattr(loop._validation, "trusted_inputs", counting)
    quiet(tiny(), tmp_path)
    assert len(trusted) == 2 * 3  # 4 steps an epoch: steps 1, 2, 3 trusted


def test_gradients_are_clipped_only_when_asked(tmp_path, monkeypatch):
    clips = []
    real = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(loop.nn.utils, "clip_grad_norm_", lambda p, m: clips.append(m) or real(p, m))
    quiet(tiny(grad_clip=0.0, epochs=1), tmp_path / "a")
    assert clips == []
    quiet(tiny(grad_clip=0.5, epochs=1), tmp_path / "b")
    assert clips == [0.5] * 4


def test_autocast_only_with_amp(tmp_path, monkeypatch):
    seen = []
    real = run_mod.build_step

    def build(*a, **k):
        step = real(*a, **k)
        return lambda *args: seen.append(torch.is_autocast_enabled("cpu")) or step(*args)

    monkeypatch.setattr(run_mod, "build_step", build)
    quiet(tiny(epochs=1), tmp_path / "a")
    quiet(tiny(epochs=1, amp=True), tmp_path / "b")
    assert seen == [False] * 4 + [True] * 4


class _Bar:
    """tqdm stand-in: records its arguments and the step of each postfix."""

    made = []

    def __init__(self, iterable, **kw):
        self.items, self.kw, self.disable, self.posts, self.n = list(iterable), kw, kw["disable"], [], -1
        _Bar.made.append(self)

    def __iter__(self):
        for n, item in enumerate(self.items):
            self.n = n
            yield item

    def set_postfix(self, **kw):
        self.posts.append((self.n, kw))

    def close(self):
        pass


def test_the_progress_bar_shows_on_a_terminal_and_every_20_steps(tmp_path, steps, monkeypatch):
    monkeypatch.setattr(loop, "tqdm", _Bar)
    _Bar.made.clear()
    monkeypatch.setattr(loop.sys.stderr, "isatty", lambda: True)
    cfg = tiny(epochs=1, batch_size=8, train_subset=176)  # 22 steps
    loop.train(cfg, tmp_path / "a", verbose=False)  # progress by default
    bar = _Bar.made[-1]
    assert bar.kw == {"desc": "epoch 1/1", "leave": False, "dynamic_ncols": True, "disable": False}
    assert [n for n, _ in bar.posts] == [0, 20]
    loss = sum(np.float32(v) * n for v, n in zip(steps["loss"][:21], steps["n"][:21])) / 168
    assert bar.posts[1][1] == {"loss": f"{loss:.4f}", "acc": f"{sum(steps['correct'][:21]) / 168:.2%}"}
    quiet(cfg, tmp_path / "b")
    assert _Bar.made[-1].disable and _Bar.made[-1].posts == []
    monkeypatch.setattr(loop.sys.stderr, "isatty", lambda: False)
    loop.train(cfg, tmp_path / "c", verbose=False)
    assert _Bar.made[-1].disable


def test_a_non_finite_first_step_stops_the_run_naming_it(tmp_path, steps):
    steps["nan_at"].add(1)
    cfg = tiny(schedule="cosine")
    with pytest.raises(RuntimeError) as err:
        quiet(cfg, tmp_path)
    assert str(err.value) == f"loss is nan at epoch 1, step 1; lower the learning rate (lr {learning_rate(cfg, 0):.4g})"
    steps["nan_at"], steps["calls"] = {7}, 0
    with pytest.raises(RuntimeError) as err:
        quiet(cfg, tmp_path / "b")
    assert str(err.value) == (f"loss is nan at epoch 2, step 3; lower the learning rate "
                              f"(lr {learning_rate(cfg, 1 + 2 / 4):.4g})")


def test_a_non_finite_loss_of_another_process_stops_this_one_too(tmp_path, monkeypatch):
    real = D.all_reduce_sum
    monkeypatch.setattr(loop.D, "all_reduce_sum", lambda values, dd: real(values, dd)[:3] + [1.0])
    cfg = tiny(schedule="cosine")
    with pytest.raises(RuntimeError) as err:
        quiet(cfg, tmp_path)
    assert str(err.value) == (f"loss is not finite at epoch 1, a step of another process; lower the learning rate "
                              f"(lr {learning_rate(cfg, 0):.4g})")


# ------------------------------------------------------------------------------ validation, checkpoints, finish


def test_the_loop_hands_every_validation_and_the_finish_to_the_runs_evaluator(tmp_path, monkeypatch):
    got = []

    class Recording:
        def validate(self, run):
            got.append(("v", run))
            return {"val_loss": 1.0, "val_acc": 0.5, "val_ece": 0.25}

        def finish(self, run, out, info, log):
            got.append(("f", run, out, info["status"], log))
            return {"f": 1}

    monkeypatch.setattr(run_mod, "_evaluator_for", lambda inputs: Recording())
    assert loop.train(tiny(epochs=2), tmp_path, progress=False, verbose=False) == {"f": 1}
    (v1, run), (v2, run2), (f, run3, out, status, log) = got
    assert (v1, v2, f) == ("v", "v", "f") and run is run2 is run3 and isinstance(run.evaluator, Recording)
    assert (out, status) == (tmp_path, "running") and log("unsaid") is None


def test_the_evaluator_is_chosen_when_the_run_is_built(tmp_path):
    from calibkit.train.dense import DenseEvaluator
    from calibkit.train.evaluate import ClassificationEvaluator
    from tests.helpers.formats import fake_fmnist

    assert type(run_mod.build_run(tiny(), D.Dist(), None, tmp_path, print).evaluator) is ClassificationEvaluator
    (tmp_path / "f").mkdir()
    fake_fmnist(str(tmp_path / "f"), n_train=60, n_test=12)
    scenes = dict(data="scenes", data_dir=str(tmp_path / "f"), batch_size=4, train_subset=8, val_size=4)
    run = run_mod.build_run(tiny(model="unet", **scenes), D.Dist(), None, tmp_path, print)
    assert isinstance(run.evaluator, DenseEvaluator) and run.evaluator.inputs is run.inputs
    assert run.evaluator.val_positions is None


def test_only_kept_weights_are_written_and_the_checkpoint_records_the_kept_epoch(tmp_path, monkeypatch):
    monkeypatch.setattr(run_mod, "Keeper", _FirstOnly)
    writes = []
    real = rundir.write_tensors
    monkeypatch.setattr(rundir, "write_tensors", lambda path, t: writes.append(path.name) or real(path, t))
    cfg = tiny(epochs=3)
    quiet(cfg, tmp_path)
    assert writes == [rundir.MODEL, rundir.LOGITS]
    ck = rundir.read_checkpoint(tmp_path / rundir.CHECKPOINT)
    history = rundir.read_json(tmp_path / rundir.HISTORY)
    assert ck["best_epoch"] == 1 and ck["best_val_acc"] == history[0]["val_acc"] and ck["config"] == cfg.to_dict()
    assert ck["epoch"] == 3 and ck["history"] == history


def test_finish_records_the_kept_weights_test_accuracy_and_ece(tmp_path, capsys):
    cfg = tiny(epochs=2, keep="last", lr=0.5)  # confident enough that 15 and 16 bins differ
    summary = loop.train(cfg, tmp_path, progress=False)
    logits = rundir.load_logits(tmp_path)
    acc = (logits["test_logits"].argmax(1) == logits["test_labels"]).double().mean().item()
    e = float(ece(logits["test_logits"].softmax(1), logits["test_labels"], n_bins=15))
    assert e != float(ece(logits["test_logits"].softmax(1), logits["test_labels"], n_bins=16))
    info = rundir.load_info(tmp_path)
    assert (summary["test_acc"], summary["test_ece"], info["test_acc"], info["test_ece"]) == (acc, e, acc, e)
    history = rundir.read_json(tmp_path / rundir.HISTORY)
    assert summary["wall_time_s"] == info["wall_time_s"] and summary["status"] == "done"
    assert summary["wall_time_s"] == pytest.approx(sum(h["time_s"] for h in history), abs=2e-3)
    assert all(0 < h["time_s"] < 60 for h in history)
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == (f"done: kept epoch 2 (last; val acc {history[1]['val_acc']:.2%}), test acc {acc:.2%}, "
                    f"test ECE {100 * e:.2f}, {info['wall_time_s']:.0f}s -> {tmp_path}")


def test_a_run_without_test_images_finishes_without_test_figures(tmp_path, monkeypatch, capsys):
    _bundle_with(monkeypatch, lambda b: dataclasses.replace(b, test=_head(b.test, 0)))
    summary = loop.train(tiny(epochs=1), tmp_path, progress=False)
    assert summary["status"] == "done" and summary["test_acc"] is None and summary["test_ece"] is None
    assert ", test acc n/a, test ECE n/a, " in capsys.readouterr().out.splitlines()[-1]


# ------------------------------------------------------------------------------ train: records and lines


def test_the_run_record_names_the_data_and_where_it_ran(tmp_path):
    quiet(tiny(epochs=1), tmp_path / "a" / "b" / "c")  # parents are made
    info = rundir.load_info(tmp_path / "a" / "b" / "c")
    b = load("digits", val_size=60, train_subset=128)
    assert (info["class_names"], info["modality"], info["world_size"], info["device"]) == (
        list(b.class_names), "image", 1, "cpu")
    assert (info["num_classes"], info["in_channels"], info["split"]) == (10, 1, b.split)


def test_every_epoch_prints_one_line_of_its_record(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(run_mod, "Keeper", _FirstOnly)
    loop.train(tiny(epochs=3), tmp_path, progress=False)  # verbose by default
    lines = capsys.readouterr().out.splitlines()
    history = rundir.read_json(tmp_path / rundir.HISTORY)
    for e, (line, r) in enumerate(zip(lines, history)):
        assert line == (f"epoch {e + 1:>3}/3  loss {r['train_loss']:.4f}  train acc {r['train_acc']:6.2%}  val acc "
                        f"{r['val_acc']:6.2%}  val ECE {100 * r['val_ece']:5.2f}  lr {r['lr']:.4g}  "
                        f"{r['time_s']:5.1f}s" + ("  *kept" if e == 0 else ""))
    assert len(lines) == 4 and lines[3].startswith("done: kept epoch 1 ")
    loop.train(tiny(epochs=3), tmp_path, progress=False)
    assert capsys.readouterr().out == f"{tmp_path}: run already finished (3 epochs); nothing to do\n"
    loop.train(tiny(epochs=3), tmp_path / "q", progress=False, verbose=False)
    assert capsys.readouterr().out == ""


def test_lines_are_flushed_and_a_resume_is_always_said(tmp_path, monkeypatch):
    said = []
    monkeypatch.setattr(loop, "print", lambda *a, **k: said.append((a, k)), raising=False)
    cfg = tiny(epochs=3)
    loop.train(cfg, tmp_path, progress=False, stop_after_epoch=1)
    assert said and all(k == {"flush": True} for _, k in said)
    said.clear()
    quiet(cfg, tmp_path)
    assert said == [((f"{tmp_path}: resuming after epoch 1 ({rundir.CHECKPOINT})",), {"flush": True})]


def test_a_restart_with_a_new_config_is_said_on_stderr(tmp_path, steps, capsys):
    steps["nan_at"].add(1)
    with pytest.raises(RuntimeError):
        quiet(tiny(lr=1e9), tmp_path)
    steps["nan_at"].clear()
    assert quiet(tiny(), tmp_path)["status"] == "done"
    assert "ended before completing an epoch; starting it again with this config" in capsys.readouterr().err


def test_a_global_batch_must_divide_by_the_processes(tmp_path, monkeypatch):
    monkeypatch.setattr(loop.D, "setup", lambda device: D.Dist(rank=0, world=3))
    with pytest.raises(ValueError) as err:
        quiet(tiny(batch_size=32), tmp_path)
    assert str(err.value) == "batch_size 32 is the global batch; it must divide by the 3 processes"


def test_a_stop_request_ends_the_run_after_that_epoch(tmp_path, monkeypatch, capsys):
    asked = iter([False, True])
    monkeypatch.setattr(loop.preempt, "agreed", lambda dd: next(asked))
    with pytest.raises(preempt.Preempted) as err:
        loop.train(tiny(epochs=3), tmp_path, progress=False)
    assert (err.value.epoch, err.value.run_dir) == (2, tmp_path)
    assert capsys.readouterr().out.splitlines()[-1] == (f"stopped on request after epoch 2; the run resumes from "
                                                        f"{tmp_path / rundir.CHECKPOINT}")
    assert rundir.read_checkpoint(tmp_path / rundir.CHECKPOINT)["epoch"] == 2
    monkeypatch.setattr(loop.preempt, "agreed", lambda dd: True)  # during the last epoch: the run just ends
    assert quiet(tiny(epochs=3), tmp_path)["status"] == "done"


def test_stop_after_epoch_returns_the_summary_so_far(tmp_path):
    s = quiet(tiny(epochs=3, keep="last"), tmp_path, stop_after_epoch=2)
    history = rundir.read_json(tmp_path / rundir.HISTORY)
    assert s["status"] == "running" and (s["epochs_done"], s["best_epoch"], s["best_val_acc"]) == (
        2, 2, history[1]["val_acc"])
    assert s["wall_time_s"] == pytest.approx(history[0]["time_s"] + history[1]["time_s"], abs=2e-3)
    assert (s["test_acc"], s["test_ece"]) == (None, None)
    assert quiet(tiny(epochs=2), tmp_path / "b", stop_after_epoch=2)["status"] == "done"  # its last epoch: finished
    assert quiet(tiny(epochs=2), tmp_path / "c", stop_after_epoch=5)["status"] == "done"

