"""Affine maps fitted by NLL: vector scaling, matrix scaling (Guo et al., 2017) and Dirichlet
calibration with ODIR (Kull et al., 2019).

All three minimise the mean negative log-likelihood of ``softmax(a(x))`` on the validation set
with L-BFGS (:func:`calibkit.calibrators._base.lbfgs`, float64), starting from the
temperature-scaling solution (``W = I / T``, ``b = 0`` with ``T`` fitted by NLL on the same rows:
``softmax(log p / T) = softmax(z / T)``), so that a fit capped at ``max_iter`` iterations is never
worse than temperature scaling on the rows it was fitted on. The logits of the
map are ``X @ W.T + b``, an ``(N, K)`` matrix: no ``(N, K, K)`` tensor is ever formed (memory
``O(K^2 + N K)``).

Warm starts: ``fit(z, y, init=fitted)`` (``fitted`` of the same class, ``K`` and layout) starts
L-BFGS from ``fitted``'s ``(W, b)`` instead of the temperature-scaling solution for vector
scaling and Dirichlet calibration (which also reuses its ``(lam, mu)``: see the class); matrix
scaling ignores it (see the class). Where the fit converges (the largest gradient entry at most
``1e-7``, or a relative decrease below ``1e-12``, before ``max_iter``) the start changes only the
number of iterations, not the solution beyond the optimiser's tolerance. Where it stops at
``max_iter`` the result depends on the start, and a start fitted on all the validation rows
carries each held-out fold of a cross-fitting into the fit scored on it: measured on 5,000 rows
of real outputs, the 5-fold cross-fitted NLL moves by at most 1e-5 for vector scaling and 5e-4
(upwards, ``init``'s ``(lam, mu)`` included) for Dirichlet calibration, against 0.69 (downwards)
for matrix scaling at K = 100.

Cross-fitting's fold fits of these three keep the stop above: the looser relative-decrease stop
of the structured maps' fold fits (``calibkit.calibrators.folds.FOLD_FTOL``) is not applied to
fits whose iteration cap is part of their result (on MNIST it moved Dirichlet calibration's
cross-fitted NLL by 0.003 and changed the chosen calibrator; ``docs/calibrators.md``, "Speed").

Binary ``(N,)`` scores are fitted as the two-class logits ``(0, z)``: vector and matrix scaling
then reduce to Platt scaling ``sigmoid(a z + c)``, Dirichlet calibration to beta calibration
``sigmoid(a log p - c' log(1 - p) + d)`` (Kull et al., 2017).
"""

from __future__ import annotations

import warnings

import torch

from calibkit.calibrators._base import Calibrator, lbfgs
from calibkit.calibrators._softmax import nll_grad
from calibkit.calibrators._state import state_names
from calibkit.calibrators.temperature import _fit_nll
from calibkit.errors import UserError

__all__ = ["VectorScaling", "MatrixScaling", "DirichletCalibration", "odir_objective"]


def _check_max_iter(max_iter, name: str = "max_iter") -> None:
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise UserError(f"{name} must be an integer >= 1, got {max_iter!r}")


def _nll(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits, y)


class _AffineScaling(Calibrator):
    """What vector and matrix scaling share: one parameter (``max_iter``), a weight and a bias."""

    _STATE = state_names("vector")  # matrix's fields too

    def __init__(self, max_iter: int = 100):
        self.max_iter = max_iter

    def _check_params(self):
        _check_max_iter(self.max_iter)


class VectorScaling(_AffineScaling):
    """Vector scaling: ``q = softmax(w * z + b)`` with one weight ``w_k`` and bias ``b_k`` per class
    (Guo et al., 2017), fitted by mean NLL on the validation logits.

    Args:
        max_iter: L-BFGS iterations (default 100; at N = 5,000, K = 100 the NLL after 100 is within
            1e-8 of that after 300).

    Attributes:
        weight_, bias_: ``(K,)`` float64 tensors.
        n_iter_: L-BFGS iterations run.
    """

    def _fit(self, z, y):
        k = z.shape[1]
        self._fit_at(z, y, torch.cat([torch.full((k,), 1 / _temperature(z, y), dtype=z.dtype, device=z.device),
                                      torch.zeros(k, dtype=z.dtype, device=z.device)]))

    def _fit_from(self, z, y, init):
        self._fit_at(z, y, _flat(init, z))

    def _fit_at(self, z, y, x0):
        k = z.shape[1]
        def value_grad(p):  # the mean NLL of z * w + b and its gradient (closed form)
            f, g = nll_grad(z * p[:k] + p[k:], y)
            return f, torch.cat([(g * z).sum(0), g.sum(0)])

        x, self.n_iter_ = lbfgs(value_grad, x0, self.max_iter, closed_form=True)
        self.weight_, self.bias_ = x[:k].clone(), x[k:].clone()

    def _predict(self, z):
        return torch.softmax(z * self.weight_ + self.bias_, dim=1)


class MatrixScaling(_AffineScaling):
    """Matrix scaling: ``q = softmax(W z + b)`` with a full ``(K, K)`` matrix ``W`` (Guo et al., 2017),
    fitted by mean NLL on the validation logits, without regularisation (as defined by Guo et al.).

    With ``K^2 + K`` parameters it overfits small validation sets (at K = 100 it has 10,100);
    :class:`DirichletCalibration` is the regularised alternative. On separable validation data
    the NLL has no minimum and the fit stops after ``max_iter`` iterations; the default of 100
    iterations is a cap on time (one iteration costs ``O(N K^2)``) and acts as early stopping.

    ``fit(..., init=fitted)`` ignores ``fitted``: every fit starts from temperature scaling. On
    real outputs the fits stop at the cap cold and warm alike (100 of 100 iterations on CIFAR-10
    and CIFAR-100 WRN-16-4, 5,000 rows), so a warm start saves no time; and since the result then
    depends on the start, a start fitted on all validation rows leaks each held-out fold into
    the fit scored on it: the 5-fold cross-fitted NLL on CIFAR-100 drops from 2.13 (cold) to 1.44
    (warm), an artefact of the start, not a better calibrator.

    Args:
        max_iter: L-BFGS iterations (default 100).

    Attributes:
        weight_: ``(K, K)`` float64 tensor.
        bias_: ``(K,)``.
        n_iter_: L-BFGS iterations run.
    """

    def _fit(self, z, y):
        self.weight_, self.bias_, self.n_iter_ = _fit_affine(z, y, 0.0, 0.0, self.max_iter,
                                                             _identity(z, _temperature(z, y)))

    def _predict(self, z):
        return torch.softmax(z @ self.weight_.T + self.bias_, dim=1)


def _temperature(x: torch.Tensor, y: torch.Tensor) -> float:
    """The NLL temperature of ``x`` (quietly clipped to [0.01, 100]: only a starting point)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _fit_nll(x, y, 1e-2, 1e2)[0]


def _flat(init, x: torch.Tensor) -> torch.Tensor:
    """The flat start ``(W, b)`` of a warm start: a fitted ``init``'s weight and bias, as float64 on ``x``'s device."""
    return torch.cat([init.weight_.reshape(-1), init.bias_]).to(dtype=x.dtype, device=x.device)


def _identity(x: torch.Tensor, t: float = 1.0) -> torch.Tensor:
    """Flat ``(W, b) = (I / t, 0)`` for ``K = x.shape[1]``."""
    k = x.shape[1]
    return torch.cat([torch.eye(k, dtype=x.dtype, device=x.device).reshape(-1) / t,
                      torch.zeros(k, dtype=x.dtype, device=x.device)])


def odir_objective(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, lam: float,
                   mu: float) -> torch.Tensor:
    """ODIR-regularised mean NLL of ``softmax(x @ W.T + b)`` (Kull et al., 2019):

    ``mean_i -log softmax(W x_i + b)_{y_i} + lam / (K (K - 1)) * sum_{j != k} W_jk^2 + mu / K * sum_k b_k^2``.

    ``x``: ``(N, K)`` features (log-probabilities for Dirichlet calibration), ``y``: ``(N,)``.
    """
    k = x.shape[1]
    off = weight - torch.diag_embed(torch.diagonal(weight))
    reg = lam / (k * (k - 1)) * (off * off).sum() + mu / k * (bias * bias).sum()
    return _nll(x @ weight.T + bias, y) + reg


def _fit_affine(x, y, lam, mu, max_iter, x0, pinned: torch.Tensor | None = None):
    """Minimise :func:`odir_objective` over ``(W, b)`` from the flat start ``x0``; ``(W, b, n_iter)``.

    ``pinned``: ``(K, K)`` with NaN rows where ``W`` is fitted; its other rows are held at their values
    (the rows of the classes without a row in ``y``: :func:`_pinned_rows`).
    """
    k = x.shape[1]
    held = None if pinned is None else ~torch.isnan(pinned[:, 0])

    def weight(p):
        w = p[:k * k].view(k, k)
        return w if held is None else torch.where(held[:, None], pinned, w)

    def value_grad(p):  # odir_objective and its gradient in (W, b), closed form (held rows: 0)
        w, b = weight(p), p[k * k:]
        f, g = nll_grad(x @ w.T + b, y)
        off = w - torch.diag_embed(torch.diagonal(w))
        f = f + lam / (k * (k - 1)) * (off * off).sum() + mu / k * (b * b).sum()
        gw = g.T @ x + (2 * lam / (k * (k - 1))) * off
        if held is not None:
            gw[held] = 0.0
        return f, torch.cat([gw.reshape(-1), g.sum(0) + (2 * mu / k) * b])

    p, n_iter = lbfgs(value_grad, x0, max_iter, closed_form=True)
    return weight(p).clone(), p[k * k:].clone(), n_iter


def _pinned_rows(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
    """For Dirichlet calibration: ``W``'s rows held at temperature scaling's, ``e_c / T`` (``T`` fitted
    on these rows), for every class ``c`` without a row in ``y``; NaN rows elsewhere; ``None`` when
    every class has a row."""
    k = x.shape[1]
    absent = torch.bincount(y, minlength=k)[:k] == 0
    if not bool(absent.any()):
        return None
    rows = torch.full((k, k), float("nan"), dtype=x.dtype, device=x.device)
    rows[absent] = torch.eye(k, dtype=x.dtype, device=x.device)[absent] / _temperature(x, y)
    return rows


def _folds(n: int, n_folds: int, seed: int, device) -> list[torch.Tensor]:
    """``n_folds`` disjoint index sets covering ``range(n)``: a seeded permutation cut into near-equal parts."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).to(device)
    return [part.sort().values for part in perm.tensor_split(n_folds)]


class DirichletCalibration(Calibrator):
    """Dirichlet calibration with ODIR (Kull et al., 2019): ``q = softmax(W log p + b)`` with
    ``p = softmax(z)`` and a full ``(K, K)`` matrix ``W``, fitted by the ODIR objective
    (:func:`odir_objective`): mean NLL ``+ lam / (K (K - 1)) * sum of squared off-diagonal W
    + mu / K * |b|^2``.

    ``lam`` and ``mu`` are chosen by ``n_folds``-fold cross-validation **on the validation set
    only**: for every candidate pair, fit on ``n_folds - 1`` folds and score the mean NLL of the
    held-out fold; the pair with the lowest mean held-out NLL (fold NLLs weighted by fold size)
    wins, ties to the earlier pair in the grid (with the default order, the stronger
    regularisation), and the final map is refitted on the whole validation set with it.
    Candidates: when ``mus`` is ``None`` each ``lam`` is paired with ``mu = lam`` (calibkit's
    default: a one-dimensional grid, ``len(lambdas) * n_folds + 1`` fits); otherwise the full
    product ``lambdas x mus`` in row-major order. Folds: a seeded permutation (``seed``) cut into
    ``n_folds`` near-equal parts.
    Within a fold, the fits run in the grid's order (the default: strongest regularisation first),
    each started from the previous solution (a warm start; the first of each fold and the final
    refit start from the temperature-scaling solution of their rows).

    The cross-validation fits stop after ``cv_max_iter`` L-BFGS iterations, the final refit after
    ``max_iter``: the held-out NLL only has to rank the candidates, and the cost of the whole fit is
    ``O((len(grid) * n_folds * cv_max_iter + max_iter) * N K^2)``.

    Defaults: ``lambdas = (1e5, 1e4, 1e3, 100)``, ``mus = None``, ``n_folds = 3``,
    ``cv_max_iter = 25``, ``max_iter = 100``, ``seed = 0``.

    Warm start (``fit(z, y, init=fitted)``, ``fitted`` a fitted ``DirichletCalibration``): no
    cross-validation; ``lam_, mu_`` are ``fitted``'s (whatever this instance's grid), ``cv_nll_``
    is a copy of ``fitted``'s (the scores that chose them, on ``fitted``'s rows) and the single
    fit of ``max_iter`` iterations starts from ``fitted``'s ``(W, b)``: one fit instead of
    ``len(grid) * n_folds + 1``. When ``fitted`` was fitted on the whole validation set and this
    fit on some of its folds (cross-fitting), the held-out fold took part in choosing
    ``(lam, mu)``, so it influences the regularisation slightly; only validation rows are
    involved, never the test split.

    **A class without a row among those fitted** (absent from the validation labels, or from the
    training parts of a fold): the diagonal of ``W`` is not penalised, so the NLL would drive that
    class's ``W_cc`` up without bound (log p is negative) until the iterations ran out, and its
    probability to exact zeros (``W_cc`` of about 3,700 after 79 iterations on a 3-class case).
    Decision (the paper is silent): that class's row of ``W`` is held at temperature scaling's,
    ``e_c / T`` (``T`` fitted on the same rows), and only its bias is fitted (penalised by ``mu``),
    so its logit stays a finite shift of the model's own ``log p_c / T`` and the class stays
    reachable where the model is confident of it; an exact 0 then only arises where the model's own
    softmax underflows. The rows of the classes present are fitted as before.

    Attributes:
        weight_: ``(K, K)`` float64 tensor.
        bias_: ``(K,)`` float64 tensor.
        lam_, mu_: the chosen regularisation strengths.
        cv_nll_: ``{"lam,mu": mean held-out NLL}`` of every candidate (a JSON-ready dict).
        n_iter_: L-BFGS iterations of the final fit.
    """

    _STATE = state_names("dirichlet")

    def __init__(self, lambdas: tuple[float, ...] = (1e5, 1e4, 1e3, 1e2), mus: tuple[float, ...] | None = None,
                 n_folds: int = 3, cv_max_iter: int = 25, max_iter: int = 100, seed: int = 0):
        self.lambdas = lambdas
        self.mus = mus
        self.n_folds = n_folds
        self.cv_max_iter = cv_max_iter
        self.max_iter = max_iter
        self.seed = seed

    def _check_params(self):
        _check_max_iter(self.max_iter)
        _check_max_iter(self.cv_max_iter, "cv_max_iter")
        for name in ("lambdas",) + (("mus",) if self.mus is not None else ()):
            v = getattr(self, name)
            if not isinstance(v, (tuple, list)) or not v or any(isinstance(a, bool) or not isinstance(a, (int, float))
                                                                or not a >= 0 for a in v):
                raise UserError(f"{name} must be a non-empty tuple of numbers >= 0, got {v!r}")
        if isinstance(self.n_folds, bool) or not isinstance(self.n_folds, int) or self.n_folds < 2:
            raise UserError(f"n_folds must be an integer >= 2, got {self.n_folds!r}")

    def _grid(self) -> list[tuple[float, float]]:
        if self.mus is None:
            return [(float(a), float(a)) for a in self.lambdas]
        return [(float(a), float(m)) for a in self.lambdas for m in self.mus]

    def _fit(self, z, y):
        x = torch.log_softmax(z, dim=1)
        n = x.shape[0]
        if n < self.n_folds:
            raise UserError(f"DirichletCalibration needs at least n_folds = {self.n_folds} validation samples, got {n}")
        grid = self._grid()
        held = torch.zeros(len(grid), dtype=torch.float64)
        folds = _folds(n, self.n_folds, self.seed, x.device)
        for f, test_idx in enumerate(folds):
            train_idx = torch.cat([folds[j] for j in range(len(folds)) if j != f])
            start = _identity(x, _temperature(x[train_idx], y[train_idx]))
            pinned = _pinned_rows(x[train_idx], y[train_idx])
            for g, (lam, mu) in enumerate(grid):
                w, b, _ = _fit_affine(x[train_idx], y[train_idx], lam, mu, self.cv_max_iter, start, pinned)
                start = torch.cat([w.reshape(-1), b])
                held[g] += float(_nll(x[test_idx] @ w.T + b, y[test_idx])) * test_idx.numel() / n
        best = min(range(len(grid)), key=lambda i: (float(held[i]), i))
        self.lam_, self.mu_ = grid[best]
        self.cv_nll_ = {f"{lam!r},{mu!r}": float(h) for (lam, mu), h in zip(grid, held)}
        self.weight_, self.bias_, self.n_iter_ = _fit_affine(x, y, self.lam_, self.mu_, self.max_iter,
                                                             _identity(x, _temperature(x, y)), _pinned_rows(x, y))

    def _fit_from(self, z, y, init):
        """Warm start: ``init``'s ``(lam, mu)`` without cross-validation, the fit started from its map."""
        self.lam_, self.mu_ = init.lam_, init.mu_
        self.cv_nll_ = dict(init.cv_nll_)
        x = torch.log_softmax(z, dim=1)
        self.weight_, self.bias_, self.n_iter_ = _fit_affine(x, y, self.lam_, self.mu_, self.max_iter, _flat(init, z),
                                                             _pinned_rows(x, y))

    def _predict(self, z):
        return torch.softmax(torch.log_softmax(z, dim=1) @ self.weight_.T + self.bias_, dim=1)
