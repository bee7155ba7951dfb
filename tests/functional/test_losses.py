"""calibkit.functional losses: hand-computed values, loop references, gradients, identities."""

import math

import pytest
import torch

import calibkit.functional as F

LN = math.log


# ----------------------------------------------------------------------------- loop references
# Straightforward per-sample formulas on Python floats, written from the spec, independent of
# the vectorised implementation (no log_softmax, no gather, no masks).
def _softmax(row):
    m = max(row)
    e = [math.exp(v - m) for v in row]
    s = sum(e)
    return [v / s for v in e]


def _rows(logits, targets):
    for row, y in zip(logits.tolist(), targets.tolist()):
        yield row, _softmax(row), y


def ref_ce(logits, targets):
    return sum(-LN(p[y]) for _, p, y in _rows(logits, targets)) / len(targets)


def ref_ls(logits, targets, alpha):
    tot = 0.0
    for _, p, y in _rows(logits, targets):
        tot += (1 - alpha) * -LN(p[y]) + alpha * sum(-LN(q) for q in p) / len(p)
    return tot / len(targets)


def ref_focal(logits, targets, gamma):
    return sum(-(1 - p[y]) ** gamma * LN(p[y]) for _, p, y in _rows(logits, targets)) / len(targets)


def ref_flsd(logits, targets):
    tot = 0.0
    for _, p, y in _rows(logits, targets):
        g = 5 if p[y] < 0.2 else 3
        tot += -(1 - p[y]) ** g * LN(p[y])
    return tot / len(targets)


def ref_ecp(logits, targets, beta):
    tot = 0.0
    for _, p, y in _rows(logits, targets):
        h = -sum(q * LN(q) for q in p)
        tot += -LN(p[y]) - beta * h / len(p)
    return tot / len(targets)


def ref_mbls(logits, targets, margin, lam):
    n, k = logits.shape
    pen = 0.0
    for row, _, _ in _rows(logits, targets):
        pen += sum(max(max(row) - v - margin, 0.0) for v in row)
    return ref_ce(logits, targets) + lam * pen / (n * k)


def ref_acls(logits, targets, alpha, lam1, lam2, margin):
    n, k = logits.shape
    first = second = 0.0
    for row, _, _ in _rows(logits, targets):
        j = row.index(max(row))
        first += max(row[j] - margin, 0.0) ** 2
        second += sum(max(row[j] - row[c] - margin, 0.0) ** 2 for c in range(k) if c != j)
    reg = lam1 * first / n + lam2 * second / (n * (k - 1))
    return ref_ce(logits, targets) + alpha * reg


def ref_dfl(logits, targets, gamma):
    tot = 0.0
    for _, p, y in _rows(logits, targets):
        below = [q for q in p if q < p[y]]
        pj = max(below) if below else 0.0
        tot += -(1 - p[y] + pj) ** gamma * LN(p[y])
    return tot / len(targets)


def ref_adafocal(logits, targets, gammas):
    tot = 0.0
    for (_, p, y), g in zip(_rows(logits, targets), gammas.tolist()):
        w = (1 - p[y]) ** g if g >= 0 else (1 + p[y]) ** (-g)
        tot += -w * LN(p[y])
    return tot / len(targets)


def ref_weighted_ls(logits, targets, alphas):
    tot = 0.0
    for (_, p, y), a in zip(_rows(logits, targets), alphas.tolist()):
        tot += (1 - a) * -LN(p[y]) + a * sum(-LN(q) for q in p) / len(p)
    return tot / len(targets)


def ref_weighted_mbls(logits, targets, alphas, margin):
    tot = 0.0
    for (row, p, y), a in zip(_rows(logits, targets), alphas.tolist()):
        pen = sum(max(max(row) - v - margin, 0.0) for v in row) / len(row)
        tot += (1 - a) * -LN(p[y]) + a * pen
    return tot / len(targets)


def ref_soft_ce(logits, soft):
    rows = zip(logits.tolist(), soft.tolist())
    return sum(-sum(t * LN(q) for t, q in zip(s, _softmax(r))) for r, s in rows) / len(soft)


def ref_soft_l2(logits, soft):
    rows = zip(logits.tolist(), soft.tolist())
    return sum(sum((q - t) ** 2 for t, q in zip(s, _softmax(r))) for r, s in rows) / len(soft)


@pytest.fixture
def batch(gen):
    # Spread of logits wide enough that margins of 2-3 are active for some entries.
    logits = torch.randn(12, 5, generator=gen, dtype=torch.float64) * 3
    targets = torch.randint(0, 5, (12,), generator=gen)
    return logits, targets


CASES = [
    ("cross_entropy", {}, ref_ce),
    ("label_smoothing", {"alpha": 0.2}, ref_ls),
    ("focal", {"gamma": 2.5}, ref_focal),
    ("flsd", {}, ref_flsd),
    ("ecp", {"beta": 0.3}, ref_ecp),
    ("mbls", {"margin": 2.0, "lam": 0.5}, ref_mbls),
    ("acls", {"alpha": 0.3, "lam1": 1.0, "lam2": 0.5, "margin": 1.5}, ref_acls),
    ("dual_focal", {"gamma": 4.0}, ref_dfl),
]


@pytest.mark.parametrize("name,kwargs,ref", CASES, ids=[c[0] for c in CASES])
def test_matches_loop_reference(batch, name, kwargs, ref):
    logits, targets = batch
    got = getattr(F, name)(logits, targets, **kwargs)
    assert got.dim() == 0
    assert float(got) == pytest.approx(ref(logits, targets, **kwargs), rel=1e-10, abs=1e-12)


def test_defaults_match_the_spec(batch):
    logits, targets = batch
    assert float(F.label_smoothing(logits, targets)) == pytest.approx(ref_ls(logits, targets, 0.05))
    assert float(F.focal(logits, targets)) == pytest.approx(ref_focal(logits, targets, 3.0))
    assert float(F.ecp(logits, targets)) == pytest.approx(ref_ecp(logits, targets, 0.1))
    assert float(F.mbls(logits * 5, targets)) == pytest.approx(ref_mbls(logits * 5, targets, 10.0, 0.1))
    assert float(F.acls(logits * 5, targets)) == pytest.approx(ref_acls(logits * 5, targets, 0.1, 1.0, 0.1, 10.0))
    assert float(F.dual_focal(logits, targets)) == pytest.approx(ref_dfl(logits, targets, 5.0))


def test_per_sample_and_soft_losses_match_loop_reference(batch, gen):
    logits, targets = batch
    gammas = torch.tensor([-2.0, -0.2, 0.2, 1.0, 3.0, 20.0] * 2, dtype=torch.float64)
    assert float(F.adafocal(logits, targets, gammas)) == pytest.approx(ref_adafocal(logits, targets, gammas), rel=1e-10)
    alphas = torch.rand(12, generator=gen, dtype=torch.float64) * 0.2
    assert float(F.weighted_label_smoothing(logits, targets, alphas)) == pytest.approx(
        ref_weighted_ls(logits, targets, alphas), rel=1e-10)
    assert float(F.weighted_mbls(logits, targets, alphas, 2.0)) == pytest.approx(
        ref_weighted_mbls(logits, targets, alphas, 2.0), rel=1e-10)
    soft = torch.softmax(torch.randn(12, 5, generator=gen, dtype=torch.float64), 1)
    assert float(F.soft_cross_entropy(logits, soft)) == pytest.approx(ref_soft_ce(logits, soft), rel=1e-10)
    assert float(F.soft_l2(logits, soft)) == pytest.approx(ref_soft_l2(logits, soft), rel=1e-10)


# ----------------------------------------------------------------------------- hand computations
# logits [0, ln 3] -> p = [1/4, 3/4]; target 1 unless stated.
P2 = torch.tensor([[0.0, LN(3.0)]], dtype=torch.float64)
Y1 = torch.tensor([1])


def test_hand_values_two_classes():
    assert float(F.cross_entropy(P2, Y1)) == pytest.approx(-LN(0.75))
    assert (float(F.label_smoothing(P2, Y1, alpha=0.1))
            == pytest.approx(0.9 * -LN(0.75) + 0.1 * (-LN(0.25) - LN(0.75)) / 2))
    assert float(F.focal(P2, Y1, gamma=2)) == pytest.approx(-(0.25 ** 2) * LN(0.75))
    entropy = -(0.25 * LN(0.25) + 0.75 * LN(0.75))
    assert float(F.ecp(P2, Y1, beta=0.1)) == pytest.approx(-LN(0.75) - 0.1 * entropy / 2)
    assert float(F.adafocal(P2, Y1, gamma=-2.0)) == pytest.approx(-(1.75 ** 2) * LN(0.75))
    assert float(F.adafocal(P2, Y1, gamma=2.0)) == pytest.approx(-(0.25 ** 2) * LN(0.75))
    soft = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    assert float(F.soft_l2(P2, soft)) == pytest.approx(0.125)
    assert float(F.soft_cross_entropy(P2, soft)) == pytest.approx(-(0.5 * LN(0.25) + 0.5 * LN(0.75)))


def test_hand_value_flsd_switches_gamma_at_0_2():
    # Row 0: p = [0.9, 0.1], p_y = 0.1 < 0.2 -> gamma 5. Row 1: p_y = 0.75 -> gamma 3.
    logits = torch.tensor([[LN(9.0), 0.0], [0.0, LN(3.0)]], dtype=torch.float64)
    want = (-(0.9 ** 5) * LN(0.1) - (0.25 ** 3) * LN(0.75)) / 2
    assert float(F.flsd(logits, torch.tensor([1, 1]))) == pytest.approx(want)


def test_hand_value_mbls_and_acls():
    logits = torch.tensor([[0.0, 12.0, 1.0]], dtype=torch.float64)
    ce = -float(torch.log_softmax(logits, 1)[0, 1])
    # gaps d = [12, 0, 11]; relu(d - 10) = [2, 0, 1]; mean over N x K = 1
    assert float(F.mbls(logits, Y1, margin=10, lam=0.1)) == pytest.approx(ce + 0.1 * 1.0)
    assert float(F.margin_penalty(logits, margin=10)) == pytest.approx(1.0)
    # ACLS: first relu(12 - 10)^2 = 4; second (relu(12-0-10)^2 + relu(12-1-10)^2) / (1 * 2) = 2.5
    assert (float(F.acls(logits, Y1, alpha=0.1, lam1=1.0, lam2=0.1, margin=10))
            == pytest.approx(ce + 0.1 * (4 + 0.1 * 2.5)))


def test_hand_value_dual_focal_next_lower_probability():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]] * 3, dtype=torch.float64))
    targets = torch.tensor([1, 2, 0])
    # p_j: below 0.3 -> 0.2; below 0.2 -> none (0); below 0.5 -> 0.3
    want = (-(1 - 0.3 + 0.2) ** 2 * LN(0.3) - (1 - 0.2) ** 2 * LN(0.2) - (1 - 0.5 + 0.3) ** 2 * LN(0.5)) / 3
    assert float(F.dual_focal(logits, targets, gamma=2)) == pytest.approx(want)


def test_fedlas_pieces_by_hand():
    feats = torch.tensor([[1.0, -2.0, 3.0], [0.5, 0.5, 0.0]])
    norms = F.feature_l1_norms(feats)
    assert norms.tolist() == [6.0, 1.0]
    nci = F.fedlas_nci(norms, 2.0, 4.0)
    assert nci.tolist() == pytest.approx([4 / 4.001, -1 / 4.001])
    psi = torch.tensor([1.0, -1.0])
    alpha = F.fedlas_alpha(nci, psi, alpha=0.05, beta=2.0)
    want = [0.1 / (1 + math.exp(-2 * 4 / 4.001)), 0.1 / (1 + math.exp(-2 * 1 / 4.001))]
    assert alpha.tolist() == pytest.approx(want)
    assert F.fedlas_alpha(nci, psi, alpha=0.05, beta=0.0).tolist() == pytest.approx([0.05, 0.05])


# ----------------------------------------------------------------------------- gradients
# ACLS's second term stops the gradient through the max logit, which finite differences cannot
# see: gradcheck runs with lam2 = 0 and the stopped term is checked by hand below.
GRAD_CASES = [c if c[0] != "acls" else ("acls", {**c[1], "lam2": 0.0}, None) for c in CASES] + [
    ("adafocal", {"gamma": torch.tensor([-1.5, 0.5, 2.0, -0.3, 1.0, 3.0])}, None),
    ("weighted_label_smoothing", {"alpha": torch.linspace(0.0, 0.3, 6, dtype=torch.float64)}, None),
    ("weighted_mbls", {"alpha": torch.linspace(0.0, 0.3, 6, dtype=torch.float64), "margin": 1.0}, None),
]


@pytest.mark.parametrize("name,kwargs,_", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_gradcheck_float64(gen, name, kwargs, _):
    logits = (torch.randn(6, 4, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    targets = torch.randint(0, 4, (6,), generator=gen)
    assert torch.autograd.gradcheck(lambda x: getattr(F, name)(x, targets, **kwargs), (logits,))


def test_gradcheck_soft_and_per_sample_weight(gen):
    logits = torch.randn(5, 3, generator=gen, dtype=torch.float64).requires_grad_()
    soft = torch.softmax(torch.randn(5, 3, generator=gen, dtype=torch.float64), 1)
    assert torch.autograd.gradcheck(lambda x: F.soft_l2(x, soft), (logits,))
    assert torch.autograd.gradcheck(lambda x: F.soft_cross_entropy(x, soft), (logits,))
    # FeDLaS trains its gate through alpha_i: the weighted losses must differentiate in alpha too.
    targets = torch.randint(0, 3, (5,), generator=gen)
    alpha = (torch.rand(5, generator=gen, dtype=torch.float64) * 0.2).requires_grad_()
    assert torch.autograd.gradcheck(lambda a: F.weighted_label_smoothing(logits.detach(), targets, a), (alpha,))
    assert torch.autograd.gradcheck(lambda a: F.weighted_mbls(logits.detach() * 3, targets, a, 1.0), (alpha,))


def test_mbls_gradient_flows_through_max_logit():
    logits = torch.tensor([[0.0, 12.0, 1.0]], requires_grad=True)
    F.margin_penalty(logits, margin=10).backward()
    # d/dl of mean(relu(l_max - l_k - 10)) over 3 entries: max gets +2/3, the two active others -1/3.
    assert logits.grad[0].tolist() == pytest.approx([-1 / 3, 2 / 3, -1 / 3])


def test_acls_gradient_stops_through_max_logit_in_second_term():
    logits = torch.tensor([[0.0, 12.0, 1.0]], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([1])
    (g_acls,) = torch.autograd.grad(F.acls(logits, y, alpha=1.0, lam1=1.0, lam2=1.0, margin=10), logits)
    (g_ce,) = torch.autograd.grad(F.cross_entropy(logits, y), logits)
    # first term: d/dl1 relu(l1 - 10)^2 = 2 * 2 = 4. second: (relu(2)^2 + relu(1)^2) / 2 with l1
    # stopped -> d/dl0 = -2 * 2 / 2 = -2, d/dl2 = -2 * 1 / 2 = -1, nothing more on l1.
    assert (g_acls - g_ce)[0].tolist() == pytest.approx([-2.0, 4.0, -1.0])


def test_focal_gradient_finite_when_p_y_is_one():
    logits = torch.tensor([[200.0, 0.0]], requires_grad=True)
    F.adafocal(logits, torch.tensor([0]), gamma=0.3).backward()
    assert torch.isfinite(logits.grad).all()


# ----------------------------------------------------------------------------- identities
def test_identities_reduce_to_cross_entropy(batch):
    logits, targets = batch
    ce = F.cross_entropy(logits, targets)
    assert torch.equal(F.focal(logits, targets, gamma=0), ce)
    assert torch.allclose(F.label_smoothing(logits, targets, alpha=0), ce, rtol=1e-14)
    assert torch.allclose(F.mbls(logits, targets, lam=0), ce, rtol=1e-14)
    assert torch.allclose(F.ecp(logits, targets, beta=0), ce, rtol=1e-14)
    assert torch.allclose(F.adafocal(logits, targets, gamma=0.0), ce, rtol=1e-14)
    assert torch.allclose(F.dual_focal(logits, targets, gamma=0), ce, rtol=1e-14)
    big = float((logits.max(1).values - logits.min(1).values).max()) + 1
    assert torch.allclose(F.mbls(logits, targets, margin=big, lam=1.0), ce, rtol=1e-14)
    assert torch.allclose(F.acls(logits, targets, margin=big), ce, rtol=1e-14)
    assert torch.allclose(F.weighted_label_smoothing(logits, targets, 0.0), ce, rtol=1e-14)
    assert torch.allclose(F.weighted_mbls(logits, targets, 0.0, 1.0), ce, rtol=1e-14)


def test_label_smoothing_equals_soft_ce_with_smoothed_targets(batch):
    logits, targets = batch
    smoothed = 0.8 * torch.nn.functional.one_hot(targets, 5).double() + 0.2 / 5
    assert torch.allclose(F.label_smoothing(logits, targets, alpha=0.2), F.soft_cross_entropy(logits, smoothed))
    assert torch.allclose(F.weighted_label_smoothing(logits, targets, 0.2), F.label_smoothing(logits, targets, 0.2))


def test_weighted_mbls_is_convex_combination(batch):
    logits, targets = batch
    ce = F.cross_entropy(logits, targets)
    pen = F.margin_penalty(logits, margin=2.0)
    assert torch.allclose(F.weighted_mbls(logits, targets, 0.3, 2.0), 0.7 * ce + 0.3 * pen)


def test_batch_mean_invariant_to_permutation_and_split(batch):
    logits, targets = batch
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(1))
    for name, kwargs, _ in CASES:
        fn = getattr(F, name)
        whole = fn(logits, targets, **kwargs)
        assert torch.allclose(fn(logits[perm], targets[perm], **kwargs), whole), name
        if name != "mbls" and name != "acls":  # these two are means too, checked below
            halves = (fn(logits[:6], targets[:6], **kwargs) + fn(logits[6:], targets[6:], **kwargs)) / 2
            assert torch.allclose(halves, whole), name
    for name in ("mbls", "acls"):
        fn = getattr(F, name)
        halves = (fn(logits[:6], targets[:6], margin=1.0) + fn(logits[6:], targets[6:], margin=1.0)) / 2
        assert torch.allclose(halves, fn(logits, targets, margin=1.0)), name


# ----------------------------------------------------------------------------- input checks
@pytest.mark.parametrize("name,kwargs,_", CASES, ids=[c[0] for c in CASES])
def test_bad_input_rejected(name, kwargs, _):
    fn = getattr(F, name)
    logits = torch.zeros(3, 4)
    with pytest.raises(ValueError, match="targets"):
        fn(logits, torch.tensor([0, 1]), **kwargs)
    with pytest.raises(ValueError, match="out of range"):
        fn(logits, torch.tensor([0, 1, 4]), **kwargs)
    with pytest.raises(ValueError, match="NaN"):
        fn(torch.tensor([[0.0, float("nan")]] * 3), torch.tensor([0, 1, 0]), **kwargs)
    with pytest.raises(ValueError, match="shape"):
        fn(torch.zeros(4), torch.tensor([0, 1, 0, 1]), **kwargs)


def test_bad_hyperparameters_rejected():
    x, y = torch.zeros(2, 3), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="alpha"):
        F.label_smoothing(x, y, alpha=1.5)
    with pytest.raises(ValueError, match="gamma"):
        F.focal(x, y, gamma=-1)
    with pytest.raises(ValueError, match="margin"):
        F.mbls(x, y, margin=-1)
    with pytest.raises(ValueError, match="lam"):
        F.mbls(x, y, lam=float("nan"))
    with pytest.raises(ValueError, match="gamma"):
        F.adafocal(x, y, gamma=torch.ones(3))
    with pytest.raises(ValueError, match="soft_targets"):
        F.soft_l2(x, torch.ones(2, 3))
    with pytest.raises(ValueError, match="features"):
        F.feature_l1_norms(torch.tensor([[float("inf")]]))


def test_half_precision_upcast(batch):
    logits, targets = batch
    for dtype in (torch.float16, torch.bfloat16):
        half = logits.to(dtype)
        got = F.focal(half, targets)
        assert got.dtype == torch.float32
        assert float(got) == pytest.approx(float(F.focal(half.float(), targets)), rel=1e-6)
