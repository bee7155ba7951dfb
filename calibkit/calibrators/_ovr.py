"""What the one-vs-rest calibrators of their own modules share (CIR, Venn-Abers, the one-vs-rest
spline): the per-class scores they are fitted on, and the way their per-class outputs become rows.

* **Scores.** Class ``k``'s map is fitted on the pairs ``(p_ik, 1[y_i = k])``, ``p = softmax(z)``.
  With ``K = 2`` (and the binary layout) one map is fitted, on the positive class (``G = 1``), as
  the reference implementation of these calibrators does; otherwise one per class (``G = K``).
* **Rows.** The ``G`` outputs ``g_ik`` in ``[0, 1]`` are floored at :data:`FLOOR` and the row
  renormalised, ``q_ik = max(g_ik, FLOOR) / sum_j max(g_ij, FLOOR)``, so no entry is ever exactly
  0 (a row whose maps all give 0 becomes uniform); with ``G = 1``, ``q = (1 - g, g)`` with ``g``
  clipped to ``[FLOOR, 1 - FLOOR]``. Decision: ``1e-12`` keeps a wrong zero's NLL at most
  ``-log(1e-12 / K)`` (about 30 at ``K = 100``) instead of infinite, and moves no row whose
  entries are all above it; the reference floors at ``1e-30`` (``docs/calibrators.md`` gives the
  difference this makes).
"""

from __future__ import annotations

import torch

__all__ = ["FLOOR", "n_maps", "ovr_pairs", "ovr_rows", "run_tables"]

#: The least probability a one-vs-rest calibrator outputs before its row is renormalised.
FLOOR = 1e-12


def n_maps(k: int) -> int:
    """``G``: 1 map for ``K = 2``, else ``K``."""
    return 1 if k == 2 else k


def ovr_pairs(z: torch.Tensor, y: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(scores (G, N), targets (G, N) or None)`` of float64 ``(N, K)`` logits ``z``."""
    p = torch.softmax(z, 1)
    cols = p[:, 1:] if z.shape[1] == 2 else p
    target = None
    if y is not None:
        onehot = torch.nn.functional.one_hot(y, z.shape[1]).double()
        target = (onehot[:, 1:] if z.shape[1] == 2 else onehot).T.contiguous()
    return cols.T.contiguous(), target


def ovr_rows(g: torch.Tensor, k: int) -> torch.Tensor:
    """``(N, K)`` rows of the per-map outputs ``g`` ``(G, N)`` in ``[0, 1]`` (module docstring)."""
    if k == 2:
        q = g[0].clamp(FLOOR, 1 - FLOOR)
        return torch.stack([1 - q, q], 1)
    q = g.T.clamp(min=FLOOR)
    return q / q.sum(1, keepdim=True)


def run_tables(x: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Knot tables of rows ``x`` ``(G, N)`` (each sorted ascending) with values ``v`` ``(G, N)``: tied
    ``x`` within a row become one knot whose value is their mean. Returns ``xs, ys`` ``(G, L)`` and
    ``length`` ``(G,)`` in the layout of :func:`calibkit.calibrators.binning.pav_tables` (padding
    ``x = 2``, the last value), read by :func:`calibkit.calibrators.binning.interpolate`."""
    g, n = x.shape
    dev = x.device
    new = torch.ones_like(x, dtype=torch.bool)
    new[:, 1:] = x[:, 1:] != x[:, :-1]
    run = new.long().cumsum(1) - 1  # (G, N) run index within the row
    length = run[:, -1] + 1
    width = int(length.max())
    flat = (run + torch.arange(g, device=dev)[:, None] * width).reshape(-1)
    total = torch.zeros(g * width, dtype=torch.float64, device=dev).index_add_(0, flat, v.reshape(-1).double())
    count = torch.zeros(g * width, dtype=torch.float64, device=dev).index_add_(
        0, flat, torch.ones(g * n, dtype=torch.float64, device=dev))
    xs = torch.full((g * width,), 2.0, dtype=torch.float64, device=dev)
    xs[flat] = x.reshape(-1).double()
    ys = (total / count.clamp(min=1)).view(g, width)
    xs = xs.view(g, width)
    last = ys.gather(1, (length - 1)[:, None])
    ys = torch.where(torch.arange(width, device=dev) < length[:, None], ys, last)
    return xs, ys, length
