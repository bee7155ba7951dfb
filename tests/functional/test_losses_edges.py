"""calibkit.functional.losses: the edges the main tests leave open -- (N, K, L) inputs, a chosen
``ignore_index``, a single valid pixel, exact hyperparameter bounds and the errors' wording,
per-sample weights given in other dtypes, and the gradient of the FeDLaS weight."""

import math
import warnings

import pytest
import torch

import calibkit.functional as F
from calibkit.functional.losses import _check_number, feature_l1_norms, fedlas_alpha

K = 5

HARD = {  # name -> (function, non-default hyperparameters)
    "ce": (F.cross_entropy, {}),
    "ls": (F.label_smoothing, {"alpha": 0.2}),
    "focal": (F.focal, {"gamma": 2.0}),
    "flsd": (F.flsd, {}),
    "ecp": (F.ecp, {"beta": 0.5}),
    "mbls": (F.mbls, {"margin": 2.0, "lam": 0.3}),
    "acls": (F.acls, {"margin": 2.0}),
    "dfl": (F.dual_focal, {"gamma": 2.0}),
    "adafocal": (F.adafocal, {"gamma": 1.5}),
    "wls": (F.weighted_label_smoothing, {"alpha": 0.3}),
    "wmbls": (F.weighted_mbls, {"alpha": 0.3, "margin": 2.0}),
}


def _seq(gen, n=3, length=6):
    """(N, K, L) logits and (N, L) targets with label 0 at three positions."""
    logits = torch.randn(n, K, length, generator=gen, dtype=torch.float64) * 4
    targets = torch.randint(1, K, (n, length), generator=gen)
    targets[0, :3] = 0
    return logits, targets


def _rows(logits, targets):
    return logits.movedim(1, -1).reshape(-1, K), targets.reshape(-1)


@pytest.mark.parametrize("name", list(HARD))
def test_sequence_input_with_a_chosen_ignore_index_equals_the_kept_rows(name, gen):
    fn, kw = HARD[name]
    logits, targets = _seq(gen)
    rows, ys = _rows(logits, targets)
    keep = ys != 0
    want = fn(rows[keep], ys[keep], **kw)
    torch.testing.assert_close(fn(logits, targets, **kw, ignore_index=0), want)
    # with the default (255) nothing is left out here, which gives another value
    torch.testing.assert_close(fn(logits, targets, **kw), fn(rows, ys, **kw))
    assert not torch.allclose(fn(rows, ys, **kw), want)


@pytest.mark.parametrize("name", ["adafocal", "wls", "wmbls"])
def test_per_position_weights_of_sequence_input(name, gen):
    fn, kw = HARD[name]
    key = "gamma" if name == "adafocal" else "alpha"
    logits, targets = _seq(gen)
    w = torch.rand(targets.shape, generator=gen, dtype=torch.float64) * 0.5
    rows, ys = _rows(logits, targets)
    torch.testing.assert_close(fn(logits, targets, **{**kw, key: w}), fn(rows, ys, **{**kw, key: w.reshape(-1)}))


@pytest.mark.parametrize("name", list(HARD))
def test_one_valid_pixel_is_the_loss_of_that_pixel(name, gen):
    fn, kw = HARD[name]
    logits = torch.randn(1, K, 2, 2, generator=gen, dtype=torch.float64) * 3
    targets = torch.full((1, 2, 2), 255)
    targets[0, 1, 0] = 3
    want = fn(logits[:, :, 1, 0], torch.tensor([3]), **kw)
    torch.testing.assert_close(fn(logits, targets, **kw), want)


def test_margin_penalty_default_margin_and_its_ignore_index(gen):
    logits = torch.tensor([[0.0, 10.5, 3.0]], dtype=torch.float64)  # gaps 10.5, 0, 7.5
    assert float(F.margin_penalty(logits)) == pytest.approx(0.5 / 3)  # margin 10 by default
    dense, targets = _seq(gen)
    rows, ys = _rows(dense, targets)
    keep = ys != 0
    torch.testing.assert_close(F.margin_penalty(dense, 2.0, targets=targets, ignore_index=0),
                               F.margin_penalty(rows[keep], 2.0))
    assert not torch.allclose(F.margin_penalty(rows, 2.0), F.margin_penalty(rows[keep], 2.0))


def test_flsd_takes_gamma_3_at_exactly_0_2():
    logits = torch.zeros(1, K, dtype=torch.float64)  # p_y = 1/5 = 0.2 exactly in float64
    assert float(torch.log_softmax(logits, 1)[0, 0].exp()) == 0.2
    assert float(F.flsd(logits, torch.tensor([0]))) == pytest.approx(-(0.8 ** 3) * math.log(0.2))


def test_check_number_message_names_both_bounds():
    with pytest.raises(ValueError, match=r"x must lie in \[-inf, 1.0\], got 5.0"):
        _check_number(5, "x", None, 1.0)
    with pytest.raises(ValueError, match=r"x must lie in \[0.0, inf\], got -1.0"):
        _check_number(-1, "x", 0.0)
    assert _check_number(1, "x", 0.0, 1.0) == 1.0 and _check_number(0, "x", 0.0, 1.0) == 0.0


@pytest.mark.parametrize("call, match", [
    (lambda x, y: F.label_smoothing(x, y, alpha=-0.1), r"alpha must lie in \[0.0, 1.0\], got -0.1"),
    (lambda x, y: F.label_smoothing(x, y, alpha=1.5), r"alpha must lie in \[0.0, 1.0\], got 1.5"),
    (lambda x, y: F.focal(x, y, gamma=-1), r"gamma must lie in \[0.0, inf\], got -1.0"),
    (lambda x, y: F.ecp(x, y, beta="b"), r"beta must be a real number, got 'b'"),
    (lambda x, y: F.margin_penalty(x, margin=-1), r"margin must lie in \[0.0, inf\], got -1.0"),
    (lambda x, y: F.mbls(x, y, margin=-1), r"margin must lie in \[0.0, inf\], got -1.0"),
    (lambda x, y: F.mbls(x, y, lam=-1), r"lam must lie in \[0.0, inf\], got -1.0"),
    (lambda x, y: F.acls(x, y, alpha=-1), r"alpha must lie in \[0.0, inf\], got -1.0"),
    (lambda x, y: F.acls(x, y, lam1=-1), r"lam1 must lie in \[0.0, inf\], got -1.0"),
    (lambda x, y: F.acls(x, y, lam2=-1), r"lam2 must lie in \[0.0, inf\], got -1.0"),
    (lambda x, y: F.acls(x, y, margin="m"), r"margin must be a real number, got 'm'"),
    (lambda x, y: F.dual_focal(x, y, gamma=-1), r"gamma must lie in \[0.0, inf\], got -1.0"),
    (lambda x, y: F.weighted_mbls(x, y, 0.1, margin=-1), r"margin must lie in \[0.0, inf\], got -1.0"),
    (lambda x, y: F.weighted_label_smoothing(x, y, torch.ones(7)), r"alpha must be a scalar or have shape \(4,\), "
                                                                   r"got \(7,\)"),
    (lambda x, y: F.weighted_mbls(x, y, torch.ones(7), 1.0),
     r"alpha must be a scalar or have shape \(4,\), got \(7,\)"),
    (lambda x, y: F.adafocal(x, y, torch.ones(7)), r"gamma must be a scalar or have shape \(4,\), got \(7,\)"),
    (lambda x, y: F.weighted_label_smoothing(x, y, "a"), r"alpha: cannot convert str"),
    (lambda x, y: F.weighted_label_smoothing(x, y, torch.tensor([0.1, math.nan, 0.1, 0.1])),
     r"alpha contains NaN or infinite value\(s\)"),
    (lambda x, y: F.cross_entropy([["a"] * K] * 4, y), r"logits: cannot convert list"),
    (lambda x, y: F.soft_cross_entropy(x, torch.full((4, 3), 1 / 3)), r"soft_targets has shape \(4, 3\) but logits "
                                                                      r"have \(4, 5\)"),
    (lambda x, y: F.soft_l2(x, -torch.ones(4, K)), r"^soft_targets has entries outside \[0, 1\]"),
    (lambda x, y: F.soft_l2(x.reshape(4, K, 1), torch.ones(4, K) / K),
     r"logits have shape \(4, 5, 1\): the soft-label losses serve image-level methods \(Mixup, RegMixup, CSM\) and "
     r"take \(N, K\) logits; they are not defined per pixel"),
])
def test_errors_name_the_problem(call, match, gen):
    logits = torch.randn(4, K, generator=gen)
    with pytest.raises(ValueError, match=match):
        call(logits, torch.tensor([0, 1, 2, 3]))


def test_hyperparameter_bounds_are_inclusive(gen):
    x, y = torch.randn(4, K, generator=gen), torch.tensor([0, 1, 2, 3])
    torch.testing.assert_close(F.label_smoothing(x, y, alpha=1.0), -torch.log_softmax(x, 1).mean())
    for m in (0.0, 0.5):  # any margin >= 0, including below 1
        assert torch.isfinite(F.margin_penalty(x, margin=m)) and torch.isfinite(F.mbls(x, y, margin=m))
        assert torch.isfinite(F.weighted_mbls(x, y, 0.1, margin=m))
    ce = F.cross_entropy(x, y)
    assert F.acls(x, y, margin=-1.0) > ce  # a negative ACLS margin is valid (no lower bound)
    for key in ("lam1", "lam2", "alpha"):  # the loss is affine in each weight; 0.5 lies inside the range
        mid = F.acls(x, y, margin=1.0, **{key: 0.5})
        ends = (F.acls(x, y, margin=1.0, **{key: 0.0}) + F.acls(x, y, margin=1.0, **{key: 1.0})) / 2
        torch.testing.assert_close(mid, ends)


def test_weights_in_other_dtypes(gen):
    x, y = torch.randn(4, K, generator=gen), torch.tensor([0, 1, 2, 3])
    want = F.adafocal(x, y, torch.tensor([1.0, 2.0, 0.0, 3.0]))
    torch.testing.assert_close(F.adafocal(x, y, torch.tensor([1, 2, 0, 3])), want)  # integer gammas
    a64 = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    for v in (F.weighted_label_smoothing(x, y, a64), F.weighted_mbls(x, y, a64, 1.0)):
        assert v.dtype == torch.float32  # the weights take the logits' dtype
    soft = torch.softmax(torch.randn(4, K, generator=gen, dtype=torch.float64), 1)
    for fn in (F.soft_cross_entropy, F.soft_l2):
        assert fn(x, soft).dtype == torch.float32


def test_losses_emit_no_warnings(gen):
    x, y = torch.randn(4, K, generator=gen), torch.tensor([0, 1, 2, 3])
    soft = torch.full((4, K), 1 / K)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for fn, kw in HARD.values():
            fn(x, y, **kw)
        F.soft_cross_entropy(x, soft)
        F.soft_l2(x, soft)


def test_feature_l1_norms_shapes_and_messages(gen):
    assert torch.equal(feature_l1_norms(torch.tensor([[-2.0], [3.0]])), torch.tensor([2.0, 3.0]))  # D = 1
    for bad in (torch.zeros(0, 4), torch.zeros(4, 0), torch.zeros(2, 3, 4), torch.zeros(4)):
        with pytest.raises(ValueError, match=r"features must have shape \(N, D\) with N, D >= 1, got "
                                             + re_shape(bad.shape)):
            feature_l1_norms(bad)
    with pytest.raises(ValueError, match="features must be a floating-point tensor, got dtype torch.int64"):
        feature_l1_norms(torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^features contains NaN or infinite value\(s\)$"):
        feature_l1_norms(torch.tensor([[1.0, math.inf]]))
    with pytest.raises(ValueError, match="features: cannot convert list"):
        feature_l1_norms([["a", "b"]])


def re_shape(shape):
    import re

    return re.escape(str(tuple(shape)))


def test_fedlas_alpha_gradient_in_psi():
    # d alpha / d psi = 2 a * s (1 - s) * beta * nci, s = sigmoid(beta psi nci); the gate learns through it
    nci = torch.tensor([0.7, -1.3, 2.0], dtype=torch.float64)
    psi = torch.tensor([1.0, -1.0, -1.0], dtype=torch.float64, requires_grad=True)
    a, beta = 0.05, 3.0
    fedlas_alpha(nci, psi, a, beta).sum().backward()
    s = torch.sigmoid(beta * psi.detach() * nci)
    torch.testing.assert_close(psi.grad, 2 * a * s * (1 - s) * beta * nci)
