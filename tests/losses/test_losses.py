"""calibkit.losses: registry conformance, spec parsing, AdaFocal and FeDLaS state and gradients."""

import inspect
import math
import os

import pytest
import torch
import torch.multiprocessing as mp

import calibkit.functional as F
from calibkit.losses import LOSSES, AdaFocal, FeDLaS, build
from tests.helpers.ports import free_port as _free_port

K = 10


def _inputs(gen, n=16, k=K, scale=3.0):
    logits = torch.randn(n, k, generator=gen) * scale
    targets = torch.randint(0, k, (n,), generator=gen)
    features = torch.randn(n, 32, generator=gen).abs() * 2  # non-negative like post-ReLU pooled features
    return logits, targets, features


def _spec_with_defaults(name):
    """'name:k=v,...' with every numeric default written out, so parsing is exercised for each key."""
    params = inspect.signature(LOSSES[name]).parameters.values()
    items = [f"{p.name}={p.default}" for p in params
             if p.name not in ("num_classes", "ignore_index") and isinstance(p.default, (int, float))
             and not isinstance(p.default, bool)]
    return name + (":" + ",".join(items) if items else "")


# ----------------------------------------------------------------------------- conformance loop
@pytest.mark.parametrize("name", list(LOSSES))
def test_every_loss_conforms(name, gen):
    logits, targets, features = _inputs(gen)
    torch.manual_seed(0)
    loss = build(_spec_with_defaults(name), num_classes=K)
    torch.manual_seed(0)
    plain = build(name, num_classes=K)
    assert isinstance(loss, torch.nn.Module)
    x = logits.clone().requires_grad_()
    value = loss(x, targets, features=features)
    assert value.dim() == 0 and torch.isfinite(value)
    assert torch.allclose(value, plain(logits, targets, features=features))
    value.backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    # half precision logits are upcast inside
    for dtype in (torch.float16, torch.bfloat16):
        h = logits.to(dtype).requires_grad_()
        v = loss(h, targets, features=features.to(dtype))
        assert v.dtype == torch.float32 and torch.isfinite(v)
        v.backward()
        assert h.grad.dtype == dtype and torch.isfinite(h.grad.float()).all()
    # bad input
    with pytest.raises(ValueError, match="targets"):
        loss(logits, targets[:-1], features=features)
    with pytest.raises(ValueError, match="out of range"):
        loss(logits, torch.full_like(targets, K), features=features)
    bad = logits.clone()
    bad[3, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        loss(bad, targets, features=features)
    with pytest.raises(ValueError, match="shape"):
        loss(logits[0], targets[:1], features=features[:1])


STATELESS = {
    "ce": (F.cross_entropy, {}),
    "ls": (F.label_smoothing, {"alpha": 0.05}),
    "focal": (F.focal, {"gamma": 3.0}),
    "flsd": (F.flsd, {}),
    "ecp": (F.ecp, {"beta": 0.1}),
    "mbls": (F.mbls, {"margin": 10.0, "lam": 0.1}),
    "acls": (F.acls, {"alpha": 0.1, "lam1": 1.0, "lam2": 0.1, "margin": 10.0}),
    "dfl": (F.dual_focal, {"gamma": 5.0}),
}


@pytest.mark.parametrize("name", list(STATELESS))
def test_module_defaults_equal_functional_with_spec_defaults(name, gen):
    logits, targets, _ = _inputs(gen, scale=8.0)
    fn, kwargs = STATELESS[name]
    module = build(name)
    assert not module.needs_features
    assert torch.equal(module(logits, targets), fn(logits, targets, **kwargs))
    assert list(module.parameters()) == []


def test_build_parses_values_safely():
    m = build("mbls:margin=6,lam=0.1")
    assert m.hparams == {"margin": 6, "lam": 0.1} and isinstance(m.hparams["margin"], int)
    assert build(" focal : gamma = 2.5 ").hparams == {"gamma": 2.5}
    assert build("ls:alpha=1e-1").hparams == {"alpha": 0.1}
    f = build("fedlas_mbls:margin=10,theta=0.5,alpha=0.05", num_classes=4)
    assert (f.variant, f.margin, f.theta, f.alpha, f.beta) == ("mbls", 10, 0.5, 0.05, 0.5)
    f = build("fedlas_ls", num_classes=4)
    assert (f.variant, f.alpha, f.beta, f.theta, f.margin) == ("ls", 0.05, 4.0, 0.95, None)
    # no eval: an expression is a string, which the hyperparameter check then rejects
    with pytest.raises(ValueError, match="gamma"):
        build("focal:gamma=__import__('os').getcwd()")


def test_build_errors_list_valid_choices():
    with pytest.raises(ValueError, match="valid losses: ce, ls, focal"):
        build("crossentropy")
    with pytest.raises(ValueError, match="valid: margin, lam"):
        build("mbls:gamma=2")
    with pytest.raises(ValueError, match=r"valid: \(none\)"):
        build("ce:alpha=0.1")
    with pytest.raises(ValueError, match="key=value"):
        build("mbls:margin")
    with pytest.raises(ValueError, match="twice"):
        build("mbls:lam=1,lam=2")
    with pytest.raises(ValueError, match="num_classes"):
        build("adafocal")
    with pytest.raises(ValueError, match="alpha"):
        build("ls:alpha=2")
    with pytest.raises(ValueError, match="num_classes"):
        build("fedlas_ls", num_classes=1)


# ----------------------------------------------------------------------------- AdaFocal
def _overconfident(gen, n=300):
    # High, distinct confidences on random labels: accuracy ~ 1/K. (Much larger logits would
    # round many confidences to exactly 1.0; tied values then share one bin and leave others empty.)
    return torch.randn(n, K, generator=gen) * 6, torch.randint(0, K, (n,), generator=gen)


def _underconfident(gen, n=300):
    # Nearly flat logits (confidence ~ 0.1-0.2) but the argmax is always right.
    logits = torch.randn(n, K, generator=gen) * 0.1
    return logits, logits.argmax(1)


def test_adafocal_bins_are_equal_mass(gen):
    loss = AdaFocal(K)
    logits, labels = _overconfident(gen, n=150)
    logits = torch.randn(150, K, generator=gen) * 2
    loss.update(logits, labels)
    conf = torch.softmax(logits.double(), 1).max(1).values
    counts = torch.bincount(loss._bin_of(conf), minlength=15)
    # N = 150, B = 15: every bin holds exactly 10 ranks (edge j = the sorted confidence of rank
    # 10 j - 1, the largest of bin j - 1; bins (lo, hi])
    assert counts.tolist() == [10] * 15
    assert loss.edges[0] == 0 and loss.edges[-1] == 1 and (loss.edges.diff() >= 0).all()


def test_adafocal_overconfident_raises_gamma_by_the_rule(gen):
    loss = AdaFocal(K)
    logits, labels = _overconfident(gen)
    gap = loss.update(logits, labels)
    assert (gap > 0.2).all()
    assert torch.allclose(loss.gammas, torch.exp(gap))  # g = 1 * exp(lam * gap), lam = 1
    for _ in range(20):
        loss.update(logits, labels)
    assert torch.equal(loss.gammas, torch.full((15,), 20.0))  # clipped at gamma_max


def test_adafocal_underconfident_lowers_gamma_flips_and_clips(gen):
    loss = AdaFocal(K)
    logits, labels = _underconfident(gen)
    g = torch.ones(15, dtype=torch.float64)
    gap = loss.update(logits, labels).double()
    assert (gap < -0.7).all()
    g = g * torch.exp(gap)
    assert torch.allclose(loss.gammas.double(), g, rtol=1e-6) and (g > 0.2).all()
    gap = loss.update(logits, labels).double()  # 1 * exp(2 gap) < 0.2 -> flips to -0.2
    assert torch.equal(loss.gammas, torch.full((15,), -0.2))
    gap = loss.update(logits, labels).double()  # negative branch: g * exp(-gap), |g| grows
    assert torch.allclose(loss.gammas.double(), -0.2 * torch.exp(-gap), rtol=1e-6)
    for _ in range(5):
        loss.update(logits, labels)
    assert torch.equal(loss.gammas, torch.full((15,), -2.0))  # clipped at gamma_min
    # a negative gamma is the inverse focal loss: it weighs samples up, above plain CE
    x, y, _ = _inputs(gen)
    assert loss(x, y) > F.cross_entropy(x, y)


def test_adafocal_negative_gamma_flips_back_when_overconfident(gen):
    loss = AdaFocal(K, gamma_init=-0.21)
    logits, labels = _overconfident(gen)
    loss.update(logits, labels)  # -0.21 * exp(-gap) with gap > 0.2 -> |g| < 0.2 -> +0.2
    assert torch.equal(loss.gammas, torch.full((15,), 0.2))


def test_adafocal_samples_take_the_gamma_of_their_p_y_bin(gen):
    loss = AdaFocal(K, n_bins=3)
    loss.edges.copy_(torch.tensor([0.0, 0.3, 0.6, 1.0]))
    loss.gammas.copy_(torch.tensor([5.0, -1.0, 2.0]))
    # p_y = 0.1, 0.45, 0.9 for a two-class-like row padded with very negative logits
    p = torch.tensor([0.1, 0.45, 0.9])
    logits = torch.full((3, K), -1e4)
    logits[:, 0] = torch.log(p)
    logits[:, 1] = torch.log(1 - p)
    targets = torch.zeros(3, dtype=torch.long)
    assert loss.sample_gammas(logits, targets).tolist() == [5.0, -1.0, 2.0]
    want = F.adafocal(logits, targets, torch.tensor([5.0, -1.0, 2.0]))
    assert torch.equal(loss(logits, targets), want)


def test_adafocal_state_round_trips(gen, tmp_path):
    loss = AdaFocal(K)
    loss.update(*_overconfident(gen))
    loss.update(*_underconfident(gen))
    path = tmp_path / "loss.pt"
    torch.save(loss.state_dict(), path)
    restored = AdaFocal(K)
    restored.load_state_dict(torch.load(path, weights_only=True))
    assert set(loss.state_dict()) == {"edges", "gammas"}
    assert torch.equal(restored.gammas, loss.gammas) and torch.equal(restored.edges, loss.edges)
    x, y, _ = _inputs(gen)
    assert torch.equal(restored(x, y), loss(x, y))
    assert not torch.equal(AdaFocal(K)(x, y), loss(x, y))


# ----------------------------------------------------------------------------- FeDLaS
def test_fedlas_beta_zero_is_the_base_loss(gen):
    logits, targets, features = _inputs(gen, scale=6.0)
    ls = FeDLaS(K, "ls", alpha=0.1, beta=0.0)
    assert torch.allclose(ls(logits, targets, features), F.label_smoothing(logits, targets, alpha=0.1))
    mb = FeDLaS(K, "mbls", alpha=0.1, beta=0.0, margin=6.0)
    convex = 0.9 * F.cross_entropy(logits, targets) + 0.1 * F.margin_penalty(logits, margin=6.0)
    assert torch.allclose(mb(logits, targets, features), convex)


@pytest.mark.parametrize("variant", ["ls", "mbls"])
def test_fedlas_value_against_explicit_computation(gen, variant):
    torch.manual_seed(3)
    loss = FeDLaS(K, variant, beta=2.0).eval()
    loss.mu.fill_(30.0)
    loss.sigma.fill_(10.0)
    logits, targets, features = _inputs(gen, scale=6.0)
    w1, b1 = loss.gate[0].weight, loss.gate[0].bias
    w2, b2 = loss.gate[2].weight, loss.gate[2].bias
    with torch.no_grad():
        h = logits @ w1.T + b1
        o = torch.where(h > 0, h, 0.01 * h) @ w2.T + b2
        psi = torch.where(o[:, 1] >= o[:, 0], 1.0, -1.0)  # sign(p1 - p0) == sign(o1 - o0)
        nci = (features.abs().sum(1) - 30.0) / (10.0 + 1e-3)
        alpha = loss.alpha * 2 / (1 + torch.exp(-2.0 * psi * nci))
    assert (psi == 1).any() and (psi == -1).any()  # both branches exercised
    if variant == "ls":
        logp = torch.log_softmax(logits, 1)
        nll = -logp[torch.arange(16), targets]
        want = ((1 - alpha) * nll + alpha * (-logp.mean(1))).mean()
    else:
        logp = torch.log_softmax(logits, 1)
        nll = -logp[torch.arange(16), targets]
        pen = torch.relu(logits.max(1, keepdim=True).values - logits - 6.0).mean(1)
        want = ((1 - alpha) * nll).mean() + (alpha * pen).mean()
    assert torch.allclose(loss(logits, targets, features), want, rtol=1e-6)


def test_fedlas_gate_learns_through_straight_through_sign(gen):
    torch.manual_seed(0)
    loss = FeDLaS(K, "ls")
    logits, targets, features = _inputs(gen)
    x = logits.clone().requires_grad_()
    loss(x, targets, features).backward()
    for name, p in loss.gate.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_fedlas_logit_gradient_holds_alpha_fixed(gen):
    # The gate sees detached logits, so the logits' gradient is that of LS with alpha_i constant.
    torch.manual_seed(0)
    loss = FeDLaS(K, "ls").eval()
    logits, targets, features = _inputs(gen)
    x = logits.clone().requires_grad_()
    loss(x, targets, features).backward()
    alpha = loss.sample_alphas(logits, features).detach()
    assert alpha.unique().numel() > 1
    y = logits.clone().requires_grad_()
    F.weighted_label_smoothing(y, targets, alpha).backward()
    assert torch.allclose(x.grad, y.grad)


def test_fedlas_running_stats_follow_ema_in_train_and_freeze_in_eval(gen):
    loss = FeDLaS(K, "ls", theta=0.9)
    logits, targets, f1 = _inputs(gen)
    f2 = torch.randn(16, 32, generator=gen) * 5
    n1, n2 = f1.abs().sum(1).double(), f2.abs().sum(1).double()
    mu = 0.9 * n1.mean() + 0.1 * 20
    sigma = 0.9 * n1.std() + 0.1 * 100  # torch.std is unbiased by default
    loss(logits, targets, f1)
    assert loss.mu.item() == pytest.approx(mu.item(), rel=1e-6)
    assert loss.sigma.item() == pytest.approx(sigma.item(), rel=1e-6)
    loss(logits, targets, f2)
    mu, sigma = 0.9 * n2.mean() + 0.1 * mu, 0.9 * n2.std() + 0.1 * sigma
    assert loss.mu.item() == pytest.approx(mu.item(), rel=1e-6)
    assert loss.sigma.item() == pytest.approx(sigma.item(), rel=1e-6)
    loss.eval()
    before = (loss.mu.clone(), loss.sigma.clone())
    loss(logits, targets, f1 * 3)
    assert torch.equal(loss.mu, before[0]) and torch.equal(loss.sigma, before[1])
    loss.train()
    loss(logits[:1], targets[:1], f1[:1])  # one sample: std undefined, sigma kept
    assert loss.sigma.item() == pytest.approx(before[1].item(), rel=1e-6)
    assert loss.mu.item() == pytest.approx(0.9 * n1[0].item() + 0.1 * before[0].item(), rel=1e-6)


def test_fedlas_needs_features_and_checks_them(gen):
    loss = build("fedlas_mbls", num_classes=K)
    assert loss.needs_features
    logits, targets, features = _inputs(gen)
    with pytest.raises(ValueError, match="forward_features"):
        loss(logits, targets)
    with pytest.raises(ValueError, match="rows"):
        loss(logits, targets, features[:3])
    with pytest.raises(ValueError, match="num_classes"):
        loss(logits[:, :5], targets % 5, features)
    with pytest.raises(ValueError, match="margin"):
        FeDLaS(K, "ls", margin=3.0)
    with pytest.raises(ValueError, match="variant"):
        FeDLaS(K, "focal")
    assert {"mu", "sigma", "gate.0.weight", "gate.2.bias"} <= set(loss.state_dict())


def _dist_worker(rank, port, features, out_dir):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        loss = FeDLaS(K, "ls", theta=0.7)
        rows = slice(0, 5) if rank == 0 else slice(5, None)  # uneven shards: 5 and 7 rows
        for f in features:
            n = f[rows].shape[0]
            loss(torch.randn(n, K), torch.zeros(n, dtype=torch.long), f[rows])
        torch.save({"mu": loss.mu, "sigma": loss.sigma}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        torch.distributed.destroy_process_group()


def test_fedlas_distributed_stats_equal_single_process_on_whole_batch(gen, tmp_path):
    features = [torch.randn(12, 8, generator=gen) * 4 + 1, torch.randn(12, 8, generator=gen) * 2]
    mp.spawn(_dist_worker, args=(_free_port(), features, str(tmp_path)), nprocs=2, join=True)
    single = FeDLaS(K, "ls", theta=0.7)
    for f in features:
        single(torch.randn(12, K), torch.zeros(12, dtype=torch.long), f)
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert got["mu"].item() == pytest.approx(single.mu.item(), rel=1e-6)
        assert got["sigma"].item() == pytest.approx(single.sigma.item(), rel=1e-6)
    assert not math.isclose(single.mu.item(), 20.0)
