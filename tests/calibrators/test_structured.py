"""Structured vector / matrix scaling: the objective written here from the definition (at a given
strength, ``n_folds=0``), identity on calibrated data, a temperature-like shrink of 3x logits,
strengths set by the validation rows only, the strength chosen by the inner cross-validation
against held-out NLLs computed here."""

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize, minimize_scalar

from calibkit.calibrators import CALIBRATORS, StructuredMatrixScaling, StructuredVectorScaling


def _data(seed=0, n=2000, k=4, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    return scale * z, y


def _reference(z, y, matrix, lams=(1.0, 1.0, 1.0)):
    """The SVS / SMS fit from the definition: TS by NLL (scipy), the ts-mix features, the ridge
    objective minimised by scipy's L-BFGS-B with autograd gradients. Returns (T, weight, bias)."""
    n, k = z.shape
    t = minimize_scalar(lambda u: float(torch.nn.functional.cross_entropy(z * math.exp(-u), y)),
                        bounds=(-5, 5), method="bounded", options={"xatol": 1e-10}).x
    temp = math.exp(t)
    eps = 1 / (n + 1)
    x = torch.log((1 - eps) * torch.softmax(z / temp, 1) + eps / k)
    l_b, l_d, l_o = lams[0] * k / n, lams[1] * k / n, lams[2] * k * (k - 1) / n
    size = k * k if matrix else k

    def objective(p):
        d, b = p[:size], p[size:]
        if matrix:
            d = d.view(k, k)
            off = d - torch.diag(torch.diagonal(d))
            logits = x + x @ d.T + b
            reg = l_d * (torch.diagonal(d) ** 2).sum() + l_o * (off ** 2).sum()
        else:
            logits = x * (1 + d) + b
            reg = l_d * (d ** 2).sum()
        return torch.nn.functional.cross_entropy(logits, y) + reg + l_b * (b ** 2).sum()

    def fun(p):
        pt = torch.tensor(p, dtype=torch.float64, requires_grad=True)
        f = objective(pt)
        (grad,) = torch.autograd.grad(f, pt)
        return f.item(), grad.numpy()

    res = minimize(fun, np.zeros(size + k), jac=True, method="L-BFGS-B", options={"gtol": 1e-12, "ftol": 1e-15,
                                                                                    "maxiter": 5000})
    p = torch.tensor(res.x, dtype=torch.float64)
    weight = (torch.eye(k, dtype=torch.float64) + p[:size].view(k, k)) if matrix else 1 + p[:size]
    return temp, weight, p[size:], lambda zt: torch.softmax(_map(zt, temp, eps, weight, p[size:]), 1)


def _map(zt, temp, eps, weight, bias):
    x = torch.log((1 - eps) * torch.softmax(zt / temp, 1) + eps / zt.shape[1])
    return (x @ weight.T if weight.dim() == 2 else x * weight) + bias


@pytest.mark.parametrize("cls,matrix", [(StructuredVectorScaling, False), (StructuredMatrixScaling, True)])
def test_fit_is_the_minimiser_of_the_stated_objective(cls, matrix):
    z, y = _data(k=4)
    z = z + torch.tensor([0.8, 0.0, -0.5, 0.2], dtype=torch.float64)  # class bias for the map to fix
    cal = cls(max_iter=500, n_folds=0).fit(z, y)
    temp, weight, bias, predict = _reference(z, y, matrix)
    assert cal.temperature_ == pytest.approx(temp, rel=1e-6)
    assert cal.mix_ == 1 / (len(y) + 1)
    # the NLL ignores a common shift of the logits (b + c, or a vector added to every row of D):
    # only the small ridge pins those directions, so the parameters agree less closely than the map
    torch.testing.assert_close(cal.weight_, weight, atol=1e-4, rtol=0)
    torch.testing.assert_close(cal.bias_, bias, atol=1e-4, rtol=0)
    zt, _ = _data(seed=1, n=500, k=4)
    torch.testing.assert_close(cal.predict_proba(zt), predict(zt), atol=1e-5, rtol=0)


def test_lambda_multipliers_enter_the_objective():
    z, y = _data(k=3)
    cal = StructuredMatrixScaling(lambda_intercept=0.5, lambda_diagonal=2.0, lambda_off_diagonal=0.1, max_iter=500,
                                   n_folds=0)
    cal.fit(z, y)
    _, weight, _, predict = _reference(z, y, True, (0.5, 2.0, 0.1))
    torch.testing.assert_close(cal.weight_, weight, atol=1e-4, rtol=0)
    torch.testing.assert_close(cal.predict_proba(z), predict(z), atol=1e-5, rtol=0)
    assert cal.reg_ == pytest.approx({"intercept": 0.5 * 3 / 2000, "diagonal": 2.0 * 3 / 2000,
                                      "off_diagonal": 0.1 * 6 / 2000})


@pytest.mark.parametrize("name", ["svs", "sms"])
def test_calibrated_logits_keep_the_identity(name):
    z, y = _data(n=20_000, k=5, scale=1.0)
    cal = CALIBRATORS[name]().fit(z, y)
    k = z.shape[1]
    assert cal.temperature_ == pytest.approx(1.0, abs=0.03)
    identity = torch.eye(k, dtype=torch.float64) if name == "sms" else torch.ones(k, dtype=torch.float64)
    torch.testing.assert_close(cal.weight_, identity, atol=0.05, rtol=0)
    q = cal.predict_proba(z)
    assert (q - torch.softmax(z, 1)).abs().mean().item() < 0.005


@pytest.mark.parametrize("name", ["svs", "sms"])
def test_logits_three_times_too_sharp_are_shrunk_like_a_temperature(name):
    z, y = _data(n=20_000, k=5, scale=3.0)
    cal = CALIBRATORS[name]().fit(z, y)
    assert cal.temperature_ == pytest.approx(3.0, rel=0.03)
    zt, _ = _data(seed=1, n=2000, k=5, scale=3.0)
    assert (cal.predict_proba(zt) - torch.softmax(zt / 3, 1)).abs().mean().item() < 0.005


def test_strengths_come_from_the_validation_rows_passed_to_fit_only():
    z, y = _data(n=3000, k=4)
    half = StructuredMatrixScaling(n_folds=0).fit(z[:1500], y[:1500])
    full = StructuredMatrixScaling(n_folds=0).fit(z, y)
    assert half.reg_["off_diagonal"] == pytest.approx(4 * 3 / 1500) and full.reg_["diagonal"] == pytest.approx(4 / 3000)
    state = {k: v.clone() for k, v in ((n, getattr(half, n)) for n in ("weight_", "bias_"))}
    half.predict_proba(z[1500:])  # predicting on other rows changes nothing
    assert all(torch.equal(getattr(half, n), v) for n, v in state.items())
    again = StructuredMatrixScaling(n_folds=0).fit(z[:1500], y[:1500])  # the held-out rows never entered
    assert torch.equal(again.weight_, half.weight_) and again.reg_ == half.reg_


@pytest.mark.parametrize("cls", [StructuredVectorScaling, StructuredMatrixScaling])
def test_warm_start_reuses_the_chosen_strength_and_reaches_the_same_fit(cls):
    z, y = _data(n=3000, k=4)
    init = cls(reg_grid=(4.0, 0.25)).fit(z, y)
    sub = torch.arange(3000) % 5 != 0
    at_init = cls(n_folds=0, lambda_intercept=init.reg_scale_, lambda_diagonal=init.reg_scale_,
                  **({"lambda_off_diagonal": init.reg_scale_} if cls is StructuredMatrixScaling else {}))
    cold = at_init.fit(z[sub], y[sub])
    warm = cls(reg_grid=(16.0,)).fit(z[sub], y[sub], init=init)  # no search: init's s, whatever the grid
    assert warm.reg_scale_ == init.reg_scale_ and warm.cv_nll_ == init.cv_nll_ and warm.reg_ == cold.reg_
    # the same optimum, to the solver's tolerance (as against the scipy reference above)
    torch.testing.assert_close(warm.predict_proba(z), cold.predict_proba(z), atol=1e-5, rtol=0)


def _held_out_nll(z, y, folds, matrix, scale):
    """Mean held-out NLL of the reference fit (scipy) at strength ``scale`` over ``folds``."""
    total = 0.0
    for f, test in enumerate(folds):
        train = torch.cat([folds[j] for j in range(len(folds)) if j != f])
        *_, predict = _reference(z[train], y[train], matrix, (scale,) * 3)
        q = predict(z[test])
        total += float(-torch.log(q[torch.arange(len(test)), y[test]]).sum())
    return total / len(y)


@pytest.mark.parametrize("cls,matrix", [(StructuredVectorScaling, False), (StructuredMatrixScaling, True)])
def test_the_chosen_strength_has_the_lowest_held_out_nll(cls, matrix):
    # few rows and a class-bias that the map must learn: neither the strongest nor the weakest candidate wins
    z, y = _data(n=240, k=3, scale=2.0)
    z = z + torch.tensor([1.5, 0.0, -1.0], dtype=torch.float64)
    grid = (64.0, 8.0, 1.0, 0.125, 0.015625)
    cal = cls(reg_grid=grid, n_folds=3, cv_max_iter=1000, seed=5).fit(z, y)
    perm = torch.randperm(240, generator=torch.Generator().manual_seed(5))  # the documented folds
    folds = [part.sort().values for part in perm.tensor_split(3)]
    held = {s: _held_out_nll(z, y, folds, matrix, s) for s in grid}
    assert cal.cv_nll_ == pytest.approx({repr(s): h for s, h in held.items()}, abs=1e-6)
    assert cal.reg_scale_ == min(grid, key=lambda s: held[s])
    assert grid[0] > cal.reg_scale_ > grid[-1]  # the case discriminates: an interior candidate wins
    assert cal.reg_ == pytest.approx(cls(n_folds=0)._strengths(240, 3, cal.reg_scale_))
    again = cls(reg_grid=grid, n_folds=3, cv_max_iter=1000, seed=5).fit(z, y)  # deterministic
    assert again.reg_scale_ == cal.reg_scale_ and torch.equal(again.weight_, cal.weight_)
    assert torch.equal(again.bias_, cal.bias_) and again.cv_nll_ == cal.cv_nll_


@pytest.mark.parametrize("cls", [StructuredVectorScaling, StructuredMatrixScaling])
def test_save_and_load_keep_the_chosen_strength(cls, tmp_path):
    from calibkit.calibrators import load, save

    z, y = _data(n=600, k=3)
    cal = cls(reg_grid=(4.0, 0.25), seed=1).fit(z, y)
    save(cal, tmp_path / "cal")
    back = load(tmp_path / "cal")
    assert back.reg_scale_ == cal.reg_scale_ and back.cv_nll_ == cal.cv_nll_ and back.reg_ == cal.reg_
    assert back.get_params() == cal.get_params()
    assert torch.equal(back.predict_proba(z), cal.predict_proba(z))


@pytest.mark.parametrize("kwargs,match", [({"lambda_intercept": -1.0}, "lambda_intercept must be a finite number >= 0"),
                                          ({"max_iter": 0}, "max_iter must be an integer >= 1"),
                                          ({"n_folds": 1}, "n_folds must be 0"),
                                          ({"reg_grid": (1.0, 0.0)}, "reg_grid must be a non-empty tuple"),
                                          ({"cv_max_iter": 0}, "cv_max_iter must be an integer >= 1")])
def test_bad_hyperparameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StructuredVectorScaling(**kwargs).fit(torch.randn(20, 3), torch.arange(20) % 3)
