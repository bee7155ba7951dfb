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
