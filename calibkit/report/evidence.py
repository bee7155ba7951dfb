"""The report's figures: those under the recommendation (the first screen of ``index.html``) and
the Figures section (:func:`figures_section`).

Three compact figures (each about 400 px wide, side by side in the HTML), drawn from what the
report has already computed, so that the recommendation is read with its evidence:

* :func:`ece_interval_figure`: every method's test ECE before any calibrator and after its own
  calibrator chosen on validation, each with its 95% bootstrap interval (the seed-level interval
  of :func:`calibkit.report.paired.seed_interval`, the one the ranking's O-/U-ECE use);
* :func:`pair_reliability_figure`: CE's reliability diagram (no calibrator) beside the chosen
  method's after its chosen calibrator (seed: the lowest);
* :func:`smooth_figure`: the smooth reliability curves (:mod:`calibkit.curves`) of CE, CE +
  temperature scaling and the chosen pair, with their smooth ECE.

:func:`risk_coverage_figure` (the Figures section) draws the risk-coverage curves of CE, CE +
temperature scaling and the chosen pair. The Figures section also holds the bar charts and the
calibrators' heatmap of every method (:mod:`calibkit.report.figures`) and the reliability figures
of the methods :func:`figure_methods` names (the preset's ``report_figures``: every method's, or
CE's and the recommended method's only).

Intervals are drawn as lines from the interval's low to its high end and the estimate as a bar
(not as symmetric error bars): a basic bootstrap interval need not be centred on the estimate.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from calibkit.bench.grid import REFERENCE
from calibkit.curves import risk_coverage_plot, smooth_reliability_diagram
from calibkit.plots import reliability_diagram
from calibkit.report.calibrated import NONE
from calibkit.report.data import label
from calibkit.report.figures import Figure, _pyplot, _save, calibrator_heatmap, method_figure, summary_figures
from calibkit.report.paired import seed_interval
from calibkit.report.render import Section

__all__ = ["ece_interval_figure", "pair_reliability_figure", "smooth_figure", "risk_coverage_figure",
           "evidence_figures", "figure_methods", "figures_section"]

SIZE = (4.6, 3.3)  # inches at DPI 100: ~460 x 330 px; three side by side fit the first screen of a 1,400 px page


def ece_interval_figure(summary: dict, probs, selections: dict, n_boot: int, seed: int, path: Path) -> Figure:
    """Test ECE x100 per method, before (grey) and after its chosen calibrator (green), 95% intervals."""
    plt = _pyplot()
    methods = list(summary)
    cal = {m: selections[m].chosen if m in selections else NONE for m in methods}
    cells = {}
    for m in methods:
        for c in dict.fromkeys((NONE, cal[m])):
            cells[(m, c)] = seed_interval(summary[m]["runs"], probs, "ece", after=c, n_boot=n_boot, seed=seed)
    fig, ax = plt.subplots(figsize=(SIZE[0], SIZE[1]))
    y = np.arange(len(methods))[::-1]
    for offset, key, color, name in ((0.2, NONE, "tab:gray", "no calibrator"),
                                     (-0.2, None, "tab:green", "its calibrator chosen on validation")):
        vals, los, his = [], [], []
        for m in methods:
            ci = cells.get((m, cal[m] if key is None else key)) or {"value": np.nan, "lo": np.nan, "hi": np.nan}
            vals.append(100 * ci["value"])
            los.append(100 * ci["lo"])
            his.append(100 * ci["hi"])
        ax.barh(y + offset, vals, 0.4, color=color, label=name)
        ax.hlines(y + offset, los, his, color="black", lw=1.2)
    names = [f"{label(m)} + {cal[m]}" if cal[m] != NONE else label(m) for m in methods]
    ax.set_yticks(y, names, fontsize=7)
    ax.set_xlabel("test ECE x100 (black: 95% bootstrap interval)", fontsize=8)
    ax.set_title("Test ECE by method, before and after its calibrator", fontsize=9)
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(fontsize=7, loc="lower right", frameon=False)
    fig.tight_layout()
    n_seeds = max(len(e["runs"]) for e in summary.values())
    caption = (f"Test ECE (x100, mean over {n_seeds} seed(s)) of each method with no calibrator (grey) and after "
               f"the calibrator chosen for it on validation (green, named after the method), with 95% bootstrap "
               f"intervals ({n_boot} resamples; black lines).")
    return Figure(_save(fig, path, laid_out=True), caption)


def _first_run(summary: dict, method: str) -> dict:
    return min(summary[method]["runs"], key=lambda r: r["seed"])


def pair_reliability_figure(summary: dict, probs, method: str, calibrator: str, path: Path) -> Figure:
    """CE without a calibrator beside ``method`` after ``calibrator`` (binned reliability diagrams)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(SIZE[0] * 1.25, SIZE[1]), sharey=True)
    ce, pick = _first_run(summary, REFERENCE), _first_run(summary, method)
    for ax, row, cal in ((axes[0], ce, NONE), (axes[1], pick, calibrator)):
        p, y = probs(row, cal)
        name = label(row["method"]) + ("" if cal == NONE else f" + {cal}")
        reliability_diagram(p, y, ax=ax, title=name, show_counts=False)
        ax.title.set_fontsize(8)
        ax.get_legend().remove()
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    caption = (f"Reliability diagrams on the test set (seed {pick['seed']}): CE with no calibrator (left) and the "
               f"recommendation, {label(method)} + {calibrator} (right). Blue bars: accuracy per confidence bin; "
               "the gap to the dashed diagonal is shaded (red: over-confident, purple: under-confident).")
    return Figure(_save(fig, path, laid_out=True), caption)


def _pairs(summary: dict, probs, method: str, calibrator: str) -> dict:
    ce = _first_run(summary, REFERENCE)
    out = {"CE": probs(ce, NONE), "CE + temperature": probs(ce, "temperature")}
    out.setdefault(f"{label(method)} + {calibrator}", probs(_first_run(summary, method), calibrator))
    return out


def smooth_figure(summary: dict, probs, method: str, calibrator: str, path: Path) -> Figure:
    """Smooth reliability curves of CE, CE + temperature scaling and the chosen pair."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=SIZE)
    smooth_reliability_diagram(_pairs(summary, probs, method, calibrator), ax=ax,
                               title="Smooth reliability diagram (test)")
    ax.tick_params(labelsize=7)
    fig.tight_layout()
    caption = ("Smooth reliability diagram (the kernel-smoothed accuracy against confidence of smooth ECE, "
               "bandwidth sigma at its fixed point; no bins) of CE, CE + temperature scaling and the "
               "recommendation, seed "
               f"{_first_run(summary, REFERENCE)['seed']}; drawn where rows are (density at least 1% of its peak).")
    return Figure(_save(fig, path, laid_out=True), caption)


def risk_coverage_figure(summary: dict, probs, method: str, calibrator: str, path: Path) -> Figure:
    """Risk-coverage curves of CE, CE + temperature scaling and the chosen pair."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(SIZE[0] * 1.3, SIZE[1]))
    risk_coverage_plot(_pairs(summary, probs, method, calibrator), ax=ax, title="Risk-coverage on the test set")
    fig.tight_layout()
    caption = ("Risk-coverage curves (accept the most confident test rows first; the error among the accepted "
               "rows against the share accepted; lower is better) of CE, CE + temperature scaling and the "
               "recommendation; AURC x100 in the legend.")
    return Figure(_save(fig, path, laid_out=True), caption)


def evidence_figures(ctx) -> list[Figure]:
    """The first screen's three figures (empty without a recommendation or without figures)."""
    if not ctx.figures or ctx.verdict is None or ctx.selections is None or REFERENCE not in ctx.summary:
        return []
    method, cal = ctx.verdict["method"], ctx.verdict["calibrator"]
    out = ctx.figdir
    return [ece_interval_figure(ctx.summary, ctx.probs, ctx.selections, ctx.n_boot, 0, out / "ece_intervals.png"),
            pair_reliability_figure(ctx.summary, ctx.probs, method, cal, out / "reliability_ce_vs_chosen.png"),
            smooth_figure(ctx.summary, ctx.probs, method, cal, out / "smooth_reliability.png")]



def evidence_section(ctx) -> list:
    """The section of the first screen's figures, right under the recommendation (HTML and Markdown only)."""
    figs = evidence_figures(ctx)
    if not figs:
        return []
    return [Section("The evidence, at a glance (test set)", figures=figs, terminal=False, anchor="evidence", lead=True)]


def figure_methods(summary: dict, which: str, verdict: dict | None = None) -> list[str]:
    """The methods of ``summary`` (grid order) whose reliability figure the report draws: every one
    for ``which = "all"``; for ``"ce-and-chosen"``, CE and the method of ``verdict`` (the
    recommendation; None: not known, CE alone)."""
    if which == "all":
        return list(summary)
    chosen = {REFERENCE} | ({verdict["method"]} if verdict is not None else set())
    return [m for m in summary if m in chosen]


def figures_section(ctx) -> list:
    """The Figures section: the bar charts, the calibrators' heatmap, the risk-coverage curves and
    the reliability figures of ``ctx.figure_methods`` (HTML and Markdown only). A method's figure
    left over from an earlier build that drew it is removed, so ``figures/`` holds what the report shows."""
    if not ctx.figures:
        return []
    figs = summary_figures(ctx.summary, ctx.figdir)
    if ctx.grid:
        figs.append(calibrator_heatmap(ctx.grid, ctx.figdir))
    if ctx.verdict is not None and REFERENCE in ctx.summary:
        figs.append(risk_coverage_figure(ctx.summary, ctx.probs, ctx.verdict["method"], ctx.verdict["calibrator"],
                                         ctx.figdir / "risk_coverage.png"))
    shown = list(ctx.summary) if ctx.figure_methods is None else ctx.figure_methods
    for method, entry in ctx.summary.items():
        path = ctx.figdir / f"reliability_{method}.png"
        if method in shown:
            figs.append(method_figure(entry["runs"][0], path, draw=path not in ctx.drawn))
        else:
            path.unlink(missing_ok=True)
    text = ("Reliability diagrams: blue bars = accuracy per confidence bin, the dashed diagonal = perfect "
            "calibration, hatched bands = the gap to the bin's mean confidence (light red above a bar: "
            "over-confident; purple inside a bar: under-confident), numbers = images per bin. "
            "One seed per method (the lowest).")
    if len(shown) < len(ctx.summary):
        names = ", ".join(label(m) for m in shown)
        if REFERENCE not in ctx.summary:  # no CE: no recommendation either (it is measured against CE + TS)
            whose = "no method (no CE run, no recommendation)"
        else:
            whose = f"CE and the recommended method only ({names})" if ctx.verdict else "CE only (no recommendation)"
        text += (f" Drawn for {whose}: the preset's `report_figures = \"ce-and-chosen\"`; "
                 "`calibkit report DIR --all-figures` draws every method's.")
    return [Section("Figures", text, figures=figs, terminal=False)]
