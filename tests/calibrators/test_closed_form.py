"""The closed-form NLL gradients of the affine maps' fits and the preconditioned L-BFGS, against
autograd (an independent derivation of the same derivatives) and an exactly solvable quadratic."""

import pytest
import torch

from calibkit.calibrators import scaling
from calibkit.calibrators._base import lbfgs, lbfgs_ftol
from calibkit.calibrators._softmax import nll_grad, softmax_curvature
from calibkit.calibrators.structured import StructuredMatrixScaling, StructuredVectorScaling


def _rows(seed, n=60, k=6, absent=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, k, generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, k if absent is None else k - 1, (n,), generator=g)
    return x, y, g


def _autograd(fn, p):
    p = p.clone().requires_grad_(True)
    f = fn(p)
    (g,) = torch.autograd.grad(f, p)
    return float(f.detach()), g


def test_nll_grad_and_curvature_against_autograd():
    x, y, _ = _rows(0)
    f, g = nll_grad(x, y)
    fa, ga = _autograd(lambda z: torch.nn.functional.cross_entropy(z.view_as(x), y), x.reshape(-1))
    assert float(f) == pytest.approx(fa, rel=1e-14)
    torch.testing.assert_close(g.reshape(-1), ga, rtol=0, atol=1e-16)
    # the Hessian of the mean NLL in one row's logits is (diag(p) - p p^T) / N
    h = torch.autograd.functional.hessian(lambda z: torch.nn.functional.cross_entropy(z[None], y[:1]) / len(y), x[0])
    torch.testing.assert_close(softmax_curvature(x)[0], h.diagonal(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("cls", [StructuredVectorScaling, StructuredMatrixScaling])
def test_structured_value_grad_and_hessian_diagonal(cls):
    x, y, g = _rows(1)
    k = x.shape[1]
    reg = {"intercept": 0.3, "diagonal": 0.05, "off_diagonal": 0.7}  # unequal, so each term is checked
    p = torch.randn(cls._n_params(k), generator=g, dtype=torch.float64) * 0.3
    objective = lambda q: cls()._objective(x, y, q, k, reg)  # noqa: E731
    f, grad = cls._value_grad(x, y, p, k, reg)
    fa, ga = _autograd(objective, p)
    assert float(f) == pytest.approx(fa, rel=1e-14)
    torch.testing.assert_close(grad, ga, rtol=0, atol=1e-15)
    hess = torch.autograd.functional.hessian(objective, p)
    torch.testing.assert_close(cls._curvature(x, p, k, reg), hess.diagonal(), rtol=1e-12, atol=1e-14)


def _handed(monkeypatch) -> list:
    """Records the function and keywords each L-BFGS run of ``scaling`` is given (and runs none)."""
    seen = []
    monkeypatch.setattr(scaling, "lbfgs", lambda fn, x0, *a, **kw: (seen.append((fn, kw)), (x0, 0))[1])
    return seen


def _same_value_and_grad(fn, kw, reference, p):
    assert kw.get("closed_form") is True
    f, grad = fn(p)
    fa, ga = _autograd(reference, p)
    assert float(f) == pytest.approx(fa, rel=1e-14)
    torch.testing.assert_close(grad, ga, rtol=0, atol=1e-15)
    return grad


@pytest.mark.parametrize("absent", [None, 5])
def test_odir_gradient_against_autograd(absent, monkeypatch):
    """The function Dirichlet calibration hands to L-BFGS (rows of an absent class held) against
    autograd of ``odir_objective``; a held row gets no gradient."""
    x, y, g = _rows(2, absent=absent)
    k = x.shape[1]
    seen = _handed(monkeypatch)
    pinned = scaling._pinned_rows(x, y)
    assert (pinned is None) == (absent is None)
    p0 = torch.randn(k * k + k, generator=g, dtype=torch.float64) * 0.3
    scaling._fit_affine(x, y, 3.0, 2.0, 10, p0, pinned)
    held = torch.zeros(k, dtype=torch.bool) if pinned is None else ~torch.isnan(pinned[:, 0])
    base = torch.zeros(k, k, dtype=torch.float64) if pinned is None else pinned.nan_to_num()

    def reference(p):
        w = torch.where(held[:, None], base, p[:k * k].view(k, k))
        return scaling.odir_objective(x, y, w, p[k * k:], 3.0, 2.0)

    grad = _same_value_and_grad(*seen[0], reference, p0)
    assert torch.all(grad[:k * k].view(k, k)[held] == 0)


def test_vector_scaling_gradient_against_autograd(monkeypatch):
    x, y, g = _rows(3)
    k = x.shape[1]
    seen = _handed(monkeypatch)
    scaling.VectorScaling().fit(x, y)
    p = torch.randn(2 * k, generator=g, dtype=torch.float64)
    _same_value_and_grad(*seen[0], lambda q: torch.nn.functional.cross_entropy(x * q[:k] + q[k:], y), p)


def test_preconditioned_lbfgs_on_a_badly_scaled_quadratic():
    """``f = 1/2 sum a_i (x_i - c_i)^2`` with scales ``a`` over six orders: the minimiser is ``c``;
    the diagonal ``a`` as preconditioner reaches it (stopping rule unchanged: largest gradient
    entry 1e-7) in far fewer iterations than the plain iteration."""
    g = torch.Generator().manual_seed(3)
    a = 10 ** torch.linspace(-3, 3, 200, dtype=torch.float64)
    c = torch.randn(200, generator=g, dtype=torch.float64)

    def value_grad(x):
        return 0.5 * float((a * (x - c) ** 2).sum()), a * (x - c)

    x0 = torch.zeros(200, dtype=torch.float64)
    plain, n_plain = lbfgs(value_grad, x0, 5000, closed_form=True)
    pre, n_pre = lbfgs(value_grad, x0, 5000, closed_form=True, precondition=a)
    assert float((a * (pre - c)).abs().max()) <= 1e-7  # the stopping rule, on the gradient itself
    torch.testing.assert_close(pre, c, rtol=0, atol=1e-7 / 1e-3)
    # diag(1 / a) is the exact inverse Hessian: the first scaled step and one more reach c; the plain
    # iteration stops on its relative-drop rule before the gradient is that small
    assert n_pre <= 3 < n_plain
    assert float((a * (plain - c)).abs().max()) > 1e-7


def test_closed_form_and_autograd_give_the_same_iterates():
    """``closed_form`` only changes how the gradient is computed: the same path to rounding."""
    x, y, _ = _rows(4, n=200)
    k = x.shape[1]
    x0 = torch.zeros(2 * k, dtype=torch.float64)
    auto, n_auto = lbfgs(lambda p: torch.nn.functional.cross_entropy(x * p[:k] + p[k:], y), x0, 8)
    closed, n_closed = lbfgs(lambda p: (lambda f, g: (f, torch.cat([(g * x).sum(0), g.sum(0)])))(
        *nll_grad(x * p[:k] + p[k:], y)), x0, 8, closed_form=True)
    assert n_auto == n_closed == 8  # neither stopped early
    torch.testing.assert_close(closed, auto, rtol=0, atol=1e-10)


def test_lbfgs_relative_drop_stop_is_set_by_its_argument_or_the_block():
    """``ftol``: L-BFGS stops at the first iteration whose relative drop of the loss is at most
    ``ftol``; :func:`lbfgs_ftol` sets the default within its block only (``1e-12`` outside)."""
    a = 10 ** torch.linspace(-3, 0, 50, dtype=torch.float64)  # ill-conditioned: slow, shrinking drops

    def value_grad(x):
        return 0.5 * float((a * (x - 1) ** 2).sum()) + 1.0, a * (x - 1)

    x0 = torch.zeros(50, dtype=torch.float64)
    full, n_full = lbfgs(value_grad, x0, 5000, closed_form=True)
    loose, n_loose = lbfgs(value_grad, x0, 5000, closed_form=True, ftol=1e-4)
    assert 1 < n_loose < n_full
    # the same path cut short: the full-stop run capped at n_loose iterations, and the losses of the
    # capped runs show the rule (every drop before the last above 1e-4 relative, the last not)
    capped, _ = lbfgs(value_grad, x0, n_loose, closed_form=True)
    assert torch.equal(capped, loose)
    f = [value_grad(lbfgs(value_grad, x0, j, closed_form=True)[0])[0] if j else value_grad(x0)[0]
         for j in range(n_loose + 1)]
    assert all(f[j - 1] - f[j] > 1e-4 * max(1.0, f[j]) for j in range(1, n_loose))
    assert f[n_loose - 1] - f[n_loose] <= 1e-4 * max(1.0, f[n_loose])
    with lbfgs_ftol(1e-4):
        same, n_same = lbfgs(value_grad, x0, 5000, closed_form=True)
    assert n_same == n_loose and torch.equal(same, loose)
    again, n_again = lbfgs(value_grad, x0, 5000, closed_form=True)  # outside the block: 1e-12 again
    assert n_again == n_full and torch.equal(again, full)
    with lbfgs_ftol(1e-4):  # an explicit argument wins over the block
        explicit, n_explicit = lbfgs(value_grad, x0, 5000, closed_form=True, ftol=1e-12)
    assert n_explicit == n_full and torch.equal(explicit, full)
