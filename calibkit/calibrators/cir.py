"""Centred isotonic regression, one-vs-rest (Oron and Flournoy, 2017, "Centered isotonic
regression: point and interval estimation for dose-response studies").

Isotonic regression gives a step function: flat stretches (the level sets of the pool-adjacent-
violators fit) joined by jumps. CIR keeps the fitted levels but moves each level set to one point,
at the mean of its scores, and interpolates linearly between those points, so the map is strictly
increasing between the first and last level sets instead of flat; the fit is never further from
the data than needed (the level values are the isotonic ones).

The rule, per class ``k`` on the validation pairs ``(p_ik, 1[y_i = k])`` (:mod:`._ovr`):

1. the isotonic fit (:func:`calibkit.calibrators.binning.pav_tables`; tied scores pooled first);
2. each level set (a maximal run of sorted scores with one fitted value ``v``) gives its knots:
   ``(x_mean, v)`` with ``x_mean`` the mean of its scores; the first level set also keeps
   ``(x_min, v)`` and the last ``(x_max, v)``, so that the map covers the range of the scores;
   a level set at ``v = 0`` or ``v = 1`` is not centred but keeps both ends ``(x_min, v)``,
   ``(x_max, v)`` (the paper's treatment of the boundary levels of a binary response);
3. ``g_k`` interpolates the knots linearly and is constant outside ``[x_min, x_max]``.

The rows are ``g`` floored at ``1e-12`` and renormalised (:mod:`._ovr`): the level ``v = 0`` of a
class's low scores would otherwise give exact zeros. These are the conventions of the
``cir-model`` package, which the ``probmetrics`` benchmark runs one-vs-rest
(``docs/calibrators.md`` compares the two).
"""

from __future__ import annotations

import torch

from calibkit.calibrators._base import Calibrator
from calibkit.calibrators._ovr import ovr_pairs, ovr_rows
from calibkit.calibrators._state import state_names
from calibkit.calibrators.binning import interpolate, pav_tables
from calibkit.errors import UserError

__all__ = ["CenteredIsotonicCalibration", "cir_knots"]


def cir_knots(x: torch.Tensor, v: torch.Tensor, keep_edges: bool = True) -> tuple[torch.Tensor, ...]:
    """CIR knot tables of sorted scores ``x`` ``(G, N)`` (ascending in each row) and their isotonic
    fitted values ``v`` ``(G, N)`` (step 2 of the module docstring; ``keep_edges=False`` centres the
    levels 0 and 1 as well). Returns ``xs, ys`` ``(G, L)``
    and ``length`` ``(G,)`` in the layout of :func:`~calibkit.calibrators.binning.pav_tables`."""
    g, n = x.shape
    dev = x.device
    head = torch.ones_like(x, dtype=torch.bool)
    head[:, 1:] = v[:, 1:] != v[:, :-1]
    level = (head.long().cumsum(1) - 1 + torch.arange(g, device=dev)[:, None] * n).reshape(-1)
    lv, inv = torch.unique_consecutive(level, return_inverse=True)
    n_lv = lv.numel()
    total = torch.zeros(n_lv, dtype=torch.float64, device=dev).index_add_(0, inv, x.reshape(-1))
    count = torch.zeros(n_lv, dtype=torch.float64, device=dev).index_add_(0, inv, torch.ones_like(total[inv]))
    first_at = torch.full((n_lv,), n * g, dtype=torch.long, device=dev).scatter_reduce_(
        0, inv, torch.arange(n * g, device=dev), "amin")
    last_at = torch.full((n_lv,), -1, dtype=torch.long, device=dev).scatter_reduce_(
        0, inv, torch.arange(n * g, device=dev), "amax")
    flat_x, flat_v = x.reshape(-1), v.reshape(-1)
    lo, hi, mean, val = flat_x[first_at], flat_x[last_at], total / count, flat_v[first_at]
    grp = lv // n
    first = torch.ones(n_lv, dtype=torch.bool, device=dev)
    first[1:] = grp[1:] != grp[:-1]
    last = torch.ones(n_lv, dtype=torch.bool, device=dev)
    last[:-1] = grp[1:] != grp[:-1]
    edge = ((val == 0) | (val == 1)) & keep_edges
    left = torch.where(edge | first, lo, mean)
    right = torch.where(edge | (last & ~first), hi, mean)
    px = torch.stack([left, right], 1).reshape(-1)
    py, pg = val.repeat_interleave(2), grp.repeat_interleave(2)
    keep = torch.ones_like(px, dtype=torch.bool)
    keep[1:] = (px[1:] != px[:-1]) | (py[1:] != py[:-1]) | (pg[1:] != pg[:-1])
    px, py, pg = px[keep], py[keep], pg[keep]
    length = torch.bincount(pg, minlength=g)
    width = int(length.max())
    col = torch.arange(px.numel(), device=dev) - (torch.cumsum(length, 0) - length)[pg]
    xs = torch.full((g, width), 2.0, dtype=torch.float64, device=dev)
    ys = torch.zeros((g, width), dtype=torch.float64, device=dev)
    xs[pg, col], ys[pg, col] = px, py
    lastv = ys.gather(1, (length - 1)[:, None])
    ys = torch.where(torch.arange(width, device=dev) < length[:, None], ys, lastv)
    return xs, ys, length


class CenteredIsotonicCalibration(Calibrator):
    """Centred isotonic regression (CIR), one-vs-rest; the rule is in the module docstring.

    Args:
        keep_edges: level sets at 0 or 1 keep both ends instead of being centred (default True, the
            paper's and the reference's rule).

    ``K = 2`` (and binary logits): one map, of the positive class. Outputs: rows floored at
    ``1e-12`` and renormalised (:mod:`calibkit.calibrators._ovr`).

    Attributes:
        knots_x_, knots_y_: ``(G, L)`` padded knot tables of the maps (``G = K``, 1 when ``K = 2``);
        n_knots_: ``(G,)`` knots per map.
    """

    _STATE = state_names("cir")

    def __init__(self, keep_edges: bool = True):
        self.keep_edges = keep_edges

    def _check_params(self):
        if not isinstance(self.keep_edges, bool):
            raise UserError(f"keep_edges must be True or False, got {self.keep_edges!r}")

    def _fit(self, z, y):
        s, t = ovr_pairs(z, y)
        g, n = s.shape
        group = torch.arange(g, device=z.device).repeat_interleave(n)
        tables = pav_tables(s.reshape(-1), t.reshape(-1), group, g)
        xs = s.sort(dim=1).values
        v = interpolate(*tables, xs)
        self.knots_x_, self.knots_y_, self.n_knots_ = cir_knots(xs, v, self.keep_edges)

    def _predict(self, z):
        s, _ = ovr_pairs(z)
        g = interpolate(self.knots_x_, self.knots_y_, self.n_knots_, s).clamp(0, 1)
        return ovr_rows(g, z.shape[1])
