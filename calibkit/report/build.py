"""``build_report``: read the results database, compute the summaries, write the report files.

The report is a list of sections made by the builders in :data:`SECTIONS`, in order. A builder
takes the :class:`ReportContext` (database rows, per-method summary, ECE differences, where
figures go) and returns the sections it has to show (none when the database holds nothing for
it). Adding a part to the report = writing one builder and inserting it into :data:`SECTIONS`;
the terminal text, ``report.md`` and ``index.html`` all follow.
"""

from __future__ import annotations

import inspect
import shutil
import textwrap
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from calibkit.bench.collect import unrecorded
from calibkit.bench.grid import REFERENCE
from calibkit.bench.progress import Phases
from calibkit.bootstrap import shared_draws
from calibkit.errors import UserError
from calibkit.losses import LOSSES
from calibkit.report import fits, sets
from calibkit.report.calibrated import CalibratedProbs, calibrator_names
from calibkit.report.data import BETTER_MARK, WORSE_MARK, ece_deltas, interval_note, label, summarize, usable_rows
from calibkit.report.evidence import evidence_section, figure_methods, figures_section
from calibkit.report.preset import (
    effective_settings,
    note_for_runs,
    preset_section,
    recorded_preset,
    report_calibrators,
)
from calibkit.report.protocol import protocol_section
from calibkit.report.render import Section, to_html, to_markdown, to_text
from calibkit.report.tables import ROW_BEST_MARK, calibrator_tables, grid_tables, ranked_table, robustness_table
from calibkit.report.tuning import load_current_runs
from calibkit.report.verdict import (
    DEFAULT_RULE,
    metric_name,
    recommendation_text,
    validation_table,
)
from calibkit.rundir import atomic_write
from calibkit.store import describe_store


@dataclass
class ReportContext:
    """What every section builder may read.

    Attributes:
        out_dir: the bench output directory.
        preset: the preset whose runs are reported.
        rows: every database row of the preset (any status).
        summary: :func:`calibkit.report.data.summarize` of the finished rows (grid order).
        deltas: :func:`calibkit.report.data.ece_deltas` (paired ECE differences from CE).
        n_boot: bootstrap resamples used for ``deltas``.
        figdir: where figures are written (``out_dir/report/figures``).
        figures: whether to draw figures.
        store: the results store (None: ``out_dir/runs.db``; else a ``postgresql://`` URL).
        probs: the runs' test probabilities after each calibrator (:mod:`calibkit.report.calibrated`).
        grid: :func:`calibkit.report.calibrated.calibrator_grid` (methods x calibrators).
        comps: :func:`calibkit.report.paired.comparisons` (the ranking's paired columns).
        selections: ``{method: Selection}``, each method's calibrator chosen on validation
            (:func:`calibkit.report.verdict.method_selections`).
        verdict: :func:`calibkit.report.verdict.recommendation` (the method + calibrator pair).
        alpha: miscoverage of the conformal sets (:mod:`calibkit.report.sets`).
        sets: :func:`calibkit.report.sets.method_sets`, set by its section builder.
        drawn: the per-method figures already drawn in this build by other processes
            (:mod:`calibkit.report.prefetch`), which the figures section does not draw again.
        figure_methods: the methods whose reliability figure the figures section draws, in grid
            order (:func:`calibkit.report.evidence.figure_methods`; None: every method's).
    """

    out_dir: Path
    preset: str
    rows: list
    summary: dict
    deltas: dict
    n_boot: int
    figdir: Path
    figures: bool = True
    store: str | None = None
    probs: CalibratedProbs | None = None
    grid: dict | None = None
    comps: dict | None = None
    selections: dict | None = None
    verdict: dict | None = None
    alpha: float = 0.1
    sets: dict | None = None
    drawn: set = field(default_factory=set)
    figure_methods: list | None = None

    @property
    def n_seeds(self) -> int:
        return max((len(e["seeds"]) for e in self.summary.values()), default=0)


def summary_section(ctx: ReportContext) -> list[Section]:
    marks = (f"`{BETTER_MARK}` = the 95% interval lies wholly on the better side of 0 (significantly better), "
             f"`{WORSE_MARK}` = wholly on the worse side (significantly worse)")
    text = (f"Test set, calibration and accuracy x100, mean over {ctx.n_seeds} seed(s); 1 = lowest ECE. "
            "The best value of each column is in bold: highest Acc, lowest ECE "
            "and ECE after temperature scaling (`ECE (TS)`), most negative difference from CE. "
            "O-ECE + U-ECE = ECE splits it into over- and under-confidence and is not ranked. "
            f"`dECE vs CE` = paired bootstrap ({ctx.n_boot} resamples) of the seed-averaged ECE difference "
            f"from CE, 95% basic bootstrap interval; {marks}.")
    short = (f"x100, mean over {ctx.n_seeds} seed(s). < = best in its column (O-ECE + U-ECE = ECE, not ranked). "
             f"dECE vs CE = paired bootstrap ({ctx.n_boot} resamples) of the ECE difference from CE, 95% "
             f"basic interval, {BETTER_MARK} = significantly better, {WORSE_MARK} = significantly worse.")
    if ctx.comps is not None:
        more = (" `dAcc vs CE` = paired bootstrap of the accuracy difference from CE (higher is better). "
                "O-ECE and U-ECE carry their own bootstrap intervals. `dECE vs CE+TS` = the method's ECE minus "
                "the ECE of CE after temperature scaling, `dECE(TS) vs CE+TS` = the same after the method's own "
                "temperature scaling (T fitted on its validation logits): does the training-time method beat "
                "the post-hoc baseline, before and after it is itself recalibrated?")
        text += more
        short += (" dAcc vs CE: accuracy difference from CE. dECE vs CE+TS: ECE minus CE's after temperature "
                  "scaling; dECE(TS): after the method's own TS too.")
    return [Section("Ranking by test ECE (before temperature scaling)", text,
                    [ranked_table(ctx.summary, ctx.deltas, ctx.comps)], anchor="ranking", terminal_text=short)]


def recommendation_section(ctx: ReportContext) -> list[Section]:
    """The method + calibrator chosen on validation, with its test evidence (first in the report)."""
    if ctx.verdict is None:
        return []
    return [Section("Recommendation (chosen on validation)", recommendation_text(ctx.verdict),
                    anchor="recommendation")]


def calibrators_section(ctx: ReportContext) -> list[Section]:
    """The methods x post-hoc calibrators tables: the validation choice, then test numbers."""
    if not ctx.grid:
        return []
    chosen = {m: s.chosen for m, s in (ctx.selections or {}).items()}
    rule = DEFAULT_RULE.describe()
    first = next(iter((ctx.selections or {}).values()), None)
    metric = metric_name(first.rule.select_by if first else DEFAULT_RULE.select_by)
    which = ("every post-hoc calibrator of `calibkit.calibrators.CALIBRATORS`" if ctx.probs is None
             or ctx.probs.names == calibrator_names() else
             f"the post-hoc calibrators the preset's `report_calibrators` names ({', '.join(ctx.probs.names[1:])})")
    text = (f"Every run's saved validation logits fit {which} (default settings; nothing retrained, nothing "
            f"fitted on the test set), applied to its saved test logits; `none` = the uncalibrated softmax. Mean over "
            f"{ctx.n_seeds} seed(s). The first table holds the numbers each method's calibrator is chosen on: "
            f"{rule} (mean over seeds; in parentheses: excluded by a guard). In italics: the calibrator chosen "
            "for each method. The other tables are test ECE and cwECE x100, test NLL and the share of test "
            "predictions the calibrator changed (%), for reference: no test cell is marked best, since the lowest "
            "of many test cells is a choice made on test. An NLL marked \u2020 has test rows whose true class got "
            "a probability below 1e-12: each adds about 708 (-log of the smallest float64), so that NLL counts "
            "them rather than measuring calibration.")
    short = (f"Post-hoc calibrators fitted on the validation logits (none = uncalibrated), mean over {ctx.n_seeds} "
             f"seed(s). First table: cross-fitted validation {metric}, the numbers the choice is made on "
             f"((...) = excluded by a guard); {ROW_BEST_MARK} = the calibrator chosen for that method. Then test "
             "ECE/cwECE x100, NLL (\u2020 = rows with a zero true-class probability) and changed predictions %, "
             "for reference only.")
    if ctx.probs is not None and ctx.probs.names != calibrator_names():
        short += f" Only the preset's report_calibrators: {', '.join(ctx.probs.names[1:])}."
    failed = ctx.probs.failures if ctx.probs is not None else {}
    if failed:
        note = " Failed (shown as -): " + "; ".join(f"{name} on {key}: {err}" for (key, name), err in failed.items())
        text, short = text + note, short + note
    tables = ([validation_table(ctx.selections)] if ctx.selections else []) + calibrator_tables(ctx.grid, chosen)
    return [Section("Methods x post-hoc calibrators", text, tables, anchor="calibrators", terminal_text=short)]


def notes_section(ctx: ReportContext) -> list[Section]:
    """Explains methods whose test predictions equal CE's exactly (their difference is exactly 0),
    and what the paired intervals cover (:func:`calibkit.report.data.interval_note`)."""
    same = [m for m, d in ctx.deltas.items() if d.get("identical")]
    coverage = interval_note(ctx.deltas, getattr(ctx, "comps", None))
    if not same and not coverage:
        return []
    lines = []
    for method in same:
        margin = _margin(ctx, method)
        why = (f" Its loss adds a penalty only where a logit (or a logit gap) exceeds the margin {margin:g}; "
               "the logits never grew that large in this preset's training, so the penalty was 0 at every "
               "step and the run trained exactly as CE did. Longer training (e.g. preset `default`) "
               "reaches the margin." if margin is not None else "")
        lines.append(f"**{label(method)}** gave exactly CE's test predictions in every seed, hence a "
                     f"difference of exactly 0.{why}")
    if coverage:
        lines.append(coverage)
    return [Section("Notes", "\n\n".join(lines))]


def _margin(ctx: ReportContext, method: str) -> float | None:
    """The ``margin`` hyperparameter of the method's loss spec (given, else the loss's default), or None."""
    spec = ((ctx.summary[method]["runs"][0].get("config") or {}).get("loss")) or ""
    name, _, rest = spec.partition(":")
    factory = LOSSES.get(name.strip().lower())
    param = inspect.signature(factory).parameters.get("margin") if factory else None
    if param is None:
        return None
    given = dict(item.split("=", 1) for item in rest.replace(" ", "").split(",") if "=" in item)
    try:
        return float(given.get("margin", param.default))
    except (TypeError, ValueError):
        return None


def _ood_text(ctx: ReportContext) -> str:
    """Which OOD set the AUROC columns measure (named from the runs' records)."""
    measured = [r["ood"] for r in ctx.rows if r["status"] == "done" and r.get("ood")]
    if not measured:
        return "No OOD set (`ood = none`): no OOD detection is measured."
    names = sorted({m.get("dataset") for m in measured} - {None})
    against = f"the OOD set `{'`, `'.join(names)}`" if names else "the preset's OOD set"
    return (f"AUROC (x100) of OOD detection against {against} (the OOD inputs are the positives) by predictive "
            "entropy (AUROC-H) and by maximum probability (AUROC-MSP).")


def tables_section(ctx: ReportContext) -> list[Section]:
    before, after = grid_tables(ctx.summary, ctx.deltas, pm="±")
    return [
        Section("Test set, before temperature scaling (grid order)",
                "Mean ± std over seeds (`n` = seeds); calibration and accuracy x100, NLL and Brier as they are. "
                "AECE = equal-mass bins, cwECE = classwise ECE, MCE = maximum calibration error.", [before]),
        Section("After temperature scaling, OOD detection, corrupted test sets, training time",
                f"Temperature T fitted on the validation set by NLL. {_ood_text(ctx)} Shift = mean over corruptions "
                "and severities. Train s = training wall time in seconds.", [after]),
    ]


def robustness_section(ctx: ReportContext) -> list[Section]:
    table = robustness_table(ctx.summary, pm="±")
    if table is None:
        return []
    return [Section("Corrupted test sets per severity", "Mean over corruptions (x100).", [table], terminal=False)]


# The report, in order. Each builder: ReportContext -> list[Section].
def sets_section(ctx: ReportContext) -> list[Section]:
    """Selective prediction (AURC, AUGRC) and conformal sets (coverage, set size) per method
    (:mod:`calibkit.report.sets`)."""
    if ctx.probs is None or ctx.grid is None:
        return []

    rows = sets.SetRows(ctx.probs, ctx.alpha, ctx.out_dir / "cache" / "sets")
    cells, too_few = sets.method_sets_or_selective(ctx.summary, rows, ctx.selections, ctx.n_boot)
    ctx.sets = cells
    if not cells:
        return []
    text, short = sets.section_text(ctx.n_seeds, ctx.n_boot, ctx.alpha)
    if rows.failures:
        note = " No sets (shown as -): " + "; ".join(f"{c} on {m}: {e}" for (m, c), e in rows.failures.items())
        text, short = text + note, short + note
    if too_few:  # no tables of sets, the reason in the text
        text, short = (t + f" No conformal sets: the threshold is fitted on half the validation rows; {too_few}."
                       for t in (text, short))
    tables = [sets.selective_table(cells)] + ([] if too_few else [sets.sets_table(cells, ctx.alpha),
                                                                  sets.sets_grid_table(cells, rows.probs.names)])
    return [Section("Selective prediction and conformal sets", text, tables, anchor="sets", terminal_text=short)]


#: What the progress line says while a builder runs (the others: the builder's name in words).
PHASE_NAMES = {"sets_section": "selective prediction and conformal sets", "figures_section": "drawing the figures",
               "evidence_section": "drawing the recommendation's figures", "protocol_section": "the protocol"}

SECTIONS = (recommendation_section, evidence_section, summary_section, notes_section, tables_section,
            calibrators_section, sets_section,
            robustness_section, protocol_section, preset_section, figures_section)


def build_report(out_dir, preset: str | None = None, n_boot: int | None = None, seed: int = 0,
                 figures: bool = True, width: int | None = None, store: str | None = None,
                 alpha: float = 0.1, progress: Phases | None = None, num_threads: int | None = 1,
                 jobs: int | None = None, all_figures: bool = False) -> dict:
    """Write ``out_dir/report/`` (report.md, index.html, figures/) from ``out_dir/runs.db``.

    Args:
        out_dir: the bench output directory (holding ``runs.db``).
        preset: which preset's runs (default: the only one, or the most recent).
        n_boot: bootstrap resamples (default: the preset's, else 1000).
        seed: bootstrap seed (fixed, so a rebuilt report is identical).
        figures: draw the figures (off only in quick tests of the tables).
        width: terminal width the text tables must fit (default: the terminal's, else ``COLUMNS``,
            else 100); wider tables are split into parts. 0: never split.
        store: the results store (None: ``out_dir/runs.db``; else a ``postgresql://`` URL).
        alpha: miscoverage of the conformal sets of the selective-prediction section, in (0, 1).
        progress: says which phase runs (:class:`calibkit.bench.progress.Phases`; None: silent); its
            ``times`` hold each phase's seconds afterwards.
        num_threads: torch CPU threads while the report is built (restored afterwards; None: leave
            torch's setting). Default 1: the report's tensors are small (validation and test logits
            of one run at a time), and on a busy machine torch's thread pool spent up to 40 times
            the CPU of one thread fitting Dirichlet calibration on 500 rows; one thread gives the
            same numbers.
        jobs: processes that fit the runs' calibrators (:mod:`calibkit.report.prefetch`; each
            started one with ``num_threads`` torch threads, one when that is None); None: one per
            core when there are enough fits to share, 1: none started. The report is the same.
        all_figures: draw every method's reliability figure, also where the preset's
            ``report_figures`` is ``"ce-and-chosen"`` (CE's and the recommended method's only).

    Returns:
        ``{"text": terminal text, "summary", "deltas", "grid", "comparisons", "preset", "paths": {...}}``
        (``grid``: methods x calibrators, :func:`calibkit.report.calibrated.calibrator_grid`;
        ``comparisons``: :func:`calibkit.report.paired.comparisons`). The calibrated test
        probabilities are cached under ``out_dir/cache/`` (keyed by content: :mod:`~calibkit.report.calibrated`).
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise UserError(f"alpha must be a number in (0, 1) (the miscoverage of the conformal sets), got {alpha!r}")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise UserError(f"jobs must be an integer >= 1 (processes fitting the runs' calibrators) or None, got {jobs!r}")
    if not isinstance(all_figures, bool):
        raise UserError(f"all_figures must be True or False, got {all_figures!r}")
    with fits.torch_threads(num_threads), shared_draws():  # one draw of each size of resamples per build
        return _build(Path(out_dir), preset, n_boot, seed, figures, width, store, alpha,
                      progress or Phases("report", quiet=True), (jobs, num_threads or 1), all_figures)


def _build(out_dir: Path, preset, n_boot, seed, figures, width, store, alpha, phases: Phases,
           parallel: tuple[int | None, int | None] = (None, 1), all_figures: bool = False) -> dict:
    preset, rows = load_current_runs(out_dir, preset, store)
    recorded_keys = {r["run_key"] for r in rows}
    # A finished row the report cannot read is named, left out with a warning, and the rest reported.
    rows, skipped = usable_rows(rows)
    for line in skipped:
        warnings.warn(f"{line}; left out of the report", stacklevel=2)
    done = [r for r in rows if r["status"] == "done"]
    if not done:
        unreadable = f" that the report can read ({len(skipped)} left out: {'; '.join(skipped)})" if skipped else ""
        raise UserError(f"no finished runs of preset {preset!r} in {describe_store(out_dir, store)}{unreadable}")
    recorded = recorded_preset(out_dir, preset)
    if n_boot is None:
        n_boot = recorded.n_boot if recorded is not None else 1000
    summary = summarize(done)
    rep = out_dir / "report"
    probs = CalibratedProbs(out_dir / "cache" / "calibrated", report_calibrators(recorded))
    which = "all" if all_figures or recorded is None else recorded.report_figures  # whose reliability figures
    drawn = fits.prefetch_tasks(out_dir, summary, probs, alpha, phases, parallel, rep / "figures" if figures else None,
                                figure_methods(summary, which))  # the recommended one is not known yet
    grid, comps, selections, verdict = fits.calibrated(summary, probs, n_boot, seed, phases,
                                                       out_dir / "cache" / "selection")
    with phases.phase("ECE differences from CE"):
        deltas = ece_deltas(summary, n_boot=n_boot, seed=seed)
    ctx = ReportContext(out_dir, preset, rows, summary, deltas, n_boot, rep / "figures", figures, store, probs, grid,
                        comps, selections, verdict, alpha, drawn=drawn,
                        figure_methods=figure_methods(summary, which, verdict))
    ctx.figdir.mkdir(parents=True, exist_ok=True)
    sections: list[Section] = []
    for build in SECTIONS:
        name = PHASE_NAMES.get(build.__name__)  # the others take well under a second: timed, not announced
        with phases.phase(name or build.__name__.replace("_", " "), say=name is not None):
            sections += build(ctx)

    pending = [r for r in rows if r["status"] != "done"]
    if store is None:  # runs submitted to SLURM whose task left no result, hence no row: named too
        pending += unrecorded(out_dir, preset, recorded_keys)
    unfinished = ", ".join(f"{r['run_key']} ({r['status']})" for r in pending)
    title = f"calibkit bench: preset {preset}, {len(done)} finished runs"
    text_title = title + (f", {len(pending)} unfinished ({unfinished})" if pending else "")
    if width is None:
        width = shutil.get_terminal_size((100, 24)).columns

    settings = f"Runs: {effective_settings(done)}."  # the header says what ran, not what the preset's note says
    note = note_for_runs(preset, recorded, done)

    for line in (settings, note) if note else (settings,):  # under the title, wrapped like the rest of the text
        text_title += "\n" + (textwrap.fill(line, width) if width else line)
    text = to_text(text_title, sections, width)

    first = done[0]
    versions = ", ".join(f"{k} {v}" for k, v in sorted((first.get("versions") or {}).items()))
    intro = (f"Preset `{preset}`: {len(done)} finished runs of {len(summary)} methods; CE (`{REFERENCE}`) is the "
             f"reference. {settings} Git commit `{first.get('git_commit') or 'unknown'}`; {versions}.")
    if pending:
        intro += f"\n\nUnfinished runs: {unfinished}."
    if skipped:
        intro += f"\n\nLeft out (unreadable in the database): {'; '.join(skipped)}."
    if note:
        intro += f"\n\n{note}"
    # atomic: benches on several hosts sharing DIR may each build the report at their end
    for s in sections:  # the first screen: the recommendation, then its figures
        s.lead = s.lead or s.anchor == "recommendation"
    with phases.phase("writing report.md and index.html"):
        md, html = to_markdown(title, intro, sections), to_html(title, intro, sections)
        atomic_write(rep / "report.md", lambda tmp: Path(tmp).write_text(md))
        atomic_write(rep / "index.html", lambda tmp: Path(tmp).write_text(html))
    figs = {f.path.stem: f.path for s in sections for f in s.figures}
    return {"text": text, "summary": summary, "deltas": ctx.deltas, "grid": ctx.grid, "comparisons": ctx.comps,
            "preset": preset, "selections": ctx.selections, "recommendation": ctx.verdict,
            "sections": sections, "sets": ctx.sets,
            "paths": {"report": rep, "md": rep / "report.md", "html": rep / "index.html", "figures": figs}}
