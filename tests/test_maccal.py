"""Tests of MaC-Cal (calibkit.methods.maccal): the mask, the keep-rate rule, stage 2, inference, CLI."""

import copy
import math

import pytest
import torch
from torch import nn

from calibkit.methods import maccal
from calibkit.methods.maccal import (
    bernoulli_mask,
    fit_masked_head,
    head_logits,
    masked_linear,
    mc_predict_proba,
    update_keep_rate,
)


# ---------------------------------------------------------------------------------------------
# The mask and its 1/r scaling
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("r", [0.1, 0.5, 0.9])
def test_mask_keeps_fraction_close_to_r(r):
    gen = torch.Generator().manual_seed(1)
    shape = (50, 400)  # 20,000 i.i.d. entries
    n = shape[0] * shape[1]
    mask = bernoulli_mask(shape, r, gen)
    assert set(mask.unique().tolist()) <= {0.0, 1.0}
    frac = float(mask.mean())
    se = math.sqrt(r * (1 - r) / n)  # standard error of a Bernoulli(r) mean over n draws
    assert abs(frac - r) < 4 * se, (frac, r, se)
    # A fresh mask every call (two independent draws agree only on a fraction r^2 + (1-r)^2 < 1).
    assert not torch.equal(mask, bernoulli_mask(shape, r, gen))


def test_keep_rate_one_is_exact_no_op():
    gen = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(5, 7, generator=gen), torch.randn(3, 7, generator=gen), torch.randn(3, generator=gen)
    assert torch.equal(masked_linear(x, w, b, 1.0, gen), nn.functional.linear(x, w, b))


def test_scaling_keeps_expected_logit_unbiased():
    gen = torch.Generator().manual_seed(2)
    r, S = 0.3, 3000
    x = torch.randn(4, 30, generator=gen, dtype=torch.float64)
    w = torch.randn(3, 30, generator=gen, dtype=torch.float64)
    b = torch.randn(3, generator=gen, dtype=torch.float64)
    exact = nn.functional.linear(x, w, b)
    mean = sum(masked_linear(x, w, b, r, gen) for _ in range(S)) / S
    # Var of one masked logit: sum_d x_d^2 w_kd^2 Var(m/r) with Var(m/r) = (1-r)/r; SE = sqrt(Var/S).
    var = (x**2) @ (w**2).T * (1 - r) / r
    se = (var / S).sqrt()
    assert ((mean - exact).abs() < 5 * se).all(), ((mean - exact) / se)
    # The bound is tight enough to catch a missing 1/r: the unscaled mean r*Wx + b is far outside it.
    assert (((1 - r) * (exact - b)).abs() > 10 * se).any()


def test_gradient_reaches_only_kept_weights_with_one_over_r():
    r = 0.5
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(3))
    w = torch.randn(4, 8, generator=torch.Generator().manual_seed(4), requires_grad=True)
    out = masked_linear(x, w, None, r, torch.Generator().manual_seed(5))
    g_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(6))
    out.backward(g_out)
    mask = bernoulli_mask(w.shape, r, torch.Generator().manual_seed(5))  # the same draw
    assert 0 < mask.sum() < mask.numel()
    torch.testing.assert_close(w.grad, (g_out.T @ x) * mask / r)


def test_masked_linear_bias_is_not_masked():
    x, w, b = torch.zeros(3, 5), torch.ones(2, 5), torch.tensor([1.5, -2.0])
    for seed in range(5):
        out = masked_linear(x, w, b, 0.2, torch.Generator().manual_seed(seed))
        assert torch.equal(out, b.expand(3, 2))


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, float("nan"), "0.5", True])
def test_bad_keep_rate_rejected(bad):
    with pytest.raises(ValueError, match="keep_rate"):
        masked_linear(torch.ones(1, 2), torch.ones(1, 2), None, bad)


# ---------------------------------------------------------------------------------------------
# The keep-rate rule
# ---------------------------------------------------------------------------------------------
def test_update_keep_rate_formula_and_clipping():
    assert update_keep_rate(0.9, 0.95, 0.85, eta=1.0, r_min=0.1) == pytest.approx(0.8)
    assert update_keep_rate(0.6, 0.70, 0.90, eta=0.5, r_min=0.1) == pytest.approx(0.7)
    assert update_keep_rate(0.9, 0.5, 0.9) == 1.0  # clipped at 1
    assert update_keep_rate(0.2, 1.0, 0.2, eta=1.0, r_min=0.1) == 0.1  # clipped at r_min
    assert update_keep_rate(0.4, 0.8, 0.8) == pytest.approx(0.4)  # calibrated: unchanged
    with pytest.raises(ValueError, match="conf"):
        update_keep_rate(0.5, 1.2, 0.5)
    with pytest.raises(ValueError, match="eta"):
        update_keep_rate(0.5, 0.5, 0.5, eta=-1)


# ---------------------------------------------------------------------------------------------
# Stage 2 on cached features
# ---------------------------------------------------------------------------------------------
def _clusters(n, k=4, d=16, noise=0.0, seed=0, spread=1.0):
    """Gaussian clusters: features (n, d) around k orthogonal means; a fraction ``noise`` of labels random."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, k, (n,), generator=g)
    means = torch.zeros(k, d)
    means[torch.arange(k), torch.arange(k)] = 3.0
    x = means[y] + spread * torch.randn(n, d, generator=g)
    flip = torch.rand(n, generator=g) < noise
    y_obs = torch.where(flip, torch.randint(0, k, (n,), generator=g), y)
    return x, y_obs, means


def _head(means, scale):
    k, d = means.shape
    head = nn.Linear(d, k)
    with torch.no_grad():
        head.weight.copy_(scale * means)
        head.bias.zero_()
    return head


def test_keep_rate_moves_down_when_overconfident():
    x_tr, y_tr, means = _clusters(512, seed=0)
    x_va, y_va, _ = _clusters(512, noise=0.5, seed=1)  # half the validation labels random
    head = _head(means, scale=5.0)  # large logits: confidence ~1 while val accuracy ~0.6
    _, hist = fit_masked_head(head, x_tr, y_tr, x_va, y_va, r_init=0.9, eta=1.0, r_min=0.1, epochs=3)
    recs = hist["records"][1:]
    assert all(rec["val_conf"] > rec["val_acc"] + 0.1 for rec in recs)
    assert hist["keep_rates"][0] == 0.9
    assert all(b < a for a, b in zip(hist["keep_rates"], hist["keep_rates"][1:]))
    assert recs[-1]["next_keep_rate"] < recs[-1]["keep_rate"]


def test_keep_rate_moves_up_when_underconfident():
    x_tr, y_tr, means = _clusters(512, seed=0)
    x_va, y_va, _ = _clusters(512, seed=1)
    head = _head(means, scale=0.02)  # tiny logits: confidence ~1/K while val accuracy ~0.9
    _, hist = fit_masked_head(head, x_tr, y_tr, x_va, y_va, r_init=0.5, eta=0.2, epochs=2, lr=1e-3)
    recs = hist["records"][1:]
    assert all(rec["val_conf"] < rec["val_acc"] - 0.1 for rec in recs)
    assert hist["keep_rates"][1] > hist["keep_rates"][0] == 0.5
    assert recs[-1]["next_keep_rate"] > recs[-1]["keep_rate"]


def test_history_follows_the_rule_and_best_epoch_has_lowest_val_ece():
    x_tr, y_tr, means = _clusters(400, seed=2, spread=1.5)
    x_va, y_va, _ = _clusters(300, seed=3, spread=1.5, noise=0.2)
    head = _head(means, scale=2.0)
    before = copy.deepcopy(head.state_dict())
    best, hist = fit_masked_head(head, x_tr, y_tr, x_va, y_va, epochs=5, seed=7)
    recs = hist["records"]
    assert [rec["epoch"] for rec in recs] == list(range(6))
    for rec in recs[1:]:
        assert rec["next_keep_rate"] == pytest.approx(
            update_keep_rate(rec["keep_rate"], rec["val_conf"], rec["val_acc"], 1.0, 0.1))
    for prev, rec in zip(recs[1:], recs[2:]):
        assert rec["keep_rate"] == prev["next_keep_rate"]
    eces = [rec["val_ece"] for rec in recs[1:]]
    assert hist["best_epoch"] == 1 + eces.index(min(eces))
    assert hist["best_keep_rate"] == recs[hist["best_epoch"]]["keep_rate"]
    # The returned head really is that epoch's: its unmasked val ECE matches the record.
    from calibkit.functional import ece

    with torch.no_grad():
        assert float(ece(torch.softmax(best(x_va), 1), y_va, n_bins=15)) == pytest.approx(min(eces), abs=1e-6)
    # The input head is untouched, the returned one has moved.
    for k, v in head.state_dict().items():
        assert torch.equal(v, before[k])
    assert not torch.equal(best.weight, head.weight)
    # Same seed -> same result (masks and shuffling come from the seeded generator).
    best2, hist2 = fit_masked_head(head, x_tr, y_tr, x_va, y_va, epochs=5, seed=7)
    assert torch.equal(best2.weight, best.weight)
    assert hist2["keep_rates"] == hist["keep_rates"]


def test_fit_masked_head_rejects_bad_input():
    x, y, means = _clusters(64)
    head = _head(means, 1.0)
    with pytest.raises(ValueError, match="train_feats"):
        fit_masked_head(head, x[:, :5], y, x, y, epochs=1)
    with pytest.raises(ValueError, match="val_labels"):
        fit_masked_head(head, x, y, x, y[:10], epochs=1)
    with pytest.raises(ValueError, match="r_init"):
        fit_masked_head(head, x, y, x, y, epochs=1, r_init=0.05, r_min=0.1)
    with pytest.raises(ValueError, match="epochs"):
        fit_masked_head(head, x, y, x, y, epochs=0)


# ---------------------------------------------------------------------------------------------
# Inference
# ---------------------------------------------------------------------------------------------
def test_full_head_inference_is_deterministic():
    x, _, means = _clusters(100)
    head = _head(means, 1.0)
    a = head_logits(x, head)
    b = head_logits(x, head)
    assert torch.equal(a, b)
    assert torch.equal(a, head(x).detach())


def test_mc_inference_averages_probabilities():
    x, _, means = _clusters(50)
    head = _head(means, 3.0)
    r, S = 0.4, 25
    probs = torch.softmax(head_logits(x, head, mc_samples=S, keep_rate=r,
                                      generator=torch.Generator().manual_seed(11)), dim=1)
    g = torch.Generator().manual_seed(11)
    manual_p = sum(torch.softmax(masked_linear(x, head.weight, head.bias, r, g), 1) for _ in range(S)) / S
    torch.testing.assert_close(probs, manual_p.detach(), rtol=1e-5, atol=1e-6)
    # Averaging logits instead would give a different (sharper) answer: the test can tell them apart.
    g = torch.Generator().manual_seed(11)
    manual_l = sum(masked_linear(x, head.weight, head.bias, r, g) for _ in range(S)) / S
    assert (torch.softmax(manual_l, 1) - probs).abs().max() > 1e-2
    # Different seeds give different Monte-Carlo answers (it really samples).
    other = mc_predict_proba(x, head.weight, head.bias, r, S, torch.Generator().manual_seed(12))
    assert not torch.allclose(other, probs)
    with pytest.raises(ValueError, match="keep_rate"):
        head_logits(x, head, mc_samples=3)


# ---------------------------------------------------------------------------------------------
# Run level: a tiny stage-1 run on digits, MaC-Cal through the command line, eval and plot
# ---------------------------------------------------------------------------------------------
import json  # noqa: E402
import subprocess  # noqa: E402

from conftest import PYTHON  # noqa: E402


def _cli(args, env):
    res = subprocess.run([PYTHON, "-m", "calibkit", *args], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 2-epoch MLP on digits (stage 1) and MaC-Cal on top of it (3 stage-2 epochs), both via the CLI."""
    import os

    from conftest import ROOT

    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    root = tmp_path_factory.mktemp("maccal")
    s1, m = root / "s1", root / "m"
    _cli(["train", "--data", "digits", "--model", "mlp", "--epochs", "2", "--out", str(s1),
          "--num-threads", "1", "--no-progress", "--quiet"], env)
    out = _cli(["maccal", str(s1), "--out", str(m), "--epochs", "3", "--seed", "0", "--device", "cpu"], env)
    return {"s1": s1, "m": m, "env": env, "root": root, "maccal_stdout": out.stdout}


def test_cli_end_to_end_eval_and_plot_read_the_run(runs, capsys):
    from calibkit import rundir

    m = runs["m"]
    for name in ("config.json", "model.safetensors", "logits.safetensors", "history.json", "maccal.json"):
        assert (m / name).is_file(), name
    info = json.loads((m / "config.json").read_text())
    assert info["method"] == "maccal" and info["config"]["method"] == "maccal" and info["status"] == "done"
    assert info["stage1"]["path"] == str(runs["s1"].resolve())
    assert info["stage1"]["config"]["method"] == "standard"
    assert info["maccal"]["epochs"] == 3 and info["maccal"]["r_init"] == 0.9
    rec = json.loads((m / "maccal.json").read_text())
    hist = json.loads((m / "history.json").read_text())
    assert len(rec["keep_rates"]) == len(rec["val_ece"]) == 3 and len(hist) == 4
    assert rec["best_epoch"] == 1 + rec["val_ece"].index(min(rec["val_ece"]))
    assert rec["stage2_wall_time_s"] > 0
    # The cached features reproduce stage 1's own validation logits (same weights, eval mode).
    assert rec["stage1_val_logits_max_abs_diff"] < 1e-4
    assert "epoch   3/3" in runs["maccal_stdout"]

    # eval and plot through the same entry point, in-process (a fresh interpreter costs ~10 s here).
    from calibkit.cli import main

    assert main(["eval", str(m)]) == 0
    assert "method maccal" in capsys.readouterr().out and (m / "metrics.json").is_file()
    metrics = json.loads((m / "metrics.json").read_text())
    acc = float((rundir.load_logits(m)["test_logits"].argmax(1) == rundir.load_logits(m)["test_labels"]).double().mean())
    assert metrics["before"]["acc"] == pytest.approx(acc)
    plots = runs["root"] / "plots"
    assert main(["plot", str(m), "--out", str(plots)]) == 0
    assert (plots / "reliability.png").is_file()


def test_backbone_unchanged_head_changed_and_inference_deterministic(runs):
    from calibkit import rundir
    from calibkit.data import load

    before = rundir.read_tensors(runs["s1"] / "model.safetensors")
    after = rundir.read_tensors(runs["m"] / "model.safetensors")
    assert before.keys() == after.keys()
    head_keys = {k for k in after if k.startswith("head.")}
    assert head_keys == {"head.weight", "head.bias"}
    for k in before.keys() - head_keys:
        assert torch.equal(before[k], after[k]), k
    assert not torch.equal(before["head.weight"], after["head.weight"])
    # The saved model (backbone + new head) reproduces the stored full-head test logits, twice alike.
    model, _, info = rundir.load_run(runs["m"])
    test = load("digits").test
    a = rundir.predict_logits(model, test.images, info)
    b = rundir.predict_logits(model, test.images, info)
    assert torch.equal(a, b)
    torch.testing.assert_close(a, rundir.load_logits(runs["m"])["test_logits"], rtol=1e-5, atol=1e-5)


def test_mc_run_stores_log_of_averaged_probabilities(runs, tmp_path):
    from calibkit import rundir
    from calibkit.data import load

    out = tmp_path / "mc"
    summary = maccal.run_maccal(runs["s1"], out, epochs=1, seed=3, mc_samples=5, device="cpu")
    rec = json.loads((out / "maccal.json").read_text())
    assert rec["hparams"]["mc_samples"] == 5 and summary["best_keep_rate"] == rec["best_keep_rate"]
    model, _, info = rundir.load_run(out)
    bundle = load("digits")
    feats = maccal.extract_features(model, bundle.val.images, info["mean"], info["std"])
    # Same stream as run_maccal's inference: generator seeded with seed + 1, val drawn before test.
    g = torch.Generator().manual_seed(3 + 1)
    manual = sum(torch.softmax(masked_linear(feats, model.head.weight, model.head.bias, rec["best_keep_rate"], g), 1)
                 for _ in range(5)) / 5
    stored = rundir.load_logits(out)["val_logits"]
    torch.testing.assert_close(stored.softmax(1), manual, rtol=1e-4, atol=1e-5)


def test_bad_stage1_and_out_dirs_give_clear_errors(runs, tmp_path, capsys):
    from calibkit.cli import main

    missing = tmp_path / "nope"
    assert main(["maccal", str(missing), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "not found" in err and str(missing) in err
    # A run directory whose training has not finished.
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    info = json.loads((runs["s1"] / "config.json").read_text())
    (unfinished / "config.json").write_text(json.dumps({**info, "status": "running"}))
    with pytest.raises(ValueError, match="not a finished run"):
        maccal.run_maccal(unfinished, tmp_path / "o")
    with pytest.raises(ValueError, match="itself a MaC-Cal run"):
        maccal.run_maccal(runs["m"], tmp_path / "o")
    with pytest.raises(ValueError, match="not empty"):
        maccal.run_maccal(runs["s1"], runs["m"])  # never overwrites an existing run
    with pytest.raises(ValueError, match="stage-1 run itself"):
        maccal.run_maccal(runs["s1"], runs["s1"])


def _loss_names():
    from calibkit.losses import LOSSES

    return sorted(LOSSES)


@pytest.mark.parametrize("spec", _loss_names())
def test_stage2_runs_with_every_calibkit_loss(spec):
    from calibkit.losses import build

    x_tr, y_tr, means = _clusters(256, seed=4)
    x_va, y_va, _ = _clusters(128, seed=5, noise=0.2)
    head = _head(means, 2.0)
    loss_fn = build(spec, num_classes=4)
    state0 = {k: v.clone() for k, v in loss_fn.state_dict().items()}
    best, hist = fit_masked_head(head, x_tr, y_tr, x_va, y_va, epochs=2, loss_fn=loss_fn)
    assert all(math.isfinite(rec["train_loss"]) for rec in hist["records"][1:])
    assert not torch.equal(best.weight, head.weight)
    # Stateful losses see stage 2: AdaFocal's per-bin gammas are updated on the validation logits,
    # FeDLaS's running statistics and gate move with the training batches.
    if hasattr(loss_fn, "update") or getattr(loss_fn, "needs_features", False):
        assert any(not torch.equal(v, loss_fn.state_dict()[k]) for k, v in state0.items())
