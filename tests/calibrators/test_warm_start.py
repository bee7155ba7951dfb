"""Warm starts: ``fit(..., init=fitted)`` reaches the cold fit's solution in fewer iterations;
Dirichlet calibration reuses ``init``'s (lam, mu); a wrong ``init`` is refused."""

import contextlib

import pytest
import torch

from calibkit.calibrators import (
    CALIBRATORS,
    DirichletCalibration,
    HistogramBinning,
    IsotonicCalibration,
    MatrixScaling,
    TemperatureScaling,
    VectorScaling,
    scaling,
)
from calibkit.calibrators._base import lbfgs, lbfgs_ftol
from calibkit.calibrators.crossfit import SelectionRule, cross_fit_predictions, folds
from calibkit.calibrators.folds import FOLD_FTOL, TO_TOLERANCE
from calibkit.calibrators.scaling import odir_objective


def _data(seed, n=3000, k=4):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * 1.5
    bias = torch.linspace(-0.5, 0.5, k, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(2 * z + bias, 1), 1, generator=g).squeeze(1)
    return z, y


def _objective(cal, z, y):
    """The fitted objective as a function of the flat parameters, written from the definitions."""
    k = z.shape[1]
    if isinstance(cal, VectorScaling):
        return lambda p: torch.nn.functional.cross_entropy(z * p[:k] + p[k:], y)
    x = torch.log_softmax(z, 1)
    return lambda p: odir_objective(x, y, p[:k * k].view(k, k), p[k * k:], cal.lam_, cal.mu_)


def _flat(cal):
    return torch.cat([cal.weight_.reshape(-1), cal.bias_])


def _grad(f, p):
    p = p.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(f(p), p)
    return g


# Each case: the calibrator for the whole set (init) and for the subset (cold and warm alike).
# Dirichlet's subset fits get a one-candidate grid holding init's choice, so the cold fit
# minimises the same objective as the warm one (which reuses init's (lam, mu)).
CASES = {
    "vector": (lambda: VectorScaling(max_iter=500), lambda init: VectorScaling(max_iter=500)),
    "dirichlet": (lambda: DirichletCalibration(lambdas=(1e3, 10.0, 0.1), max_iter=500),
                  lambda init: DirichletCalibration(lambdas=(init.lam_,), mus=(init.mu_,), max_iter=500)),
}


@pytest.mark.parametrize("case", CASES)
def test_warm_fit_reaches_the_cold_solution_in_fewer_iterations(case, monkeypatch):
    make_init, make_sub = CASES[case]
    z, y = _data(1)
    sub = torch.arange(len(y)) % 5 != 0  # 4/5 of the rows: one cross-fitted fit
    init = make_init().fit(z, y)
    runs = []  # iterations of every L-BFGS run of a fit (Dirichlet: the cross-validation's too)

    def counted(*args, **kwargs):
        out = lbfgs(*args, **kwargs)
        runs.append(out[1])
        return out

    monkeypatch.setattr(scaling, "lbfgs", counted)
    cold = make_sub(init).fit(z[sub], y[sub])
    cold_runs, runs[:] = list(runs), []
    warm = make_sub(init).fit(z[sub], y[sub], init=init)
    assert cold.n_iter_ < 500 and warm.n_iter_ < 500  # both converged before the cap
    # Dirichlet: one run instead of n_folds + 1 (here 3 + 1); its final run alone is not always
    # shorter from the warm start (30 cold, 31 warm on this data: L-BFGS spends most iterations
    # building its curvature pairs, which a start point does not carry)
    assert len(runs) == 1 and len(cold_runs) == (4 if case == "dirichlet" else 1)
    assert sum(runs) < sum(cold_runs)
    # Both stop where the gradient is small, not zero. For a convex objective with Hessian H,
    # |theta - theta*| <= |g(theta)| / lambda_min(H) near the minimum, so the two solutions lie
    # within (|g_cold| + |g_warm|) / lambda_min of each other; the factor 2 covers the change of
    # H over that distance. Vector scaling is invariant along the direction that shifts every
    # bias alike (H is singular there): it is projected out.
    f = _objective(warm, z[sub], y[sub])
    h = torch.autograd.functional.hessian(f, _flat(cold))
    evals, evecs = torch.linalg.eigh(h)
    keep = evals > 1e-9 * evals.max()
    null = {"vector": 1, "dirichlet": 0}[case]
    assert int((~keep).sum()) == null
    lam_min = float(evals[keep].min())
    grads = float(_grad(f, _flat(cold)).norm() + _grad(f, _flat(warm)).norm())
    bound = 2 * grads / lam_min
    assert bound < 1e-4  # the check below is a real one
    gap = evecs[:, keep].T @ (_flat(warm) - _flat(cold))
    assert float(gap.norm()) <= bound
    torch.testing.assert_close(warm.predict_proba(z), cold.predict_proba(z), rtol=0, atol=10 * bound)


def test_dirichlet_warm_start_reuses_init_lam_mu_and_skips_cross_validation(monkeypatch):
    z, y = _data(2)
    init = DirichletCalibration(lambdas=(1e3, 10.0, 0.1), mus=(1.0, 0.01)).fit(z, y)
    assert (init.lam_, init.mu_) != (5.0, 5.0)
    monkeypatch.setattr(scaling, "_folds", lambda *a: pytest.fail("a warm start must not cross-validate"))
    warm = DirichletCalibration(lambdas=(5.0,)).fit(z[:2000], y[:2000], init=init)
    assert (warm.lam_, warm.mu_) == (init.lam_, init.mu_)
    assert warm.cv_nll_ == init.cv_nll_ and warm.cv_nll_ is not init.cv_nll_
    # the map minimises the ODIR objective at init's (lam, mu) on the rows it was given, not the
    # one at this instance's lam = mu = 5 (L-BFGS also stops on a relative decrease below 1e-12,
    # which leaves gradient entries of order 1e-6)
    x = torch.log_softmax(z[:2000], 1)
    for lam, mu, small in ((init.lam_, init.mu_, True), (5.0, 5.0, False)):
        g = _grad(lambda p, lam=lam, mu=mu: odir_objective(x, y[:2000], p[:16].view(4, 4), p[16:], lam, mu),
                  _flat(warm))
        assert (float(g.abs().max()) < 1e-5) is small


def test_temperature_warm_start_same_root_fewer_newton_steps():
    z, y = _data(3, k=10)
    init = TemperatureScaling().fit(3 * z, y)
    cold = TemperatureScaling().fit(3 * z[:2400], y[:2400])
    warm = TemperatureScaling().fit(3 * z[:2400], y[:2400], init=init)
    assert warm.n_iter_ < cold.n_iter_
    # the solver stops when a Newton step changes 1/T by at most 1e-10 relative
    assert warm.temperature_ == pytest.approx(cold.temperature_, rel=1e-9)
    assert cold.temperature_ != pytest.approx(init.temperature_, rel=1e-6)  # a different problem


@pytest.mark.parametrize("cls", [HistogramBinning, IsotonicCalibration, MatrixScaling])
def test_calibrators_without_a_warm_start_ignore_init(cls):
    """The non-iterative ones, and matrix scaling (capped fits: the start would decide the result)."""
    z, y = _data(4)
    init = cls().fit(z, y)
    cold, warm = cls().fit(z[:2000], y[:2000]), cls().fit(z[:2000], y[:2000], init=init)
    assert torch.equal(warm.predict_proba(z), cold.predict_proba(z))


@pytest.mark.parametrize("cls", [VectorScaling, MatrixScaling, DirichletCalibration, HistogramBinning])
def test_bad_init_is_refused(cls):
    z, y = _data(5)
    other = MatrixScaling if cls is not MatrixScaling else VectorScaling
    with pytest.raises(ValueError, match=f"init must be a fitted {cls.__name__}.*got {other.__name__}"):
        cls().fit(z, y, init=other().fit(z, y))
    with pytest.raises(ValueError, match="init is an unfitted"):
        cls().fit(z, y, init=cls())
    z5, y5 = _data(5, k=5)
    with pytest.raises(ValueError, match="init was fitted on K = 5 but .* on K = 4"):
        cls().fit(z, y, init=cls().fit(z5, y5))
    binary = cls().fit(z[:, 0], (y == 0).long())
    with pytest.raises(ValueError, match=r"init was fitted on \(N,\) binary logits but .* on K = 4"):
        cls().fit(z, y, init=binary)


def test_temperature_bad_init_is_refused():
    z, y = _data(6)
    with pytest.raises(ValueError, match="init must be a fitted TemperatureScaling.*got VectorScaling"):
        TemperatureScaling().fit(z, y, init=VectorScaling().fit(z, y))
    with pytest.raises(ValueError, match="init is an unfitted TemperatureScaling"):
        TemperatureScaling().fit(z, y, init=TemperatureScaling())


@pytest.mark.parametrize("name", ["svs", "sms", "dirichlet", "vector"])
def test_cross_fitting_fold_fits_stop_looser_only_for_the_maps_fitted_to_tolerance(name):
    """SVS and SMS fold fits run under ``lbfgs_ftol(FOLD_FTOL)``; vector, matrix and Dirichlet
    scaling, whose iteration cap is part of the fit, keep the full stop: the out-of-fold
    predictions equal warm fits on the folds made by hand with and without the block."""
    z, y = _data(7, n=600)
    rule = SelectionRule(n_folds=5, seed=0)
    _, fitted, oof, _ = cross_fit_predictions(z, y, [name], rule)
    full = fitted[name]
    assert (CALIBRATORS[name] in TO_TOLERANCE) == (name in ("svs", "sms"))
    by_hand = torch.empty(len(y), z.shape[1], dtype=torch.float64)
    for held in folds(len(y), 5, 0):
        keep = torch.ones(len(y), dtype=torch.bool)
        keep[held] = False
        with lbfgs_ftol(FOLD_FTOL) if name in ("svs", "sms") else contextlib.nullcontext():
            cal = CALIBRATORS[name]().fit(z[keep], y[keep], init=full)
        by_hand[held] = cal.predict_proba(z[held]).double()
    assert torch.equal(oof[name], by_hand)
    assert FOLD_FTOL == 1e-8  # the value measured on the real outputs (docs/calibrators.md, "Speed")
