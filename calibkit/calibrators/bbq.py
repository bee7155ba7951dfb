"""Bayesian Binning into Quantiles (Naeini, Cooper and Hauskrecht, AAAI 2015), one-vs-rest.

For each class ``k``, on the pairs ``(p_ik, 1[y_i = k])`` of the validation set (``p = softmax(z)``):

* **model space**: the equal-frequency binnings of ``p_k`` with ``B`` bins for every integer ``B``
  from ``max(1, floor(N^(1/3) / C))`` to ``min(N, ceil(C N^(1/3)))`` (the paper's range, ``C``
  = ``c`` = 10; 1 to 171 bins at N = 5,000). Edges: the equal-mass rule of calibkit's histogram
  binning (:func:`calibkit.calibrators.binning.fit_bins`: inner edges ``e_b = s_(ceil(b N / B))``,
  membership ``(e_b, e_{b+1}]``); the outer bins reach 0 and 1, so bin ``b`` is the interval
  ``(lo_b, hi_b]`` with ``lo_1 = 0``, ``hi_B = 1``.
* **prior per bin**: ``Beta(alpha_b, beta_b)`` with ``alpha_b = (N' / B) m_b``,
  ``beta_b = (N' / B) (1 - m_b)``, ``m_b = (lo_b + hi_b) / 2`` the midpoint of the bin and ``N'``
  the equivalent sample size (``ess``, default 2).
* **score** (BDeu-style marginal likelihood, uniform prior over models):
  ``P(D | M) = prod_b Gamma(N'/B) / Gamma(n_b + N'/B) * Gamma(n1_b + alpha_b) / Gamma(alpha_b)
  * Gamma(n0_b + beta_b) / Gamma(beta_b)`` with ``n_b`` the bin's rows, ``n1_b`` / ``n0_b`` its
  positives / negatives; computed in logs.
* **prediction**: each model predicts its bin's posterior mean ``(n1_b + alpha_b) / (n_b + N'/B)``;
  BBQ averages the models' predictions weighted by their normalised scores
  ``P(D | M) / sum_M' P(D | M')`` (every model kept, no pruning).

**Degenerate bins** (calibkit's choice; the paper assumes scores strictly inside ``(0, 1)``): on
a confident model many ``p_k`` are exactly 1.0 (or 0.0) in float64, so a bin ``(1, 1]`` (or
``(0, 0]``) has the midpoint 1 (or 0) and the prior ``Beta(a, 0)`` (or ``Beta(0, b)``) is improper:
``Gamma(0)`` is infinite, the score ``inf - inf`` is NaN and, before this rule, every weight and
every prediction was NaN, then uniform. The prior mean is therefore clipped to
``[1e-6, 1 - 1e-6]``: both Beta parameters stay positive, every score is finite, and a bin's
prediction ``(n1 + a) / (n + N'/B)`` lies strictly inside ``(0, 1)``. A row whose levels all come
out 0 (impossible with this rule; kept as a guard) keeps ``p``; rows are then floored at ``floor``
(:func:`calibkit.calibrators._toplabel.floor_rows`, default ``1e-6``) so that float32 rounding
cannot make a 0 either.

The average of step functions is a step function: calibkit stores it as one table per class,
every model's inner edge sorted (``knots_``) and the averaged value above each (``levels_``), so
predicting costs one search per class, not one per model. Then ``q = g / sum_j g_j``; with two
classes one map, on class 1, and ``q = (1 - g(p_1), g(p_1))``. Fit: one sort per class and a
search of every model's edges at once (``O(K (N + E) log N)``, ``E`` the edges of all models).
"""

from __future__ import annotations

import math

import torch

from calibkit.calibrators._base import Calibrator
from calibkit.calibrators._state import state_names
from calibkit.calibrators._toplabel import DEFAULT_FLOOR, check_floor, floor_rows
from calibkit.errors import UserError
from calibkit.functional.binning import equal_mass_ranks

__all__ = ["BBQ", "bin_range"]

#: The prior mean of a bin is kept in ``[_EDGE, 1 - _EDGE]`` (module docstring, "Degenerate bins").
_EDGE = 1e-6


def bin_range(n: int, c: float) -> list[int]:
    """The bin counts of BBQ's models for ``n`` rows: ``max(1, floor(n^(1/3) / c))`` to
    ``min(n, ceil(c n^(1/3)))``."""
    root = n ** (1 / 3)
    lo = max(1, math.floor(root / c + 1e-9))
    hi = max(lo, min(n, math.ceil(c * root - 1e-9)))
    return list(range(lo, hi + 1))


def _layout(n_bins: list[int], device):
    """Index maps of the models' bins, all models at once (``T = sum B`` bins, ``E = sum (B - 1)`` edges).

    Returns ``(model (T,), lo (T,), hi (T,), edge_bin (E,))``: each bin's model; the indices of
    its lower and upper bounds in the row ``[0, edges..., 1]`` (``0``: the bound 0, ``E + 1``: the
    bound 1, ``e + 1``: edge ``e``); and, for each edge, the index of the bin below it.
    """
    sizes = torch.tensor(n_bins, dtype=torch.long, device=device)
    model = torch.repeat_interleave(torch.arange(len(n_bins), device=device), sizes)
    bin_start = torch.cumsum(sizes, 0) - sizes
    edge_start = bin_start - torch.arange(len(n_bins), device=device)  # model m's edges: sum of earlier (B - 1)
    j = torch.arange(model.numel(), device=device) - bin_start[model]  # position of the bin in its model
    n_edges = int((sizes - 1).sum())
    lo = torch.where(j == 0, 0, edge_start[model] + j)  # edge j - 1 of the model, shifted by 1
    hi = torch.where(j == sizes[model] - 1, n_edges + 1, edge_start[model] + j + 1)
    edge_bin = torch.nonzero(j < sizes[model] - 1).squeeze(1)
    return model, lo, hi, edge_bin


def _model_tables(s: torch.Tensor, t: torch.Tensor, n_bins: list[int], ess: float):
    """Per class and model: inner edges, bin values, log marginal likelihood.

    ``s``, ``t``: ``(G, N)`` scores and 0/1 targets. Returns ``edges (G, E)`` (the models' inner
    edges, concatenated in the order of ``n_bins``), ``values (G, T)`` (their bins' posterior
    means, likewise), ``log_score (G, M)`` and the layout of :func:`_layout`.
    """
    g, n = s.shape
    dev = s.device
    order = s.argsort(dim=1, stable=True)
    sorted_s = s.gather(1, order)
    pos = torch.cat([torch.zeros(g, 1, dtype=s.dtype, device=dev), t.gather(1, order).cumsum(1)], 1)
    # rows <= sorted_s[:, r]: one past the end of r's block of ties
    last = torch.ones_like(sorted_s, dtype=torch.bool)
    last[:, :-1] = sorted_s[:, 1:] != sorted_s[:, :-1]
    idx = torch.arange(n, device=dev).expand(g, n)
    block_end = torch.where(last, idx, n).flip(1).cummin(1).values.flip(1) + 1
    ranks = torch.cat([equal_mass_ranks(n, b, dev) for b in n_bins])
    edges = sorted_s[:, ranks]  # (G, E)
    zero = torch.zeros(g, 1, dtype=torch.long, device=dev)
    cuts = torch.cat([zero, block_end[:, ranks], zero + n], 1)  # rows <= each bound
    bounds = torch.cat([torch.zeros(g, 1, dtype=s.dtype, device=dev), edges,
                        torch.ones(g, 1, dtype=s.dtype, device=dev)], 1)
    model, lo, hi, edge_bin = _layout(n_bins, dev)
    rows = (cuts[:, hi] - cuts[:, lo]).to(s.dtype)
    ones = pos.gather(1, cuts[:, hi]) - pos.gather(1, cuts[:, lo])
    mid = ((bounds[:, lo] + bounds[:, hi]) / 2).clamp(_EDGE, 1 - _EDGE)  # a bin at 0 or 1: Beta(a, 0) is improper
    prior = ess / torch.tensor(n_bins, dtype=s.dtype, device=dev)[model]  # N' / B per bin
    a, b = prior * mid, prior * (1 - mid)
    log_ml = (torch.lgamma(prior) - torch.lgamma(rows + prior) + torch.lgamma(ones + a) - torch.lgamma(a)
              + torch.lgamma(rows - ones + b) - torch.lgamma(b))
    log_score = torch.zeros(g, len(n_bins), dtype=s.dtype, device=dev).index_add_(1, model, log_ml)
    return edges, (ones + a) / (rows + prior), log_score, (model, edge_bin)


def _average_table(edges, values, weights, layout):
    """The weighted average of the models' step functions as one table: ``(knots (G, E), levels (G, E + 1))``.

    ``g(x) = sum_M w_M v_M(bin_M(x))``; crossing a model's inner edge upwards adds
    ``w_M (v_M(bin above) - v_M(bin below))``, so ``g`` just above the ``j``-th smallest edge is
    the weighted value of the models' lowest bins plus the sum of the first ``j`` jumps.
    """
    model, edge_bin = layout
    first = torch.ones_like(model, dtype=torch.bool)
    first[1:] = model[1:] != model[:-1]
    base = (weights * values[:, first]).sum(1, keepdim=True)
    jumps = weights[:, model[edge_bin]] * (values[:, edge_bin + 1] - values[:, edge_bin])
    knots, order = edges.sort(dim=1, stable=True)
    levels = torch.cat([base, base + jumps.gather(1, order).cumsum(1)], 1)
    return knots, levels.clamp(0.0, 1.0)


class BBQ(Calibrator):
    """Bayesian Binning into Quantiles (Naeini, Cooper and Hauskrecht, 2015), one-vs-rest on
    ``p_k = softmax(z)_k``, rows renormalised (module docstring: the model space, the Beta prior
    from each bin's midpoint, the BDeu-style score, the score-weighted average).

    Args:
        c: the range constant ``C``: ``B`` from ``N^(1/3) / C`` to ``C N^(1/3)`` (default 10).
        ess: the equivalent sample size ``N'`` of the prior (default 2).
        floor: the least probability before renormalising (default 1e-6; 0: none).

    Attributes:
        n_bins_: ``(M,)`` int64, the models' bin counts.
        weights_: ``(G, M)`` float64, each model's normalised score per class (rows sum to 1;
            ``G = K``, or 1 for two classes: class 1).
        knots_: ``(G, E)`` every model's inner edges, sorted (``E = sum (B - 1)``).
        levels_: ``(G, E + 1)`` the averaged prediction at and below the first knot, then just above each knot.
    """

    _STATE = state_names("bbq")

    def __init__(self, c: float = 10.0, ess: float = 2.0, floor: float = DEFAULT_FLOOR):
        self.c = c
        self.ess = ess
        self.floor = floor

    def _check_params(self):
        for name in ("c", "ess"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise UserError(f"{name} must be a finite number > 0, got {v!r}")
        if self.c < 1:
            raise UserError(f"c must be >= 1 (B runs from N^(1/3) / c to c N^(1/3)), got {self.c!r}")
        check_floor(self.floor)

    def _fit(self, z, y):
        k = z.shape[1]
        p = torch.softmax(z, 1).T  # (K, N)
        classes = torch.arange(1 if k == 2 else 0, k, device=z.device)
        s = p[classes]
        t = (y[None, :] == classes[:, None]).to(z.dtype)
        n_bins = bin_range(z.shape[0], float(self.c))
        edges, values, log_score, layout = _model_tables(s, t, n_bins, float(self.ess))
        self.weights_ = torch.softmax(log_score, 1)
        self.knots_, self.levels_ = _average_table(edges, values, self.weights_, layout)
        self.n_bins_ = torch.tensor(n_bins, dtype=torch.long, device=z.device)

    def _predict(self, z):
        p = torch.softmax(z, 1).T
        k = z.shape[1]
        s = p[1:] if k == 2 else p
        idx = torch.searchsorted(self.knots_.contiguous(), s.contiguous())  # knots < s: bins (lo, hi]
        g = self.levels_.gather(1, idx).T
        if k == 2:
            return floor_rows(torch.cat([1 - g, g], 1), self.floor)
        total = g.sum(1, keepdim=True)
        return floor_rows(torch.where(total > 0, g / torch.where(total > 0, total, 1.0), p.T), self.floor)
