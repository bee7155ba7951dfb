"""Vector, matrix and Dirichlet scaling: recovery of a known map, optimality against a generic optimiser."""

import numpy as np
import pytest
import torch

from calibkit.calibrators import DirichletCalibration, MatrixScaling, VectorScaling


def _draw(gen, n, k):
    return torch.randn(n, k, generator=gen, dtype=torch.float64) * 1.5


def _labels(gen, logits):
    return torch.multinomial(torch.softmax(logits, 1), 1, generator=gen).squeeze(1)


def test_vector_scaling_recovers_a_known_map():
    g = torch.Generator().manual_seed(0)
    z = _draw(g, 20_000, 4)
    w, b = (torch.tensor([0.5, 1.0, 2.0, 0.8], dtype=torch.float64),
            torch.tensor([0.3, -0.2, 0.0, 0.6], dtype=torch.float64))
    y = _labels(g, z * w + b)
    cal = VectorScaling().fit(z, y)
    torch.testing.assert_close(cal.weight_, w, rtol=0, atol=0.05)
    # softmax ignores a common shift of the biases: compare centred biases
    torch.testing.assert_close(cal.bias_ - cal.bias_.mean(), b - b.mean(), rtol=0, atol=0.05)
    torch.testing.assert_close(cal.predict_proba(z[:5]), torch.softmax(z[:5] * cal.weight_ + cal.bias_, 1))


def test_matrix_scaling_recovers_a_known_map():
    g = torch.Generator().manual_seed(1)
    z = _draw(g, 40_000, 3)
    w = torch.tensor([[1.2, 0.4, -0.3], [0.0, 0.7, 0.2], [-0.5, 0.1, 1.5]], dtype=torch.float64)
    b = torch.tensor([0.2, -0.4, 0.1], dtype=torch.float64)
    y = _labels(g, z @ w.T + b)
    cal = MatrixScaling().fit(z, y)
    # adding one vector to every row of W adds the same logit to every class: centre the columns
    torch.testing.assert_close(cal.weight_ - cal.weight_.mean(0), w - w.mean(0), rtol=0, atol=0.06)
    torch.testing.assert_close(cal.bias_ - cal.bias_.mean(), b - b.mean(), rtol=0, atol=0.05)


@pytest.mark.parametrize("cls", [VectorScaling, MatrixScaling])
def test_fit_is_a_stationary_point_of_the_nll(cls):
    g = torch.Generator().manual_seed(2)
    z = _draw(g, 3000, 5)
    y = _labels(g, 2 * z)
    cal = cls(max_iter=500).fit(z, y)
    w, b = cal.weight_.clone().requires_grad_(), cal.bias_.clone().requires_grad_()
    logits = z * w + b if cls is VectorScaling else z @ w.T + b
    grads = torch.autograd.grad(torch.nn.functional.cross_entropy(logits, y), (w, b))
    assert max(float(t.abs().max()) for t in grads) < 1e-6


def _odir_numpy(params, x, y, k, lam, mu):
    """The ODIR objective and its gradient, written out in numpy for scipy."""
    w, b = params[:k * k].reshape(k, k), params[k * k:]
    a = x @ w.T + b
    a = a - a.max(1, keepdims=True)
    lse = np.log(np.exp(a).sum(1))
    n = len(y)
    nll = float((lse - a[np.arange(n), y]).mean())
    q = np.exp(a - lse[:, None])
    q[np.arange(n), y] -= 1
    off = w - np.diag(np.diag(w))
    value = nll + lam / (k * (k - 1)) * (off**2).sum() + mu / k * (b**2).sum()
    gw = q.T @ x / n + 2 * lam / (k * (k - 1)) * off
    gb = q.mean(0) + 2 * mu / k * b
    return value, np.concatenate([gw.ravel(), gb])


def test_dirichlet_fit_minimises_the_odir_objective():
    from scipy.optimize import minimize

    g = torch.Generator().manual_seed(3)
    z = _draw(g, 2000, 4) * 2
    y = _labels(g, z / 2)
    lam, mu = 0.7, 0.3
    cal = DirichletCalibration(lambdas=(lam,), mus=(mu,), max_iter=500).fit(z, y)
    assert (cal.lam_, cal.mu_) == (lam, mu)
    x = torch.log_softmax(z, 1).numpy()
    k = 4
    res = minimize(_odir_numpy, np.zeros(k * k + k), args=(x, y.numpy(), k, lam, mu), jac=True, method="BFGS",
                   options={"gtol": 1e-10, "maxiter": 10_000})
    ours, _ = _odir_numpy(np.concatenate([cal.weight_.numpy().ravel(), cal.bias_.numpy()]), x, y.numpy(), k, lam, mu)
    assert ours == pytest.approx(res.fun, rel=1e-9, abs=1e-10)
    np.testing.assert_allclose(cal.weight_.numpy().ravel(), res.x[:k * k], atol=1e-4)
    q = torch.softmax(torch.log_softmax(z, 1) @ cal.weight_.T + cal.bias_, 1)
    torch.testing.assert_close(cal.predict_proba(z), q)


def test_dirichlet_cross_validation_picks_the_lowest_held_out_nll():
    g = torch.Generator().manual_seed(4)
    z = _draw(g, 900, 5)
    y = _labels(g, 3 * z[:, [1, 2, 3, 4, 0]])  # the labels follow the *next* class: W needs off-diagonals
    cal = DirichletCalibration(lambdas=(1e3, 1.0), mus=(1e3, 0.01)).fit(z, y)
    assert len(cal.cv_nll_) == 4
    best = min(cal.cv_nll_, key=cal.cv_nll_.get)
    assert best == f"{cal.lam_!r},{cal.mu_!r}" and cal.lam_ == 1.0
    assert cal.cv_nll_["1000.0,1000.0"] > cal.cv_nll_[best] + 0.1
    tied = DirichletCalibration(lambdas=(10.0, 0.1)).fit(z, y)  # mus=None: mu = lam
    assert sorted(tied.cv_nll_) == ["0.1,0.1", "10.0,10.0"]
    assert DirichletCalibration(lambdas=(1.0, 1.0)).fit(z, y).lam_ == 1.0  # a tie goes to the first pair


def test_dirichlet_bad_hyperparameters():
    z = torch.randn(20, 3, dtype=torch.float64)
    y = torch.arange(20) % 3
    with pytest.raises(ValueError, match="lambdas must be a non-empty tuple"):
        DirichletCalibration(lambdas=()).fit(z, y)
    with pytest.raises(ValueError, match="mus must be a non-empty tuple"):
        DirichletCalibration(mus=(-1.0,)).fit(z, y)
    with pytest.raises(ValueError, match="n_folds must be an integer >= 2"):
        DirichletCalibration(n_folds=1).fit(z, y)
    with pytest.raises(ValueError, match="at least n_folds = 3 validation samples"):
        DirichletCalibration().fit(z[:2], y[:2])
    with pytest.raises(ValueError, match="max_iter must be an integer >= 1"):
        VectorScaling(max_iter=0).fit(z, y)


def test_dirichlet_memory_stays_linear_in_n():
    # W log p is an (N, K) product: the autograd graph of one objective holds O(N K + K^2) floats
    from calibkit.calibrators.scaling import odir_objective

    n, k = 2000, 50
    x = torch.randn(n, k, dtype=torch.float64)
    w = torch.eye(k, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(k, dtype=torch.float64, requires_grad=True)
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        odir_objective(x, torch.zeros(n, dtype=torch.long), w, b, 1.0, 1.0).backward()
    assert max(sizes) <= n * k  # never an (N, K, K) tensor


def test_dirichlet_keeps_a_class_absent_from_the_fit_above_zero_and_reachable():
    """Class 2 of 3 has no validation row. Its unpenalised diagonal entry used to grow without bound
    and give exact zeros at the default settings; its row of W is now held at temperature scaling's."""
    from scipy.optimize import minimize_scalar

    g = torch.Generator().manual_seed(0)
    z = 2 * torch.randn(200, 3, generator=g, dtype=torch.float64)
    y = _labels(g, z)
    keep = y != 2
    zv, yv = z[keep], y[keep]
    zt = 2 * torch.randn(300, 3, generator=g, dtype=torch.float64)
    zt[:100, 2] += 30.0  # the model is sure of class 2 on these rows (softmax still > 0 everywhere)
    assert bool((torch.softmax(zt, 1) > 0).all())
    with pytest.warns(UserWarning, match="class 2"):
        cal = DirichletCalibration().fit(zv, yv)
    for logits in (zt, zt.float()):
        q = cal.predict_proba(logits)
        assert bool((q > 0).all()), int((q == 0).sum())
    x = torch.log_softmax(zv, 1)  # the temperature of these rows, fitted here by scipy
    u = minimize_scalar(lambda a: float(torch.nn.functional.cross_entropy(x * np.exp(-a), yv)), bounds=(-5, 5),
                        method="bounded", options={"xatol": 1e-10}).x
    torch.testing.assert_close(cal.weight_[2], torch.tensor([0.0, 0.0, np.exp(-u)], dtype=torch.float64),
                               atol=1e-6, rtol=0)
    assert bool((cal.predict_proba(zt[:100]).argmax(1) == 2).all())  # reachable where the model is sure of it
