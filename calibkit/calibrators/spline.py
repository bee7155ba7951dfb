"""Spline calibration of the top label (Gupta et al., ICLR 2021, "Calibration of neural networks
using splines").

The definition (written down from the paper and its reference code):

1. On the validation set take the top-label confidence ``c_i = max_k p_ik`` (``p = softmax(z)``)
   and the correctness ``a_i = 1[argmax_k p_ik = y_i]``; sort the samples by ``c`` (ascending).
2. Cumulative curves over the fractile ``s_i = i / N`` (``i = 1..N`` in sorted order):
   ``A(s_i) = (1/N) sum_{j <= i} a_j`` (accuracy) and ``C(s_i) = (1/N) sum_{j <= i} c_j`` (score).
   The model is calibrated when ``A = C``; the KS error is ``max_i |A(s_i) - C(s_i)|``.
3. Fit a natural cubic spline ``h`` with ``n_knots`` equally spaced knots on ``[0, 1]`` to
   ``A - C`` by least squares. Its derivative estimates the accuracy minus the score at each
   fractile, so the recalibrated score of the ``i``-th sorted sample is ``c_i + h'(s_i)``.
4. The recalibration function ``f`` interpolates the points ``(c_i, c_i + h'(s_i))`` linearly,
   is constant outside ``[c_min, c_max]`` and its values are clipped to ``[0, 1]``.

Choices the paper leaves open, and calibkit's:

* The fractile: the reference code uses ``s = linspace(0, 1, N)`` (``i / (N - 1)``), whose
  derivative scale is off by ``(N - 1) / N``; calibkit uses ``s_i = i / N``, for which the
  derivative of ``A`` is exactly the accuracy density.
* Tied confidences: their recalibrated values are averaged into one knot of ``f``.
* Spline basis: the natural cubic spline space with the given knots, spanned by the truncated-
  power basis of Hastie, Tibshirani and Friedman (ESL, eq. 5.4-5.5); the least-squares fit over
  this space is the same function as the reference code's knot-value parametrisation.
* The full distribution (the paper recalibrates the top score only): the top class gets
  ``q_top = f(c)``, the spline's own estimate, and the other classes share ``1 - q_top`` in
  proportion to their probabilities, **mixed with the uniform share** ``1 / (K - 1)`` just enough
  that none reaches ``q_top``: with ``m = p_2 / (1 - c)`` the runner-up's share, the mixing weight
  is the smallest ``alpha`` in ``[0, 1]`` with
  ``(1 - q_top) ((1 - alpha) m + alpha / (K - 1)) <= q_top / (1 + 1e-6)`` (0 where the
  proportional shares already stay below; the margin ``1 + 1e-6`` survives float32 rounding), so
  the prediction never changes and the order of the other classes is kept
  (:func:`calibkit.calibrators._toplabel.spread_top`, shared with top-label histogram binning). Only where
  ``f(c) < 1 / (1 + (K - 1) / (1 + 1e-6))`` (just above ``1 / K``), where no distribution keeps
  the top class first, is ``q_top`` raised to that value. A row whose top two probabilities
  already tie keeps its own probabilities (``q_top = c``).

  Decision, measured by ``benchmarks/spline_guard.py`` on over-confident synthetic logits: the
  earlier guard raised ``q_top`` to ``p_2 / (1 - c + p_2)`` (where the runner-up's proportional
  share would tie) and so overrode the spline on a third of the rows at K = 10 and three quarters
  at K = 100, doubling to quadrupling the test ECE; no guard at all keeps ``q_top = f(c)`` but
  hands the argmax to the runner-up on those same rows (accuracy falls, and the new top class's
  probability is not calibrated by anything). Mixing the other classes with the uniform share
  keeps both the spline's top-label estimate and the prediction.
* No exact zeros: ``f`` reaches 1 on confident validation sets (and the other classes then get 0),
  so the row is floored at ``floor`` (default 1e-6) and renormalised
  (:func:`calibkit.calibrators._toplabel.floor_rows`; order and prediction kept).
"""

from __future__ import annotations

import torch

from calibkit.calibrators._base import Calibrator
from calibkit.calibrators._state import state_names
from calibkit.calibrators._toplabel import DEFAULT_FLOOR, check_floor, floor_rows, spread_top
from calibkit.calibrators.binning import interpolate
from calibkit.errors import UserError

__all__ = ["SplineCalibration", "natural_cubic_basis"]


def natural_cubic_basis(s: torch.Tensor, knots: torch.Tensor, derivative: bool = False) -> torch.Tensor:
    """Natural cubic spline basis ``(N, m)`` at ``s`` ``(N,)`` for ``m >= 2`` increasing knots (ESL 5.4-5.5):
    ``1, s, d_j(s) - d_{m-1}(s)`` with ``d_j(s) = ((s - t_j)_+^3 - (s - t_m)_+^3) / (t_m - t_j)``;
    with ``derivative=True`` the derivatives of the same functions."""
    m = knots.numel()
    pos = (s[:, None] - knots[None, :]).clamp(min=0)  # (N, m)
    p = 3 * pos**2 if derivative else pos**3
    d = (p[:, :-1] - p[:, -1:]) / (knots[-1] - knots[:-1])  # d_1 .. d_{m-1}
    cols = [torch.zeros_like(s) if derivative else torch.ones_like(s), torch.ones_like(s) if derivative else s]
    return torch.stack(cols + [d[:, j] - d[:, m - 2] for j in range(m - 2)], 1)


class SplineCalibration(Calibrator):
    """Top-label spline calibration (Gupta et al., 2021); the definition and calibkit's choices are
    in the module docstring.

    Args:
        n_knots: knots of the natural cubic spline, ``>= 2`` (default 6, the paper's setting).
        floor: the least probability before the row is renormalised
            (:func:`~calibkit.calibrators._toplabel.floor_rows`; default 1e-6, 0 allows exact zeros).

    Attributes:
        coef_: ``(n_knots,)`` spline coefficients in :func:`natural_cubic_basis`;
        knots_x_, knots_y_: ``(1, L)`` table of the recalibration function ``f``.
        n_knots_: ``(1,)``.
    """

    _STATE = state_names("spline")

    def __init__(self, n_knots: int = 6, floor: float = DEFAULT_FLOOR):
        self.n_knots = n_knots
        self.floor = floor

    def _check_params(self):
        if isinstance(self.n_knots, bool) or not isinstance(self.n_knots, int) or self.n_knots < 2:
            raise UserError(f"n_knots must be an integer >= 2, got {self.n_knots!r}")
        check_floor(self.floor)

    def _fit(self, z, y):
        conf, pred = torch.softmax(z, 1).max(1)
        order = torch.sort(conf, stable=True).indices
        c, a = conf[order], (pred == y)[order].double()
        n = c.numel()
        s = torch.arange(1, n + 1, dtype=torch.float64, device=z.device) / n
        gap = (a.cumsum(0) - c.cumsum(0)) / n
        knots = torch.linspace(0, 1, self.n_knots, dtype=torch.float64, device=z.device)
        basis = natural_cubic_basis(s, knots)
        self.coef_ = torch.linalg.lstsq(basis.cpu(), gap.cpu()[:, None], driver="gelsd").solution[:, 0].to(z.device)
        value = c + natural_cubic_basis(s, knots, derivative=True) @ self.coef_
        new = torch.ones_like(c, dtype=torch.bool)
        new[1:] = c[1:] != c[:-1]
        run = new.cumsum(0) - 1
        runs = int(run[-1]) + 1
        total = torch.zeros(runs, dtype=torch.float64, device=z.device).index_add_(0, run, value)
        count = torch.zeros(runs, dtype=torch.float64, device=z.device).index_add_(0, run, torch.ones_like(value))
        self.knots_x_ = c[new][None, :].clone()
        self.knots_y_ = (total / count)[None, :]
        self.n_knots_ = torch.tensor([runs], device=z.device)

    def _predict(self, z):
        p = torch.softmax(z, 1)
        q = interpolate(self.knots_x_, self.knots_y_, self.n_knots_, p.max(1).values[None, :])[0]
        return floor_rows(spread_top(p, q), self.floor)
