"""MaC-Cal's tensor pieces at their edges: the strict mask threshold, requested dtypes, exact
bounds of the keep-rate rule and the wording of its errors."""

import pytest
import torch

from calibkit.methods.maccal import bernoulli_mask, masked_linear, mc_predict_proba, update_keep_rate
from calibkit.methods.maccal.masking import check_int, check_keep_rate

pytestmark = pytest.mark.usefixtures("one_thread")


def test_mask_is_strictly_below_the_keep_rate():
    # r equal to one of the uniforms drawn: that entry is dropped (M = [U < r], not U <= r)
    u = torch.rand(6, 7, generator=torch.Generator().manual_seed(3))
    r = float(u[2, 4])
    mask = bernoulli_mask((6, 7), r, torch.Generator().manual_seed(3))
    assert torch.equal(mask, (u < r).float()) and mask[2, 4] == 0


def test_mask_dtype_and_draws_do_not_depend_on_the_default_dtype():
    assert bernoulli_mask((2, 3), 1.0, dtype=torch.float64).dtype == torch.float64
    assert bernoulli_mask((2, 3), 0.5, torch.Generator().manual_seed(0), dtype=torch.float64).dtype == torch.float64
    want = bernoulli_mask((40, 50), 0.3, torch.Generator().manual_seed(1))
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:  # the uniforms are float32 draws whatever the default: the same masks for a seed
        got = bernoulli_mask((40, 50), 0.3, torch.Generator().manual_seed(1), dtype=torch.float32)
    finally:
        torch.set_default_dtype(before)
    assert torch.equal(got, want)


def test_masked_linear_in_bfloat16():
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 8, generator=gen).bfloat16(), torch.randn(4, 8, generator=gen).bfloat16()
    out = masked_linear(x, w, None, 0.5, torch.Generator().manual_seed(2))
    mask = bernoulli_mask((4, 8), 0.5, torch.Generator().manual_seed(2))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), (x.float() @ (w.float() * mask / 0.5).T), rtol=2e-2, atol=2e-2)
    assert torch.equal(masked_linear(x, w, None, 1.0), torch.nn.functional.linear(x, w))  # r = 1: no mask, bf16


def test_shape_errors():
    msg = r"^features \(N, D\) and weight \(K, D\) must agree on D, got {} and {}$"
    with pytest.raises(ValueError, match=msg.format(r"\(2, 5\)", r"\(3, 4\)")):
        masked_linear(torch.ones(2, 5), torch.ones(3, 4), None, 0.5)
    with pytest.raises(ValueError, match=msg.format(r"\(2, 4, 1\)", r"\(3, 4\)")):
        masked_linear(torch.ones(2, 4, 1), torch.ones(3, 4), None, 0.5)
    with pytest.raises(ValueError, match=msg.format(r"\(2, 4\)", r"\(3, 4, 1\)")):
        mc_predict_proba(torch.ones(2, 4), torch.ones(3, 4, 1), None, 0.5, 2)


def test_integer_and_rate_checks_name_the_argument():
    with pytest.raises(ValueError, match=r"^mc_samples must be an integer >= 1, got 2.0$"):
        check_int(2.0, "mc_samples", 1)
    with pytest.raises(ValueError, match=r"^mc_samples must be an integer >= 1, got 2.0$"):
        mc_predict_proba(torch.ones(2, 4), torch.ones(3, 4), None, 0.5, 2.0)
    assert check_int(1, "n", 1) == 1
    with pytest.raises(ValueError, match=r"^keep_rate must lie in \(0, 1\], got 1.5$"):
        check_keep_rate(1.5)
    with pytest.raises(ValueError, match=r"^keep_rate must be a number in \(0, 1\], got '0.5'$"):
        bernoulli_mask((2, 2), "0.5")


def test_keep_rate_rule_defaults_bounds_and_messages():
    assert update_keep_rate(0.9, 0.95, 0.85) == pytest.approx(0.8)  # eta = 1 by default
    assert update_keep_rate(0.3, 0.9, 0.7, eta=0.5) == pytest.approx(0.2)
    assert update_keep_rate(0.15, 0.9, 0.7, eta=0.5) == pytest.approx(0.1)  # r_min = 0.1 by default
    assert update_keep_rate(0.5, 0.0, 0.0) == 0.5  # conf = acc = 0 is valid
    assert update_keep_rate(0.5, 0.9, 0.1, eta=0) == 0.5  # eta = 0 freezes the rate
    for kwargs, match in [
        ({"r": 1.5}, r"^r must lie in \(0, 1\], got 1.5$"),
        ({"r_min": 0.0}, r"^r_min must lie in \(0, 1\], got 0.0$"),
        ({"conf": 1.2}, r"^conf must lie in \[0, 1\], got 1.2$"),
        ({"acc": -0.1}, r"^acc must lie in \[0, 1\], got -0.1$"),
        ({"eta": -1}, r"^eta must be >= 0, got -1$"),
    ]:
        args = {"r": 0.5, "conf": 0.5, "acc": 0.5, **kwargs}
        with pytest.raises(ValueError, match=match):
            update_keep_rate(**args)


# ----------------------------------------------------------------------------- the MaCCal object
def _clusters(n, k=4, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, k, (n,), generator=g)
    means = torch.zeros(k, d)
    means[torch.arange(k), torch.arange(k)] = 3.0
    return means[y] + 1.5 * torch.randn(n, d, generator=g), y, means


def _head(means, scale=2.0):
    head = torch.nn.Linear(means.shape[1], means.shape[0])
    with torch.no_grad():
        head.weight.copy_(scale * means)
        head.bias.zero_()
    return head


def test_maccal_params_repr_and_messages():
    from calibkit.methods.maccal import MaCCal, NotFittedError

    head = torch.nn.Linear(8, 4)
    est = MaCCal(head, epochs=2)
    params = est.get_params()
    assert params["head"] is head and params["epochs"] == 2 and len(params) == 14
    other = torch.nn.Linear(8, 4)
    assert est.set_params(head=other).head is other
    with pytest.raises(ValueError, match=r"^MaCCal has no parameter 'x'; valid: head, r_init, eta, r_min, epochs, lr, "
                                         r"momentum, weight_decay, batch_size, grad_clip, n_bins, seed, "
                                         r"mc_samples, loss$"):
        est.set_params(x=1)
    assert repr(MaCCal(head)) == ("MaCCal(Linear(8, 4), r_init=0.9, eta=2.0, r_min=0.1, epochs=30, lr=0.01, "
                                  "momentum=0.9, weight_decay=0.0005, batch_size=128, grad_clip=2.0, n_bins=15, "
                                  "seed=0, mc_samples=64, loss=None)")
    assert repr(MaCCal(torch.nn.Sequential(), loss="ce")).startswith("MaCCal(Sequential, r_init=0.9, ")
    with pytest.raises(NotFittedError, match=r"^this MaCCal is not fitted yet; call fit\(train_features, "
                                             r"train_labels, val_features, val_labels\) first$"):
        est.predict(torch.ones(2, 8))
    x, y, _ = _clusters(16)
    with pytest.raises(ValueError, match=r"^head must be an nn.Linear \(the model's last layer\), got Sequential$"):
        MaCCal(torch.nn.Sequential()).fit(x, y, x, y)
    with pytest.raises(ValueError, match=r"^loss must be None, a loss spec string or a callable, got 3$"):
        MaCCal(head, epochs=1, mc_samples=1, loss=3).fit(x, y, x, y)


def test_maccal_losses_progress_and_unmasked_log_proba():
    from calibkit.losses import AdaFocal
    from calibkit.methods.maccal import MaCCal

    x_tr, y_tr, means = _clusters(128, seed=1)
    x_va, y_va, _ = _clusters(64, seed=2)
    head = _head(means)
    seen = []
    plain = MaCCal(head, epochs=2, mc_samples=4).fit(x_tr, y_tr, x_va, y_va, progress=seen.append)
    assert [r["epoch"] for r in seen] == [0, 1, 2] and seen == plain.history_["records"]
    ce = MaCCal(head, epochs=2, mc_samples=4, loss="ce").fit(x_tr, y_tr, x_va, y_va)
    assert ce.loss_ is None and torch.equal(ce.head_.weight, plain.head_.weight)  # "ce" is the default loss
    # a loss object is copied: its state after training is the estimator's, the caller's stays as given
    mine = AdaFocal(4)
    est = MaCCal(head, epochs=2, mc_samples=4, loss=mine).fit(x_tr, y_tr, x_va, y_va)
    assert isinstance(est.loss_, AdaFocal) and est.loss_ is not mine
    assert torch.equal(mine.gammas, torch.ones(15)) and not torch.equal(est.loss_.gammas, mine.gammas)
    assert not torch.equal(est.head_.weight, plain.head_.weight)  # the loss was used
    bare = torch.softmax(est.head_(x_va), 1)
    torch.testing.assert_close(est.predict_log_proba(x_va, unmasked=True).softmax(1), bare)
    assert not torch.allclose(est.predict_log_proba(x_va).softmax(1), bare)


def test_extract_features_batches_lists_and_one_tuples():
    from calibkit.methods.maccal import extract_features

    x, y = torch.randn(29, 3), torch.randint(0, 2, (29,))
    sizes = []

    def fn(model, inputs):
        sizes.append(len(inputs))
        return inputs * 2

    net = torch.nn.Linear(3, 2)
    f, labels = extract_features(net, torch.utils.data.TensorDataset(x), fn, batch_size=8)
    assert sizes == [8, 8, 8, 5] and labels is None and torch.equal(f, x * 2)  # (x,) batches: no labels
    f, labels = extract_features(net, [x[:10], x[10:20], x[20:]], fn)  # an iterable of input batches
    assert torch.equal(f, x * 2) and labels is None
    with pytest.raises(ValueError, match=r"^inputs and labels differ in length: 29 vs 28$"):
        extract_features(net, (x, y[:-1]), fn)


# ----------------------------------------------------------------------------- stage 2
def test_stage2_with_a_frozen_head_records_plain_cross_entropy_and_keeps_the_first_epoch():
    # lr 0 and r = 1 (no mask): every epoch's head is the stage-1 head, so the recorded training
    # loss is the batch-size weighted mean of cross-entropy, i.e. the plain mean over the set,
    # every epoch has the same validation ECE and the first one is selected.
    import time

    from calibkit.methods.maccal import fit_masked_head

    x_tr, y_tr, means = _clusters(50, seed=3)
    x_va, y_va, _ = _clusters(40, seed=4)
    head = _head(means, 0.5)
    t0 = time.perf_counter()
    best, hist = fit_masked_head(head, x_tr, y_tr, x_va, y_va, r_init=1.0, eta=0.0, epochs=3, lr=0.0,
                                 batch_size=16, mc_samples=4)
    elapsed = time.perf_counter() - t0
    with torch.no_grad():
        ce = float(torch.nn.functional.cross_entropy(head(x_tr), y_tr))
    recs = hist["records"]
    for rec in recs[1:]:
        assert rec["train_loss"] == pytest.approx(ce, rel=1e-6)
    assert len({rec["val_ece"] for rec in recs[1:]}) == 1 and hist["best_epoch"] == 1
    assert {k: recs[0][k] for k in ("epoch", "keep_rate", "next_keep_rate", "train_loss", "lr", "time_s")} == \
        {"epoch": 0, "keep_rate": 1.0, "next_keep_rate": 1.0, "train_loss": None, "lr": None, "time_s": 0.0}
    times = [rec["time_s"] for rec in recs]
    assert times == sorted(times) and 0 <= times[-1] <= hist["wall_time_s"] <= elapsed
    assert not best.weight.requires_grad and not best.training
    assert torch.equal(best.weight, head.weight)


def test_stage2_float64_features_train_a_float32_head_and_r_min_is_used():
    from calibkit.methods.maccal import fit_masked_head

    x_tr, y_tr, means = _clusters(64, seed=5)
    x_va, y_va, _ = _clusters(64, seed=6)
    y_va = torch.randint(0, 4, (64,), generator=torch.Generator().manual_seed(0))  # random labels: over-confident
    head = _head(means, 4.0)
    best, hist = fit_masked_head(head, x_tr.double(), y_tr, x_va.double(), y_va, r_init=0.9, eta=5.0, r_min=0.5,
                                 epochs=2, mc_samples=4)
    assert best.weight.dtype == torch.float32
    assert hist["records"][1]["next_keep_rate"] == 0.5  # clipped at the given floor, not the default 0.1
    assert hist["keep_rates"] == [0.9, 0.5]


def test_stage2_trains_the_losss_own_parameters():
    from calibkit.losses import FeDLaS
    from calibkit.methods.maccal import fit_masked_head

    x_tr, y_tr, means = _clusters(64, seed=7)
    x_va, y_va, _ = _clusters(32, seed=8)
    torch.manual_seed(0)
    loss = FeDLaS(4, "ls")
    gate0 = {k: v.clone() for k, v in loss.gate.state_dict().items()}
    fit_masked_head(_head(means), x_tr, y_tr, x_va, y_va, epochs=1, mc_samples=2, loss_fn=loss)
    assert all(not torch.equal(v, loss.gate.state_dict()[k]) for k, v in gate0.items())


def test_stage2_non_finite_loss_names_rate_and_lr():
    from calibkit.methods.maccal import fit_masked_head

    x, y, means = _clusters(16)
    with pytest.raises(RuntimeError, match=r"^stage-2 loss is nan \(keep rate 0.900\); lower the learning rate "
                                           r"\(lr 0.03\)$"):
        fit_masked_head(_head(means), x, y, x, y, epochs=1, lr=0.03, mc_samples=1,
                        loss_fn=lambda logits, t: logits.sum() * float("nan"))


def test_stage2_input_checks_and_messages():
    from calibkit.methods.maccal import fit_masked_head
    from calibkit.methods.maccal.stage2 import _check_hparams, check_features

    x, y, means = _clusters(12)
    head = _head(means)
    check_features("train", x[:1], y[:1], 8, 4)  # one sample is enough
    cases = [
        ((x, y.tolist()), r"^train features and labels must be torch tensors$"),
        ((x[:0], y[:0]), r"^train_feats is empty \(N = 0\)$"),
        ((x, y[:5]), r"^train_labels must have shape \(12,\), got \(5,\)$"),
        ((x, y.float()), r"^train_labels must be integer class indices, got dtype torch.float32$"),
        ((x, y.bool()), r"^train_labels must be integer class indices, got dtype torch.bool$"),
        ((x, torch.where(y == 0, 4, y)), r"^train_labels out of range \[0, 3\]: found 1..4$"),
    ]
    for (f, lab), match in cases:
        with pytest.raises(ValueError, match=match):
            check_features("train", f, lab, 8, 4)
    assert _check_hparams(0.1, 0.0, 0.1, 1, 1, 0) == 0.1  # r_init == r_min, batch size 1
    bad = [
        ({"epochs": 0}, r"^epochs must be an integer >= 1, got 0$"),
        ({"batch_size": 0}, r"^batch_size must be an integer >= 1, got 0$"),
        ({"mc_samples": -1}, r"^mc_samples must be an integer >= 0, got -1$"),
        ({"r_init": 0.0}, r"^r_init must lie in \(0, 1\], got 0.0$"),
        ({"r_min": 1.5}, r"^r_min must lie in \(0, 1\], got 1.5$"),
        ({"eta": -1}, r"^eta must be >= 0, got -1$"),
    ]
    for kwargs, match in bad:
        with pytest.raises(ValueError, match=match):
            fit_masked_head(head, x, y, x, y, **kwargs)
    with pytest.raises(ValueError, match=r"^head must be an nn.Linear, got Sequential$"):
        fit_masked_head(torch.nn.Sequential(), x, y, x, y)
