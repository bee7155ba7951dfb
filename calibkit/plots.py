"""Reliability diagram and confidence histogram.

Computing the curve (:func:`reliability_curve`, numbers only) is separate from drawing it. The
drawing functions take an existing matplotlib ``Axes`` or, with ``ax=None``, create a figure on
the Agg canvas (``matplotlib.figure.Figure`` + ``FigureCanvasAgg``) without touching pyplot or
the global backend, so they work on machines without a display. Save with
``ax.figure.savefig(path)``.

Binning is that of the metrics (:mod:`calibkit.functional.binning`): equal-width ``(lo, hi]``
bins, edges in the confidence's dtype, 1.0 in the last bin; the ECE in the title therefore equals
:func:`calibkit.functional.ece`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from calibkit._validation import as_tensor, check_n_bins, check_probs
from calibkit.functional.binning import (
    BinSums,
    binned_errors,
    equal_width_bins,
    equal_width_edges,
    top_label,
)
from calibkit.functional.inputs import to_rows

__all__ = ["ReliabilityCurve", "reliability_curve", "reliability_diagram", "confidence_histogram"]


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
    """

    edges: np.ndarray
    count: np.ndarray
    confidence: np.ndarray
    accuracy: np.ndarray
    ece: float
    n: int


def reliability_curve(probs, labels, n_bins: int = 15, ignore_index: int | None = None) -> ReliabilityCurve:
    """Bin the top-label confidences of ``probs`` and the correctness against ``labels``.

    Every layout of the metrics: ``(N, K)``, binary ``(N,)`` positive-class probabilities
    (confidence ``max(p, 1 - p)``), dense ``(N, K, *spatial)``, with ``ignore_index``.
    """
    from calibkit.functional.metrics import _sums

    s = _sums(probs, labels, check_n_bins(n_bins), ignore_index=ignore_index)
    sums = BinSums(*(t.cpu() for t in (s.top.count, s.top.conf, s.top.correct)))
    count = sums.count.numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        confidence = np.where(count > 0, sums.conf.numpy() / count, np.nan)
        accuracy = np.where(count > 0, sums.correct.numpy() / count, np.nan)
    return ReliabilityCurve(
        edges=equal_width_edges(n_bins).numpy(),
        count=count,
        confidence=confidence,
        accuracy=accuracy,
        ece=float(binned_errors(sums)["ece"]),
        n=int(round(float(sums.count.sum()))),
    )


def _new_axes(ax, figsize=(4.5, 4.5)):
    if ax is not None:
        return ax
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig.add_subplot(1, 1, 1)


def reliability_diagram(probs, labels, n_bins: int = 15, ax=None, title: str | None = None,
                        show_counts: bool = True):
    """Bars of accuracy per confidence bin, with the gap to the diagonal shaded.

    Each non-empty bin draws a blue bar of height ``acc_b``; the gap between ``acc_b`` and the
    bin's mean confidence ``conf_b`` is a hatched band: light red above the bar where the bin is
    over-confident (``conf_b > acc_b``), purple inside the bar where it is under-confident
    (``acc_b > conf_b``; the bar's top is still ``acc_b``). The dashed diagonal is perfect calibration, the number above each bar is
    ``n_b``, and the title carries the ECE (in %). The legend sits below the axes, so it never
    covers a bar or a count.

    Args:
        probs: ``(N, K)`` probabilities; labels: ``(N,)`` integer labels.
        n_bins: equal-width bins.
        ax: matplotlib Axes to draw on (a new Agg figure when ``None``).
        title: text placed before the ECE in the title.
        show_counts: write the count above each bar.

    Returns:
        The Axes drawn on.
    """
    curve = reliability_curve(probs, labels, n_bins)
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
    if show_counts:
        size = 7 if n_bins <= 20 else 5
        for x, w, a, c, n in zip(lo[full], width[full], curve.accuracy[full], curve.confidence[full], curve.count[full]):
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
