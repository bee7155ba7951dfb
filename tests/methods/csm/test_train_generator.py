"""The CSM generator's training loop: resume, checkpoint file, log, progress, schedules, class dropout.

Most tests replace the UNet by a stand-in of two small weights (``_Affine``) and the clock by a fake one
that advances a fixed, binary-exact ``DT`` seconds per reading, so that every recorded number (the
wall time, the rate, the ETA, the loss means) is known by hand and a test runs in milliseconds.
The resume and default-configuration tests use the real denoiser.
"""

import dataclasses
import importlib
import itertools
import json
import pickle
import sys
import types

import pytest
import torch
from torch import nn

pytest.importorskip("diffusers")

from calibkit.methods.csm.generator import GeneratorConfig  # noqa: E402
from calibkit.methods.csm.train_generator import GeneratorTrainConfig, train_generator  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
tg = importlib.import_module("calibkit.methods.csm.train_generator")  # the package re-exports the function

DT = 120.34375  # seconds per clock reading: 120 + 11/32, exact in binary, so sums of it are exact
TINY = GeneratorConfig(num_classes=3, in_channels=1, data_size=2, image_size=4, block_out_channels=(4, 4),
                       attention_levels=(False, False), norm_num_groups=2, attention_head_dim=2)
IMAGES = torch.tensor([[0, 255, 51, 102], [204, 153, 0, 0], [255, 255, 17, 34], [85, 170, 1, 2],
                       [9, 99, 199, 250], [128, 127, 64, 192]], dtype=torch.uint8).view(6, 1, 2, 2)
LABELS = torch.tensor([0, 1, 2, 0, 1, 2])


class _Affine(nn.Module):
    """Stand-in denoiser ``D(x; sigma, y) = a * x + y @ b`` (per channel): C + K * C parameters."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.a = nn.Parameter(torch.randn(config.in_channels))
        self.b = nn.Parameter(torch.randn(config.num_classes, config.in_channels))

    def forward(self, x, sigma, y):
        return self.a.view(1, -1, 1, 1) * x + (y @ self.b)[:, :, None, None]


@pytest.fixture
def stub(monkeypatch):
    monkeypatch.setattr(tg, "CondDenoiser", _Affine)


@pytest.fixture
def clock(monkeypatch):
    """The module's clock: the k-th reading is k * DT seconds."""
    ticks = itertools.count()
    monkeypatch.setattr(tg, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks) * DT))


@pytest.fixture
def spy(monkeypatch):
    """Record every call of the EDM loss: its batch, class vectors, generator and value."""
    calls, real = [], tg.edm_loss

    def loss(model, x0, y, gen=None):
        out = real(model, x0, y, gen)
        calls.append({"x0": x0.clone(), "y": y.clone(), "gen": gen, "loss": out.item()})
        return out

    monkeypatch.setattr(tg, "edm_loss", loss)
    return calls


def _cfg(**kw):
    return GeneratorTrainConfig(**{"steps": 2, "batch_size": 4, "seed": 3, "lr": 0.01, "warmup_steps": 2,
                                   "ema_decay": 0.15, "p_uncond": 0.25, "grad_clip": 0.5, **kw})


def _train(out, cfg=None, progress=False, **kw):
    return train_generator(IMAGES, LABELS, out, cfg or _cfg(), TINY, progress=progress, **kw)


def _state(out):
    return torch.load(out / "train_state.pt", weights_only=True)


def _log(out):
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def test_ema_decay_warms_up_as_1_plus_t_over_10_plus_t():
    assert tg._ema_decay(0, 0.999) == pytest.approx(1 / 10)
    assert tg._ema_decay(2, 0.999) == pytest.approx(3 / 12)
    assert tg._ema_decay(5, 0.999) == pytest.approx(6 / 15)
    assert tg._ema_decay(8, 0.5) == pytest.approx(0.5)  # 9 / 18 reaches the cap exactly
    assert tg._ema_decay(20, 0.5) == 0.5  # 21 / 30 is above the cap


def test_steps_and_batch_size_must_be_positive(stub, tmp_path):
    for steps, batch in ((0, 4), (3, 0)):
        with pytest.raises(ValueError, match="^steps and batch_size must be positive$"):
            _train(tmp_path / "bad", _cfg(steps=steps, batch_size=batch))
    _train(tmp_path / "one", _cfg(steps=1, batch_size=1))  # the smallest valid run
    assert [r["step"] for r in _log(tmp_path / "one")] == [1]


def test_default_architecture_follows_the_data(tmp_path):
    images = torch.randint(0, 256, (4, 3, 32, 32), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    labels = torch.tensor([0, 2, 1, 2])  # three classes: 0..max
    ema = train_generator(images, labels, tmp_path / "g", GeneratorTrainConfig(steps=1, batch_size=2), progress=False)
    want = GeneratorConfig(num_classes=3, in_channels=3, data_size=32)
    assert ema.config == want
    saved = json.loads((tmp_path / "g" / "generator.json").read_text())["config"]
    assert GeneratorConfig.from_dict(saved) == want
    # Images that are not square: the error names the square shape the height asks for.
    with pytest.raises(ValueError, match=r"must have shape \(N, 3, 32, 32\), got \(4, 3, 32, 28\)"):
        train_generator(images[..., :28], labels, tmp_path / "h", GeneratorTrainConfig(steps=1, batch_size=2),
                        progress=False)


def test_nested_output_folder_is_created_and_reused(stub, tmp_path):
    out = tmp_path / "a" / "b"
    _train(out, _cfg(steps=1))
    _train(out, _cfg(steps=2))  # the folder exists now: resumed, not refused
    assert [r["step"] for r in _log(out)] == [1, 2]


def test_resume_continues_the_uninterrupted_trajectory(tmp_path):
    """A run of 2 steps resumed to 4 ends exactly where a 4-step run ends (weights, EMA, Adam, RNG)."""
    cfg = _cfg(steps=4)
    straight = train_generator(IMAGES, LABELS, tmp_path / "a", cfg, TINY, checkpoint_every=2, progress=False)
    train_generator(IMAGES, LABELS, tmp_path / "b", _cfg(steps=2), TINY, checkpoint_every=2, progress=False)
    resumed = train_generator(IMAGES, LABELS, tmp_path / "b", cfg, TINY, checkpoint_every=2, progress=False)
    a, b = _state(tmp_path / "a"), _state(tmp_path / "b")
    assert a["step"] == b["step"] == 4
    for part in ("model", "ema"):
        for k, v in a[part].items():
            assert torch.equal(v, b[part][k]), (part, k)
    assert torch.equal(a["rng"], b["rng"])
    for k, s in a["opt"]["state"].items():
        for name in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(s[name], b["opt"]["state"][k][name]), (k, name)
    for k, v in straight.state_dict().items():
        assert torch.equal(v, resumed.state_dict()[k]), k
    assert [r["step"] for r in _log(tmp_path / "b")] == [2, 4]


def test_changed_settings_are_refused_and_the_run_kept(stub, tmp_path):
    _train(tmp_path, _cfg(steps=2))
    before = (tmp_path / "train_state.pt").read_bytes()
    msg = (r"train_state.pt was written with different settings: \{'gen': .*'lr': 0.01.*\}; "
           r"use a new --out directory or the same settings$")
    with pytest.raises(ValueError, match=msg):
        _train(tmp_path, _cfg(steps=3, lr=0.02))
    with pytest.raises(ValueError, match=msg):
        train_generator(IMAGES, LABELS, tmp_path, _cfg(steps=3), dataclasses.replace(TINY, pad_value=0.0),
                        progress=False)
    assert (tmp_path / "train_state.pt").read_bytes() == before


def test_checkpoint_file_holds_the_full_state(stub, clock, spy, tmp_path):
    cfg = _cfg(steps=2)
    ema = _train(tmp_path, cfg, checkpoint_every=1)
    state = _state(tmp_path)
    assert set(state) == {"model", "ema", "opt", "rng", "step", "elapsed", "fingerprint"}
    assert state["step"] == 2 and state["elapsed"] == 2 * DT
    # The settings a resume must match: the architecture and every optimisation setting but the budget.
    assert json.loads(state["fingerprint"]) == {
        "gen": json.loads(json.dumps(dataclasses.asdict(TINY))),
        "train": {"batch_size": 4, "seed": 3, "lr": 0.01, "warmup_steps": 2, "ema_decay": 0.15,
                  "p_uncond": 0.25, "grad_clip": 0.5}}
    assert torch.equal(state["rng"], spy[-1]["gen"].get_state())  # the generator after the last draw
    for k, v in ema.state_dict().items():
        assert torch.equal(state["ema"][k], v), k
    assert not torch.equal(state["model"]["a"], state["ema"]["a"])
    assert [int(s["step"]) for s in state["opt"]["state"].values()] == [2, 2]  # Adam's own step count


def test_state_file_holding_python_objects_is_refused(stub, tmp_path, monkeypatch):
    """The resume loads tensors only, even where the environment asks torch to unpickle anything."""
    _train(tmp_path, _cfg(steps=1))
    state = _state(tmp_path)
    state["note"] = __import__("fractions").Fraction(1, 3)  # not a tensor type: needs full unpickling
    torch.save(state, tmp_path / "train_state.pt")
    before = (tmp_path / "train_state.pt").read_bytes()
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # honoured only where weights_only is not given
    with pytest.raises(pickle.UnpicklingError):
        _train(tmp_path, _cfg(steps=2))
    assert (tmp_path / "train_state.pt").read_bytes() == before


def test_generator_json_records_the_run(stub, clock, tmp_path):
    _train(tmp_path, _cfg(steps=2), checkpoint_every=5, extra_meta={"data": "toy", "argv": ["x"]})
    meta = json.loads((tmp_path / "generator.json").read_text())
    assert meta["train"] == {"steps": 2, "batch_size": 4, "seed": 3, "lr": 0.01, "warmup_steps": 2,
                             "ema_decay": 0.15, "p_uncond": 0.25, "grad_clip": 0.5, "steps_done": 2}
    assert meta["wall_seconds"] == 240.7  # 2 * DT = 240.6875 s, to a tenth
    assert meta["parameters"] == 1 + 3 * 1  # _Affine: a (C,) and b (K, C) with C = 1, K = 3
    assert meta["threads"] == torch.get_num_threads() == 1
    assert meta["device"] == "cpu"
    assert meta["data"] == "toy" and meta["argv"] == ["x"]
    assert meta["config"] == json.loads(json.dumps(dataclasses.asdict(TINY)))


def test_log_holds_the_mean_loss_of_each_window(stub, clock, spy, tmp_path):
    """Checkpoints at every 2nd step and at the last; each record averages the losses since the previous."""
    _train(tmp_path, _cfg(steps=5), checkpoint_every=2)
    losses = [c["loss"] for c in spy]
    assert len(losses) == 5
    windows = [losses[0:2], losses[2:4], losses[4:5]]
    # Wall time: one clock reading (DT) per step; the reading after each checkpoint is not counted.
    want = [{"step": s, "loss": round(sum(w) / len(w), 5), "elapsed_s": e}
            for s, w, e in zip((2, 4, 5), windows, (240.7, 481.4, 601.7))]
    assert _log(tmp_path) == want
    assert (tmp_path / "train_log.jsonl").read_text().count("\n") == 3


class _Stdout:
    """A stdout that records writes and marks every flush with a ``|``."""

    def __init__(self):
        self.text = ""

    def write(self, s):
        self.text += s
        return len(s)

    def flush(self):
        self.text += "|"


def test_progress_lines_and_resume_message(stub, clock, tmp_path, monkeypatch):
    out = _Stdout()
    monkeypatch.setattr(sys, "stdout", out)
    train_generator(IMAGES, LABELS, tmp_path, _cfg(steps=4), TINY, checkpoint_every=2)  # progress by default
    first = out.text
    out.text = ""
    train_generator(IMAGES, LABELS, tmp_path, _cfg(steps=6), TINY, checkpoint_every=2)
    loss = [r["loss"] for r in _log(tmp_path)]
    # rate = DT s/step; ETA = (steps left) * DT / 60 min: 2 * 120.34375 / 60 = 4.01
    assert first == (f"step 2/4 loss {loss[0]:.4f} 120.34 s/step eta 4.0 min\n|"
                     f"step 4/4 loss {loss[1]:.4f} 120.34 s/step eta 0.0 min\n|")
    assert out.text == ("resuming from step 4 (481 s so far)\n|"  # 4 * DT = 481.375 s
                        f"step 6/6 loss {loss[2]:.4f} 120.34 s/step eta 0.0 min\n|")


def test_default_checkpoint_interval_is_100_steps(stub, tmp_path, capsys):
    train_generator(IMAGES, LABELS, tmp_path, _cfg(steps=101), TINY)
    assert [r["step"] for r in _log(tmp_path)] == [100, 101]
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[1] for ln in lines] == ["100/101", "101/101"]


def test_first_batch_class_dropout_and_random_stream(stub, spy, tmp_path):
    """Step 1 draws its rows, then one uniform per row; a row is unconditional when its uniform < p_uncond."""
    ref = torch.Generator().manual_seed(3)
    idx = torch.randint(6, (5,), generator=ref)
    u = torch.rand(5, generator=ref)
    p = float(u.sort().values[2])  # the median draw: two rows below it, one equal (kept), two above
    _train(tmp_path, _cfg(steps=1, batch_size=5, p_uncond=p))
    (call,) = spy
    x = IMAGES[idx].float() / 127.5 - 1.0
    assert torch.equal(call["x0"], nn.functional.pad(x, (1, 1, 1, 1), value=-1.0))
    keep = torch.tensor([float(v) >= p for v in u])
    assert keep.sum() == 3
    want_y = torch.zeros(5, 3)
    want_y[torch.arange(5)[keep], LABELS[idx][keep]] = 1.0
    assert torch.equal(call["y"], want_y)
    # The loss got the same stream: after its sigma and noise draws it stands where `ref` does after them.
    torch.randn(5, generator=ref), torch.randn(call["x0"].shape, generator=ref)
    assert torch.equal(call["gen"].get_state(), ref.get_state())


@pytest.mark.parametrize("warmup, steps, want", [
    (4, 6, [0.0025, 0.005, 0.0075, 0.01, 0.01, 0.01]),  # lr * (t + 1) / warmup, then lr
    (1, 2, [0.01, 0.01]),
    (0, 2, [0.01, 0.01]),  # no warm-up
])
def test_learning_rate_warm_up(stub, tmp_path, warmup, steps, want):
    seen = []
    hook = importlib.import_module("torch.optim.optimizer").register_optimizer_step_pre_hook(
        lambda opt, args, kwargs: seen.append(opt.param_groups[0]["lr"]))
    try:
        _train(tmp_path, _cfg(steps=steps, warmup_steps=warmup))
    finally:
        hook.remove()
    assert seen == pytest.approx(want, rel=1e-12)


def test_ema_is_the_decayed_average_of_the_weights(stub, tmp_path):
    """EMA_t = d_t * EMA_{t-1} + (1 - d_t) * theta_t, d_t = min(decay, (1 + t) / (10 + t)), EMA_{-1} = theta_init."""
    torch.manual_seed(3)
    init = _Affine(TINY).state_dict()
    _train(tmp_path, _cfg(steps=1))
    s1 = _state(tmp_path)
    ema = _train(tmp_path, _cfg(steps=2))
    s2 = _state(tmp_path)
    for k in ("a", "b"):
        e1 = 0.1 * init[k] + 0.9 * s1["model"][k]  # d_0 = min(0.15, 1/10)
        torch.testing.assert_close(s1["ema"][k], e1, rtol=0, atol=1e-7)
        e2 = 0.15 * e1 + 0.85 * s2["model"][k]  # d_1 = min(0.15, 2/11)
        torch.testing.assert_close(s2["ema"][k], e2, rtol=0, atol=1e-7)
    assert not ema.training and not any(p.requires_grad for p in ema.parameters())


def test_three_steps_match_the_loop_written_out(stub, tmp_path):
    """Draws, class dropout, warm-up, gradient clipping (by hand), Adam and the EMA, step by step."""
    cfg = _cfg(steps=3, grad_clip=10.0)  # gradient norms here: about 28, 34 and 6
    ema = _train(tmp_path, cfg)
    torch.manual_seed(cfg.seed)
    net = _Affine(TINY)
    avg = {k: v.detach().clone() for k, v in net.named_parameters()}
    opt = torch.optim.Adam(net.parameters())
    g = torch.Generator().manual_seed(cfg.seed)
    x = nn.functional.pad(IMAGES.float() / 127.5 - 1.0, (1, 1, 1, 1), value=-1.0)
    scales = []
    for t in range(cfg.steps):
        idx = torch.randint(len(IMAGES), (cfg.batch_size,), generator=g)
        keep = torch.rand(cfg.batch_size, generator=g) >= cfg.p_uncond
        y = nn.functional.one_hot(LABELS[idx], 3).float() * keep[:, None]
        loss = tg.edm_loss(net, x[idx], y, g)
        grads = torch.autograd.grad(loss, list(net.parameters()))
        norm = float(sum((gr**2).sum() for gr in grads)) ** 0.5
        scales.append(min(1.0, cfg.grad_clip / (norm + 1e-6)))  # torch's clip_grad_norm_ rule
        for p, gr in zip(net.parameters(), grads):
            p.grad = gr * scales[-1]
        opt.param_groups[0]["lr"] = cfg.lr * min(1.0, (t + 1) / cfg.warmup_steps)
        opt.step()
        d = min(cfg.ema_decay, (1 + t) / (10 + t))
        for k, p in net.named_parameters():
            avg[k] = d * avg[k] + (1 - d) * p.detach()
    assert min(scales) < 1 == max(scales)  # the clipping binds at some steps only (Adam undoes a common scale)
    state = _state(tmp_path)
    for k, p in net.named_parameters():
        torch.testing.assert_close(state["model"][k], p.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ema.state_dict()[k], avg[k], rtol=1e-5, atol=1e-6)


class _Stop(Exception):
    pass


def test_everything_the_loss_sees_lives_on_the_device(stub, tmp_path, monkeypatch):
    """``device`` reaches the network, the images and the class vectors' identity matrix.

    The meta device stands in for an accelerator (tensors without data: the loss's inputs are
    recorded, then the run stops, since a meta loss has no value to log); a part left on the CPU
    shows up as a ``cpu`` device here, or as an indexing error between devices as on a GPU. (CPU
    labels indexed by meta row indices give meta values, so the labels' move is told only by a GPU.)
    """
    seen = []

    def loss(model, x0, y, gen=None):
        seen.append({p.device.type for p in model.parameters()} | {x0.device.type, y.device.type})
        raise _Stop

    monkeypatch.setattr(tg, "edm_loss", loss)
    with pytest.raises(_Stop):
        _train(tmp_path, _cfg(steps=1), device="meta")
    assert seen == [{"meta"}]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_checkpoint_written_on_a_gpu_resumes_on_the_cpu(stub, tmp_path, monkeypatch):
    """A state file whose tensors were saved from CUDA memory resumes on a machine without CUDA."""
    _train(tmp_path / "a", _cfg(steps=2))
    _train(tmp_path / "b", _cfg(steps=1))
    state = _state(tmp_path / "b")
    with monkeypatch.context() as m:  # every storage tagged as CUDA memory, as torch.save does on a GPU
        m.setattr(importlib.import_module("torch.serialization"), "location_tag", lambda storage: "cuda:0")
        torch.save(state, tmp_path / "b" / "train_state.pt")
    with pytest.raises(RuntimeError, match="CUDA"):  # what a plain load does with such a file here
        torch.load(tmp_path / "b" / "train_state.pt", weights_only=True)
    resumed = _train(tmp_path / "b", _cfg(steps=2))
    for k, v in _state(tmp_path / "a")["ema"].items():
        assert torch.equal(resumed.state_dict()[k], v), k
