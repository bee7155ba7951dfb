"""calibkit.losses modules: every hyperparameter and ``ignore_index`` reaches the loss, the repr
names them, and the class-count check accepts exactly the integers >= 2."""

import pytest
import torch

import calibkit.functional as F
from calibkit.losses import ACLS, ECP, FLSD, AdaFocal, CrossEntropy, DualFocal, FeDLaS, Focal, LabelSmoothing, MbLS

K = 5

# class, functional, non-default hyperparameters, the functional's defaults for the same keys
NON_DEFAULT = {
    "ls": (LabelSmoothing, F.label_smoothing, {"alpha": 0.3}, {"alpha": 0.05}),
    "focal": (Focal, F.focal, {"gamma": 1.5}, {"gamma": 3.0}),
    "ecp": (ECP, F.ecp, {"beta": 0.7}, {"beta": 0.1}),
    "mbls": (MbLS, F.mbls, {"margin": 2.0, "lam": 0.4}, {"margin": 10.0, "lam": 0.1}),
    "acls": (ACLS, F.acls, {"alpha": 0.3, "lam1": 0.5, "lam2": 0.7, "margin": 2.0},
             {"alpha": 0.1, "lam1": 1.0, "lam2": 0.1, "margin": 10.0}),
    "dfl": (DualFocal, F.dual_focal, {"gamma": 2.0}, {"gamma": 5.0}),
}


@pytest.mark.parametrize("name", list(NON_DEFAULT))
def test_every_hyperparameter_reaches_the_loss(name, gen):
    cls, fn, hp, defaults = NON_DEFAULT[name]
    logits = torch.randn(12, K, generator=gen, dtype=torch.float64) * 8
    targets = torch.randint(0, K, (12,), generator=gen)
    got = cls(**hp)(logits, targets)
    assert torch.equal(got, fn(logits, targets, **hp))
    for key in hp:  # each value matters: putting one key back to its default changes the loss
        other = fn(logits, targets, **{**hp, key: defaults[key]})
        assert not torch.allclose(got, other), key


@pytest.mark.parametrize("cls, fn", [(CrossEntropy, F.cross_entropy), (FLSD, F.flsd)]
                         + [(c, f) for c, f, _, _ in NON_DEFAULT.values()])
def test_module_ignore_index_drops_those_pixels(cls, fn, gen):
    logits = torch.randn(2, K, 3, 4, generator=gen, dtype=torch.float64) * 4
    targets = torch.randint(0, K, (2, 3, 4), generator=gen)
    targets[0, 0, :2] = 0
    targets[1, 2, 1:] = 1
    loss = cls(ignore_index=0)
    rows = logits.permute(0, 2, 3, 1).reshape(-1, K)
    ys = targets.reshape(-1)
    keep = ys != 0
    assert 0 < int(keep.sum()) < ys.numel()
    want = fn(rows[keep], ys[keep])  # the flat loss on the pixels whose label is not 0
    assert torch.allclose(loss(logits, targets), want)
    assert not torch.allclose(fn(rows, ys), want)  # leaving nothing out would give another value
    assert cls()(logits, targets).item() == pytest.approx(fn(rows, ys).item())  # 255: nothing here


def test_repr_names_the_hyperparameters():
    assert repr(CrossEntropy()) == "CrossEntropy()"
    assert repr(MbLS(margin=6, lam=0.2)) == "MbLS(margin=6, lam=0.2)"
    assert repr(Focal(ignore_index=0)) == "Focal(gamma=3.0, ignore_index=0)"
    assert repr(CrossEntropy(ignore_index=None)) == "CrossEntropy(ignore_index=None)"


@pytest.mark.parametrize("bad", [3.0, "3", True, 1, 0, -4])
def test_num_classes_must_be_an_integer_of_at_least_two(bad):
    for cls in (AdaFocal, FeDLaS):
        with pytest.raises(ValueError, match=r"num_classes must be an integer >= 2, got"):
            cls(bad)


def test_two_classes_are_accepted(gen):
    logits = torch.randn(6, 2, generator=gen)
    targets = torch.randint(0, 2, (6,), generator=gen)
    assert AdaFocal(2).num_classes == 2
    f = FeDLaS(2)
    assert f.gate[0].weight.shape == (1, 2)  # Linear(K, K // 2)
    assert torch.isfinite(f(logits, targets, torch.rand(6, 3, generator=gen)))


# ----------------------------------------------------------------------------- FeDLaS
def test_fedlas_hyperparameter_errors_name_the_parameter():
    with pytest.raises(ValueError, match="^margin applies to FeDLaS variant 'mbls' only$"):
        FeDLaS(K, "ls", margin=3.0)
    with pytest.raises(ValueError, match=r"alpha must lie in \[0.0, inf\], got -0.1"):
        FeDLaS(K, alpha=-0.1)
    with pytest.raises(ValueError, match="beta must be a real number, got 'x'"):
        FeDLaS(K, beta="x")
    with pytest.raises(ValueError, match=r"theta must lie in \[0.0, 1.0\], got -0.1"):
        FeDLaS(K, theta=-0.1)
    with pytest.raises(ValueError, match=r"theta must lie in \[0.0, 1.0\], got 1.5"):
        FeDLaS(K, theta=1.5)
    with pytest.raises(ValueError, match=r"margin must lie in \[0.0, inf\], got -1.0"):
        FeDLaS(K, "mbls", margin=-1.0)
    # the bounds are inclusive, and any margin >= 0 is valid
    f = FeDLaS(K, "mbls", alpha=0.0, beta=-2.0, theta=1.0, margin=0.5)
    assert (f.alpha, f.beta, f.theta, f.margin) == (0.0, -2.0, 1.0, 0.5)
    assert FeDLaS(K, theta=0.0).theta == 0.0


def test_fedlas_registry_factories_pass_every_hyperparameter():
    from calibkit.losses import build

    f = build("fedlas_ls:alpha=0.2,beta=1.5,theta=0.5", num_classes=K, ignore_index=0)
    assert (f.variant, f.alpha, f.beta, f.theta, f.margin, f.ignore_index) == ("ls", 0.2, 1.5, 0.5, None, 0)
    f = build("fedlas_mbls:alpha=0.3,beta=2,theta=0.25,margin=3", num_classes=K, ignore_index=None)
    assert (f.variant, f.alpha, f.beta, f.theta, f.margin, f.ignore_index) == ("mbls", 0.3, 2.0, 0.25, 3.0, None)


def test_fedlas_gate_layout_and_repr():
    # the spec's gate: Linear(K, K//2) -> LeakyReLU(0.01) -> Linear(K//2, 2); checkpoints depend on it
    f = FeDLaS(10, "mbls")
    shapes = {k: tuple(v.shape) for k, v in f.state_dict().items()}
    assert shapes == {"gate.0.weight": (5, 10), "gate.0.bias": (5,), "gate.2.weight": (2, 5),
                      "gate.2.bias": (2,), "mu": (), "sigma": ()}
    assert f.extra_repr() == "num_classes=10, variant='mbls', alpha=0.1, beta=0.5, theta=0.95, margin=6.0"
    assert FeDLaS(4).extra_repr() == "num_classes=4, variant='ls', alpha=0.05, beta=4.0, theta=0.95"


def test_fedlas_sign_of_a_tie_is_plus_one(gen):
    f = FeDLaS(K, beta=3.0).eval()
    with torch.no_grad():  # both gate outputs equal: p1 - p0 == 0 exactly for every sample
        f.gate[2].weight[1] = f.gate[2].weight[0]
        f.gate[2].bias[1] = f.gate[2].bias[0]
    logits = torch.randn(8, K, generator=gen, dtype=torch.float64)
    feats = torch.rand(8, 4, generator=gen, dtype=torch.float64) * 80
    assert torch.equal(f.sign_gate(logits), torch.ones(8))
    nci = (feats.sum(1) - 20.0) / (100.0 + 1e-3)
    want = 0.05 * 2 * torch.sigmoid(3.0 * nci)  # psi = +1 everywhere
    torch.testing.assert_close(f.sample_alphas(logits, feats), want, rtol=1e-12, atol=0)


def test_fedlas_psi_dtype_and_float64_alphas(gen):
    logits = torch.randn(8, K, generator=gen)
    assert FeDLaS(K).to(torch.bfloat16).sign_gate(logits).dtype == torch.bfloat16  # the gate's dtype
    # float32 buffers, float64 features: sigma + 1e-3 is formed in float64 (not rounded to float32)
    f = FeDLaS(K).eval()
    f.sigma.fill_(2.9)
    feats = torch.rand(8, 4, generator=gen, dtype=torch.float64) * 40
    psi = f.sign_gate(logits).double()
    want = 0.05 * 2 * torch.sigmoid(4.0 * psi * (feats.sum(1) - 20.0) / (float(f.sigma) + 1e-3))
    torch.testing.assert_close(f.sample_alphas(logits.double(), feats), want, rtol=1e-13, atol=0)


def test_fedlas_errors_name_the_loss_and_counts(gen):
    f = FeDLaS(K)
    logits = torch.randn(16, 7, generator=gen)
    targets = torch.zeros(16, dtype=torch.long)
    msg = f"FeDLaS was built for num_classes={K} but logits have 7 columns"
    with pytest.raises(ValueError, match=msg):
        f(logits, targets, torch.rand(16, 3, generator=gen))
    with pytest.raises(ValueError, match=msg):
        f(logits.reshape(2, 7, 8), targets.reshape(2, 8), torch.rand(2, 3, 8, generator=gen))
    with pytest.raises(ValueError, match="features have 3 rows but logits have 16"):
        FeDLaS(7)(logits, targets, torch.rand(3, 4, generator=gen))
    with pytest.raises(ValueError, match=r"FeDLaS needs the penultimate features: call loss\(logits, targets, "
                                         r"features=model.forward_features\(x\)\) \(FeDLaS.needs_features is True\)"):
        f(logits, targets)


@pytest.mark.parametrize("variant", ["ls", "mbls"])
def test_fedlas_sequence_input_with_its_own_ignore_index(variant, gen):
    # (N, K, L) logits (one label per position) are dense input too; ignore_index=0 drops label 0
    logits = torch.randn(3, K, 6, generator=gen, dtype=torch.float64) * 4
    targets = torch.randint(0, K, (3, 6), generator=gen)
    targets[0, :3] = 0
    feats = torch.rand(3, 4, 6, generator=gen, dtype=torch.float64) * 10
    f = FeDLaS(K, variant, beta=2.0, ignore_index=0).double().eval()
    rows = logits.permute(0, 2, 1).reshape(-1, K)
    frows = feats.permute(0, 2, 1).reshape(-1, 4)
    ys = targets.reshape(-1)
    keep = ys != 0
    assert 0 < int(keep.sum()) < ys.numel()
    torch.testing.assert_close(f(logits, targets, feats), f(rows[keep], ys[keep], frows[keep]))
    assert not torch.allclose(f(rows, ys, frows), f(rows[keep], ys[keep], frows[keep]))
    # in training the running statistics see the kept positions only
    f.train()(logits, targets, feats)
    norms = frows[keep].sum(1)
    assert f.mu.item() == pytest.approx(0.95 * norms.mean().item() + 0.05 * 20.0, rel=1e-12)


# ----------------------------------------------------------------------------- AdaFocal
def test_adafocal_constructor_bounds_are_exact():
    with pytest.raises(ValueError, match="n_bins must be an integer >= 1, got 0"):
        AdaFocal(K, n_bins=0)
    for bad in (2.0, True):
        with pytest.raises(ValueError, match="n_bins must be an integer >= 1"):
            AdaFocal(K, n_bins=bad)
    assert AdaFocal(K, n_bins=1).gammas.shape == (1,)
    need = r"need gamma_min < 0 < flip_threshold <= gamma_max, got "
    with pytest.raises(ValueError, match=need + r"0.0, 0.2, 20.0"):
        AdaFocal(K, gamma_min=0.0)
    with pytest.raises(ValueError, match=need + r"-2.0, 0.0, 20.0"):
        AdaFocal(K, flip_threshold=0.0)
    with pytest.raises(ValueError, match=need):
        AdaFocal(K, flip_threshold=0.5, gamma_max=0.4, gamma_init=0.5)
    init = r"gamma_init must satisfy \|gamma_init\| >= 0.2 and lie in \[-2.0, 20.0\], got "
    with pytest.raises(ValueError, match=init + "0.1"):
        AdaFocal(K, gamma_init=0.1)  # inside the clip range but below the flip threshold
    with pytest.raises(ValueError, match=init + "21"):
        AdaFocal(K, gamma_init=21)
    # every bound is inclusive where the docstring says <=
    for g in (0.2, -0.2, -2.0, 20.0):
        assert AdaFocal(K, gamma_init=g).gammas[0] == pytest.approx(g)
    assert AdaFocal(K, flip_threshold=0.5, gamma_max=0.5, gamma_init=0.5).gamma_max == 0.5


def test_adafocal_initial_edges_are_equal_width_on_the_unit_interval():
    assert AdaFocal(K, n_bins=4).edges.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_adafocal_a_confidence_on_an_edge_belongs_to_the_lower_bin():
    loss = AdaFocal(K, n_bins=2)
    loss.edges.copy_(torch.tensor([0.0, 0.5, 1.0]))
    loss.gammas.copy_(torch.tensor([4.0, -1.0]))
    logits = torch.full((3, K), -1e4)
    logits[:, :2] = 0.0  # p = (0.5, 0.5, 0, ...) exactly
    logits[2, 0] = 1.0  # p_0 > 0.5
    # (lo, hi]: p_y = 0.5 is in bin 0 (as adaptive_ece bins it), 0 clamps to bin 0, p_0 > 0.5 in bin 1
    assert loss.sample_gammas(logits, torch.tensor([0, 2, 0])).tolist() == [4.0, 4.0, -1.0]


def test_adafocal_error_names_the_loss_and_targets_may_be_a_list(gen):
    loss = AdaFocal(K)
    with pytest.raises(ValueError, match=f"AdaFocal was built for num_classes={K} but logits have 4 columns"):
        loss(torch.randn(3, 4, generator=gen), torch.zeros(3, dtype=torch.long))
    logits = torch.randn(3, K, generator=gen)
    assert torch.equal(loss(logits, [1, 0, 2]), loss(logits, torch.tensor([1, 0, 2])))


def test_adafocal_sequence_input_with_its_own_ignore_index(gen):
    logits = torch.randn(3, K, 6, generator=gen, dtype=torch.float64) * 4
    targets = torch.randint(0, K, (3, 6), generator=gen)
    targets[0, :3] = 0
    loss = AdaFocal(K, n_bins=3, ignore_index=0)
    loss.edges.copy_(torch.tensor([0.0, 0.2, 0.5, 1.0]))
    loss.gammas.copy_(torch.tensor([3.0, -1.5, 0.5]))
    rows = logits.permute(0, 2, 1).reshape(-1, K)
    ys = targets.reshape(-1)
    keep = ys != 0
    assert 0 < int(keep.sum()) < ys.numel()
    g = loss.sample_gammas(logits, targets)
    assert g.shape == targets.shape and torch.equal(g.reshape(-1)[keep], loss.sample_gammas(rows[keep], ys[keep]))
    assert loss.sample_gammas(rows[keep], ys[keep]).unique().numel() == 3  # every bin used
    torch.testing.assert_close(loss(logits, targets), loss(rows[keep], ys[keep]))
    assert not torch.allclose(loss(rows, ys), loss(rows[keep], ys[keep]))
    bad = targets.clone()
    bad[1, 0] = 255  # with ignore_index=0, 255 is a label out of range, not a void pixel
    with pytest.raises(ValueError, match="out of range"):
        loss.sample_gammas(logits, bad)
