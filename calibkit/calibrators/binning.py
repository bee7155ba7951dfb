"""Non-parametric one-vs-rest maps on the softmax probabilities: histogram binning (Zadrozny and
Elkan, 2001), isotonic regression (Zadrozny and Elkan, 2002; the shared-map IRM variant of Zhang
et al., 2020) and scaling-binning (Kumar et al., 2019).

Each fits one map ``g_k`` per class ``k`` on the pairs ``(p_ik, 1[y_i = k])`` of the validation
set (``p = softmax(z)``) and predicts ``q_ik = g_k(p_ik) / sum_j g_j(p_ij)``; a row where every
``g_j`` is 0 keeps its uncalibrated probabilities (never 0 / 0 = NaN, nor a uniform row where
the model was confident). The renormalisation can change the
argmax (one-vs-rest maps are fitted independently); ``docs/calibrators.md`` says how often.
Histogram binning is top-label by default (:class:`HistogramBinning`), which never changes it.

No exact zeros: a map is 0 wherever its class had no positive in the validation rows around, so
every calibrator here floors the final row at ``floor`` (default ``1e-6``) and renormalises
(:func:`calibkit.calibrators._toplabel.floor_rows`: order and prediction kept, a row moves by at
most ``K floor``); ``floor=0`` is the opt-in to the unfloored maps.
"""

from __future__ import annotations

import torch

from calibkit._validation import check_n_bins
from calibkit.calibrators._base import Calibrator
from calibkit.calibrators._state import state_names
from calibkit.calibrators._toplabel import DEFAULT_FLOOR, check_floor, floor_rows, spread_top
from calibkit.calibrators.temperature import _fit_nll
from calibkit.errors import UserError
from calibkit.functional.binning import equal_mass_ranks

__all__ = ["HistogramBinning", "IsotonicCalibration", "ScalingBinning", "UniformHistogramBinning", "pav_tables",
           "interpolate"]


def _normalise(g: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """Rows of ``g`` ``(N, K)`` divided by their sums; an all-zero row (no map gives any class a
    chance: no information) keeps its row of ``fallback``, the uncalibrated probabilities."""
    s = g.sum(1, keepdim=True)
    return torch.where(s > 0, g / torch.where(s > 0, s, 1.0), fallback)


# ---------------------------------------------------------------------------------- equal-mass bins
def fit_bins(values: torch.Tensor, targets: torch.Tensor, n_bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Equal-mass bins of each column of ``values`` ``(N, K)`` and the mean of ``targets`` per bin.

    Edges: the equal-mass rule of the metrics (:mod:`calibkit.functional.binning`, shared with
    AECE, the sweep ECE and AdaFocal): with ``s_(1) <= ... <= s_(N)`` a column's sorted values, the
    inner edges are the order statistics ``e_b = s_(ceil(b N / B))`` (1-based; rank
    ``ceil(b N / B) - 1`` of :func:`~calibkit.functional.binning.equal_mass_ranks`),
    ``b = 1..B-1`` (``(K, B - 1)``), and membership is ``(e_b, e_{b+1}]`` (bin 0: ``<= e_1``; the
    last bin: ``> e_{B-1}``). Without ties bin ``b`` holds the ranks
    ``ceil(b N / B) + 1 .. ceil((b + 1) N / B)``: sizes differ by at most one, and are exactly
    ``N / B`` when ``B`` divides ``N``; a block of ties stays whole in the bin of its lowest rank.
    A bin that holds no validation value (ties can leave one empty, and ``B > N`` does) takes the
    mean of the nearest non-empty bin below it (bin 0 always holds the smallest value).
    Returns ``(edges (K, B - 1), means (K, B))``, float64.
    """
    n, k = values.shape
    dev = values.device
    edges = values.T.sort(dim=1).values[:, equal_mass_ranks(n, n_bins, dev)]
    idx = _bin_of(edges, values.T)  # (K, N)
    flat = (idx + torch.arange(k, device=dev)[:, None] * n_bins).reshape(-1)
    count = torch.zeros(k * n_bins, dtype=torch.float64, device=dev).index_add_(
        0, flat, torch.ones_like(flat, dtype=torch.float64)).view(k, n_bins)
    total = torch.zeros(k * n_bins, dtype=torch.float64, device=dev).index_add_(
        0, flat, targets.T.reshape(-1).double()).view(k, n_bins)
    means = total / count.clamp(min=1)
    filled = torch.where(count > 0, torch.arange(n_bins, device=dev), 0).cummax(dim=1).values
    return edges, means.gather(1, filled)


def _bin_of(edges: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Bin index ``(K, M)`` of the values ``v`` ``(K, M)`` under the inner ``edges`` ``(K, B - 1)``."""
    if edges.shape[1] == 0:
        return torch.zeros(v.shape, dtype=torch.long, device=v.device)
    return torch.searchsorted(edges.contiguous(), v.contiguous())  # first edge >= v: (lo, hi]


def apply_bins(edges: torch.Tensor, means: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``means[k, bin_k(values[:, k])]`` for every entry of ``values`` ``(N, K)``; ``(N, K)``."""
    return means.gather(1, _bin_of(edges, values.T)).T


def fit_uniform_bins(values: torch.Tensor, targets: torch.Tensor, n_bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Equal-width bins of ``[0, 1]`` for each column of ``values`` ``(N, K)`` and the mean of
    ``targets`` per bin: inner edges ``b / B`` (``b = 1..B-1``), membership ``(e_b, e_{b+1}]`` as in
    :func:`fit_bins`. A bin that holds no validation value predicts its midpoint ``(b + 1/2) / B``
    (no evidence to move the identity map there). Returns ``(edges (K, B - 1), means (K, B))``."""
    n, k = values.shape
    dev = values.device
    grid = torch.arange(1, n_bins, dtype=torch.float64, device=dev) / n_bins
    edges = grid.expand(k, n_bins - 1).contiguous()
    idx = _bin_of(edges, values.T.double())
    zero = torch.zeros(k, n_bins, dtype=torch.float64, device=dev)
    count = zero.scatter_add(1, idx, torch.ones_like(idx, dtype=torch.float64))
    total = zero.scatter_add(1, idx, targets.T.double())
    mid = (torch.arange(n_bins, dtype=torch.float64, device=dev) + 0.5) / n_bins
    return edges, torch.where(count > 0, total / count.clamp(min=1), mid)


_MULTICLASS = ("top_label", "ovr")


class HistogramBinning(Calibrator):
    """Histogram binning (Zadrozny and Elkan, 2001) with ``B`` equal-mass bins (:func:`fit_bins`),
    each predicting the fraction of its validation samples that are positive.

    * ``multiclass="top_label"`` (default): one histogram of the top-label confidence
      ``c = max_k p_k`` against the correctness ``1[argmax p = y]`` (top-label histogram binning,
      Gupta and Ramdas, 2022); the top class gets its bin's accuracy and the other classes share
      the rest in proportion to their probabilities
      (:func:`~calibkit.calibrators._toplabel.spread_top`), so the prediction never changes.
    * ``multiclass="ovr"``: one histogram per class ``k`` on ``p_k`` against ``1[y = k]``, the row
      renormalised (module docstring); the renormalisation moves the argmax on coarse bins (11% of
      the predictions of the CIFAR-10 real outputs, ``docs/calibrators.md``).

    Every row is then floored at ``floor`` and renormalised (no exact zeros where a bin held no
    positive; :func:`~calibkit.calibrators._toplabel.floor_rows`; ``floor=0`` allows them).

    Args:
        n_bins: bins per histogram (default 15).
        multiclass: ``"top_label"`` (default) or ``"ovr"``.
        floor: the least probability before renormalising (default 1e-6).

    Attributes:
        edges_: ``(G, B - 1)`` inner edges (``G = 1`` top-label, ``K`` one-vs-rest).
        values_: ``(G, B)`` per-bin frequencies (float64).
    """

    _STATE = state_names("histogram")  # histogram_uniform's too
    _UNIFORM = False

    def __init__(self, n_bins: int = 15, multiclass: str = "top_label", floor: float = DEFAULT_FLOOR):
        self.n_bins = n_bins
        self.multiclass = multiclass
        self.floor = floor

    def _check_params(self):
        check_n_bins(self.n_bins)
        if self.multiclass not in _MULTICLASS:
            raise UserError(f"multiclass must be one of {', '.join(_MULTICLASS)}, got {self.multiclass!r}")
        check_floor(self.floor)

    def _fit(self, z, y):
        p = torch.softmax(z, 1)
        fit = fit_uniform_bins if self._UNIFORM else fit_bins
        if self.multiclass == "top_label":
            conf, pred = p.max(1)
            self.edges_, self.values_ = fit(conf[:, None], (pred == y).double()[:, None], self.n_bins)
        else:
            self.edges_, self.values_ = fit(p, torch.nn.functional.one_hot(y, z.shape[1]).double(), self.n_bins)

    def _predict(self, z):
        p = torch.softmax(z, 1)
        if self.multiclass == "top_label":
            q = spread_top(p, apply_bins(self.edges_, self.values_, p.max(1).values[:, None])[:, 0])
        else:
            q = _normalise(apply_bins(self.edges_, self.values_, p), p)
        return floor_rows(q, self.floor)

    @classmethod
    def from_dict(cls, d: dict):
        """As :meth:`Calibrator.from_dict`; a file saved before ``multiclass`` existed holds
        one-vs-rest bins, so it loads with ``multiclass="ovr"``."""
        if isinstance(d, dict) and isinstance(d.get("params"), dict) and "multiclass" not in d["params"]:
            d = {**d, "params": {**d["params"], "multiclass": "ovr"}}
        return super().from_dict(d)


class UniformHistogramBinning(HistogramBinning):
    """Histogram binning with ``B`` **equal-width** bins of ``[0, 1]`` (:func:`fit_uniform_bins`; an
    empty bin predicts its midpoint); otherwise as :class:`HistogramBinning` (same arguments,
    state and conventions)."""

    _UNIFORM = True

    def __init__(self, n_bins: int = 15, multiclass: str = "top_label", floor: float = DEFAULT_FLOOR):
        super().__init__(n_bins, multiclass, floor)


# ---------------------------------------------------------------------------------- isotonic
def pav_tables(x: torch.Tensor, y: torch.Tensor, group: torch.Tensor, n_groups: int):
    """Least-squares non-decreasing fit of ``y`` on ``x`` within each group (pool adjacent violators).

    Tied ``x`` within a group are first merged into one point (weight = count, value = mean ``y``),
    as scikit-learn's ``IsotonicRegression`` does; neighbouring points with equal values start in
    one block. PAV then runs on all groups at once: every pass
    merges each maximal run of adjacent blocks whose means decrease (a sequence of merges of
    violating neighbours, so the result is the unique PAV solution), until no block's mean exceeds
    its right neighbour's within a group. Points inside a constant stretch are dropped (linear
    interpolation is unchanged). Returns padded tables ``xs, ys`` ``(G, L)`` and ``length`` ``(G,)``:
    group ``g``'s knots are ``xs[g, :length[g]]`` (increasing); padding repeats ``x = 2`` and the
    last value.
    """
    dev = x.device
    order = torch.sort(x, stable=True).indices
    order = order[torch.sort(group[order], stable=True).indices]
    x, y, group = x[order], y[order].double(), group[order]
    new = torch.ones_like(x, dtype=torch.bool)
    new[1:] = (group[1:] != group[:-1]) | (x[1:] != x[:-1])
    run = new.cumsum(0) - 1
    n_runs = int(run[-1]) + 1
    w = torch.zeros(n_runs, dtype=torch.float64, device=dev).index_add_(0, run, torch.ones_like(y))
    wy = torch.zeros(n_runs, dtype=torch.float64, device=dev).index_add_(0, run, y)
    ux, ug = x[new], group[new]
    # Start from blocks of neighbouring runs with equal means (they never violate; pooling them
    # first leaves few blocks, so the passes below converge in a handful of iterations).
    mean = wy / w
    head = torch.ones_like(mean, dtype=torch.bool)
    head[1:] = (mean[1:] != mean[:-1]) | (ug[1:] != ug[:-1])
    gid = head.cumsum(0) - 1
    nb = int(gid[-1]) + 1
    sw = torch.zeros(nb, dtype=torch.float64, device=dev).index_add_(0, gid, w)
    swy = torch.zeros(nb, dtype=torch.float64, device=dev).index_add_(0, gid, wy)
    bg, start = ug[head], torch.arange(n_runs, device=dev)[head]
    while True:
        m = swy / sw
        viol = (m[:-1] > m[1:]) & (bg[:-1] == bg[1:])
        if not bool(viol.any()):
            break
        head = torch.ones_like(m, dtype=torch.bool)
        head[1:] = ~viol
        gid = head.cumsum(0) - 1
        nb = int(gid[-1]) + 1
        sw = torch.zeros(nb, dtype=torch.float64, device=dev).index_add_(0, gid, sw)
        swy = torch.zeros(nb, dtype=torch.float64, device=dev).index_add_(0, gid, swy)
        bg, start = bg[head], start[head]
    fit = (swy / sw)[torch.searchsorted(start, torch.arange(n_runs, device=dev), right=True) - 1]
    keep = torch.ones_like(fit, dtype=torch.bool)  # drop knots inside a constant stretch of one group
    same_prev = (fit[1:-1] == fit[:-2]) & (ug[1:-1] == ug[:-2])
    same_next = (fit[1:-1] == fit[2:]) & (ug[1:-1] == ug[2:])
    keep[1:-1] = ~(same_prev & same_next)
    ux, fit, ug = ux[keep], fit[keep], ug[keep]
    length = torch.bincount(ug, minlength=n_groups)
    width = int(length.max())
    first = torch.cumsum(length, 0) - length
    col = torch.arange(ux.numel(), device=dev) - first[ug]
    xs = torch.full((n_groups, width), 2.0, dtype=torch.float64, device=dev)
    ys = torch.zeros((n_groups, width), dtype=torch.float64, device=dev)
    xs[ug, col], ys[ug, col] = ux.double(), fit
    last = ys.gather(1, (length - 1).clamp(min=0)[:, None])
    ys = torch.where(torch.arange(width, device=dev) < length[:, None], ys, last)
    return xs, ys, length


def interpolate(xs: torch.Tensor, ys: torch.Tensor, length: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Piecewise-linear interpolation of the tables of :func:`pav_tables` at ``v`` ``(G, M)``,
    clipped to each table's range (``out_of_bounds="clip"``); ``(G, M)``."""
    lo = xs[:, :1]
    hi = xs.gather(1, (length - 1)[:, None])
    v = torch.minimum(torch.maximum(v, lo), hi).contiguous()
    i = (torch.searchsorted(xs.contiguous(), v, right=True) - 1).clamp(min=0)
    j = torch.minimum(i + 1, (length - 1)[:, None])
    x0, x1, y0, y1 = xs.gather(1, i), xs.gather(1, j), ys.gather(1, i), ys.gather(1, j)
    dx = x1 - x0
    t = torch.where(dx > 0, (v - x0) / torch.where(dx > 0, dx, 1.0), 0.0)
    return y0 + t * (y1 - y0)


class IsotonicCalibration(Calibrator):
    """Isotonic regression, one-vs-rest: for each class ``k``, ``g_k`` is the non-decreasing
    least-squares fit to the validation pairs ``(p_ik, 1[y_i = k])`` (:func:`pav_tables`),
    linearly interpolated between its knots and clipped outside the fitted range (values in
    ``[0, 1]``); ``q_k = g_k(p_k) / sum_j g_j(p_j)``, an all-zero row keeps ``p``; then the floor.

    ``irm=True``: one map shared by all classes, fitted on the ``N K`` pooled pairs
    (Zhang et al., 2020, "IRM"); it preserves the ordering of the classes within a row up to
    ties, unlike the one-vs-rest maps.

    Args:
        irm: one shared map instead of one per class (default False).
        floor: the least probability before renormalising (default 1e-6; 0 allows the exact zeros
            of a map fitted to 0 below its first positive).

    Attributes:
        knots_x_, knots_y_: ``(G, L)`` padded knot tables (``G = K``, or 1 with ``irm``);
        n_knots_: ``(G,)`` knots per map.
    """

    _STATE = state_names("isotonic")

    def __init__(self, irm: bool = False, floor: float = DEFAULT_FLOOR):
        self.irm = irm
        self.floor = floor

    def _check_params(self):
        if not isinstance(self.irm, bool):
            raise UserError(f"irm must be True or False, got {self.irm!r}")
        check_floor(self.floor)

    def _fit(self, z, y):
        p = torch.softmax(z, 1)
        n, k = p.shape
        target = torch.nn.functional.one_hot(y, k).double()
        if self.irm:
            group, n_groups = torch.zeros(n * k, dtype=torch.long, device=z.device), 1
        else:
            group, n_groups = torch.arange(k, device=z.device).repeat(n), k
        self.knots_x_, self.knots_y_, self.n_knots_ = pav_tables(p.reshape(-1), target.reshape(-1), group, n_groups)

    def _predict(self, z):
        p = torch.softmax(z, 1)
        v = p.reshape(1, -1) if self.irm else p.T
        g = interpolate(self.knots_x_, self.knots_y_, self.n_knots_, v)
        return floor_rows(_normalise(g.reshape(p.shape) if self.irm else g.T, p), self.floor)


# ---------------------------------------------------------------------------------- scaling-binning
class ScalingBinning(Calibrator):
    """Scaling-binning (Kumar et al., 2019, "Verified uncertainty calibration"), one-vs-rest.

    1. Scaling: temperature scaling ``s = softmax(z / T)``, ``T`` by mean NLL, fitted on the first
       part of the validation set (a seeded permutation; ``fit_fraction`` of the rows).
    2. Binning: on the other part, ``B`` equal-mass bins of each class's scaled ``s_k``
       (:func:`fit_bins`); each bin outputs the **mean of the scaled values** ``s_k`` in it (not
       of the labels, which is what separates it from histogram binning).
    3. ``q = renormalise(bin means)`` (module docstring).

    Kumar et al. split the recalibration set into three parts (scaling, bin edges, bin means);
    calibkit uses two, taking the edges and the means from the same part (the means are of scaled
    values, not labels, so they do not overfit the labels). Using all of the validation set for
    both steps (``fit_fraction = 1``) is allowed.

    Args:
        n_bins: bins per class (default 15).
        fit_fraction: share of the validation rows used to fit ``T`` (default 0.5; 1 = all rows
            for both steps).
        seed: seed of the split (default 0).
        floor: the least probability before renormalising (default 1e-6).

    Attributes:
        temperature_: ``T``.
        edges_: ``(K, B - 1)``.
        values_: ``(K, B)``.
    """

    _STATE = state_names("scaling_binning")

    def __init__(self, n_bins: int = 15, fit_fraction: float = 0.5, seed: int = 0, floor: float = DEFAULT_FLOOR):
        self.n_bins = n_bins
        self.fit_fraction = fit_fraction
        self.seed = seed
        self.floor = floor

    def _check_params(self):
        check_n_bins(self.n_bins)
        check_floor(self.floor)
        if not 0 < self.fit_fraction <= 1:
            raise UserError(f"fit_fraction must be in (0, 1], got {self.fit_fraction!r}")

    def _fit(self, z, y):
        n = z.shape[0]
        if self.fit_fraction == 1:
            first = second = torch.arange(n, device=z.device)
        else:
            n1 = int(round(self.fit_fraction * n))
            if not 1 <= n1 < n:
                raise UserError(f"ScalingBinning: fit_fraction={self.fit_fraction} of {n} validation rows leaves a "
                                 "part empty; use more rows or fit_fraction=1")
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed)).to(z.device)
            first, second = perm[:n1].sort().values, perm[n1:].sort().values
        self.temperature_, _ = _fit_nll(z[first], y[first], 1e-2, 1e2)
        s = torch.softmax(z[second] / self.temperature_, 1)
        self.edges_, self.values_ = fit_bins(s, s, self.n_bins)

    def _predict(self, z):
        s = torch.softmax(z / self.temperature_, 1)
        q = _normalise(apply_bins(self.edges_, self.values_, s), s)
        return floor_rows(q, self.floor)
