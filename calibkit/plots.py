"""Reliability diagram and confidence histogram.

Computing the curve (:func:`reliability_curve`, numbers only) is separate from drawing it. The
drawing functions take an existing matplotlib ``Axes`` or, with ``ax=None``, create a figure on
the Agg canvas (``matplotlib.figure.Figure`` + ``FigureCanvasAgg``) without touching pyplot or
the global backend, so they work on machines without a display. Save with
``ax.figure.savefig(path)``.

Binning is that of the metrics (:mod:`calibkit.functional.binning`): equal-width ``(lo, hi]``
bins, edges in the confidence's dtype, 1.0 in the last bin; the ECE in the title therefore equals
:func:`calibkit.functional.ece`.

**Bootstrap band** (``band=True``): how far each bin's accuracy could move with another sample
of the same size. ``n_boot`` resamples of the ``N`` rows with replacement, the bin of each row
fixed by its confidence (fixed edges); in each resample the accuracy of every bin is recomputed,
and the band of bin ``b`` is the percentile interval ``[q_{(1 - level)/2}, q_{(1 + level)/2}]``
(``np.quantile``, linear interpolation) of those accuracies, default ``level = 0.9`` over 1000
resamples. A resample in which bin ``b`` is empty has no accuracy there and is left out of that
bin's quantiles (its other bins still count); a bin empty in the data has no band (NaN).
A resample of rows only changes how many rows of each (bin, correct) cell it holds, so the
resamples are drawn as their cell counts, one multinomial draw of ``N`` over the ``2 B`` cells
``(bin 0 wrong, bin 0 correct, bin 1 wrong, ...)`` with probabilities the cells' shares of the
rows: the same distribution as drawing row indices, at a cost independent of ``N``. The draw
uses ``numpy.random.default_rng(seed)`` (``seed = 0`` by default), so a band is reproducible.
It answers "how sure is this bar's height", **not** "is this bar consistent with calibration": a
bar can have a bootstrap band that misses the diagonal by chance alone (on simulated calibrated
models, a 90% band holds the calibrated value in 80-84% of the bins, 63% of those under 20 rows,
and in every bin at once in 11-12% of the simulations; ``docs/metrics.md``).

**Consistency band** (``band_kind="consistency"``, Broecker and Smith, 2007, "consistency
bars"): the spread of the bars of a **perfectly calibrated** model with the same confidences. If
the labels were drawn ``y_i ~ Bernoulli(c_i)`` from the observed confidences, bin ``b``'s correct
count would be Poisson-binomial with mean ``sum c_i = n_b conf_b``; calibkit uses the binomial
``Bin(n_b, conf_b)`` with the same mean (exact quantiles from its probability mass function, no
sampling), whose tails bound the Poisson-binomial's (Hoeffding, 1956), so the band errs on the wide
side. The band of bin ``b`` is ``[k_lo / n_b, k_hi / n_b]`` with ``k_lo`` the ``t``-quantile and
``k_hi`` the ``(1 - t)``-quantile of that binomial, ``t = (1 - level) / 2``: a calibrated model's
bar lies inside with probability at least ``level``. ``simultaneous=True`` uses
``t = (1 - level) / (2 m)`` over the ``m`` non-empty bins (Bonferroni), so that **every** bar lies
inside at once with probability at least ``level``. The band sits around the diagonal (at each
bin's mean confidence); a bar outside it is evidence of miscalibration at that level.
Coverage measured by simulation: ``benchmarks/reliability_band_coverage.py`` and
``docs/metrics.md``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from calibkit._validation import as_tensor, check_n_bins, check_probs
from calibkit.errors import UserError
from calibkit.functional.binning import (
    BinSums,
    binned_errors,
    equal_width_bins,
    equal_width_edges,
    top_label,
)
from calibkit.functional.inputs import to_rows
from calibkit.functional.metrics import _sums

__all__ = ["ReliabilityCurve", "reliability_curve", "bootstrap_band", "consistency_band", "reliability_diagram",
           "confidence_histogram", "BAND_KINDS"]

#: The bands a reliability diagram can show (module docstring).
BAND_KINDS = ("bootstrap", "consistency")


@dataclass
class ReliabilityCurve:
    """Per-bin numbers of a reliability diagram (numpy float64 arrays of shape ``(B,)``).

    Attributes:
        edges: ``(B + 1,)`` bin edges ``j / B``.
        count: samples per bin ``n_b``.
        confidence: mean top-label confidence per bin (NaN for empty bins).
        accuracy: accuracy per bin (NaN for empty bins).
        ece: expected calibration error of the same bins.
        n: number of samples.
        band_lo, band_hi: the band per bin (NaN for empty bins), or ``None`` without ``band``:
            the bootstrap interval of the accuracy, or the consistency band of a calibrated
            model (module docstring).
        band_level: its coverage level, or ``None``.
        band_kind: ``"bootstrap"`` or ``"consistency"``, or ``None``; band_simultaneous: whether
            the level holds for all bins at once (consistency band only).
    """

    edges: np.ndarray
    count: np.ndarray
    confidence: np.ndarray
    accuracy: np.ndarray
    ece: float
    n: int
    band_lo: np.ndarray | None = None
    band_hi: np.ndarray | None = None
    band_level: float | None = None
    band_kind: str | None = None
    band_simultaneous: bool = False


def reliability_curve(probs, labels, n_bins: int = 15, ignore_index: int | None = None, band: bool = False,
                      level: float = 0.9, n_boot: int = 1000, seed: int = 0, band_kind: str = "bootstrap",
                      simultaneous: bool = False) -> ReliabilityCurve:
    """Bin the top-label confidences of ``probs`` and the correctness against ``labels``.

    Every layout of the metrics: ``(N, K)``, binary ``(N,)`` positive-class probabilities
    (confidence ``max(p, 1 - p)``), dense ``(N, K, *spatial)``, with ``ignore_index``.
    ``band=True`` adds the bootstrap interval of each bin's accuracy (module docstring):
    ``level`` in ``(0, 1)``, ``n_boot >= 2`` resamples, integer ``seed >= 0`` (checked even
    without ``band``). ``band_kind="consistency"`` adds the consistency band of a calibrated model
    instead (pointwise, or for all bins at once with ``simultaneous=True``; ``n_boot`` and ``seed``
    unused: its quantiles are exact).
    """
    _check_band_args(level, n_boot, seed)
    _check_kind(band_kind, simultaneous)
    s = _sums(probs, labels, check_n_bins(n_bins), ignore_index=ignore_index)
    sums = BinSums(*(t.cpu() for t in (s.top.count, s.top.conf, s.top.correct)))
    count = sums.count.numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        confidence = np.where(count > 0, sums.conf.numpy() / count, np.nan)
        accuracy = np.where(count > 0, sums.correct.numpy() / count, np.nan)
    curve = ReliabilityCurve(
        edges=equal_width_edges(n_bins).numpy(),
        count=count,
        confidence=confidence,
        accuracy=accuracy,
        ece=float(binned_errors(sums)["ece"]),
        n=int(round(float(sums.count.sum()))),
    )
    if band and band_kind == "consistency":
        curve.band_lo, curve.band_hi = consistency_band(count, sums.conf.numpy(), level, simultaneous)
    elif band:
        curve.band_lo, curve.band_hi = bootstrap_band(count, sums.correct.numpy(), level, n_boot, seed)
    if band:
        curve.band_level, curve.band_kind = float(level), band_kind
        curve.band_simultaneous = bool(simultaneous and band_kind == "consistency")
    return curve


def _check_kind(band_kind, simultaneous) -> None:
    if band_kind not in BAND_KINDS:
        raise UserError(f"band_kind must be one of {', '.join(BAND_KINDS)}, got {band_kind!r}")
    if not isinstance(simultaneous, bool):
        raise UserError(f"simultaneous must be True or False, got {simultaneous!r}")
    if simultaneous and band_kind != "consistency":
        raise UserError("simultaneous=True is for band_kind='consistency' (the bootstrap band is per bin)")


def consistency_band(count, conf_sum, level: float = 0.9, simultaneous: bool = False):
    """The consistency band of a calibrated model from the bin counts ``count`` and the sums of
    the confidences ``conf_sum`` (``(B,)`` each): ``(lo, hi)`` float64 arrays ``(B,)``, NaN for
    empty bins (method: module docstring; exact binomial quantiles)."""
    _check_band_args(level, 2, 0)
    count = np.rint(np.asarray(count, np.float64))
    conf_sum = np.asarray(conf_sum, np.float64)
    full = count > 0
    tail = (1 - level) / (2 * max(1, int(full.sum())) if simultaneous else 2)
    lo, hi = np.full(len(count), np.nan), np.full(len(count), np.nan)
    for b in np.flatnonzero(full):
        n = int(count[b])
        c = min(max(conf_sum[b] / n, 0.0), 1.0)
        k = torch.arange(n + 1, dtype=torch.float64)
        nt, ct = torch.tensor(float(n), dtype=torch.float64), torch.tensor(c, dtype=torch.float64)
        log_pmf = (torch.lgamma(nt + 1) - torch.lgamma(k + 1) - torch.lgamma(nt - k + 1)
                   + torch.xlogy(k, ct) + torch.xlogy(nt - k, 1 - ct))
        cdf = torch.cumsum(torch.exp(log_pmf), 0).numpy()
        cdf /= cdf[-1]
        lo[b] = np.searchsorted(cdf, tail) / n  # least k with P(X <= k) >= t
        hi[b] = min(int(np.searchsorted(cdf, 1 - tail)), n) / n
    return lo, hi


def _check_band_args(level, n_boot, seed) -> None:
    if isinstance(level, bool) or not isinstance(level, (int, float, np.floating)) or not 0 < level < 1:
        raise UserError(f"level must be a number in (0, 1), got {level!r}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 2:
        raise UserError(f"n_boot must be an integer >= 2, got {n_boot!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise UserError(f"seed must be a non-negative integer, got {seed!r}")


def bootstrap_band(count, correct, level: float = 0.9, n_boot: int = 1000, seed: int = 0):
    """Per-bin bootstrap interval of the accuracy from the bin counts ``count`` and correct
    counts ``correct`` (``(B,)`` each): ``(lo, hi)`` float64 arrays ``(B,)``, NaN for bins that
    are empty in the data (method: module docstring)."""
    _check_band_args(level, n_boot, seed)
    count, correct = np.rint(np.asarray(count, np.float64)), np.rint(np.asarray(correct, np.float64))
    n = int(count.sum())
    cells = np.stack([count - correct, correct], 1).reshape(-1)  # (bin 0 wrong, bin 0 correct, ...)
    draws = np.random.default_rng(seed).multinomial(n, cells / n, size=n_boot).reshape(n_boot, -1, 2)
    drawn = draws.sum(2).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = np.where(drawn > 0, draws[..., 1] / drawn, np.nan)  # an empty bin has no accuracy
    tail = (1 - level) / 2
    lo, hi = np.full(len(count), np.nan), np.full(len(count), np.nan)
    full = count > 0
    if full.any():
        with warnings.catch_warnings():  # a bin empty in every resample (tiny bins, few resamples): NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            q = np.nanquantile(acc[:, full], [tail, 1 - tail], axis=0)
        lo[full], hi[full] = q[0], q[1]
    return lo, hi


def _new_axes(ax, figsize=(4.5, 4.5)):
    if ax is not None:
        return ax

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig.add_subplot(1, 1, 1)


def reliability_diagram(probs, labels, n_bins: int = 15, ax=None, title: str | None = None,
                        show_counts: bool = True, band: bool = False, level: float = 0.9, n_boot: int = 1000,
                        seed: int = 0, band_kind: str = "bootstrap", simultaneous: bool = False):
    """Bars of accuracy per confidence bin, with the gap to the diagonal shaded.

    Each non-empty bin draws a blue bar of height ``acc_b``; the gap between ``acc_b`` and the
    bin's mean confidence ``conf_b`` is a hatched band: light red above the bar where the bin is
    over-confident (``conf_b > acc_b``), purple inside the bar where it is under-confident
    (``acc_b > conf_b``; the bar's top is still ``acc_b``). The dashed diagonal is perfect
    calibration, the number above each bar is ``n_b``, and the title carries the ECE (in %). The
    legend sits below the axes, so it never covers a bar or a count.

    Args:
        probs: ``(N, K)`` probabilities; labels: ``(N,)`` integer labels.
        n_bins: equal-width bins.
        ax: matplotlib Axes to draw on (a new Agg figure when ``None``).
        title: text placed before the ECE in the title.
        show_counts: write the count above each bar.
        band: shade a band over each non-empty bin's width (grey, a step band; the legend names
            which): ``band_kind="bootstrap"``, the bootstrap interval of the accuracy around the
            bar tops; ``"consistency"``, where a calibrated model's bars would lie, around the
            diagonal (``simultaneous=True``: all bins at once). Methods in the module docstring.
        level, n_boot, seed: the band's coverage level, resamples and seed.

    Returns:
        The Axes drawn on.
    """
    curve = reliability_curve(probs, labels, n_bins, band=band, level=level, n_boot=n_boot, seed=seed,
                              band_kind=band_kind, simultaneous=simultaneous)
    ax = _new_axes(ax)
    lo, width = curve.edges[:-1], np.diff(curve.edges)
    full = curve.count > 0
    ax.plot([0, 1], [0, 1], ls="--", color="0.4", lw=1, label="perfect calibration")
    ax.bar(lo[full], curve.accuracy[full], width=width[full], align="edge", color="#4878cf",
           edgecolor="black", lw=0.6, label="accuracy")
    over = full & (curve.confidence > curve.accuracy)
    under = full & (curve.accuracy > curve.confidence)
    # The band is light red above a bar (over-confidence) and purple inside it (under-confidence: the
    # red band seen over the blue bar), each named in the legend.
    for mask, color, hatch, text in ((over, "#ecb7b7", "//", "gap above the bar: over-confident (conf > acc)"),
                                     (under, "#886d9d", "\\\\", "gap inside the bar: under-confident (acc > conf)")):
        if mask.any():
            ax.bar(lo[mask], np.abs(curve.accuracy - curve.confidence)[mask],
                   bottom=np.minimum(curve.accuracy, curve.confidence)[mask], width=width[mask], align="edge",
                   color=color, edgecolor="#b03030", hatch=hatch, lw=0.6, label=text)
    if band:
        _draw_band(ax, curve, n_boot)
    if show_counts:
        size = 7 if n_bins <= 20 else 5
        bars = zip(lo[full], width[full], curve.accuracy[full], curve.confidence[full], curve.count[full])
        for x, w, a, c, n in bars:
            ax.text(x + w / 2, max(a, c) + 0.01, f"{int(n)}", ha="center", va="bottom", fontsize=size,
                    rotation=90 if n_bins > 10 else 0, color="0.2")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.2)  # room above 1.0 for the rotated counts of the top bins
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy")
    ece_text = f"ECE = {100 * curve.ece:.2f}%  (N = {curve.n}, {n_bins} bins)"
    ax.set_title(f"{title}\n{ece_text}" if title else ece_text, fontsize=10)
    _legend_below(ax)
    return ax


def _draw_band(ax, curve: ReliabilityCurve, n_boot: int) -> None:
    """The band as one step-shaped fill (a collection, no bar patch): flat over each bin."""
    assert curve.band_lo is not None and curve.band_hi is not None and curve.band_level is not None  # band=True
    has = np.isfinite(curve.band_lo)
    if not has.any():
        return
    x = np.repeat(curve.edges, 2)[1:-1]  # each bin's (lo, hi)
    if curve.band_kind == "consistency":
        which = "all bins at once" if curve.band_simultaneous else "per bin"
        text = f"{100 * curve.band_level:g}% consistency band of a calibrated model ({which})"
    else:
        text = f"{100 * curve.band_level:g}% bootstrap band of the accuracy ({n_boot} resamples)"
    ax.fill_between(x, np.repeat(np.where(has, curve.band_lo, 0), 2), np.repeat(np.where(has, curve.band_hi, 0), 2),
                    where=np.repeat(has, 2), facecolor=(0.1, 0.1, 0.1, 0.3), edgecolor="black", lw=0.8, zorder=3,
                    label=text)


def confidence_histogram(probs, labels=None, n_bins: int = 15, ax=None, title: str | None = None):
    """Histogram of top-label confidences (fraction of samples per equal-width bin).

    Vertical lines mark the mean confidence and, when ``labels`` are given, the accuracy: a
    mean confidence to the right of the accuracy is over-confidence.

    Returns:
        The Axes drawn on.
    """
    if labels is not None:
        rows = to_rows(probs, labels)  # binary (N,) and dense layouts become (P, K) rows
        probs, y = check_probs(rows.probs, rows.labels)
    else:
        p = as_tensor(probs, "probs")
        probs, y = check_probs(torch.stack([1 - p, p], 1) if p.dim() == 1 else p), None
    n_bins = check_n_bins(n_bins)
    conf, pred = top_label(probs)
    edges = equal_width_edges(n_bins).numpy()
    count = np.bincount(equal_width_bins(conf, n_bins).numpy(), minlength=n_bins)
    ax = _new_axes(ax)
    ax.bar(edges[:-1], count / count.sum(), width=np.diff(edges), align="edge", color="#6acc65",
           edgecolor="black", lw=0.6)
    mean_conf = float(conf.double().mean())
    ax.axvline(mean_conf, color="#b03030", ls="--", lw=1.5, label=f"mean confidence {100 * mean_conf:.1f}%")
    if y is not None:
        acc = float((pred == y).double().mean())
        ax.axvline(acc, color="#4878cf", ls="-", lw=1.5, label=f"accuracy {100 * acc:.1f}%")
    ax.set_xlim(0, 1)
    ax.set_xlabel("confidence")
    ax.set_ylabel("fraction of samples")
    ax.set_title(title if title else f"confidence histogram (N = {probs.shape[0]})", fontsize=10)
    _legend_below(ax)
    return ax


def _legend_below(ax) -> None:
    """The legend under the x-axis label, one entry per row: outside the data, readable at 8 pt."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=1, fontsize=8, frameon=False,
              handlelength=1.6, borderaxespad=0.0)
