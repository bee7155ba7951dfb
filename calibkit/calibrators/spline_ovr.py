"""Spline calibration, one-vs-rest: Gupta et al.'s (ICLR 2021) cumulative-curve spline fitted to
each class's score instead of the top label's (the multiclass form the ``probmetrics`` benchmark
runs; calibkit's :class:`~calibkit.calibrators.spline.SplineCalibration` is the top-label one).

Per class ``k``, on the validation pairs ``(p_ik, 1[y_i = k])`` (:mod:`._ovr`), sorted by score
``c_1 <= ... <= c_N`` with targets ``a_i``: the same steps and choices as the top-label spline
(:mod:`calibkit.calibrators.spline`): the fractile ``s_i = i / N``, the cumulative gap
``(1/N) sum_{j <= i} (a_j - c_j)`` fitted by least squares in the natural cubic spline space with
``n_knots`` equally spaced knots on ``[0, 1]``, the recalibrated value ``c_i + h'(s_i)`` (tied scores
averaged into one knot), and ``g_k`` the linear interpolation of those points, constant outside the
scores' range and clipped to ``[0, 1]``. Rows: floored at ``1e-12`` and renormalised (:mod:`._ovr`);
``K = 2``: one map, of the positive class. The fractile ``i / N`` differs from the reference code's
``(i - 1) / (N - 1)`` by a factor ``(N - 1) / N`` in the derivative, and the reference does not
clip to ``[0, 1]`` before its ``1e-30`` floor (``docs/calibrators.md``).
"""

from __future__ import annotations

import torch

from calibkit.calibrators._base import Calibrator
from calibkit.calibrators._ovr import ovr_pairs, ovr_rows, run_tables
from calibkit.calibrators._state import state_names
from calibkit.calibrators.binning import interpolate
from calibkit.calibrators.spline import natural_cubic_basis
from calibkit.errors import UserError

__all__ = ["OneVsRestSplineCalibration"]


class OneVsRestSplineCalibration(Calibrator):
    """One-vs-rest spline calibration; the rule is in the module docstring.

    Args:
        n_knots: knots of each class's natural cubic spline, ``>= 2`` (default 6, the paper's).

    Attributes:
        coef_: ``(G, n_knots)`` spline coefficients in
            :func:`~calibkit.calibrators.spline.natural_cubic_basis` (``G = K``, 1 when ``K = 2``);
        knots_x_, knots_y_: ``(G, L)`` padded tables of the maps;
        n_knots_: ``(G,)`` knots per map.
    """

    _STATE = state_names("spline_ovr")

    def __init__(self, n_knots: int = 6):
        self.n_knots = n_knots

    def _check_params(self):
        if isinstance(self.n_knots, bool) or not isinstance(self.n_knots, int) or self.n_knots < 2:
            raise UserError(f"n_knots must be an integer >= 2, got {self.n_knots!r}")

    def _fit(self, z, y):
        scores, target = ovr_pairs(z, y)
        c, order = scores.sort(dim=1, stable=True)
        a = target.gather(1, order)
        n = c.shape[1]
        s = torch.arange(1, n + 1, dtype=torch.float64, device=z.device) / n
        gap = ((a - c).cumsum(1) / n).T  # (N, G)
        knots = torch.linspace(0, 1, self.n_knots, dtype=torch.float64, device=z.device)
        basis = natural_cubic_basis(s, knots)
        coef = torch.linalg.lstsq(basis.cpu(), gap.cpu(), driver="gelsd").solution.to(z.device)  # (n_knots, G)
        value = c + (natural_cubic_basis(s, knots, derivative=True) @ coef).T
        self.coef_ = coef.T.contiguous()
        self.knots_x_, self.knots_y_, self.n_knots_ = run_tables(c, value)

    def _predict(self, z):
        s, _ = ovr_pairs(z)
        g = interpolate(self.knots_x_, self.knots_y_, self.n_knots_, s).clamp(0, 1)
        return ovr_rows(g, z.shape[1])
