"""Bootstrap over test samples: an interval for one metric, and a paired interval for the
difference between two models scored on the same test set.

Resampling draws ``R`` sets of ``N`` sample indices with replacement from a seeded
``torch.Generator``; resample ``r`` is summarised by its count vector ``W[r]`` (how often each
sample was drawn). The panel metrics are functions of weighted sums, so for a metric *name*
every resample is evaluated at once, without copying rows:

* ``acc``, ``nll``, ``brier``: ``W @ v / N`` for the per-sample correctness, ``-log p_y``, Brier;
* equal-width metrics (``ece``, ``mce``, ``rmsce``, ``o_ece``, ``u_ece``): per-bin sums
  ``W @ onehot(bin) * (1, conf, correct)``, then :func:`binned_errors` on all resamples;
* ``aece``: the equal-mass edges of each resample are weighted order statistics (a cumulative
  sum of ``W`` in sorted-confidence order, then ``searchsorted``);
* ``cece``: the sparse classwise entries (``p_ik > 1/B``) and the labelled entries weighted by
  ``W``, bin 0 from the weighted column sums ``W @ P``.

Any other callable ``metric(probs, labels) -> scalar`` is evaluated resample by resample on the
same indices (slower, general). The paired variant uses the same ``W`` for both models, so the
interval of the difference reflects only the models' disagreement, not which test samples were
drawn. :func:`bootstrap_cis` shares one draw among any number of models on the same labels.

Intervals (``q_a`` = the ``a`` quantile of the resampled values, linear interpolation;
``estimate`` = the metric on the full data):

* ``"basic"`` (default): ``[2 estimate - q_hi, 2 estimate - q_lo]`` with ``hi = (1 + level)/2``,
  ``lo = (1 - level)/2``; for a single panel metric the ends are clipped to the metric's range
  (e.g. ECE >= 0). It assumes that ``estimate - truth`` is distributed like
  ``resampled - estimate``, so it **corrects the bias the bootstrap sees**: binned calibration
  errors are biased upwards (noise in each bin's accuracy only ever adds ``|gap|``), a resample
  (with duplicates) is noisier still, and the percentile interval of a well-calibrated model's
  ECE then lies entirely above its own estimate. The basic interval is centred on the
  bias-corrected estimate ``estimate - bias`` (``bias = mean(resampled) - estimate``).
* ``"percentile"``: ``[q_lo, q_hi]``, the distribution of the resampled values themselves.

A single sample (N = 1, after ``ignore_index``) is refused with a ``ValueError``, like an empty
set: every resample would be that sample, and the zero-width interval would read as certainty
(calibkit's choice; a warning would let the interval into tables unnoticed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from calibkit import resampling
from calibkit._validation import check_n_bins, check_probs, upcast
from calibkit.errors import UserError
from calibkit.functional import metrics as F
from calibkit.functional.binning import (
    BinSums,
    bin_indices,
    binned_errors,
    equal_width_edges,
    top_label,
    weighted_equal_mass_bins,
)
from calibkit.functional.inputs import to_rows
from calibkit.resampling import count_draws, shared_draws  # re-exported: the public names stay here

__all__ = ["BootstrapResult", "bootstrap_ci", "bootstrap_cis", "paired_bootstrap_diff", "bootstrap_interval",
           "count_draws", "shared_draws", "FAST_METRICS", "INTERVALS"]

INTERVALS = ("basic", "percentile")
# Range of each panel metric, for clipping the basic interval.
_RANGE = {"acc": (0.0, 1.0), "ece": (0.0, 1.0), "aece": (0.0, 1.0), "cece": (0.0, 1.0), "mce": (0.0, 1.0),
          "rmsce": (0.0, 1.0), "o_ece": (0.0, 1.0), "u_ece": (0.0, 1.0), "nll": (0.0, float("inf")),
          "brier": (0.0, 2.0)}

FAST_METRICS = ("acc", "ece", "aece", "cece", "mce", "rmsce", "o_ece", "u_ece", "nll", "brier")
_BY_FUNCTION = {F.accuracy: "acc", F.ece: "ece", F.adaptive_ece: "aece", F.classwise_ece: "cece",
                F.mce: "mce", F.rmsce: "rmsce", F.nll: "nll", F.brier: "brier"}


@dataclass
class BootstrapResult:
    """A point estimate with its bootstrap interval.

    Attributes:
        estimate: the metric on the full data (for a paired result: metric(a) - metric(b)).
        low, high: interval bounds at ``level``.
        level: nominal coverage, e.g. 0.95.
        samples: ``(R,)`` float64 tensor of the resampled values.
        method: ``"basic"`` or ``"percentile"`` (module docstring).
        bias: bootstrap estimate of the estimator's bias, ``mean(samples) - estimate``;
            ``estimate - bias`` is the bias-corrected estimate, the centre of the basic interval.
    """

    estimate: float
    low: float
    high: float
    level: float
    samples: torch.Tensor = field(repr=False)
    method: str = "basic"
    bias: float = 0.0

    @property
    def corrected(self) -> float:
        """Bias-corrected estimate ``estimate - bias`` (``2 estimate - mean(samples)``)."""
        return self.estimate - self.bias


class _Prepared:
    """Per-sample quantities of one model, so every resample costs only weighted sums."""

    def __init__(self, probs, labels, n_bins, ignore_index=None):
        self.inputs = (probs, labels)
        self.key = resampling.model_key(probs, labels, n_bins, ignore_index)  # the inputs' identity, for _SUMS
        rows = to_rows(probs, labels, ignore_index, compact=True)
        probs, labels = check_probs(rows.probs.cpu(), rows.labels.cpu())
        self.probs, self.labels, self.B = probs, labels, n_bins
        self.N, self.K = probs.shape
        if self.N == 1:  # refused rather than warned: a zero-width interval reads as certainty
            raise UserError("bootstrap needs at least 2 samples: with N = 1 every resample is that one sample, "
                             "so the interval would have zero width")
        conf, pred = top_label(probs)
        self.conf_native = conf
        self.conf = conf.double()
        self.correct = (pred == labels).double()
        self.p_y = probs.gather(1, labels.view(-1, 1)).squeeze(1).double()

    def stats(self, name: str, W: torch.Tensor) -> torch.Tensor:
        """Metric ``name`` for each row of the count matrix ``W`` ``(R, N)``; returns ``(R,)``."""
        n = self.N
        if name == "acc":
            return W @ self.correct / n
        if name == "nll":
            return W @ -self.p_y.clamp(min=torch.finfo(self.probs.dtype).tiny).log() / n
        if name == "brier":
            sq = torch.linalg.vector_norm(upcast(self.probs), dim=1).double() ** 2
            return W @ (sq - 2 * self.p_y + 1) / n
        if name == "aece":
            return self._aece(W)
        if name == "cece":
            return self._cece(W)
        return binned_errors(self._binned_sums(W))[name]

    def _binned_sums(self, W: torch.Tensor) -> BinSums:
        """The per-bin sums of every row of ``W``; inside :func:`shared_draws` computed once per model
        and draw (the report asks for ECE, O-ECE and U-ECE of one model, and pairs one model with many)."""
        return resampling.kept_sums(self.key, W, self.inputs, lambda: self._sums(W))

    def _sums(self, W: torch.Tensor) -> BinSums:
        bins = bin_indices(self.conf_native, equal_width_edges(self.B, self.conf_native.dtype))
        onehot = torch.nn.functional.one_hot(bins, self.B).double()  # (N, B)
        # counts and hits are sums of integers (counts x 0/1), exact in any order: the same bits as
        # W @ onehot, at about a third of its cost; the confidences' sums keep the product's order
        return BinSums(torch.zeros(W.shape[0], self.B, dtype=W.dtype).index_add_(1, bins, W),
                       W @ (onehot * self.conf[:, None]),
                       torch.zeros(W.shape[0], self.B, dtype=W.dtype).index_add_(1, bins, W * self.correct))

    def _aece(self, W):
        R = W.shape[0]
        s, perm = self.conf.sort()
        Ws = W[:, perm]  # (R, N) counts in sorted-confidence order
        bins = weighted_equal_mass_bins(s, Ws, self.B)
        slot = (bins + torch.arange(R).view(-1, 1) * self.B).reshape(-1)
        w = Ws.reshape(-1)

        def count(x):
            return torch.bincount(slot, weights=x, minlength=R * self.B).view(R, self.B)

        sums = BinSums(count(w), count(w * s.repeat(R)), count(w * self.correct[perm].repeat(R)))
        return binned_errors(sums)["ece"]

    def _cece(self, W):
        n, K, B = self.N, self.K, self.B
        R = W.shape[0]
        edges = equal_width_edges(B, self.probs.dtype)
        conf = torch.zeros(R, K * B, dtype=torch.float64)
        if B > 1:
            flat = self.probs.reshape(-1)
            idx = torch.where(flat > edges[1])[0]
            vals = flat[idx]
            slot = (idx % K) * B + bin_indices(vals, edges)
            Wi = W[:, idx // K]  # (R, nnz)
            conf.index_add_(1, slot, Wi * vals.double())
        conf = conf.view(R, K, B)  # classwise ECE needs no bin counts: sum |hits - conf| / (N K)
        conf[:, :, 0] = W @ self.probs.double() - conf[:, :, 1:].sum(2)
        hit_slot = self.labels * B + bin_indices(self.p_y.to(self.probs.dtype), edges)
        hits = torch.zeros(R, K * B, dtype=torch.float64).index_add_(1, hit_slot, W).view(R, K, B)
        return (hits - conf).abs().sum((1, 2)) / (n * K)


def _resolve(metric):
    if isinstance(metric, str):
        if metric not in FAST_METRICS:
            raise UserError(f"unknown metric {metric!r}; expected one of {', '.join(FAST_METRICS)} or a callable")
        return metric
    if metric in _BY_FUNCTION:
        return _BY_FUNCTION[metric]
    if callable(metric):
        return metric
    raise UserError(f"metric must be a name or a callable, got {type(metric).__name__}")


#: fewer resamples than this: no interval (``bootstrap_ci`` and the commands' ``--n-boot`` refuse).
MIN_RESAMPLES = 10


def _check_args(n_resamples, level, method):
    if method not in INTERVALS:
        raise UserError(f"unknown interval method {method!r}; expected one of {', '.join(INTERVALS)}")
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, int) or n_resamples < MIN_RESAMPLES:
        raise UserError(f"n_resamples must be an integer >= {MIN_RESAMPLES} (fewer resamples give no interval: one "
                        f"gives [x, x]), got {n_resamples!r}")
    if not 0 < level < 1:
        raise UserError(f"level must be in (0, 1), got {level!r}")


def _resampled(models, metric, n, n_resamples, seed):
    """``(len(models), R)`` resampled values; every model sees the same resamples."""
    out = [[] for _ in models]
    for idx, W in count_draws(n, n_resamples, seed):
        if isinstance(metric, str):
            for i, m in enumerate(models):
                out[i].append(m.stats(metric, W))
        else:
            for i, m in enumerate(models):
                vals = [float(metric(m.probs[row], m.labels[row])) for row in idx]
                out[i].append(torch.tensor(vals, dtype=torch.float64))
    return [torch.cat(o) for o in out]


def _full(model, metric):
    if isinstance(metric, str):
        return float(model.stats(metric, torch.ones(1, model.N, dtype=torch.float64))[0])
    return float(metric(model.probs, model.labels))


def bootstrap_interval(samples, estimate: float, level: float = 0.95, method: str = "basic",
                       bounds: tuple[float, float] = (-float("inf"), float("inf"))) -> tuple[float, float]:
    """Interval from resampled values ``samples`` ``(R,)`` around ``estimate`` (module docstring).

    ``method``: ``"basic"`` (``[2 estimate - q_hi, 2 estimate - q_lo]``, clipped to ``bounds``)
    or ``"percentile"`` (``[q_lo, q_hi]``).
    """
    if method not in INTERVALS:
        raise UserError(f"unknown interval method {method!r}; expected one of {', '.join(INTERVALS)}")
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    lo, hi = (float(v) for v in torch.quantile(samples.double(), q))
    if method == "percentile":
        return lo, hi
    return min(max(2 * estimate - hi, bounds[0]), bounds[1]), min(max(2 * estimate - lo, bounds[0]), bounds[1])


def holding(low: float, high: float, estimate: float) -> tuple[float, float]:
    """``[low, high]`` extended to hold a finite ``estimate`` (it only widens): every interval calibkit
    reports holds the estimate printed beside it (docs/metrics.md, "Minimum samples")."""
    if math.isfinite(estimate):
        return min(low, estimate), max(high, estimate)
    return low, high


def _result(estimate, samples, level, method, bounds) -> BootstrapResult:
    """The reported interval holds its estimate: a basic interval that a skewed resample distribution
    puts wholly on one side of the estimate (ECE near 0: ``0.69 [0.00, 0.67]``) is extended to it, which
    only widens it (``docs/metrics.md``, "Minimum samples")."""
    low, high = holding(*bootstrap_interval(samples, estimate, level, method, bounds), estimate)
    return BootstrapResult(estimate, low, high, level, samples, method, float(samples.mean()) - estimate)


def bootstrap_ci(metric, probs, labels, n_resamples: int = 1000, seed: int = 0, level: float = 0.95,
                 n_bins: int = 15, method: str = "basic", ignore_index: int | None = None) -> BootstrapResult:
    """Bootstrap interval of ``metric`` on ``probs`` / ``labels`` (every layout of the metrics).

    Args:
        metric: a panel name (``"ece"``, ``"aece"``, ...; see :data:`FAST_METRICS`), one of the
            corresponding :mod:`calibkit.functional` functions (fast path, with ``n_bins``), or any
            callable ``metric(probs, labels) -> scalar`` (evaluated per resample).
        n_resamples: number of resamples ``R``.
        seed: seed of the resampling generator: equal seeds give equal intervals.
        level: nominal coverage of the interval.
        n_bins: bins of the binned metrics on the fast path.
        method: ``"basic"`` (default; bias-corrected, clipped to the metric's range for panel
            names) or ``"percentile"``: see the module docstring.
        ignore_index: label of samples to leave out, or ``None``.

    The interval covers the metric of the population the test set was drawn from (for binned
    metrics: with the same bins), not of this test set; the resampled values are computed on the
    CPU (tensors on other devices are copied there).
    """
    _check_args(n_resamples, level, method)
    check_n_bins(n_bins)
    metric = _resolve(metric)
    model = _Prepared(probs, labels, n_bins, ignore_index)
    (samples,) = _resampled([model], metric, model.N, n_resamples, seed)
    unbounded = (-float("inf"), float("inf"))
    bounds = _RANGE.get(metric, unbounded) if isinstance(metric, str) else unbounded
    return _result(_full(model, metric), samples, level, method, bounds)


def paired_bootstrap_diff(probs_a, probs_b, labels, metric, n_resamples: int = 1000, seed: int = 0,
                          level: float = 0.95, n_bins: int = 15, method: str = "basic",
                          ignore_index: int | None = None) -> BootstrapResult:
    """Paired bootstrap interval of ``metric(a) - metric(b)`` on one test set.

    Both models are scored on the **same** resampled indices, so sample difficulty cancels and
    the interval is narrower than one built from two independent intervals. An interval that
    excludes 0 means the difference is significant at ``1 - level``. ``method`` as in
    :func:`bootstrap_ci` (the basic interval is not clipped: a difference may be negative); the
    basic interval corrects the bias of the difference, which does not cancel when the two
    models' biases differ (a well-calibrated model's binned ECE is the more inflated).
    """
    _check_args(n_resamples, level, method)
    check_n_bins(n_bins)
    metric = _resolve(metric)
    # each model's rows are checked against the same labels, so both keep the same N rows
    a, b = _Prepared(probs_a, labels, n_bins, ignore_index), _Prepared(probs_b, labels, n_bins, ignore_index)
    sa, sb = _resampled([a, b], metric, a.N, n_resamples, seed)
    diff = sa - sb
    return _result(_full(a, metric) - _full(b, metric), diff, level, method, (-float("inf"), float("inf")))


def bootstrap_cis(metric, probs, labels, n_resamples: int = 1000, seed: int = 0, level: float = 0.95,
                  n_bins: int = 15, method: str = "basic", ignore_index: int | None = None,
                  reference=None) -> tuple[dict, dict]:
    """Bootstrap intervals of ``metric`` for many models scored on the same ``labels``, from one
    draw of resamples shared by all, and optionally each model's paired difference from one of them.

    Args:
        probs: a mapping ``{key: probs}`` or a sequence of probability tensors (keys ``0, 1, ...``),
            each of a layout :func:`bootstrap_ci` takes, all scored on ``labels``.
        reference: ``None`` or a key of ``probs``.
        metric, n_resamples, seed, level, n_bins, method, ignore_index: as in :func:`bootstrap_ci`.

    Returns:
        ``(cis, diffs)``, dicts keyed like ``probs``: ``cis[key]`` is
        ``bootstrap_ci(metric, probs[key], labels, n_resamples, seed, level, n_bins, method,
        ignore_index)``; ``diffs[key]``, for every key but ``reference``, is
        ``paired_bootstrap_diff(probs[key], probs[reference], labels, metric, n_resamples, seed,
        level, n_bins, method, ignore_index)``; ``diffs`` is empty when ``reference`` is ``None``.
        Equal to those calls bit for bit (tested): the resamples depend only on ``seed``,
        ``n_resamples`` and ``N``, so every call draws the same ones; drawing them once is the
        decision that makes this function cheaper, not different.

    Cost, for ``M`` models and a reference: one index draw and one count matrix per chunk of
    resamples instead of ``2 M - 1`` of each (one per :func:`bootstrap_ci`, one per paired
    call), and ``M`` evaluations of the metric on the resamples instead of ``3 M - 2`` (each
    model's resampled values serve its interval and its difference).
    """
    _check_args(n_resamples, level, method)
    check_n_bins(n_bins)
    metric = _resolve(metric)
    if isinstance(probs, torch.Tensor) or not isinstance(probs, (Mapping, list, tuple)):
        raise UserError(f"probs must be a dict or a list of probability tensors, got {type(probs).__name__}")
    items = dict(probs) if isinstance(probs, Mapping) else dict(enumerate(probs))
    if not items:
        raise UserError("bootstrap_cis needs at least one probability tensor")
    if reference is not None and reference not in items:
        raise UserError(f"reference {reference!r} is not a key of probs ({', '.join(map(repr, items))})")
    # every model's rows are checked against the same labels, so all keep the same N rows
    models = {k: _Prepared(p, labels, n_bins, ignore_index) for k, p in items.items()}
    n = next(iter(models.values())).N
    samples = dict(zip(models, _resampled(list(models.values()), metric, n, n_resamples, seed)))
    full = {k: _full(m, metric) for k, m in models.items()}
    inf = float("inf")
    bounds = _RANGE.get(metric, (-inf, inf)) if isinstance(metric, str) else (-inf, inf)
    cis = {k: _result(full[k], samples[k], level, method, bounds) for k in models}
    diffs = {} if reference is None else {
        k: _result(full[k] - full[reference], samples[k] - samples[reference], level, method, (-inf, inf))
        for k in models if k != reference}
    return cis, diffs
