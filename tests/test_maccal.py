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
