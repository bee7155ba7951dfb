"""Ensemble temperature scaling (Zhang, Kailkhura and Han, 2020, "Mix-n-Match").

``q = w1 softmax(z / T) + w2 softmax(z) + w3 / K`` with ``w`` on the simplex; ``T`` by NLL (the
authors' code uses squared error: see :class:`EnsembleTemperatureScaling`), ``w`` by the Brier score.
"""

from __future__ import annotations

import itertools

import torch

from calibkit.calibrators._base import Calibrator
from calibkit.calibrators._state import state_names
from calibkit.calibrators.temperature import _fit_nll
from calibkit.errors import UserError

__all__ = ["EnsembleTemperatureScaling", "simplex_qp"]


def simplex_qp(gram: torch.Tensor, lin: torch.Tensor) -> torch.Tensor:
    """Exact minimiser of ``w^T G w - 2 c^T w`` over the probability simplex (``G`` PSD, small).

    The minimiser lies in the relative interior of one face of the simplex, where it is the
    minimiser of the same quadratic under ``sum(w) = 1`` alone (a KKT linear system). Every face is
    tried (7 for three weights); the feasible solution (``w >= 0``) with the lowest objective
    wins, ties to the first face in the order of ``itertools.combinations`` by size. A singular
    face system is solved by least squares (any of its minimisers has the same objective).
    """
    m = gram.shape[0]
    best: torch.Tensor | None = None
    best_val = float("inf")
    for size in range(1, m + 1):
        for face in itertools.combinations(range(m), size):
            idx = torch.tensor(face)
            g, c = gram[idx][:, idx], lin[idx]
            a = torch.zeros(size + 1, size + 1, dtype=torch.float64)
            a[:size, :size], a[:size, size], a[size, :size] = 2 * g, 1.0, 1.0
            rhs = torch.cat([2 * c, torch.ones(1, dtype=torch.float64)])
            sol = torch.linalg.lstsq(a, rhs[:, None], driver="gelsd").solution[:size, 0]
            if bool((sol < -1e-12).any()) or abs(float(sol.sum()) - 1) > 1e-9:
                continue
            w = torch.zeros(m, dtype=torch.float64)
            w[idx] = sol.clamp(min=0)
            w /= w.sum()
            val = float(w @ gram @ w - 2 * lin @ w)
            if val < best_val - 1e-15:
                best, best_val = w, val
    assert best is not None  # a face of one vertex (w = e_i) is feasible for finite G and c
    return best


class EnsembleTemperatureScaling(Calibrator):
    """Ensemble temperature scaling: ``q = w1 softmax(z / T) + w2 softmax(z) + w3 / K``.

    Fitted in two steps, as Zhang et al. (2020) do: ``T`` first, then, with ``T`` fixed, ``w`` by
    the mean squared error ``mean_i ||q_i - onehot(y_i)||^2`` (the Brier score) over the simplex
    ``w >= 0, w1 + w2 + w3 = 1``. calibkit fits ``T`` by **mean NLL** (the solver of
    :class:`~calibkit.calibrators.TemperatureScaling`, range ``t_min`` to ``t_max``). The
    authors' code (``ets_calibrate`` in ``util_calibration.py`` of
    zhang64-llnl/Mix-n-Match-Calibration) fits ``T`` by **squared error** instead (the mean over
    the ``N K`` entries of ``(softmax(z / T) - onehot(y))^2``, L-BFGS-B from 1 with ``T`` bounded
    to ``[0.05, 5]``) and ``w`` by the same squared error (the Brier score over ``K``: the same
    minimiser as here). Decision: NLL is kept for ``T``, so that ``w = (1, 0, 0)`` is exactly
    calibkit's temperature scaling (the fitted mixture's validation Brier score is never worse
    than TS's) and every temperature in calibkit comes from one solver; results can differ from
    the authors' code by the choice of ``T``. The second step is a quadratic programme
    in three variables, solved exactly (:func:`simplex_qp`) instead of by a generic constrained
    optimiser. Since ``softmax(z / T)`` and ``softmax(z)`` order the classes alike, the mixture
    keeps the argmax of ``z`` (ties aside; with ``w1 = w2 = 0`` every class ties at ``1 / K``).

    Args:
        t_min, t_max: search range of ``T`` (default 0.01 to 100).

    Attributes:
        temperature_: ``T`` (python float).
        weights_: ``(3,)`` float64 tensor ``(w1, w2, w3)``.
    """

    _STATE = state_names("ets")

    def __init__(self, t_min: float = 1e-2, t_max: float = 1e2):
        self.t_min = t_min
        self.t_max = t_max

    def _check_params(self):
        if not 0 < self.t_min < self.t_max:
            raise UserError(f"need 0 < t_min < t_max, got t_min={self.t_min}, t_max={self.t_max}")

    def _components(self, z, t):
        k = z.shape[1]
        return torch.softmax(z / t, 1), torch.softmax(z, 1), torch.full_like(z, 1.0 / k)

    def _fit(self, z, y):
        self.temperature_, _ = _fit_nll(z, y, self.t_min, self.t_max)
        comps = self._components(z, self.temperature_)
        onehot = torch.nn.functional.one_hot(y, z.shape[1]).double()
        n = z.shape[0]
        gram = torch.stack([torch.stack([(a * b).sum() for b in comps]) for a in comps]).cpu() / n
        lin = torch.stack([(a * onehot).sum() for a in comps]).cpu() / n
        self.weights_ = simplex_qp(gram, lin)

    def _predict(self, z):
        w = self.weights_.to(z.device)
        a, b, c = self._components(z, self.temperature_)
        return w[0] * a + w[1] * b + w[2] * c
