"""Inductive Venn-Abers predictors, one-vs-rest (Vovk and Petej, 2014, "Venn-Abers predictors";
Vovk, Petej and Fedorova, 2015, "Large-scale probabilistic predictors with and without guarantees
of validity").

For a test score ``s`` of class ``k``, isotonic regression is fitted twice on the validation pairs
``(p_ik, 1[y_i = k])`` (:mod:`._ovr`) with the test point added: once labelled 0, giving ``p0`` (the
fitted value at ``s``), once labelled 1, giving ``p1``; ``p0 <= p1``, and one of the two is
calibrated in the sense of Venn predictors. The point prediction is the usual merge
``p = p1 / (1 - p0 + p1)`` (the minimiser of the worse of the two log losses).

Computing it: ``p0`` and ``p1`` change only where ``s`` crosses a validation score, so both are
tabulated once per class at the ``m + 1`` insertion positions between the ``m`` distinct sorted
scores. With ``P_j = (W_j, Y_j)`` the cumulative sum diagram (``W_j`` rows and ``Y_j`` positives
among the ``j`` lowest distinct scores), inserting the test point after ``j`` of them makes the
diagram ``P_0 .. P_j`` followed by ``P_j + d .. P_m + d`` (``d = (1, 0)`` or ``(1, 1)``); the
isotonic value at the test point is the slope of the greatest convex minorant across that gap,
i.e. the common lower tangent (bridge) of the lower hulls of the two parts. The prefix and suffix
hulls of every split are kept as predecessor / successor pointers (one pass each way) and every
bridge is found by walking both hulls at once, for all positions and classes together.

Ties: a test score equal to a validation score ``c_i`` takes ``p0`` at the position after ``c_i``'s
rows and ``p1`` at the position before them (the test point is placed after its ties for the label
0 and before them for the label 1), as the ``venn-abers`` package does. Rows: ``p`` floored at
``1e-12`` and renormalised (:mod:`._ovr`); ``K = 2``: one map, of the positive class.
"""

from __future__ import annotations

import numpy as np
import torch

from calibkit.calibrators._base import Calibrator
from calibkit.calibrators._ovr import ovr_pairs, ovr_rows, run_tables
from calibkit.calibrators._state import state_names
from calibkit.errors import UserError

__all__ = ["VennAbersCalibration", "venn_abers_tables"]


def _hull_pointers(px: np.ndarray, py: np.ndarray, length: np.ndarray, forward: bool) -> np.ndarray:
    """Lower-hull pointers of the points ``(px, py)`` ``(G, M + 1)`` (row ``g``'s points ``0..length[g]``).

    ``forward``: ``out[g, j]`` is ``j``'s predecessor on the lower hull of points ``0..j`` (-1 for
    ``j = 0``); else ``j``'s successor on the lower hull of points ``j..length[g]`` (-1 at the end).
    The pointer chains are the stacks of the monotone-chain hull, one per split point.
    """
    g, width = px.shape
    out = np.full((g, width), -1, dtype=np.int64)
    rows = np.arange(g)
    steps = range(1, width) if forward else range(width - 2, -1, -1)
    for j in steps:
        if forward:
            live = j <= length
            cand = np.full(g, j - 1)
        else:
            live = j < length
            cand = np.full(g, j + 1)
        while True:
            nxt = out[rows, cand]
            has = live & (nxt >= 0)
            # cand is dropped when it does not lie strictly below the chord from its neighbour to j
            ax, ay = px[rows, nxt], py[rows, nxt]
            bx, by = px[rows, cand], py[rows, cand]
            cx, cy = px[:, j], py[:, j]
            cross = (bx - ax) * (cy - ay) - (by - ay) * (cx - ax)
            drop = has & ((cross <= 0) if forward else (cross >= 0))
            if not drop.any():
                break
            cand = np.where(drop, nxt, cand)
        out[:, j] = np.where(live, cand, -1)
    return out


def _tangents(px, py, cidx, ptr, first, forward: bool) -> np.ndarray:
    """For every point ``j`` of ``(px, py)`` ``(G, M + 1)``: its neighbour on the lower hull of itself and
    the corner points before it (``forward``) or after it, as a full index (-1: none).

    ``cidx`` ``(G, C)``: the corner points' indices (sorted, padded by repeating the last);
    ``ptr``: their hull pointers among themselves (:func:`_hull_pointers` on the corners);
    ``first`` ``(G, M + 1)``: the corner to start from (the last before ``j`` / the first after it,
    -1: none). The walk moves along the corners' hull while the slope to ``j`` improves (grows
    going back, falls going forward): the slope to ``j`` is unimodal along a convex chain.
    """
    g, width = px.shape
    n_c = cidx.shape[1]
    fx, fy = px.ravel(), py.ravel()
    fc = (cidx + np.arange(g)[:, None] * width).ravel()  # corner -> flat point index
    fptr = np.where(ptr >= 0, ptr + np.arange(g)[:, None] * n_c, -1).ravel()
    cand = np.where(first >= 0, first + np.arange(g)[:, None] * n_c, -1).ravel()
    act = np.flatnonzero(cand >= 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        while act.size:
            c = cand[act]
            nxt = fptr[c]
            ok = nxt >= 0
            act, c, nxt = act[ok], c[ok], nxt[ok]
            i0, i1 = fc[c], fc[nxt]
            s0 = (fy[act] - fy[i0]) / (fx[act] - fx[i0])
            s1 = (fy[act] - fy[i1]) / (fx[act] - fx[i1])
            move = s1 >= s0 if forward else s1 <= s0
            act = act[move]
            cand[act] = nxt[move]
    return np.where(cand >= 0, cidx.ravel()[np.maximum(cand, 0)], -1).reshape(g, width)


def _pointers(px, py, m) -> tuple[np.ndarray, np.ndarray]:
    """Prefix-hull predecessors and suffix-hull successors ``(G, M + 1)`` of every point.

    Only "corners" can be inner hull vertices: the first and last points and the points where the
    diagram turns left (the slope into the point below the slope out of it); every other point is
    on or above the chord of its neighbours. The hull pointers are built sequentially on the
    corners only (:func:`_hull_pointers`), then every point finds its tangent to the corners'
    hull before / after it (:func:`_tangents`), in parallel.
    """
    g, width = px.shape
    dx, dy = np.diff(px, axis=1), np.diff(py, axis=1)
    corner = np.zeros((g, width), dtype=bool)
    corner[:, 1:-1] = dy[:, :-1] * dx[:, 1:] < dy[:, 1:] * dx[:, :-1]
    pos = np.arange(width)
    corner[:, 0] = True
    corner |= pos[None, :] == m[:, None]
    corner &= pos[None, :] <= m[:, None]
    n_c = corner.sum(1)
    order = np.argsort(~corner, axis=1, kind="stable")[:, : n_c.max()]
    cidx = np.where(np.arange(n_c.max())[None, :] < n_c[:, None], order, m[:, None])
    rows = np.arange(g)[:, None]
    cx, cy = px[rows, cidx], py[rows, cidx]
    prev_c = _hull_pointers(cx, cy, n_c - 1, forward=True)
    succ_c = _hull_pointers(cx, cy, n_c - 1, forward=False)
    before = np.stack([np.searchsorted(cidx[i, : n_c[i]], pos, side="left") for i in range(g)]) - 1
    after = np.stack([np.searchsorted(cidx[i, : n_c[i]], pos, side="right") for i in range(g)])
    after = np.where(after < n_c[:, None], after, -1)
    prev = _tangents(px, py, cidx, prev_c, before, forward=True)
    succ = _tangents(px, py, cidx, succ_c, after, forward=False)
    return prev, succ


def _bridges(px, py, prev, succ, length, dy: float) -> np.ndarray:
    """Slopes ``(G, M + 1)`` of the bridges between ``P_0..P_j`` and ``P_j + d..P_m + d``, ``d = (1, dy)``.

    Walks ``a`` back along the prefix hull of ``j`` and ``b`` forward along its suffix hull until
    neither end can improve (``a`` maximises the slope to ``b``, ``b`` minimises the slope from
    ``a``); only the positions still moving are carried to the next step.
    """
    g, width = px.shape
    base = (np.arange(g)[:, None] * width)
    fx, fy = px.ravel(), py.ravel()
    fprev = np.where(prev >= 0, prev + base, -1).ravel()
    fsucc = np.where(succ >= 0, succ + base, -1).ravel()
    a = np.arange(g * width)
    b = a.copy()
    out = np.empty(g * width)
    act = np.arange(g * width)

    def slope(i, t):
        return (fy[t] + dy - fy[i]) / (fx[t] + 1.0 - fx[i])

    while act.size:
        aa, bb = a[act], b[act]
        cur = slope(aa, bb)
        nb = fsucc[bb]
        ok = nb >= 0
        trial = slope(aa[ok], nb[ok])
        move_b = np.zeros(act.size, dtype=bool)
        move_b[ok] = trial <= cur[ok]
        bb = np.where(move_b, nb, bb)
        cur[move_b] = trial[move_b[ok]]
        na = fprev[aa]
        ok = na >= 0
        trial = slope(na[ok], bb[ok])
        move_a = np.zeros(act.size, dtype=bool)
        move_a[ok] = trial >= cur[ok]
        aa = np.where(move_a, na, aa)
        cur[move_a] = trial[move_a[ok]]
        a[act], b[act] = aa, bb
        out[act] = cur
        act = act[move_a | move_b]
    return out.reshape(g, width)


def venn_abers_tables(x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(scores (G, L), n_scores (G,), p0 (G, L + 1), p1 (G, L + 1))`` of the validation scores ``x``
    ``(G, N)`` with 0/1 targets ``t`` ``(G, N)``: the distinct sorted scores of each row (padded with
    2) and ``p0``, ``p1`` at each insertion position ``j = 0..m`` (module docstring)."""
    order = x.sort(dim=1).indices
    xs, ts = x.gather(1, order), t.gather(1, order)
    scores, _, length = run_tables(xs, ts)  # the distinct scores of each row
    g, width = scores.shape
    new = torch.ones_like(xs, dtype=torch.bool)
    new[:, 1:] = xs[:, 1:] != xs[:, :-1]
    run = new.long().cumsum(1) - 1
    w = torch.zeros((g, width), dtype=torch.float64).scatter_add_(1, run, torch.ones_like(ts))
    s = torch.zeros((g, width), dtype=torch.float64).scatter_add_(1, run, ts)
    px = np.zeros((g, width + 1))
    py = np.zeros((g, width + 1))
    px[:, 1:] = w.cumsum(1).numpy()
    py[:, 1:] = s.cumsum(1).numpy()
    m = length.numpy()
    prev, succ = _pointers(px, py, m)
    p0 = _bridges(px, py, prev, succ, m, 0.0)
    p1 = _bridges(px, py, prev, succ, m, 1.0)
    return scores, length, torch.from_numpy(p0.clip(0, 1)), torch.from_numpy(p1.clip(0, 1))


class VennAbersCalibration(Calibrator):
    """Inductive Venn-Abers calibration, one-vs-rest, merged ``p1 / (1 - p0 + p1)``; the rule is in
    the module docstring.

    Args:
        merge: ``"log"`` (default): ``p1 / (1 - p0 + p1)``, the merge that minimises the worse of the
            two log losses (Vovk and Petej); ``"mean"``: ``(p0 + p1) / 2``, the Brier-score one.

    Attributes:
        scores_: ``(G, L)`` distinct validation scores of each map (``G = K``, 1 when ``K = 2``),
            padded with 2;
        n_scores_: ``(G,)`` how many;
        p0_, p1_: ``(G, L + 1)`` the two isotonic values at each insertion position.
    """

    _STATE = state_names("venn_abers")

    def __init__(self, merge: str = "log"):
        self.merge = merge

    def _check_params(self):
        if self.merge not in ("log", "mean"):
            raise UserError(f"merge must be 'log' (p1 / (1 - p0 + p1)) or 'mean' ((p0 + p1) / 2), got {self.merge!r}")

    def _fit(self, z, y):
        s, t = ovr_pairs(z, y)
        tables = venn_abers_tables(s.cpu(), t.cpu())
        self.scores_, self.n_scores_, self.p0_, self.p1_ = (v.to(z.device) for v in tables)

    def _predict(self, z):
        s, _ = ovr_pairs(z)
        s = s.contiguous()
        right = torch.searchsorted(self.scores_.contiguous(), s, right=True)
        left = torch.searchsorted(self.scores_.contiguous(), s, right=False)
        p0, p1 = self.p0_.gather(1, right), self.p1_.gather(1, left)
        p = p1 / (1 - p0 + p1) if self.merge == "log" else (p0 + p1) / 2
        return ovr_rows(p, z.shape[1])
