"""What the top-label calibrators (spline, top-label histogram binning) and the binning family share:
turning a recalibrated top-class probability into a full row, and the probability floor.

**Spreading** (:func:`spread_top`): the top class gets ``q_top``, and the other classes share
``1 - q_top`` in proportion to their probabilities, **mixed with the uniform share**
``1 / (K - 1)`` just enough that none reaches ``q_top``: with ``m = p_2 / (1 - c)`` the runner-up's
share, the mixing weight is the smallest ``alpha`` in ``[0, 1]`` with
``(1 - q_top) ((1 - alpha) m + alpha / (K - 1)) <= q_top / (1 + 1e-6)`` (0 where the proportional
shares already stay below; the margin ``1 + 1e-6`` survives float32 rounding), so the prediction
never changes and the order of the other classes is kept. Where ``q_top`` is below
``1 / (1 + (K - 1) / (1 + 1e-6))`` (just above ``1 / K``), where no distribution keeps the top
class first, it is raised to that value. A row whose top two probabilities already tie keeps its
own probabilities.

**Floor** (:func:`floor_rows`): ``q' = max(q, floor) / sum_j max(q_j, floor)``. It keeps every
probability at least ``floor / (1 + K floor)`` (never an exact 0, so the NLL stays finite), keeps
the order of the classes within a row (ties at the floor aside) and so the prediction, and moves a
row by at most ``K floor`` in total variation. ``floor = 0`` leaves the rows as they are.
"""

from __future__ import annotations

import math

import torch

from calibkit.errors import UserError

__all__ = ["DEFAULT_FLOOR", "check_floor", "floor_rows", "spread_top"]

#: The binning family's default probability floor (docs/calibrators.md, "No exact zeros").
DEFAULT_FLOOR = 1e-6

_MARGIN = 1e-6  # the other classes stay below q_top / (1 + _MARGIN): strictly below, also in float32


def check_floor(floor) -> None:
    """Refuse a floor that is not a number in ``[0, 0.01]``."""
    ok = not isinstance(floor, bool) and isinstance(floor, (int, float)) and math.isfinite(floor)
    if not (ok and 0 <= floor <= 0.01):
        raise UserError(f"floor must be a number in [0, 0.01] (the least probability before renormalising; "
                        f"0 allows exact zeros), got {floor!r}")


def floor_rows(q: torch.Tensor, floor: float) -> torch.Tensor:
    """Rows of ``q`` ``(N, K)`` floored at ``floor`` and renormalised (module docstring)."""
    if floor <= 0:
        return q
    q = q.clamp(min=floor)
    return q / q.sum(1, keepdim=True)


def spread_top(p: torch.Tensor, q_top: torch.Tensor) -> torch.Tensor:
    """Rows ``(N, K)`` whose top class (of ``p``) gets ``q_top`` ``(N,)`` and the others the rest
    (module docstring)."""
    k = p.shape[1]
    top2, idx = p.topk(2, dim=1)
    c, p2 = top2[:, 0], top2[:, 1]
    others = p.scatter(1, idx[:, :1], 0.0)
    rest = others.sum(1)  # 1 - c, summed from the entries so that the shares add up exactly
    q = q_top.clamp(0, 1).clamp(min=1 / (1 + (k - 1) / (1 + _MARGIN)))  # the least q_top that can stay first
    cap = q / (1 + _MARGIN)  # every other class stays at or below this
    u = 1.0 / (k - 1)
    share = torch.where(rest[:, None] > 0, others / torch.where(rest > 0, rest, 1.0)[:, None],
                        torch.full_like(p, u))
    m = torch.where(rest > 0, p2 / torch.where(rest > 0, rest, 1.0), torch.full_like(rest, u))  # largest share
    over = (1 - q) * m - cap  # > 0: the runner-up's proportional share would reach q_top
    alpha = torch.where((over > 0) & (m > u), over / ((1 - q) * (m - u)).clamp(min=1e-300), 0.0).clamp(0, 1)
    out = (1 - q)[:, None] * ((1 - alpha)[:, None] * share + alpha[:, None] * u)
    out = out.scatter(1, idx[:, :1], q[:, None])
    return torch.where((c > p2)[:, None], out, p)  # an input tie keeps its own probabilities
