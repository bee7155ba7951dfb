"""Structured vector and matrix scaling (SVS, SMS; Berta, Holzmueller, Jordan and Bach, "Structured
matrix scaling for multi-class calibration", 2025), as defined by the authors' ``probmetrics``
package (``SVSCalibrator``, ``SMSCalibrator`` with their defaults: ridge penalty, ``rho = tau = 1``,
every ``lambda = 1``).

1. **Preprocessing** ("ts-mix"): temperature scaling ``T`` fitted by NLL on the validation rows
   (calibkit's TS solver, ``T`` in ``[0.01, 100]``), then the mixture with the uniform
   distribution ``r = (1 - eps) softmax(z / T) + eps / K``, ``eps = 1 / (N + 1)``, and the
   features ``x = log r``. The global scale of the paper's ``a I`` is thereby fixed to ``a = 1``.
2. **Map**: SVS ``q = softmax((1 + v) * x + b)`` (one scale and bias per class); SMS
   ``q = softmax((I + D) x + b)`` with a full ``K x K`` matrix ``D``.
3. **Fit**: mean NLL plus ridge penalties centred on the identity map:
   ``l_b |b|^2 + l_d |v|^2`` (SVS) or ``l_b |b|^2 + l_d sum_k D_kk^2 + l_o sum_{j != k} D_jk^2``
   (SMS), with ``l_b = lambda_intercept K / N``, ``l_d = lambda_diagonal K / N`` and
   ``l_o = lambda_off_diagonal K (K - 1) / N`` (``N``, ``K``: the validation rows and classes passed
   to ``fit``). The strengths are thus **set by the size of the validation set, not searched**: no
   cross-validation, nothing but the rows passed to ``fit`` enters. The objective is strictly
   convex; calibkit minimises it with its L-BFGS (:func:`calibkit.calibrators._base.lbfgs`) from
   the identity map (``v = 0``, ``D = 0``, ``b = 0``), float64, on the logits' device.

Warm start: ``fit(z, y, init=fitted)`` ignores ``fitted`` (every fit starts from the identity).
The start is already close to the solution (the strengths keep the map near the identity): on 3,000
rows at K = 4, SMS started from the fit on all rows took 41 iterations against 38 from the
identity, so a warm start saves nothing, while a start fitted on all validation rows would carry
each held-out fold into a cross-fitted fit that stops at ``max_iter``. Binary ``(N,)`` scores are
fitted as the two-class logits ``(0, z)`` with the same definition (``probmetrics`` uses other
maps for binary problems).
"""

from __future__ import annotations

import math
import warnings

import torch

from calibkit.calibrators._base import Calibrator, lbfgs, param_names
from calibkit.calibrators._state import state_names
from calibkit.calibrators.temperature import _fit_nll
from calibkit.errors import UserError

__all__ = ["StructuredVectorScaling", "StructuredMatrixScaling", "ts_mix_features"]


def ts_mix_features(z: torch.Tensor, temperature: float, eps: float) -> torch.Tensor:
    """``log((1 - eps) softmax(z / T) + eps / K)``, ``(N, K)``, computed in logs (finite for any ``z``)."""
    k = z.shape[1]
    log_r = torch.log_softmax(z / temperature, 1) + math.log1p(-eps)
    return torch.logaddexp(log_r, torch.full_like(log_r, math.log(eps / k)))


def _check_lambda(v, name: str) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
        raise UserError(f"{name} must be a finite number >= 0, got {v!r}")


class _Structured(Calibrator):
    """What SVS and SMS share: the preprocessing, the strengths, the L-BFGS fit."""

    lambda_intercept: float  # set by each subclass's __init__
    lambda_diagonal: float

    def _check_params(self):
        for name in param_names(type(self)):
            if name.startswith("lambda_"):
                _check_lambda(getattr(self, name), name)
        if isinstance(self.max_iter, bool) or not isinstance(self.max_iter, int) or self.max_iter < 1:
            raise UserError(f"max_iter must be an integer >= 1, got {self.max_iter!r}")

    def _prepare(self, z, y) -> torch.Tensor:
        n, k = z.shape
        with warnings.catch_warnings():  # T at a bound: the map fitted next absorbs what T lacks
            warnings.simplefilter("ignore")
            self.temperature_ = _fit_nll(z, y, 1e-2, 1e2)[0]
        self.mix_ = 1.0 / (n + 1)
        self.reg_ = {"intercept": self.lambda_intercept * k / n, "diagonal": self.lambda_diagonal * k / n}
        if hasattr(self, "lambda_off_diagonal"):
            self.reg_["off_diagonal"] = self.lambda_off_diagonal * k * (k - 1) / n
        return ts_mix_features(z, self.temperature_, self.mix_)

    def _fit(self, z, y):
        k = z.shape[1]
        self._fit_at(z, y, torch.zeros(self._n_params(k), dtype=z.dtype, device=z.device))

    def _fit_at(self, z, y, x0):
        x = self._prepare(z, y)
        k = z.shape[1]
        p, self.n_iter_ = lbfgs(lambda q: self._objective(x, y, q, k), x0, self.max_iter)
        self._store(p, k)

    def _predict(self, z):
        return torch.softmax(self._map(ts_mix_features(z, self.temperature_, self.mix_)), 1)


class StructuredVectorScaling(_Structured):
    """Structured vector scaling (SVS): ``q = softmax((1 + v) * x + b)`` on the ts-mix features
    ``x`` (module docstring), fitted by NLL ``+ (lambda_intercept K / N) |b|^2
    + (lambda_diagonal K / N) |v|^2``.

    Args:
        lambda_intercept, lambda_diagonal: multipliers of the ridge strengths (default 1, as
            ``probmetrics``).
        max_iter: L-BFGS iterations (default 100).

    Attributes:
        temperature_: the preprocessing's ``T``; ``mix_``: its ``eps = 1 / (N + 1)``.
        weight_: ``(K,)`` float64, ``1 + v``; ``bias_``: ``(K,)``.
        reg_: ``{"intercept": l_b, "diagonal": l_d}``, the strengths used.
        n_iter_: L-BFGS iterations run.
    """

    _STATE = state_names("svs")

    def __init__(self, lambda_intercept: float = 1.0, lambda_diagonal: float = 1.0, max_iter: int = 100):
        self.lambda_intercept = lambda_intercept
        self.lambda_diagonal = lambda_diagonal
        self.max_iter = max_iter

    @staticmethod
    def _n_params(k):
        return 2 * k

    def _objective(self, x, y, p, k):
        v, b = p[:k], p[k:]
        nll = torch.nn.functional.cross_entropy(x * (1 + v) + b, y)
        return nll + self.reg_["intercept"] * (b * b).sum() + self.reg_["diagonal"] * (v * v).sum()

    def _store(self, p, k):
        self.weight_, self.bias_ = 1 + p[:k].clone(), p[k:].clone()

    def _map(self, x):
        return x * self.weight_ + self.bias_


class StructuredMatrixScaling(_Structured):
    """Structured matrix scaling (SMS): ``q = softmax((I + D) x + b)`` on the ts-mix features ``x``
    (module docstring), fitted by NLL ``+ (lambda_intercept K / N) |b|^2 + (lambda_diagonal K / N)
    sum_k D_kk^2 + (lambda_off_diagonal K (K - 1) / N) sum_{j != k} D_jk^2``.

    The off-diagonal strength grows with ``K^2``: at K = 100 and N = 5,000 it is about 2 per entry
    against 0.02 for the diagonal, so the ``K^2 - K`` cross-class terms move away from 0 only where
    the validation set holds strong evidence, and the map stays close to SVS otherwise. Cost per
    L-BFGS iteration ``O(N K^2)`` (the product ``x @ (I + D).T``; no ``(N, K, K)`` tensor).

    Args:
        lambda_intercept, lambda_diagonal, lambda_off_diagonal: multipliers of the ridge strengths
            (default 1, as ``probmetrics``).
        max_iter: L-BFGS iterations (default 1000: a safeguard only, the fit runs to the solver's
            tolerance, a largest gradient entry of ``1e-7`` or a relative drop under ``1e-12``;
            the former cap of 30 stopped 1e-4 to 3e-4 above the optimum at K = 10 and flipped
            0.15-0.54% of the predictions against the converged fit; fit times before and after:
            ``benchmarks/sms_convergence.py``, ``docs/calibrators.md``).

    Attributes:
        temperature_, mix_: the preprocessing's ``T`` and ``eps``.
        weight_: ``(K, K)`` float64, ``I + D``; ``bias_``: ``(K,)``.
        reg_: ``{"intercept": l_b, "diagonal": l_d, "off_diagonal": l_o}``, the strengths used.
        n_iter_: L-BFGS iterations run.
    """

    _STATE = state_names("sms")

    def __init__(self, lambda_intercept: float = 1.0, lambda_diagonal: float = 1.0, lambda_off_diagonal: float = 1.0,
                 max_iter: int = 1000):
        self.lambda_intercept = lambda_intercept
        self.lambda_diagonal = lambda_diagonal
        self.lambda_off_diagonal = lambda_off_diagonal
        self.max_iter = max_iter

    @staticmethod
    def _n_params(k):
        return k * k + k

    def _objective(self, x, y, p, k):
        d, b = p[:k * k].view(k, k), p[k * k:]
        diag = torch.diagonal(d)
        nll = torch.nn.functional.cross_entropy(x + x @ d.T + b, y)
        off = (d * d).sum() - (diag * diag).sum()
        return (nll + self.reg_["intercept"] * (b * b).sum() + self.reg_["diagonal"] * (diag * diag).sum()
                + self.reg_["off_diagonal"] * off)

    def _store(self, p, k):
        self.weight_ = torch.eye(k, dtype=p.dtype, device=p.device) + p[:k * k].view(k, k)
        self.bias_ = p[k * k:].clone()

    def _map(self, x):
        return x @ self.weight_.T + self.bias_
