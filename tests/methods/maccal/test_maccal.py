"""Tests of MaC-Cal on tensors: the mask, the keep-rate rule, the deployed predictor, stage 2, MaCCal."""

import copy
import math

import pytest
import torch
from torch import nn

from calibkit.functional import ece
from calibkit.methods.maccal import (
    DEFAULTS,
    MC_SEED_OFFSET,
    MaCCal,
    NotFittedError,
    bernoulli_mask,
    deployed_proba,
    extract_features,
    fit_masked_head,
    masked_linear,
    mc_predict_proba,
    update_keep_rate,
)

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------
# The mask and its 1/r scaling
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("r", [0.1, 0.5, 0.9])
def test_mask_keeps_fraction_close_to_r(r):
    gen = torch.Generator().manual_seed(1)
    shape = (50, 400)  # 20,000 i.i.d. entries
    mask = bernoulli_mask(shape, r, gen)
    assert set(mask.unique().tolist()) <= {0.0, 1.0}
    se = math.sqrt(r * (1 - r) / mask.numel())  # standard error of a Bernoulli(r) mean
    assert abs(float(mask.mean()) - r) < 4 * se
    assert not torch.equal(mask, bernoulli_mask(shape, r, gen))  # a fresh mask every call


def test_keep_rate_one_is_exact_no_op():
    gen = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(5, 7, generator=gen), torch.randn(3, 7, generator=gen), torch.randn(3, generator=gen)
    state = gen.get_state()
    assert torch.equal(masked_linear(x, w, b, 1.0, gen), nn.functional.linear(x, w, b))
    assert torch.equal(gen.get_state(), state)  # no random number consumed


def test_scaling_keeps_expected_logit_unbiased():
    gen = torch.Generator().manual_seed(2)
    r, S = 0.3, 3000
    x = torch.randn(4, 30, generator=gen, dtype=torch.float64)
    w = torch.randn(3, 30, generator=gen, dtype=torch.float64)
    b = torch.randn(3, generator=gen, dtype=torch.float64)
    exact = nn.functional.linear(x, w, b)
    mean = sum(masked_linear(x, w, b, r, gen) for _ in range(S)) / S
    # Var of one masked logit: sum_d x_d^2 w_kd^2 Var(m/r) with Var(m/r) = (1-r)/r; SE = sqrt(Var/S).
    se = ((x**2) @ (w**2).T * (1 - r) / r / S).sqrt()
    assert ((mean - exact).abs() < 5 * se).all()
    assert (((1 - r) * (exact - b)).abs() > 10 * se).any()  # a missing 1/r would be caught


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
        assert torch.equal(masked_linear(x, w, b, 0.2, torch.Generator().manual_seed(seed)), b.expand(3, 2))


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, float("nan"), "0.5", True])
def test_bad_keep_rate_rejected(bad):
    with pytest.raises(ValueError, match="keep_rate"):
        masked_linear(torch.ones(1, 2), torch.ones(1, 2), None, bad)


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
# The deployed predictor: a seeded Monte-Carlo average of masked heads
# ---------------------------------------------------------------------------------------------
def _clusters(n, k=4, d=16, noise=0.0, seed=0, spread=1.0):
    """Gaussian clusters: features (n, d) around k orthogonal means; a fraction ``noise`` of labels random."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, k, (n,), generator=g)
    means = torch.zeros(k, d)
    means[torch.arange(k), torch.arange(k)] = 3.0
    x = means[y] + spread * torch.randn(n, d, generator=g)
    flip = torch.rand(n, generator=g) < noise
    return x, torch.where(flip, torch.randint(0, k, (n,), generator=g), y), means


def _head(means, scale):
    k, d = means.shape
    head = nn.Linear(d, k)
    with torch.no_grad():
        head.weight.copy_(scale * means)
        head.bias.zero_()
    return head


def _manual_mc(x, w, b, r, S, seed):
    """Independent formula: masks M_s = [U_s < r], U_s ~ U[0,1)^(K,D) from a CPU generator seeded ``seed``."""
    g = torch.Generator().manual_seed(seed)
    probs = []
    for _ in range(S):
        m = (torch.rand(w.shape, generator=g) < r).float()
        probs.append(torch.softmax(x.double() @ (m * w / r).double().T + b.double(), dim=1))
    return torch.stack(probs).mean(0)


def test_mc_predictor_is_the_average_of_seeded_masked_softmaxes():
    x, _, means = _clusters(50)
    head = _head(means, 3.0)
    r, S = 0.4, 25
    p = mc_predict_proba(x, head.weight, head.bias, r, S, seed=11)
    torch.testing.assert_close(p.double(), _manual_mc(x, head.weight.detach(), head.bias.detach(), r, S, 11),
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(p.sum(1), torch.ones(50))
    # Averaging logits instead would be sharper: the formula tells the two apart.
    g = torch.Generator().manual_seed(11)
    masks = [(torch.rand(head.weight.shape, generator=g) < r).float() for _ in range(S)]
    mean_logits = sum(x @ (m * head.weight.detach() / r).T for m in masks) / S
    assert (torch.softmax(mean_logits, 1) - p).abs().max() > 1e-2
    # The deployed predictor uses the stream seed + MC_SEED_OFFSET.
    torch.testing.assert_close(deployed_proba(x, head.weight, head.bias, r, S, seed=5),
                               mc_predict_proba(x, head.weight, head.bias, r, S, seed=5 + MC_SEED_OFFSET))


def test_mc_predictor_is_reproducible_row_wise_and_exact_at_r_one():
    x, _, means = _clusters(200)
    w, b = _head(means, 2.0).weight.detach(), torch.zeros(4)
    p1 = mc_predict_proba(x, w, b, 0.3, 16, seed=3)
    assert torch.equal(p1, mc_predict_proba(x, w, b, 0.3, 16, seed=3))  # same call, same answer
    assert not torch.allclose(p1, mc_predict_proba(x, w, b, 0.3, 16, seed=4))  # it really samples
    # A row's prediction does not depend on the other rows: batches equal the whole.
    parts = torch.cat([mc_predict_proba(x[i:i + 7], w, b, 0.3, 16, seed=3) for i in range(0, 200, 7)])
    torch.testing.assert_close(parts, p1, rtol=1e-6, atol=1e-7)
    # r = 1: every mask is all ones, exactly the unmasked head.
    assert torch.equal(mc_predict_proba(x, w, b, 1.0, 16, seed=3), torch.softmax(x @ w.T + b, 1))
    assert torch.equal(deployed_proba(x, w, b, 0.3, 0, seed=3), torch.softmax(x @ w.T + b, 1))


def test_mc_masking_lowers_confidence_monotonically_in_r():
    # Coupled masks (the same U thresholded) make the predictor move smoothly with r; on a sharp head,
    # masking more (smaller r) averages more disagreeing heads: lower mean confidence.
    x, _, means = _clusters(400, spread=1.5)
    w, b = _head(means, 4.0).weight.detach(), torch.zeros(4)
    confs = [float(mc_predict_proba(x, w, b, r, 64, seed=0).max(1).values.mean()) for r in (1.0, 0.7, 0.4, 0.15)]
    assert all(a > b for a, b in zip(confs, confs[1:])), confs


# ---------------------------------------------------------------------------------------------
# Stage 2: the rule is driven by the deployed predictor
# ---------------------------------------------------------------------------------------------
def test_rule_and_selection_use_the_deployed_predictor_not_the_unmasked_head():
    # One epoch: the epoch-1 head is returned, so the statistics that set r_2 can be recomputed
    # independently from it. The old wiring (unmasked head) would give a different r_2 and ECE.
    x_tr, y_tr, means = _clusters(512, seed=0, spread=1.5)
    x_va, y_va, _ = _clusters(512, seed=1, spread=1.5, noise=0.3)
    head = _head(means, 3.0)
    r0, S, seed = 0.3, 32, 4
    best, hist = fit_masked_head(head, x_tr, y_tr, x_va, y_va, r_init=r0, eta=1.0, r_min=0.1, epochs=1,
                                 mc_samples=S, seed=seed)
    rec = hist["records"][1]
    w, b = best.weight.detach(), best.bias.detach()
    p = _manual_mc(x_va, w, b, r0, S, seed + MC_SEED_OFFSET)
    conf, acc = float(p.max(1).values.mean()), float((p.argmax(1) == y_va).double().mean())
    bare = torch.softmax(x_va @ w.T + b, 1)
    bare_conf = float(bare.max(1).values.mean())
    assert abs(bare_conf - conf) > 0.03  # the two predictors differ enough to tell the wirings apart
    assert rec["val_conf"] == pytest.approx(conf, abs=1e-5) and rec["val_acc"] == pytest.approx(acc, abs=1e-9)
    assert rec["next_keep_rate"] == pytest.approx(update_keep_rate(r0, conf, acc, 1.0, 0.1), abs=1e-5)
    assert abs(rec["next_keep_rate"] - update_keep_rate(r0, bare_conf, acc, 1.0, 0.1)) > 0.03
    assert hist["best_val_ece"] == pytest.approx(float(ece(p.float(), y_va)), abs=1e-5)
    assert abs(hist["best_val_ece"] - float(ece(bare, y_va))) > 0.01
    assert rec["unmasked_val_conf"] == pytest.approx(bare_conf, abs=1e-5)


def test_history_follows_the_rule_and_best_epoch_has_lowest_deployed_val_ece():
    x_tr, y_tr, means = _clusters(400, seed=2, spread=1.5)
    x_va, y_va, _ = _clusters(300, seed=3, spread=1.5, noise=0.2)
    head = _head(means, 2.0)
    before = copy.deepcopy(head.state_dict())
    best, hist = fit_masked_head(head, x_tr, y_tr, x_va, y_va, epochs=5, seed=7, mc_samples=8, eta=1.0)
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
    # The returned head, deployed at its keep rate, has exactly the recorded validation ECE.
    p = deployed_proba(x_va, best.weight, best.bias, hist["best_keep_rate"], 8, seed=7)
    assert float(ece(p, y_va)) == pytest.approx(min(eces), abs=1e-6)
    for k, v in head.state_dict().items():  # the input head is untouched
        assert torch.equal(v, before[k])
    best2, hist2 = fit_masked_head(head, x_tr, y_tr, x_va, y_va, epochs=5, seed=7, mc_samples=8, eta=1.0)
    assert torch.equal(best2.weight, best.weight) and hist2["keep_rates"] == hist["keep_rates"]


def _test_split(n=2000, noise=0.0, seed=9, spread=1.0):
    x, y, _ = _clusters(n, seed=seed, noise=noise, spread=spread)
    return x, y


def test_overconfident_stage1_confidence_moves_down_to_accuracy():
    # Half of the labels random in every split: accuracy ~0.6, while a head of scale 5 is ~certain.
    x_tr, y_tr, means = _clusters(1024, seed=0, noise=0.5)
    x_va, y_va, _ = _clusters(1024, seed=1, noise=0.5)
    x_te, y_te = _test_split(noise=0.5)
    head = _head(means, 5.0)
    est = MaCCal(head, epochs=10, mc_samples=128).fit(x_tr, y_tr, x_va, y_va)
    rates = est.history_["keep_rates"]
    assert rates[1] < rates[0] == 0.9 and est.keep_rate_ < 0.9  # over-confident: r moves down
    with torch.no_grad():
        p1 = torch.softmax(head(x_te), 1)
    p2 = est.predict_proba(x_te)
    gap = lambda p: float(p.max(1).values.mean() - (p.argmax(1) == y_te).float().mean())  # noqa: E731
    assert gap(p1) > 0.3  # the stage-1 head is badly over-confident on held-out data
    assert 0 <= gap(p2) < gap(p1) / 3  # confidence moved most of the way down to accuracy
    assert float(ece(p2, y_te)) < float(ece(p1, y_te)) / 3
    assert float((p2.argmax(1) == y_te).float().mean()) > float((p1.argmax(1) == y_te).float().mean()) - 0.02


def test_underconfident_stage1_confidence_moves_up_to_accuracy():
    # A head of scale 0.02 predicts ~1/K everywhere while the clusters are ~90% separable.
    x_tr, y_tr, means = _clusters(1024, seed=0)
    x_va, y_va, _ = _clusters(1024, seed=1)
    x_te, y_te = _test_split()
    head = _head(means, 0.02)
    est = MaCCal(head, r_init=0.5, epochs=10, lr=0.05, mc_samples=32).fit(x_tr, y_tr, x_va, y_va)
    rates = est.history_["keep_rates"]
    assert rates[1] > rates[0] == 0.5  # under-confident: r moves up
    with torch.no_grad():
        p1 = torch.softmax(head(x_te), 1)
    p2 = est.predict_proba(x_te)
    conf1, conf2 = float(p1.max(1).values.mean()), float(p2.max(1).values.mean())
    acc2 = float((p2.argmax(1) == y_te).float().mean())
    assert conf1 < 0.3 < acc2 - 0.5  # stage 1 far below its accuracy
    assert conf2 > conf1 + 0.5 and abs(conf2 - acc2) < 0.05  # raised to (about) the accuracy
    assert float(ece(p2, y_te)) < float(ece(p1, y_te)) / 5


# ---------------------------------------------------------------------------------------------
# The MaCCal object
# ---------------------------------------------------------------------------------------------
def test_maccal_object_follows_the_scikit_learn_conventions():
    x_tr, y_tr, means = _clusters(300, seed=5, spread=1.5)
    x_va, y_va, _ = _clusters(200, seed=6, spread=1.5, noise=0.2)
    head = _head(means, 2.0)
    est = MaCCal(head, epochs=3, mc_samples=8, seed=2)
    assert not [a for a in vars(est) if a.endswith("_")]  # __init__ stores hyperparameters only
    assert est.get_params()["eta"] == DEFAULTS["eta"] and est.set_params(eta=0.5).eta == 0.5
    with pytest.raises(ValueError, match="no parameter"):
        est.set_params(etaa=1)
    with pytest.raises(NotFittedError, match="not fitted"):
        est.predict_proba(x_va)
    assert est.fit(x_tr, y_tr, x_va, y_va) is est
    assert est.n_features_in_ == 16 and est.n_classes_ == 4 and 1 <= est.best_epoch_ <= 3
    p = est.predict_proba(x_va)
    assert p.shape == (200, 4) and torch.equal(p, est.predict_proba(x_va))
    assert torch.equal(est.predict(x_va), p.argmax(1))
    torch.testing.assert_close(est.predict_log_proba(x_va).softmax(1), p)
    # The same object built again with the same seed gives the same predictor.
    again = MaCCal(head, epochs=3, mc_samples=8, seed=2, eta=0.5).fit(x_tr, y_tr, x_va, y_va)
    assert torch.equal(again.predict_proba(x_va), p) and again.keep_rate_ == est.keep_rate_
    # The unmasked head is an explicit, different option.
    with torch.no_grad():
        bare = torch.softmax(est.head_(x_va), 1)
    assert torch.equal(est.predict_proba(x_va, unmasked=True), bare)
    assert est.keep_rate_ < 1 and not torch.allclose(bare, p)
    # Numpy input works like tensors and gives numpy back.
    q = est.predict_proba(x_va.numpy())
    assert type(q).__name__ == "ndarray"
    torch.testing.assert_close(torch.from_numpy(q), p)
    assert (est.predict(x_va.numpy()) == p.argmax(1).numpy()).all()
    torch.testing.assert_close(torch.from_numpy(est.predict_log_proba(x_va.numpy())), est.predict_log_proba(x_va))


def test_maccal_rejects_bad_input():
    x, y, means = _clusters(64)
    est = MaCCal(_head(means, 1.0), epochs=1, mc_samples=2)
    with pytest.raises(ValueError, match="train_feats"):
        est.fit(x[:, :5], y, x, y)
    with pytest.raises(ValueError, match="val_labels"):
        est.fit(x, y, x, y[:10])
    with pytest.raises(ValueError, match="out of range"):
        est.fit(x, y + 4, x, y)
    bad = x.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        est.fit(bad, y, x, y)
    with pytest.raises(ValueError, match="r_init"):
        MaCCal(_head(means, 1.0), r_init=0.05, r_min=0.1).fit(x, y, x, y)
    with pytest.raises(ValueError, match="mc_samples"):
        MaCCal(_head(means, 1.0), mc_samples=-1).fit(x, y, x, y)
    with pytest.raises(ValueError, match="nn.Linear"):
        MaCCal(nn.Sequential(nn.Linear(16, 4))).fit(x, y, x, y)
    est.fit(x, y, x, y)
    with pytest.raises(ValueError, match=r"shape \(N, 16\)"):
        est.predict_proba(x[:, :3])


def _loss_names():
    from calibkit.losses import LOSSES

    return sorted(LOSSES)


@pytest.mark.parametrize("spec", _loss_names())
def test_stage2_runs_with_every_calibkit_loss(spec):
    from calibkit.losses import build

    x_tr, y_tr, means = _clusters(256, seed=4)
    x_va, y_va, _ = _clusters(128, seed=5, noise=0.2)
    head = _head(means, 2.0)
    torch.manual_seed(0)  # some losses initialise parameters (FeDLaS's gate) from the global generator
    loss_fn = build(spec, num_classes=4)
    state0 = {k: v.clone() for k, v in loss_fn.state_dict().items()}
    best, hist = fit_masked_head(head, x_tr, y_tr, x_va, y_va, epochs=2, loss_fn=loss_fn, mc_samples=4)
    assert all(math.isfinite(rec["train_loss"]) for rec in hist["records"][1:])
    assert not torch.equal(best.weight, head.weight)
    # Stateful losses see stage 2: AdaFocal's gammas move with the validation logits,
    # FeDLaS's running statistics and gate with the training batches.
    if hasattr(loss_fn, "update") or getattr(loss_fn, "needs_features", False):
        assert any(not torch.equal(v, loss_fn.state_dict()[k]) for k, v in state0.items())
    # Through the object, a spec string builds the same loss.
    torch.manual_seed(0)
    est = MaCCal(head, epochs=2, mc_samples=4, loss=spec).fit(x_tr, y_tr, x_va, y_va)
    assert torch.equal(est.head_.weight, best.weight)


# ---------------------------------------------------------------------------------------------
# Feature extraction from any model
# ---------------------------------------------------------------------------------------------
class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 5), nn.Dropout(0.5), nn.ReLU())
        self.fc = nn.Linear(5, 3)

    def forward(self, x):
        return self.fc(self.body(x))


def test_extract_features_from_tensors_datasets_and_loaders():
    torch.manual_seed(0)
    net = _Net().train()
    x = torch.randn(37, 6)
    y = torch.randint(0, 3, (37,))
    with torch.no_grad():
        want = net.eval().body(x)
    net.train()
    fn = lambda m, inputs: m.body(inputs)  # noqa: E731
    f, labels = extract_features(net, x, fn, batch_size=8)
    assert labels is None and torch.equal(f, want)  # eval mode: dropout off, batches concatenated
    assert net.training  # the model's mode is restored
    ds = torch.utils.data.TensorDataset(x, y)
    for data in ((x, y), ds, torch.utils.data.DataLoader(ds, batch_size=10)):
        f, labels = extract_features(net, data, fn, batch_size=8)
        torch.testing.assert_close(f, want) and None
        assert torch.equal(labels, y)
    with pytest.raises(ValueError, match="forward_features"):
        extract_features(net, x)
    with pytest.raises(ValueError, match=r"\(B, D\)"):
        extract_features(net, x, lambda m, inputs: m(inputs)[:, 0])
