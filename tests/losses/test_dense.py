"""Dense (per-pixel) losses: each equals the same loss on the valid pixels listed one by one.

The reference rows are gathered with explicit Python loops over (n, h, w), independently of
``calibkit.functional.pixels.flatten_pixels``; cross-entropy is also checked against torch's own
``F.cross_entropy(..., ignore_index=255)``.
"""

import copy

import pytest
import torch
import torch.nn.functional as TF

import calibkit.functional as F
from calibkit.functional.pixels import flatten_pixels
from calibkit.losses import LOSSES, AdaFocal, FeDLaS, build

K, D = 5, 6


def _dense(gen, n=2, h=3, w=4, scale=3.0, void=0.3):
    logits = torch.randn(n, K, h, w, generator=gen, dtype=torch.float64) * scale
    targets = torch.randint(0, K, (n, h, w), generator=gen)
    targets[torch.rand(n, h, w, generator=gen) < void] = 255
    features = torch.randn(n, D, h, w, generator=gen, dtype=torch.float64).abs() * 2
    return logits, targets, features


def _loop_rows(logits, targets, features=None, ignore=255):
    """Valid pixels in row-major (n, h, w) order, one at a time."""
    rows, ys, fs = [], [], []
    n, _, h, w = logits.shape
    for i in range(n):
        for r in range(h):
            for c in range(w):
                if int(targets[i, r, c]) != ignore:
                    rows.append(logits[i, :, r, c])
                    ys.append(int(targets[i, r, c]))
                    if features is not None:
                        fs.append(features[i, :, r, c])
    flat_f = torch.stack(fs) if features is not None else None
    return torch.stack(rows), torch.tensor(ys), flat_f


def _pair(loss, logits, targets, features):
    """(dense value, dense grad, flat value, flat grad scattered back) for one loss module."""
    a, b = copy.deepcopy(loss), copy.deepcopy(loss)  # FeDLaS updates its statistics when called
    x = logits.clone().requires_grad_()
    dense = a(x, targets, features=features)
    dense.backward()
    x2 = logits.clone().requires_grad_()
    rows, ys, fs = _loop_rows(x2, targets, features)
    flat = b(rows, ys, features=fs)
    flat.backward()
    return dense, x.grad, flat, x2.grad, a, b


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_every_loss_dense_equals_flattened_valid_pixels(name, mode, gen):
    logits, targets, features = _dense(gen)
    torch.manual_seed(0)
    loss = build(name, num_classes=K).double()
    loss.train(mode == "train")
    dense, g_dense, flat, g_flat, a, b = _pair(loss, logits, targets, features)
    torch.testing.assert_close(dense, flat, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_dense, g_flat, rtol=1e-12, atol=1e-12)
    ignored = (targets == 255)[:, None].expand_as(g_dense)
    assert (g_dense[ignored] == 0).all() and g_dense[~ignored].abs().sum() > 0
    for (k1, v1), (_, v2) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(v1, v2, msg=f"state {k1} differs")  # FeDLaS stats, AdaFocal bins
    if any(True for _ in loss.parameters()):  # FeDLaS gate: same gradient both ways
        for p1, p2 in zip(a.parameters(), b.parameters()):
            torch.testing.assert_close(p1.grad, p2.grad, rtol=1e-10, atol=1e-12)


def test_dense_cross_entropy_equals_torch_ignore_index(gen):
    logits, targets, _ = _dense(gen, n=3, h=5, w=7)
    x = logits.clone().requires_grad_()
    ours = F.cross_entropy(x, targets)
    ours.backward()
    y = logits.clone().requires_grad_()
    ref = TF.cross_entropy(y, targets, ignore_index=255)
    ref.backward()
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(x.grad, y.grad)


@pytest.mark.parametrize("fn,kwargs", [
    (F.cross_entropy, {}), (F.label_smoothing, {"alpha": 0.1}), (F.focal, {"gamma": 2.0}), (F.flsd, {}),
    (F.ecp, {"beta": 0.2}), (F.mbls, {"margin": 2.0}), (F.acls, {"margin": 1.0}), (F.dual_focal, {"gamma": 3.0}),
])
def test_functional_dense_and_3d_volumes(fn, kwargs, gen):
    logits, targets, _ = _dense(gen)
    rows, ys, _ = _loop_rows(logits, targets)
    torch.testing.assert_close(fn(logits, targets, **kwargs), fn(rows, ys, **kwargs))
    # a volume (N, K, D, H, W) is a dense input too: two slices stacked on a depth axis
    vol = torch.stack([logits, logits.flip(-1)], dim=2)
    vt = torch.stack([targets, targets.flip(-1)], dim=1)
    both = torch.cat([rows, _loop_rows(logits.flip(-1), targets.flip(-1))[0]])
    ys2 = torch.cat([ys, _loop_rows(logits.flip(-1), targets.flip(-1))[1]])
    # pixel order differs but every loss is a mean of per-pixel terms except ACLS's mean-normalised sum
    torch.testing.assert_close(fn(vol, vt, **kwargs), fn(both, ys2, **kwargs))


def test_every_pixel_ignored_gives_zero_with_zero_gradient(gen):
    logits, targets, features = _dense(gen)
    void = torch.full_like(targets, 255)
    for name in LOSSES:
        loss = build(name, num_classes=K).double()
        x = logits.clone().requires_grad_()
        value = loss(x, void, features=features)
        assert value.item() == 0.0, name
        value.backward()
        assert (x.grad == 0).all(), name


def test_per_pixel_weights_of_the_functional_api(gen):
    logits, targets, _ = _dense(gen)
    rows, ys, _ = _loop_rows(logits, targets)
    alpha = torch.rand(targets.shape, generator=gen, dtype=torch.float64) * 0.2
    gamma = torch.randn(targets.shape, generator=gen, dtype=torch.float64)
    a_rows = _loop_rows(alpha[:, None], targets)[0][:, 0]
    g_rows = _loop_rows(gamma[:, None], targets)[0][:, 0]
    torch.testing.assert_close(F.weighted_label_smoothing(logits, targets, alpha),
                               F.weighted_label_smoothing(rows, ys, a_rows))
    torch.testing.assert_close(F.weighted_mbls(logits, targets, alpha, 3.0), F.weighted_mbls(rows, ys, a_rows, 3.0))
    torch.testing.assert_close(F.adafocal(logits, targets, gamma), F.adafocal(rows, ys, g_rows))
    with pytest.raises(ValueError, match="targets' shape"):
        F.adafocal(logits, targets, gamma[:, :2])


def test_margin_penalty_dense(gen):
    logits, targets, _ = _dense(gen)
    everything = logits.permute(0, 2, 3, 1).reshape(-1, K)
    torch.testing.assert_close(F.margin_penalty(logits, 1.0), F.margin_penalty(everything, 1.0))
    rows, _, _ = _loop_rows(logits, targets)
    torch.testing.assert_close(F.margin_penalty(logits, 1.0, targets=targets), F.margin_penalty(rows, 1.0))


def test_ignore_index_choices(gen):
    logits, targets, _ = _dense(gen)
    # another ignore label
    t0 = targets.clone()
    t0[t0 == 255] = -1
    torch.testing.assert_close(F.cross_entropy(logits, t0, ignore_index=-1), F.cross_entropy(logits, targets))
    assert build("ce", ignore_index=-1)(logits, t0) == F.cross_entropy(logits, targets)
    # None: every pixel is labelled, so 255 is out of range
    with pytest.raises(ValueError, match="out of range: found 255"):
        F.cross_entropy(logits, targets, ignore_index=None)
    full = targets.clamp_max(K - 1)
    torch.testing.assert_close(F.cross_entropy(logits, full, ignore_index=None),
                               TF.cross_entropy(logits, full))
    # on (N, K) inputs ignore_index does nothing: 255 stays an error
    with pytest.raises(ValueError, match="out of range"):
        F.cross_entropy(torch.zeros(2, K), torch.tensor([0, 255]))
    with pytest.raises(ValueError, match="ignore_index"):
        F.cross_entropy(logits, targets, ignore_index=2.5)


def test_dense_bad_input_is_rejected(gen):
    logits, targets, features = _dense(gen)
    bad = targets.clone()
    bad[0, 0, 0] = K  # neither a class nor 255
    with pytest.raises(ValueError, match=rf"out of range: found {K}.*ignore_index=255"):
        F.focal(logits, bad)
    with pytest.raises(ValueError, match="targets must have shape"):
        F.cross_entropy(logits, targets[:, :2])
    with pytest.raises(ValueError, match="integer"):
        F.cross_entropy(logits, targets.double())
    nan = logits.clone()
    nan[0, 1, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        F.mbls(nan, targets)
    with pytest.raises(ValueError, match="image-level"):
        F.soft_cross_entropy(logits, torch.softmax(logits, 1))
    with pytest.raises(ValueError, match="image-level"):
        F.soft_l2(logits, torch.softmax(logits, 1))
    fed = FeDLaS(K).double()
    with pytest.raises(ValueError, match=r"features must have shape \(N, D, \*S\)"):
        fed(logits, targets, features=features.mean((2, 3)))  # pooled features with dense logits
    with pytest.raises(ValueError, match="features"):
        fed(logits, targets, features=features[..., :2])


def test_fedlas_dense_statistics_use_valid_pixels_only(gen):
    logits, targets, features = _dense(gen)
    fed = FeDLaS(K, theta=0.5).double().train()
    fed(logits, targets, features=features)
    norms = features.abs().sum(1)[targets != 255]
    torch.testing.assert_close(fed.mu.double(), (0.5 * norms.mean() + 0.5 * 20.0).to(fed.mu.dtype).double())
    torch.testing.assert_close(fed.sigma.double(), (0.5 * norms.std() + 0.5 * 100.0).to(fed.mu.dtype).double(),
                               rtol=1e-6, atol=1e-6)
    # an all-void batch leaves the statistics alone
    before = (fed.mu.clone(), fed.sigma.clone())
    fed(logits, torch.full_like(targets, 255), features=features)
    assert torch.equal(fed.mu, before[0]) and torch.equal(fed.sigma, before[1])


def test_adafocal_update_on_pixels_equals_update_on_rows(gen):
    logits, targets, _ = _dense(gen, n=4, h=8, w=8, scale=4.0)
    rows, ys, _ = _loop_rows(logits, targets)
    a, b = AdaFocal(K), AdaFocal(K)
    torch.testing.assert_close(a.update(logits, targets), b.update(rows, ys))
    assert torch.equal(a.gammas, b.gammas) and torch.equal(a.edges, b.edges)
    with pytest.raises(ValueError, match="every validation pixel"):
        a.update(logits, torch.full_like(targets, 255))


def test_half_precision_dense(gen):
    logits, targets, _ = _dense(gen)
    for dtype in (torch.float16, torch.bfloat16):
        h = logits.to(dtype).requires_grad_()
        v = F.mbls(h, targets, margin=2.0)
        assert v.dtype == torch.float32
        v.backward()
        assert h.grad.dtype == dtype and torch.isfinite(h.grad.float()).all()


def test_flatten_pixels_order_and_features(gen):
    logits, targets, features = _dense(gen)
    rows, ys, fs = flatten_pixels(logits, targets, features=features)
    r2, y2, f2 = _loop_rows(logits, targets, features)
    assert torch.equal(rows, r2) and torch.equal(ys, y2) and torch.equal(fs, f2)
