"""Structured vector and matrix scaling (SVS, SMS; Berta, Holzmueller, Jordan and Bach, "Structured
matrix scaling for multi-class calibration", 2025), as defined by the authors' ``probmetrics``
package (``SVSCalibrator``, ``SMSCalibrator`` with their defaults: ridge penalty, ``rho = tau = 1``,
every ``lambda = 1``), with the regularisation strength chosen on the validation rows.

1. **Preprocessing** ("ts-mix"): temperature scaling ``T`` fitted by NLL on the rows being fitted
   (calibkit's TS solver, ``T`` in ``[0.01, 100]``), then the mixture with the uniform
   distribution ``r = (1 - eps) softmax(z / T) + eps / K``, ``eps = 1 / (N + 1)``, and the
   features ``x = log r``. The global scale of the paper's ``a I`` is thereby fixed to ``a = 1``.
2. **Map**: SVS ``q = softmax((1 + v) * x + b)`` (one scale and bias per class); SMS
   ``q = softmax((I + D) x + b)`` with a full ``K x K`` matrix ``D``.
3. **Fit**: mean NLL plus ridge penalties centred on the identity map:
   ``l_b |b|^2 + l_d |v|^2`` (SVS) or ``l_b |b|^2 + l_d sum_k D_kk^2 + l_o sum_{j != k} D_jk^2``
   (SMS), with ``l_b = s lambda_intercept K / N``, ``l_d = s lambda_diagonal K / N`` and
   ``l_o = s lambda_off_diagonal K (K - 1) / N`` (``N``, ``K``: the rows and classes being
   fitted). The objective is strictly convex; calibkit minimises it with its L-BFGS
   (:func:`calibkit.calibrators._base.lbfgs`), float64, on the logits' device, the gradient in
   closed form (:mod:`calibkit.calibrators._softmax`). Decision (the paper and the spec name no
   solver): the fits that run to the solver's tolerance (the final fit and a warm start) are
   preconditioned by the objective's exact Hessian diagonal at their start point (``lbfgs``'s
   ``precondition``), which changes the path, not the minimiser nor the stopping rule: on
   CIFAR-100 WRN-16-4 (5,000 rows, ``s = 1/64``, from the identity map) 212 iterations instead of
   922, to an objective 8e-10 lower. The capped fits of the search keep the plain iteration.
4. **The strength** ``s`` (``reg_scale_``): the paper describes a grid search over the strengths;
   ``probmetrics`` ships fixed multipliers (``s = 1``). calibkit chooses ``s`` by an inner
   cross-validation within ``fit``, on the rows passed to it only: a seeded permutation
   (``seed``) cut into ``n_folds`` near-equal parts (as Dirichlet calibration's); for each part,
   the preprocessing and every candidate of ``reg_grid`` are fitted on the other parts (the
   strengths with their ``N``), and the candidate's map is scored by the mean NLL of the held-out
   part; the lowest mean held-out NLL over all rows wins, ties to the earlier candidate. Decisions
   (the paper and the spec leave them open): the grid multiplies every ``lambda_*`` by one common
   factor, ``16`` to ``1/64`` by factors of 4 (:data:`REG_GRID`; on the real outputs the choice
   spans 1/64 to 16); within a part the candidates run strongest first, each started from the
   previous one's solution (warm starts along the grid), each capped at ``cv_max_iter``
   iterations (they only rank the candidates); the final fit on all rows runs to the solver's
   tolerance from the mean of the parts' solutions at the chosen ``s`` (the objective is strictly
   convex, so the start changes the iterations, not the solution). ``n_folds=0`` skips the search
   (``s = 1``, ``probmetrics``'s fixed strengths). The cost is ``len(reg_grid) * n_folds`` capped
   fits plus one full fit.

Warm start: ``fit(z, y, init=fitted)`` runs no search: it reuses ``fitted``'s ``reg_scale_`` (and
copies its ``cv_nll_``) and starts the fit from ``fitted``'s map; the fit still runs to the solver's
tolerance, so the start changes the iterations only. In cross-fitting, where ``fitted`` saw every
validation row, each held-out fold thereby took part in choosing ``s`` (validation rows only, never
the test split), as with Dirichlet calibration's ``(lam, mu)``. Cross-fitting's fold fits stop
earlier, once an iteration lowers the objective by at most ``1e-8`` relative
(``calibkit.calibrators.folds.FOLD_FTOL``; ``1e-12`` elsewhere): measured on the 8 real-outputs
models, their cross-fitted NLL moved by at most 2.0e-5 and no choice changed (``docs/calibrators.md``,
"Speed"); the fit on all the rows still runs to the solver's tolerance. Binary ``(N,)`` scores are fitted
as the two-class logits ``(0, z)`` with the same definition (``probmetrics`` uses other maps for
binary problems).
"""

from __future__ import annotations

import math
import warnings
from functools import partial

import torch

from calibkit.calibrators._base import Calibrator, lbfgs, param_names
from calibkit.calibrators._softmax import nll_grad, softmax_curvature
from calibkit.calibrators._state import state_names
from calibkit.calibrators.scaling import _folds
from calibkit.calibrators.temperature import _fit_nll
from calibkit.errors import UserError

__all__ = ["REG_GRID", "StructuredVectorScaling", "StructuredMatrixScaling", "ts_mix_features"]


def ts_mix_features(z: torch.Tensor, temperature: float, eps: float) -> torch.Tensor:
    """``log((1 - eps) softmax(z / T) + eps / K)``, ``(N, K)``, computed in logs (finite for any ``z``)."""
    k = z.shape[1]
    log_r = torch.log_softmax(z / temperature, 1) + math.log1p(-eps)
    return torch.logaddexp(log_r, torch.full_like(log_r, math.log(eps / k)))


def _check_lambda(v, name: str) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
        raise UserError(f"{name} must be a finite number >= 0, got {v!r}")


def _is_int(v, lo: int) -> bool:
    return not isinstance(v, bool) and isinstance(v, int) and v >= lo


def _floor(h: torch.Tensor) -> torch.Tensor:
    """A Hessian diagonal kept positive: entries below ``1e-10`` of the largest are raised to it."""
    return h.clamp_min(1e-10 * float(h.max()) + 1e-300)


#: The default candidates for ``s`` (``reg_scale_``, the multiplier of every ``lambda_*``): ``16`` to
#: ``1/64`` by factors of 4, strongest first.
REG_GRID = (16.0, 4.0, 1.0, 0.25, 0.0625, 0.015625)


class _Structured(Calibrator):
    """What SVS and SMS share: the preprocessing, the strengths, the inner cross-validation, the L-BFGS fit."""

    lambda_intercept: float  # set by each subclass's __init__
    lambda_diagonal: float
    reg_grid: tuple[float, ...]
    n_folds: int
    cv_max_iter: int
    max_iter: int
    seed: int

    def _check_params(self):
        for name in param_names(type(self)):
            if name.startswith("lambda_"):
                _check_lambda(getattr(self, name), name)
        for name in ("max_iter", "cv_max_iter"):
            if not _is_int(getattr(self, name), 1):
                raise UserError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if not _is_int(self.n_folds, 0) or self.n_folds == 1:
            raise UserError(f"n_folds must be 0 (no search: every lambda_* as given) or an integer >= 2, "
                            f"got {self.n_folds!r}")
        g = self.reg_grid
        if not isinstance(g, (tuple, list)) or not g or any(
                isinstance(a, bool) or not isinstance(a, (int, float)) or not (math.isfinite(a) and a > 0) for a in g):
            raise UserError(f"reg_grid must be a non-empty tuple of finite numbers > 0 (multipliers of every "
                            f"lambda_*), got {g!r}")
        if not _is_int(self.seed, 0):
            raise UserError(f"seed must be an integer >= 0, got {self.seed!r}")

    @staticmethod
    def _n_params(k: int) -> int:
        """The number of fitted parameters at ``K = k`` (each subclass gives it)."""
        raise NotImplementedError

    @staticmethod
    def _logits(x: torch.Tensor, p: torch.Tensor, k: int) -> torch.Tensor:
        """The map's logits of features ``x`` at the flat parameters ``p`` (each subclass gives it)."""
        raise NotImplementedError

    def _strengths(self, n: int, k: int, scale: float) -> dict[str, float]:
        """The ridge strengths for ``n`` rows, ``k`` classes, every ``lambda_*`` multiplied by ``scale``."""
        reg = {"intercept": scale * self.lambda_intercept * k / n, "diagonal": scale * self.lambda_diagonal * k / n}
        if hasattr(self, "lambda_off_diagonal"):
            reg["off_diagonal"] = scale * self.lambda_off_diagonal * k * (k - 1) / n
        return reg

    @staticmethod
    def _features(z, y) -> tuple[float, float, torch.Tensor]:
        """The preprocessing fitted on ``(z, y)``: ``(T, eps, x)``."""
        with warnings.catch_warnings():  # T at a bound: the map fitted next absorbs what T lacks
            warnings.simplefilter("ignore")
            temperature = _fit_nll(z, y, 1e-2, 1e2)[0]
        mix = 1.0 / (z.shape[0] + 1)
        return temperature, mix, ts_mix_features(z, temperature, mix)

    def _objective(self, x, y, p, k, reg):
        return torch.nn.functional.cross_entropy(self._logits(x, p, k), y) + self._penalty(p, k, reg)

    @classmethod
    def _value_grad(cls, x, y, p, k, reg):
        """``(objective, gradient)`` of :meth:`_objective` at ``p``, the gradient in closed form."""
        f, g = nll_grad(cls._logits(x, p, k), y)
        return f + cls._penalty(p, k, reg), cls._map_grad(x, g, p, k, reg)

    def _solve(self, x, y, reg, x0, max_iter, precondition=False):
        """L-BFGS from ``x0``; ``precondition``: with the Hessian diagonal at ``x0`` (the fits run to the
        solver's tolerance; the capped fits of the search keep the plain iteration)."""
        k = x.shape[1]
        h = self._curvature(x, x0, k, reg) if precondition else None
        return lbfgs(partial(self._value_grad, x, y, k=k, reg=reg), x0, max_iter, closed_form=True, precondition=h)

    def _choose_scale(self, z, y) -> tuple[float, dict[str, float], torch.Tensor]:
        """The ``reg_grid`` entry with the lowest held-out NLL over ``n_folds`` folds (ties: the earlier
        entry), every candidate's score, and the mean of the folds' solutions at the chosen entry."""
        n, k = z.shape
        if n < self.n_folds:
            raise UserError(f"{type(self).__name__} needs at least n_folds = {self.n_folds} validation rows for its "
                            f"search of the regularisation, got {n} (pass n_folds=0 to keep every lambda_* as given)")
        grid = [float(s) for s in self.reg_grid]
        held = [0.0] * len(grid)
        sums = torch.zeros(len(grid), self._n_params(k), dtype=z.dtype, device=z.device)
        parts = _folds(n, self.n_folds, self.seed, z.device)
        for f, test in enumerate(parts):
            train = torch.cat([parts[j] for j in range(len(parts)) if j != f])
            temperature, mix, x = self._features(z[train], y[train])
            x_test = ts_mix_features(z[test], temperature, mix)
            p = torch.zeros(self._n_params(k), dtype=z.dtype, device=z.device)
            for g, scale in enumerate(grid):  # each candidate starts from the previous one's solution
                p, _ = self._solve(x, y[train], self._strengths(train.numel(), k, scale), p, self.cv_max_iter)
                nll = torch.nn.functional.cross_entropy(self._logits(x_test, p, k), y[test])
                held[g] += float(nll) * test.numel() / n
                sums[g] += p
        best = min(range(len(grid)), key=lambda i: (held[i], i))
        return grid[best], {repr(s): h for s, h in zip(grid, held)}, sums[best] / len(parts)

    def _fit(self, z, y):
        start = torch.zeros(self._n_params(z.shape[1]), dtype=z.dtype, device=z.device)
        if self.n_folds:
            self.reg_scale_, self.cv_nll_, start = self._choose_scale(z, y)
        else:
            self.reg_scale_, self.cv_nll_ = 1.0, {}
        self._fit_final(z, y, start)

    def _fit_from(self, z, y, init):
        """Warm start: ``init``'s chosen ``reg_scale_`` without a search, the fit started from ``init``'s map."""
        self.reg_scale_, self.cv_nll_ = float(init.reg_scale_), dict(init.cv_nll_)
        self._fit_final(z, y, self._flat(init, z.shape[1]).to(dtype=z.dtype, device=z.device))

    def _fit_final(self, z, y, start):
        n, k = z.shape
        self.temperature_, self.mix_, x = self._features(z, y)
        self.reg_ = self._strengths(n, k, self.reg_scale_)
        p, self.n_iter_ = self._solve(x, y, self.reg_, start, self.max_iter, precondition=True)
        self._store(p, k)

    def _predict(self, z):
        return torch.softmax(self._map(ts_mix_features(z, self.temperature_, self.mix_)), 1)


class StructuredVectorScaling(_Structured):
    """Structured vector scaling (SVS): ``q = softmax((1 + v) * x + b)`` on the ts-mix features
    ``x`` (module docstring), fitted by NLL ``+ s (lambda_intercept K / N) |b|^2
    + s (lambda_diagonal K / N) |v|^2``, ``s`` chosen by the inner cross-validation of the module
    docstring.

    Args:
        lambda_intercept, lambda_diagonal: multipliers of the ridge strengths (default 1, as
            ``probmetrics``).
        reg_grid: the candidates for ``s``, the common multiplier of every ``lambda_*``, in the
            order they are fitted (default :data:`REG_GRID`, strongest first).
        n_folds: parts of the search (default 3); ``0`` skips it and keeps ``s = 1``.
        cv_max_iter: L-BFGS iterations of each fit of the search (default 100).
        seed: the permutation of the search's parts (default 0).
        max_iter: L-BFGS iterations of the final fit (default 100).

    Attributes:
        temperature_: the preprocessing's ``T``; ``mix_``: its ``eps = 1 / (N + 1)``.
        weight_: ``(K,)`` float64, ``1 + v``; ``bias_``: ``(K,)``.
        reg_scale_: the chosen ``s`` (1.0 with ``n_folds=0``).
        cv_nll_: ``{"s": mean held-out NLL}`` of every candidate (empty with ``n_folds=0``).
        reg_: the strengths of the final fit (``s`` included).
        n_iter_: L-BFGS iterations of the final fit.
    """

    _STATE = state_names("svs")

    def __init__(self, lambda_intercept: float = 1.0, lambda_diagonal: float = 1.0,
                 reg_grid: tuple[float, ...] = REG_GRID, n_folds: int = 3, cv_max_iter: int = 100,
                 max_iter: int = 100, seed: int = 0):
        self.lambda_intercept = lambda_intercept
        self.lambda_diagonal = lambda_diagonal
        self.reg_grid = reg_grid
        self.n_folds = n_folds
        self.cv_max_iter = cv_max_iter
        self.max_iter = max_iter
        self.seed = seed

    @staticmethod
    def _n_params(k):
        return 2 * k

    @staticmethod
    def _logits(x, p, k):
        return x * (1 + p[:k]) + p[k:]

    @staticmethod
    def _penalty(p, k, reg):
        v, b = p[:k], p[k:]
        return reg["intercept"] * (b * b).sum() + reg["diagonal"] * (v * v).sum()

    @staticmethod
    def _map_grad(x, g, p, k, reg):
        return torch.cat([(g * x).sum(0) + 2 * reg["diagonal"] * p[:k], g.sum(0) + 2 * reg["intercept"] * p[k:]])

    @classmethod
    def _curvature(cls, x, p, k, reg):
        c = softmax_curvature(cls._logits(x, p, k))
        return _floor(torch.cat([(c * x * x).sum(0) + 2 * reg["diagonal"], c.sum(0) + 2 * reg["intercept"]]))

    def _store(self, p, k):
        self.weight_, self.bias_ = 1 + p[:k].clone(), p[k:].clone()

    def _flat(self, fitted, k):
        return torch.cat([fitted.weight_ - 1, fitted.bias_])

    def _map(self, x):
        return x * self.weight_ + self.bias_


class StructuredMatrixScaling(_Structured):
    """Structured matrix scaling (SMS): ``q = softmax((I + D) x + b)`` on the ts-mix features ``x``
    (module docstring), fitted by NLL ``+ s (lambda_intercept K / N) |b|^2 + s (lambda_diagonal K / N)
    sum_k D_kk^2 + s (lambda_off_diagonal K (K - 1) / N) sum_{j != k} D_jk^2``, ``s`` chosen by the
    inner cross-validation of the module docstring.

    The off-diagonal strength grows with ``K^2``: at K = 100, N = 5,000 and ``s = 1`` it is about 2
    per entry against 0.02 for the diagonal, so the ``K^2 - K`` cross-class terms move away from 0
    only where the validation set holds strong evidence. Cost per L-BFGS iteration ``O(N K^2)``
    (the product ``x @ (I + D).T``; no ``(N, K, K)`` tensor). The weaker the chosen ``s``, the
    more iterations the final fit needs (on CIFAR-100 outputs, 5,000 rows, ``s = 1/64``: 212 with the
    preconditioning of the module docstring, 922 without).

    Args:
        lambda_intercept, lambda_diagonal, lambda_off_diagonal: multipliers of the ridge strengths
            (default 1, as ``probmetrics``).
        reg_grid: the candidates for ``s``, the common multiplier of every ``lambda_*``, in the
            order they are fitted (default :data:`REG_GRID`, strongest first).
        n_folds: parts of the search (default 3); ``0`` skips it and keeps ``s = 1``.
        cv_max_iter: L-BFGS iterations of each fit of the search (default 30).
        seed: the permutation of the search's parts (default 0).
        max_iter: L-BFGS iterations of the final fit (default 1000: a safeguard only, the fit runs to the solver's
            tolerance, a largest gradient entry of ``1e-7`` or a relative drop under ``1e-12``;
            a cap of 30 stopped 1e-4 to 3e-4 above the optimum at K = 10 and flipped 0.15-0.54%
            of the predictions against the converged fit: ``benchmarks/sms_convergence.py``).

    Attributes:
        temperature_, mix_: the preprocessing's ``T`` and ``eps``.
        weight_: ``(K, K)`` float64, ``I + D``; ``bias_``: ``(K,)``.
        reg_scale_: the chosen ``s`` (1.0 with ``n_folds=0``).
        cv_nll_: ``{"s": mean held-out NLL}`` of every candidate (empty with ``n_folds=0``).
        reg_: the strengths of the final fit (``s`` included).
        n_iter_: L-BFGS iterations of the final fit.
    """

    _STATE = state_names("sms")

    def __init__(self, lambda_intercept: float = 1.0, lambda_diagonal: float = 1.0, lambda_off_diagonal: float = 1.0,
                 reg_grid: tuple[float, ...] = REG_GRID, n_folds: int = 3, cv_max_iter: int = 30,
                 max_iter: int = 1000, seed: int = 0):
        self.lambda_intercept = lambda_intercept
        self.lambda_diagonal = lambda_diagonal
        self.lambda_off_diagonal = lambda_off_diagonal
        self.reg_grid = reg_grid
        self.n_folds = n_folds
        self.cv_max_iter = cv_max_iter
        self.max_iter = max_iter
        self.seed = seed

    @staticmethod
    def _n_params(k):
        return k * k + k

    @staticmethod
    def _logits(x, p, k):
        return x + x @ p[:k * k].view(k, k).T + p[k * k:]

    @staticmethod
    def _penalty(p, k, reg):
        d, b = p[:k * k].view(k, k), p[k * k:]
        diag = torch.diagonal(d)
        off = (d * d).sum() - (diag * diag).sum()
        return reg["intercept"] * (b * b).sum() + reg["diagonal"] * (diag * diag).sum() + reg["off_diagonal"] * off

    @staticmethod
    def _map_grad(x, g, p, k, reg):
        d = p[:k * k].view(k, k)
        gd = g.T @ x + 2 * reg["off_diagonal"] * d
        gd.diagonal().add_(2 * (reg["diagonal"] - reg["off_diagonal"]) * torch.diagonal(d))
        return torch.cat([gd.reshape(-1), g.sum(0) + 2 * reg["intercept"] * p[k * k:]])

    @classmethod
    def _curvature(cls, x, p, k, reg):
        c = softmax_curvature(cls._logits(x, p, k))
        hd = c.T @ (x * x) + 2 * reg["off_diagonal"]
        hd.diagonal().add_(2 * (reg["diagonal"] - reg["off_diagonal"]))
        return _floor(torch.cat([hd.reshape(-1), c.sum(0) + 2 * reg["intercept"]]))

    def _store(self, p, k):
        self.weight_ = torch.eye(k, dtype=p.dtype, device=p.device) + p[:k * k].view(k, k)
        self.bias_ = p[k * k:].clone()

    def _flat(self, fitted, k):
        d = fitted.weight_ - torch.eye(k, dtype=fitted.weight_.dtype, device=fitted.weight_.device)
        return torch.cat([d.reshape(-1), fitted.bias_])

    def _map(self, x):
        return x @ self.weight_.T + self.bias_
