"""``calibkit calibrate --val VAL --test TEST --out DIR``: every post-hoc calibrator on a trained model's logits."""

from __future__ import annotations

import contextlib
import json
import os
import time
import warnings
from pathlib import Path

import torch

from calibkit import plots
from calibkit.bootstrap import MIN_RESAMPLES, bootstrap_cis, shared_draws
from calibkit.calibrators import CALIBRATORS, pool
from calibkit.calibrators.evidence import thin_warning, unestimable
from calibkit.calibrators.io import calibrator_class
from calibkit.calibrators.registry import default_names
from calibkit.calibrators.selection import NONE, SelectionRule, choose, cross_fit, unfittable
from calibkit.calibrators.stack import NAME as STACK
from calibkit.commands import calibout
from calibkit.commands.calibsources import check_sources, default_out, read_sources
from calibkit.commands.parsers.calibrate import CHOSEN_NAMES
from calibkit.commands.scorefile import read_scores  # noqa: F401  (looked up here at call time: tests replace it)
from calibkit.errors import UserError
from calibkit.metrics import evaluate
from calibkit.report import posthoc, sets
from calibkit.report.fits import torch_threads
from calibkit.report.posthoc import REFERENCE
from calibkit.report.tables import md_code


def _choose(spec):
    if spec is None:  # the opt-in calibrators run only when named; the stack of the others always
        return default_names() + [STACK]
    names = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [n for n in names if calibrator_class(n) is None]
    if bad or not names:
        raise UserError(f"unknown calibrator {', '.join(map(repr, bad)) or '(none given)'}; expected one of "
                         f"{', '.join(CALIBRATORS)}, {STACK}")
    return list(dict.fromkeys(names))


def _check_args(args, names):
    check_sources(args)
    for flag, value, least in (("--n-bins", args.n_bins, 1), ("--n-boot", args.n_boot, MIN_RESAMPLES),
                               ("--dpi", args.dpi, 10), ("--folds", args.folds, 2)):
        if value < least:
            raise UserError(f"{flag} must be >= {least}, got {value}")
    if args.seed < 0:  # one rule with bench --seeds and tune --seed
        raise UserError(f"--seed must be an integer >= 0, got {args.seed}")
    if not 0 < args.alpha < 1:  # also refuses NaN
        raise UserError(f"--alpha must be a number in (0, 1) (the allowed miscoverage of the sets), got {args.alpha}")
    if not 0 <= args.acc_tolerance <= 100:  # also refuses NaN
        raise UserError(f"--acc-tolerance must be a number of points in [0, 100], got {args.acc_tolerance}")
    if args.save is not None and args.save not in CHOSEN_NAMES and args.save not in names:
        raise UserError(f"--save {args.save!r}: not among the calibrators fitted here ({', '.join(names)})")


def run(args) -> int:
    # torch_threads: restored afterwards (a Python caller's setting is its own); shared_draws: the
    # resamples of each (rows, resamples, seed) drawn once for the cross-fitted scores, the test
    # intervals and the sets (the same draws as drawing them at each call)
    with torch_threads(args.num_threads or 1), shared_draws():
        return _run(args)


def _run(args) -> int:
    names = _choose(args.calibrators)
    _check_args(args, names)
    rule = SelectionRule(select_by=args.select_by, acc_tolerance=args.acc_tolerance / 100, n_folds=args.folds,
                         n_bins=args.n_bins)

    src = read_sources(args, read=read_scores)
    (val_x, val_y), (test_x, test_y) = src.val, src.test
    if val_x.dim() != test_x.dim() or (val_x.dim() == 2 and val_x.shape[1] != test_x.shape[1]):
        shape = lambda x: "binary (N,)" if x.dim() == 1 else f"K = {x.shape[1]}"  # noqa: E731
        raise UserError(f"{src.val_name} has {shape(val_x)} but {src.test_name} has {shape(test_x)}: "
                         "validation and test must come from the same model")
    if len(val_y) < args.folds:
        raise UserError(f"{src.val_name}: {len(val_y)} validation rows, fewer than --folds {args.folds}")
    args.val_name = src.val_name  # what the warnings call the validation side
    _check_rows(args, val_x, val_y, names)
    _warn_one_class(args, val_y, 2 if val_x.dim() == 1 else val_x.shape[1])
    _warn_same_data(args, src)

    timer = _Timer()
    # processes for the fits and the stack's sets: one for small fits, one per core for long ones (measured,
    # docs/performance.md)
    k = 2 if val_x.dim() == 1 else val_x.shape[1]
    jobs = args.jobs if args.jobs is not None else pool.auto_jobs(val_x.shape[0], k, torch.get_num_threads())
    sel, probs, seconds = _select_and_predict(val_x, val_y, test_x, names, rule, timer, jobs)
    if args.save and args.save not in CHOSEN_NAMES and args.save not in sel.fitted:  # its fit failed on a fold
        raise UserError(f"--save {args.save!r}: {sel.scores[args.save].error}")
    rows, rec = _test_numbers(sel, probs, test_y, seconds, args, timer, len(val_y))

    shown = _shown(probs, sel.chosen, args.full_report)
    with timer("sets"):
        set_res = sets.calibrator_sets((val_x, val_y), (test_x, test_y), shown, alpha=args.alpha,
                                       n_boot=args.n_boot, seed=args.seed, jobs=jobs,
                                       stack_parts=getattr(sel.fitted.get(STACK), "components_", None))
    text = "\n\n".join([posthoc.recommendation_text(rec), posthoc.validation_table(sel),
                        posthoc.test_table(rows, sel.chosen), sets.calibrator_sets_table(set_res, args.alpha)])
    print(f"fitted on {src.val_name} ({len(val_y)} rows, {src.val_src}); scored on {src.test_name} ({len(test_y)} "
          f"rows, {src.test_src})\n")
    print(text)

    out = Path(args.out) if args.out is not None else default_out(args)
    report = out / "report"
    report.mkdir(parents=True, exist_ok=True)
    with timer("figures"):
        _figures(report, shown, test_y, args)
    (report / "calibrators.md").write_text(
        f"# Post-hoc calibrators\n\nFitted and chosen on {md_code(src.val_name)} ({len(val_y)} rows), scored on "
        f"{md_code(src.test_name)} "
        f"({len(test_y)} rows); {args.n_boot} bootstrap resamples, 95% intervals, ECE with {args.n_bins} bins.\n\n"
        f"{text}\n\n" + "\n".join(f"![{n}](reliability_{n}.png)" for n in shown) + "\n")
    (report / "results.json").write_text(json.dumps(
        [dict(posthoc.jsonable_row(r), selected=r["calibrator"] == sel.chosen) for r in rows], indent=2))
    (report / "selection.json").write_text(json.dumps(sel.to_dict(), indent=2))
    (report / "sets.json").write_text(json.dumps({"alpha": args.alpha, "score": sets.SCORE, "calibrators": set_res},
                                                 indent=2))
    with timer("html"):
        html = calibout.html_report(report, text, sel.chosen, (src.val_name, len(val_y)), (src.test_name, len(test_y)))
    if args.save:
        calibout.save_chosen(sel, sel.chosen if args.save in CHOSEN_NAMES else args.save, out, test_x)
    print(f"\nreport: {report / 'calibrators.md'} and {html}")
    if args.timings:
        print("\ntime (s): " + ", ".join(f"{k} {v:.2f}" for k, v in timer.spent.items()))
    return 0


ROWS_PER_CLASS = 2  # fewer validation rows than this many per class: the warning of _check_rows


def _check_rows(args, val_x, val_y, names) -> None:
    """Warn when the validation split has fewer than ``ROWS_PER_CLASS`` rows in all, or fewer than
    :data:`calibkit.calibrators.evidence.MIN_ROWS_PER_CLASS` rows of some class (named); refuse
    ``--save`` of a calibrator that cross-fitting leaves unfitted (:func:`calibkit.calibrators.selection.unfittable`,
    :func:`calibkit.calibrators.evidence.unestimable`)."""
    n, k = val_x.shape[0], 2 if val_x.dim() == 1 else val_x.shape[1]
    refused = {name: why for name in names
               if name != STACK and (why := unfittable(name, n, k) or unestimable(name, val_y, k))}
    if args.save in refused:  # (CHOSEN_NAMES are never refused: the chosen one was fitted)
        raise UserError(f"--save {args.save!r}: {refused[args.save]}")
    if val_x.dim() == 2 and n < ROWS_PER_CLASS * k:  # binary scores: temperature-like maps only
        skipped = f"; not fitted: {', '.join(refused)} (the validation table says why)" if refused else ""
        warnings.warn(f"{args.val_name}: {n} validation rows for K = {k} classes (fewer than {ROWS_PER_CLASS} per "
                      "class): "
                      "the calibrators with K or K x K parameters (vector: 2K; matrix, dirichlet: K^2 + K) cannot be "
                      f"fitted reliably, and their fits may be slow{skipped}", stacklevel=2)
    if (text := thin_warning(val_y, k, args.val_name)) is not None:
        warnings.warn(text, stacklevel=2)


def _warn_one_class(args, val_y, k: int) -> None:
    """Warn when every validation label is one class: the calibrators can be fitted (temperature
    scaling then only reaches its bound), but neither the fits nor the choice learn anything about
    the other classes."""
    classes = val_y.unique()
    if len(classes) == 1:
        warnings.warn(f"{args.val_name}: validation labels hold one class ({int(classes[0])}) only: every "
                      f"calibrator is fitted and chosen without an example of the other {k - 1} class(es), so the "
                      "fits and the choice say little; use a validation split with every class", stacklevel=2)


def _warn_same_data(args, src) -> None:
    """Warn when ``--val`` and ``--test`` are one file, or the two sides hold the same logits and labels
    (a split of one file has disjoint rows; its ``val_*`` and ``test_*`` entries may still be equal)."""
    if args.val is not None and same_file(Path(args.val), Path(args.test)):
        what = "are the same file"
    elif all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(src.val, src.test)):
        what = "hold identical logits and labels"
    else:
        return
    sides = (f"--val {args.val} and --test {args.test}" if args.val is not None else
             f"{src.val_name} and {src.test_name}")
    warnings.warn(f"{sides} {what}: calibration and evaluation use the same data, so the test numbers are not "
                  "held out", stacklevel=2)


def same_file(a, b) -> bool:
    """Whether paths ``a`` and ``b`` name one file: equal after resolving symlinks and ``..``, or
    (both existing) the same inode, e.g. hard links."""
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


class _Timer:
    """Wall time per phase (``--timings``): ``with timer("phase"): ...`` adds to ``timer.spent[phase]``."""

    def __init__(self):
        self.spent: dict[str, float] = {}

    def __call__(self, phase: str):
        @contextlib.contextmanager
        def span():
            start = time.perf_counter()
            try:
                yield
            finally:
                self.spent[phase] = self.spent.get(phase, 0.0) + time.perf_counter() - start

        return span()


def _select_and_predict(val_x, val_y, test_x, names, rule, timer, jobs: int):
    """The cross-fitted selection on the validation rows, then every fitted calibrator on the test rows."""
    jobs = min(jobs, max(1, len(names)))
    with timer("fits and cross-fitting"):  # each full fit timed alone inside (the "fit s" column)
        scores, fitted = cross_fit(val_x, val_y, names, rule, jobs=jobs)
    seconds = {n: s.fit_seconds for n, s in scores.items() if n in fitted and s.fit_seconds is not None}
    for name, s in seconds.items():
        timer.spent[f"fit {name}"] = s
    sel = choose(scores, rule)
    sel.fitted = fitted
    probs = {NONE: torch.sigmoid(test_x) if test_x.dim() == 1 else torch.softmax(test_x, 1)}
    with timer("predict"):
        for name in names:
            if name in fitted:  # not those refused or failed in cross-fitting (their reason is in the tables)
                probs[name] = fitted[name].predict_proba(test_x).double()
    return sel, probs, seconds


def _test_numbers(sel, probs, test_y, seconds, args, timer, val_rows=None):
    """The test rows (panel, guards, intervals) and the recommendation's numbers."""
    boot = {"n_resamples": args.n_boot, "seed": args.seed, "n_bins": args.n_bins}
    with timer("test metrics"):
        panels = {n: evaluate(p, test_y, n_bins=args.n_bins) for n, p in probs.items()}
    ref = posthoc.REFERENCE if posthoc.REFERENCE in probs else None
    with timer("bootstrap"):  # one index draw shared by every calibrator (equal to the per-calibrator calls)
        intervals, diffs = bootstrap_cis("ece", probs, test_y, reference=ref, **boot)
        pair = {sel.chosen: probs[sel.chosen]}
        if ref is not None and sel.chosen != ref:
            pair[ref] = probs[ref]
        extra = {"d_ece": diffs.get(sel.chosen) if sel.chosen != ref else None, "d_nll": None, "d_acc": None,
                 "d_brier": None, "val_rows": val_rows}
        for m in ("nll", "acc", "brier"):
            cis, d = bootstrap_cis(m, pair, test_y, reference=ref if ref in pair else None, **boot)
            extra[f"{m}_ci"], extra[f"d_{m}"] = cis[sel.chosen], d.get(sel.chosen) if sel.chosen != ref else None
    rows = posthoc.test_rows(probs, test_y, intervals, diffs, panels, seconds)
    return rows, posthoc.recommendation(sel, rows, extra)


def _shown(probs: dict, chosen: str, full: bool) -> dict:
    """The calibrators whose sets and reliability diagrams are computed: every one with --full-report,
    else the uncalibrated model, temperature scaling and the chosen one (the sets refit each
    calibrator and the figures take ~0.15 s each: most of the time after the fits)."""
    return probs if full else {n: p for n, p in probs.items() if n in (NONE, REFERENCE, chosen)}


def _figures(report, probs, labels, args) -> None:
    for name, p in probs.items():
        ax = plots.reliability_diagram(p, labels, n_bins=args.n_bins, title=name)
        ax.figure.savefig(report / f"reliability_{name}.png", dpi=args.dpi, bbox_inches="tight")
