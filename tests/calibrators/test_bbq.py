"""BBQ against a direct implementation of its definition, written here with loops and math.lgamma."""

import math

import pytest
import torch

from calibkit.calibrators import BBQ
from calibkit.calibrators.bbq import bin_range


def _direct(scores, labels, c, ess):
    """BBQ's averaged map for binary scores in [0, 1], straight from the definition (a function)."""
    n = len(scores)
    s = sorted(scores)
    root = n ** (1 / 3)
    models = []
    for b in range(max(1, math.floor(root / c)), min(n, math.ceil(c * root)) + 1):
        edges = [s[math.ceil(j * n / b) - 1] for j in range(1, b)]  # order statistics, (lo, hi] bins
        bounds = [0.0] + edges + [1.0]

        def which(v, edges=edges):
            return sum(v > e for e in edges)

        log_ml, values = 0.0, []
        for j in range(b):
            members = [y for v, y in zip(scores, labels) if which(v) == j]
            rows, ones = len(members), sum(members)
            mid = (bounds[j] + bounds[j + 1]) / 2
            alpha, beta = ess / b * mid, ess / b * (1 - mid)
            log_ml += (math.lgamma(ess / b) - math.lgamma(rows + ess / b) + math.lgamma(ones + alpha)
                       - math.lgamma(alpha) + math.lgamma(rows - ones + beta) - math.lgamma(beta))
            values.append((ones + alpha) / (rows + ess / b))
        models.append((log_ml, which, values))
    top = max(m[0] for m in models)
    total = sum(math.exp(m[0] - top) for m in models)
    weights = [math.exp(m[0] - top) / total for m in models]
    return lambda v: sum(w * vals[which(v)] for w, (_, which, vals) in zip(weights, models)), weights


def test_bin_range_is_the_papers():
    assert bin_range(5000, 10.0) == list(range(1, 172))  # 5000^(1/3) = 17.1: floor(1.71) .. ceil(171)
    assert bin_range(12, 2.0) == [1, 2, 3, 4, 5]  # 12^(1/3) = 2.29: floor(1.14) .. ceil(4.58)
    assert bin_range(12, 10.0) == list(range(1, 13))  # capped at N bins


def test_binary_hand_case_matches_the_direct_definition():
    z = torch.tensor([-2.5, -1.7, -1.1, -0.6, -0.2, 0.0, 0.3, 0.3, 0.9, 1.4, 2.2, 3.0], dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 0, 0, 1, 0, 1, 1, 0, 1, 1])
    cal = BBQ(c=2.0).fit(z, y)
    s = torch.sigmoid(z).tolist()
    f, weights = _direct(s, y.tolist(), 2.0, 2.0)
    assert cal.n_bins_.tolist() == [1, 2, 3, 4, 5]
    torch.testing.assert_close(cal.weights_[0], torch.tensor(weights, dtype=torch.float64), rtol=1e-10, atol=1e-12)
    zt = torch.cat([z, torch.tensor([-9.0, -0.4, 0.15, 1.1, 9.0], dtype=torch.float64)])  # the edges themselves too
    expected = torch.tensor([f(v) for v in torch.sigmoid(zt).tolist()], dtype=torch.float64)
    torch.testing.assert_close(cal.predict_proba(zt), expected, rtol=1e-10, atol=1e-12)


def test_multiclass_is_the_renormalised_one_vs_rest_definition():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(12, 3, generator=g, dtype=torch.float64) * 2
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 0, 1, 2, 2, 1])
    cal = BBQ(c=2.0, ess=3.0).fit(z, y)
    p = torch.softmax(z, 1)
    maps = [_direct(p[:, k].tolist(), (y == k).long().tolist(), 2.0, 3.0)[0] for k in range(3)]
    zt = torch.randn(20, 3, generator=g, dtype=torch.float64) * 2
    pt = torch.softmax(zt, 1)
    g_ = torch.tensor([[maps[k](v) for k, v in enumerate(row)] for row in pt.tolist()], dtype=torch.float64)
    torch.testing.assert_close(cal.predict_proba(zt), g_ / g_.sum(1, keepdim=True), rtol=1e-10, atol=1e-12)


def test_tied_scores_stay_in_one_bin():
    z = torch.tensor([0.0] * 6 + [2.0] * 6, dtype=torch.float64)
    y = torch.tensor([0, 1, 0, 0, 1, 0, 1, 1, 0, 1, 1, 1])
    cal = BBQ(c=2.0).fit(z, y)
    f, _ = _direct(torch.sigmoid(z).tolist(), y.tolist(), 2.0, 2.0)
    zt = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)
    expected = torch.tensor([f(v) for v in torch.sigmoid(zt).tolist()], dtype=torch.float64)
    torch.testing.assert_close(cal.predict_proba(zt), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kwargs,match", [({"c": 0.5}, "c must be >= 1"),
                                          ({"ess": 0.0}, "ess must be a finite number > 0"),
                                          ({"ess": float("nan")}, "ess must be")])
def test_bad_hyperparameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BBQ(**kwargs).fit(torch.randn(20, 3), torch.arange(20) % 3)


def _confident_logits(n, k, seed):
    """Over-confident logits: gaps of 50 on most rows, so softmax's top entry is exactly 1.0 in
    float64 (the CIFAR case: hundreds of validation probabilities at 1.0)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, k, (n,), generator=g)
    z = torch.randn(n, k, generator=g, dtype=torch.float64)
    right = torch.rand(n, generator=g) < 0.9
    z[torch.arange(n), torch.where(right, y, (y + 1) % k)] += 50.0
    return z, y


def test_probabilities_at_exactly_one_give_finite_weights_and_informative_rows():
    z, y = _confident_logits(400, 4, 0)
    p = torch.softmax(z, 1)
    assert int((p == 1).sum()) > 300  # the failing case: before the fix every weight was NaN, every row 1/K
    cal = BBQ().fit(z, y)
    assert bool(torch.isfinite(cal.weights_).all()) and bool(torch.isfinite(cal.levels_).all())
    torch.testing.assert_close(cal.weights_.sum(1), torch.ones(4, dtype=torch.float64))
    q = cal.predict_proba(z)
    assert bool(torch.isfinite(q).all()) and bool((q > 0).all())
    assert float((q.max(1).values - q.min(1).values).min()) > 1e-3  # no uniform row
    # informative: the true class gets more than 1/K on average, and the argmax is mostly kept (equal-
    # frequency bins mix the ties at 1.0 with the largest tiny scores, so a few rows do move)
    assert float(q[torch.arange(400), y].mean()) > 0.5
    assert float((q.argmax(1) == p.argmax(1)).double().mean()) > 0.85


def test_degenerate_bins_match_the_definition_with_the_clipped_prior_mean():
    """Scores at exactly 0 and 1: the direct definition with the bin midpoint clipped to
    [1e-6, 1 - 1e-6] (the documented rule) gives the same weights and map."""
    s = [0.0, 0.0, 0.0, 0.2, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0]
    y = [0, 0, 1, 0, 1, 1, 1, 0, 1, 1]

    # A binary logit of +-inf is not allowed, so build (0, z) logits with z = +-800: sigmoid is 0/1 exactly.
    z = torch.tensor([-800.0 if v == 0 else 800.0 if v == 1 else math.log(v / (1 - v)) for v in s],
                     dtype=torch.float64)
    assert torch.sigmoid(z).tolist() == s
    cal = BBQ(c=2.0, floor=0.0).fit(z, torch.tensor(y))
    assert bool(torch.isfinite(cal.weights_).all())
    # the same computation in plain python with the clipped midpoints
    n = len(s)
    srt = sorted(s)
    root = n ** (1 / 3)
    logs, maps = [], []
    for b in range(max(1, math.floor(root / 2.0)), min(n, math.ceil(2.0 * root)) + 1):
        edges = [srt[math.ceil(j * n / b) - 1] for j in range(1, b)]
        bounds = [0.0] + edges + [1.0]
        log_ml, values = 0.0, []
        for j in range(b):
            members = [t for v, t in zip(s, y) if sum(v > e for e in edges) == j]
            rows, ones = len(members), sum(members)
            mid = min(max((bounds[j] + bounds[j + 1]) / 2, 1e-6), 1 - 1e-6)
            a, bb = 2.0 / b * mid, 2.0 / b * (1 - mid)
            log_ml += (math.lgamma(2.0 / b) - math.lgamma(rows + 2.0 / b) + math.lgamma(ones + a) - math.lgamma(a)
                       + math.lgamma(rows - ones + bb) - math.lgamma(bb))
            values.append((ones + a) / (rows + 2.0 / b))
        logs.append(log_ml)
        maps.append((edges, values))
    top = max(logs)
    w = [math.exp(v - top) for v in logs]
    w = [v / sum(w) for v in w]
    torch.testing.assert_close(cal.weights_[0], torch.tensor(w, dtype=torch.float64), rtol=1e-9, atol=1e-12)
    expected = [sum(wm * vals[sum(v > e for e in edges)] for wm, (edges, vals) in zip(w, maps)) for v in s]
    torch.testing.assert_close(cal.predict_proba(z), torch.tensor(expected, dtype=torch.float64), rtol=1e-9,
                               atol=1e-12)
