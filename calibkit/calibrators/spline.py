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
  ``q_top = f(c)``; the other classes share ``1 - q_top`` in proportion to their probabilities
  (equally when ``c = 1``). ``q_top`` is raised where needed to at least
  ``p_2 / (1 - c + p_2)`` (``p_2`` the second-largest probability; times ``1 + 1e-6``, a margin that survives float32 rounding), the value at
  which the top class would tie with the runner-up, so the prediction never changes (a row whose
  top two probabilities already tie keeps ``q_top = c``).
"""

from __future__ import annotations

import torch

from calibkit.calibrators._base import Calibrator
from calibkit.calibrators.binning import interpolate

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

    Attributes:
        coef_: ``(n_knots,)`` spline coefficients in :func:`natural_cubic_basis`;
        knots_x_, knots_y_: ``(1, L)`` table of the recalibration function ``f``.
        n_knots_: ``(1,)``.
    """

    _PARAMS = ("n_knots",)
    _STATE = ("coef_", "knots_x_", "knots_y_", "n_knots_")

    def __init__(self, n_knots: int = 6):
        self.n_knots = n_knots

    def _check_params(self):
        if isinstance(self.n_knots, bool) or not isinstance(self.n_knots, int) or self.n_knots < 2:
            raise ValueError(f"n_knots must be an integer >= 2, got {self.n_knots!r}")

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
        top2, idx = p.topk(2, dim=1)
        c, p2 = top2[:, 0], top2[:, 1]
        others = p.scatter(1, idx[:, :1], 0.0)
        rest = others.sum(1)  # 1 - c, summed from the entries so that the shares add up exactly
        q = interpolate(self.knots_x_, self.knots_y_, self.n_knots_, c[None, :])[0].clamp(0, 1)
        den = rest + p2  # 0 only where c = 1 (then p2 = 0 and the bound is 0)
        q = torch.maximum(q, p2 / torch.where(den > 0, den, 1.0) * (1 + 1e-6))  # strictly above, also in float32
        q = torch.where(c > p2, q.clamp(max=1), c)  # an input tie keeps its own probabilities
        k = p.shape[1]
        share = torch.where(rest[:, None] > 0, others / torch.where(rest > 0, rest, 1.0)[:, None],
                            torch.full_like(p, 1.0 / (k - 1)))
        return (share * (1 - q)[:, None]).scatter(1, idx[:, :1], q[:, None])
