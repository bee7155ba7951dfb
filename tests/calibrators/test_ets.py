"""Ensemble temperature scaling: T by NLL, weights on the simplex minimising the Brier score, argmax kept."""

import numpy as np
import pytest
import torch

from calibkit.calibrators import EnsembleTemperatureScaling, TemperatureScaling
from calibkit.calibrators.ets import simplex_qp


def _data(seed, n=3000, k=10, sharpen=3.0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    return sharpen * z, y


def _brier(w, comps, onehot):
    q = sum(wi * c for wi, c in zip(w, comps))
    return float(((q - onehot) ** 2).sum(1).mean())


@pytest.mark.parametrize("sharpen", [0.3, 3.0])
def test_weights_on_the_simplex_minimise_the_brier_score_and_keep_the_argmax(sharpen):
    z, y = _data(0, sharpen=sharpen)
    ets = EnsembleTemperatureScaling().fit(z, y)
    t = TemperatureScaling().fit(z, y).temperature_
    assert ets.temperature_ == t  # T by NLL, the TS solver
    w = ets.weights_
    assert bool((w >= 0).all()) and float(w.sum()) == pytest.approx(1, abs=1e-12)
    comps = [torch.softmax(z / t, 1), torch.softmax(z, 1), torch.full_like(z, 0.1)]
    onehot = torch.nn.functional.one_hot(y, 10).double()
    best = _brier(w.tolist(), comps, onehot)
    grid = [(a / 50, b / 50, 1 - a / 50 - b / 50) for a in range(51) for b in range(51 - a)]
    assert best <= min(_brier(v, comps, onehot) for v in grid) + 1e-12  # no simplex grid point is better
    zt, _ = _data(1, n=500, sharpen=sharpen)
    q = ets.predict_proba(zt)
    torch.testing.assert_close(q, w[0] * torch.softmax(zt / t, 1) + w[1] * torch.softmax(zt, 1) + w[2] / 10)
    assert torch.equal(q.argmax(1), zt.argmax(1))


def test_simplex_qp_matches_scipy():
    from scipy.optimize import minimize

    g = torch.Generator().manual_seed(2)
    for _ in range(20):
        a = torch.randn(5, 3, generator=g, dtype=torch.float64)
        gram, lin = a.T @ a, torch.randn(3, generator=g, dtype=torch.float64)
        w = simplex_qp(gram, lin)
        def fun(v, gram=gram, lin=lin):
            return float(v @ gram.numpy() @ v - 2 * lin.numpy() @ v)
        res = minimize(fun, np.full(3, 1 / 3), method="SLSQP", bounds=[(0, 1)] * 3,
                       constraints=[{"type": "eq", "fun": lambda v: v.sum() - 1}], options={"ftol": 1e-14})
        assert fun(w.numpy()) <= res.fun + 1e-9
        assert bool((w >= 0).all()) and float(w.sum()) == pytest.approx(1)
