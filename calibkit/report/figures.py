"""The report's figures: one reliability panel per method and two per-method bar charts.

Each function writes a PNG and returns a :class:`Figure` with a caption written for readers (the
HTML and Markdown reports show the caption under the image).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from calibkit.plots import confidence_histogram, reliability_diagram
from calibkit.report.data import label, load_probs
from calibkit.rundir import atomic_write

DPI = 100
#: The per-method figure's margins (figure fractions), fixed: its panels, titles (two lines), tick
#: labels and legends below the axes (at most five entries) have the same extent whatever the run, so
#: measuring every text to lay it out (``tight_layout``, a quarter of the figure's time) is not
#: needed. These are the margins ``tight_layout`` chose for the smoke bench's 15 methods (wspace:
#: their largest, 0.318), rounded up.
METHOD_LAYOUT = dict(left=0.052, right=0.98, bottom=0.345, top=0.885, wspace=0.32)


@dataclass
class Figure:
    """A written PNG and its caption."""

    path: Path
    caption: str


def _pyplot():
    matplotlib.use("Agg")  # files only; never needs a display

    return plt


def _save(fig, path: Path, laid_out: bool = False) -> Path:
    """Write ``fig`` to ``path`` and close it. ``laid_out``: the figure was laid out already
    (``tight_layout`` or fixed margins), so it is saved as it is; otherwise its bounding box is cropped to what it
    draws (``bbox_inches="tight"``). Either way the figure is laid out once: both measure every
    text of the figure, and doing both cost about a third of a figure's time."""
    crop = None if laid_out else "tight"
    if laid_out:  # tight_layout leaves a placeholder layout engine, for which savefig draws the figure
        fig.set_layout_engine(None)  # once more before drawing it; it moves nothing (rc: no autolayout)
    # atomic (a reader never sees half a figure); the format is named, the temporary file has none
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=DPI, bbox_inches=crop, format=Path(path).suffix[1:]))
    _pyplot().close(fig)
    return path


def method_figure(row: dict, path: Path, draw: bool = True) -> Figure:
    """Reliability diagram before and after TS and the confidence histogram of one run (``draw=False``:
    only its caption; the PNG at ``path`` was drawn by this function in another process)."""
    name = f"{label(row['method'])} (seed {row['seed']})"
    temperature = float((row.get("metrics") or {}).get("temperature") or 1.0)  # as load_probs reads it
    caption = (f"{name}: reliability diagrams of the test set before and after temperature scaling "
               f"(T = {temperature:.2f}, fitted on the validation set), with the 90% consistency band of a calibrated "
               "model (where its bars would lie, per bin; a bar outside is evidence of miscalibration), and the "
               "histogram of its confidences.")
    if not draw:
        return Figure(Path(path), caption)
    plt = _pyplot()

    probs, labels, temperature = load_probs(row)
    logits = np.log(np.clip(probs, 1e-300, None))  # = test logits up to a per-row constant
    z = logits / temperature
    probs_ts = np.exp(z - z.max(1, keepdims=True))
    probs_ts /= probs_ts.sum(1, keepdims=True)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.6))
    # the grey band: where a calibrated model's bars would lie, 90% per bin (consistency band, calibkit.plots)
    reliability_diagram(probs, labels, ax=axes[0], title=f"{name}: before TS", band=True, band_kind="consistency")
    reliability_diagram(probs_ts, labels, ax=axes[1], title=f"{name}: after TS (T = {temperature:.2f})", band=True,
                        band_kind="consistency")
    confidence_histogram(probs, labels, ax=axes[2], title=f"{name}: confidence, before TS")
    fig.subplots_adjust(**METHOD_LAYOUT)
    return Figure(_save(fig, path, laid_out=True), caption)


def summary_figures(summary: dict, out: Path) -> list[Figure]:
    """O-/U-ECE stacked bars (O + U = ECE) and ECE before/after TS bars, one bar group per method."""
    plt = _pyplot()
    names = [label(m) for m in summary]
    n_seeds = max((len(e["seeds"]) for e in summary.values()), default=1)

    def get(key):
        return np.array([summary[m]["stats"].get(key, (np.nan, np.nan, 0))[0] * 100 for m in summary])

    x = np.arange(len(names))
    size = (max(7.0, 0.55 * len(names) + 3), 4.2)
    figs = []
    fig, ax = plt.subplots(figsize=size)
    o, u = get("before.o_ece"), get("before.u_ece")
    ax.bar(x, o, color="tab:red", label="O-ECE (over-confidence)")
    ax.bar(x, u, bottom=o, color="tab:blue", label="U-ECE (under-confidence)")
    _finish(ax, x, names, "ECE x100 (O-ECE + U-ECE)", "Over- and under-confidence on the test set, before TS")
    figs.append(Figure(_save(fig, out / "ou_ece.png"),
                       f"Test ECE of each method split into over-confidence (O-ECE, red) and under-confidence "
                       f"(U-ECE, blue), before temperature scaling; the bar's height is the ECE (x100, mean "
                       f"over {n_seeds} seed(s))."))
    fig, ax = plt.subplots(figsize=size)
    ax.bar(x - 0.2, get("before.ece"), 0.4, label="before TS", color="tab:gray")
    ax.bar(x + 0.2, get("after.ece"), 0.4, label="after TS", color="tab:green")
    _finish(ax, x, names, "ECE x100", "Test ECE before and after temperature scaling")
    figs.append(Figure(_save(fig, out / "ece_before_after_ts.png"),
                       f"Test ECE of each method before (grey) and after (green) temperature scaling fitted on "
                       f"the validation set (x100, mean over {n_seeds} seed(s))."))
    return figs


def _finish(ax, x, names, ylabel: str, title: str) -> None:
    ax.set_xticks(x, names, rotation=45, ha="right", fontsize=9)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)


def calibrator_heatmap(grid: dict, out: Path) -> Figure:
    """Heatmap of the test ECE (x100, seed mean) of every method (rows) after every calibrator
    (columns, ``none`` = before any); ``grid``: :func:`calibkit.report.calibrated.calibrator_grid`."""
    plt = _pyplot()
    methods = list(grid)
    names = list(next(iter(grid.values())))
    values = np.array([[np.nan if grid[m][c] is None else grid[m][c]["ece"][0] * 100 for c in names]
                       for m in methods])
    fig, ax = plt.subplots(figsize=(max(4.5, 1.1 * len(names) + 2.5), max(3.0, 0.38 * len(methods) + 1.2)))
    im = ax.imshow(values, cmap="viridis_r", aspect="auto")
    ax.set_xticks(np.arange(len(names)), names, rotation=30, ha="right", fontsize=9)
    ax.set_yticks(np.arange(len(methods)), [label(m) for m in methods], fontsize=9)
    mid = np.nanmean(values)
    for i in range(len(methods)):
        for j in range(len(names)):
            text = "-" if np.isnan(values[i, j]) else f"{values[i, j]:.2f}"
            ax.text(j, i, text, ha="center", va="center", fontsize=8,
                    color="white" if values[i, j] > mid else "black")
    fig.colorbar(im, ax=ax, label="test ECE x100")
    ax.set_title("Test ECE: training-time method x post-hoc calibrator", fontsize=10)
    caption = ("Test ECE (x100, mean over seeds) of every training-time method (rows) after every post-hoc "
               "calibrator fitted on its validation logits (columns; `none` = the uncalibrated softmax). "
               "Lighter = lower ECE.")
    return Figure(_save(fig, out / "calibrators_ece.png"), caption)
