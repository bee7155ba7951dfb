"""``calibkit calibrate --val VAL --test TEST --out DIR``: every post-hoc calibrator on a trained model's logits."""

from __future__ import annotations

import argparse

from calibkit.commands import bounded as B
from calibkit.commands.calibsources import add_source_options
from calibkit.commands.scorefile import read_scores  # noqa: F401  (looked up here at call time: tests replace it)
from calibkit.errors import UserError

EPILOG = """\
Input, one of: --val FILE --test FILE; --from FILE, with val_*/test_* entries (val_logits,
val_labels, test_logits, test_labels) or split by --split FRACTION (the share for validation,
stratified by class, seeded by --seed); --run DIR, a finished calibkit run (DIR/logits.safetensors).
--logits-key/--probs-key/--labels-key name other entries (after the val_/test_ prefix, if any).
--out defaults to DIR/calibration for --run, else STEM-calibration beside the input file.

Each file (.npz, .safetensors or .pt) holds 'logits' (N, K) and 'labels' (N,), or 'probs' (N, K)
instead of 'logits' (then logits = log(probs), probabilities below 1e-300 raised to it first;
softmax(log p) = p); a file with both is refused. 1-D entries are binary positive-class logits (or
probabilities: logit(p)). Labels are integers (unsigned ones are read as int64). Nothing is
unpickled: object arrays in an .npz and anything but tensors in a .pt are refused.

Warnings (stderr): --val and --test the same file or the same logits and labels (the test numbers
are then not held out); validation labels of one class only; fewer than 2 validation rows per
class (the K and K x K parameter calibrators cannot be fitted reliably). With fewer rows than
classes, matrix and dirichlet are not fitted; the validation table says why.

The calibrator is CHOSEN ON VAL ONLY, by K-fold cross-fitting (--folds, default 5): each calibrator
is fitted on K-1 folds and scored on the held-out fold. Default rule (--select-by nll): the lowest
cross-fitted NLL (a proper score: calibration and sharpness together) among the calibrators whose
cross-fitted accuracy is at most --acc-tolerance points (default 0.5) below the uncalibrated model's
(temperature scaling on ties); the uncalibrated model is always a candidate. --select-by brier ranks
by the Brier score; --select-by ece by the ECE, guarded by NLL, and a challenger must then beat
temperature scaling significantly. ECE is always shown.
The output starts with the recommendation (test ECE, NLL, accuracy with bootstrap intervals, the
paired difference from temperature scaling, the runner-up), then the validation table the choice
was made on, then every calibrator's test numbers for reference (never a ranking): ECE x100 with
its interval, the paired difference from TS (* significantly lower, ! higher), classwise ECE, NLL
(flagged when rows get a zero true-class probability), accuracy, its change and the share of
predictions the calibrator changed. Then, for reference, the selective prediction (AURC, AUGRC) and
APS conformal sets at --alpha (default 0.1) of the uncalibrated model, temperature scaling and the
chosen calibrator (--full-report: of every calibrator): the calibrator refitted on one half of
the validation rows, the set threshold on the other half, coverage and mean set size on test, with
paired intervals against TS. Writes DIR/report/calibrators.md, results.json, selection.json, sets.json,
reliability_<name>.png (of the same calibrators as the sets) and index.html (the tables, the
reliability diagrams before/after); --save writes the chosen calibrator as DIR/NAME.safetensors +
DIR/NAME.json (NAME: its own name; the uncalibrated choice, none, as temperature 1), --save NAME that
one, for `calibkit apply` and calibkit.calibrators.load. Bad files change nothing on disk. LightGBM
(extra boost) runs only when --calibrators names it.

examples:
  calibkit calibrate --from outputs.npz --split 0.5 --save
  calibkit calibrate --run runs/smoke/runs/smoke/ce/seed0 --save
  calibkit calibrate --val val.npz --test test.npz --out calib --save dirichlet
"""


CHOSEN = "chosen"  # --save without a name
CHOSEN_NAMES = (CHOSEN, "best")  # --save values that mean the chosen calibrator


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "calibrate", help="fit every post-hoc calibrator on validation logits, choose one on validation, score on test",
        description="Fit every post-hoc calibrator on a trained model's validation logits, choose one by "
        "cross-fitting on the validation split, and report it and every other calibrator on the test logits "
        "with bootstrap intervals and the paired difference from temperature scaling; write DIR/report/.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_source_options(p)
    p.add_argument("--out", metavar="DIR", help="output directory (default: RUN/calibration for --run, else "
                                                 "STEM-calibration beside the input file)")
    p.add_argument("--calibrators", metavar="A,B", help="comma-separated subset of the registry (default: all)")
    p.add_argument("--save", metavar="NAME", nargs="?", const=CHOSEN,
                   help="store a fitted calibrator as DIR/NAME.safetensors + .json; without NAME (or with 'chosen' "
                        "or 'best'): the chosen one")
    p.add_argument("--n-bins", type=B.N_BINS, default=15, help="bins of the binned errors (default 15)")
    p.add_argument("--n-boot", type=B.N_BOOT, default=1000, help="bootstrap resamples (default 1000)")
    p.add_argument("--seed", type=B.SEED, default=0, help="bootstrap seed, an integer >= 0 (default 0)")
    p.add_argument("--dpi", type=B.DPI, default=120, help="resolution of the reliability diagrams (default 120)")
    p.add_argument("--select-by", choices=("ece", "nll", "brier"), default="nll",
                   help="cross-fitted validation metric that chooses the calibrator (default nll, a proper score; "
                        "ece is guarded by accuracy and NLL)")
    p.add_argument("--acc-tolerance", type=B.number(0.0, 100.0), default=0.5, metavar="POINTS",
                   help="largest accepted drop of cross-fitted accuracy, in points (default 0.5)")
    p.add_argument("--folds", type=B.integer(2, 1000), default=5,
                   help="cross-fitting folds of the validation split (default 5)")
    p.add_argument("--alpha", type=B.ALPHA, default=0.1,
                   help="miscoverage of the conformal prediction sets, in (0, 1) (default 0.1: 90%% coverage)")
    p.add_argument("--full-report", action="store_true",
                   help="conformal sets and reliability diagrams of every calibrator (default: of the chosen one, "
                        "temperature scaling and the uncalibrated model only)")
    p.add_argument("--timings", action="store_true", help="print where the time went")
    p.add_argument("--jobs", type=B.integer(1, 1024), metavar="N",
                   help="processes that fit the calibrators (default: one per core when the validation split has "
                        "at least 20,000 cells, else 1; the numbers do not depend on it)")
    from calibkit.commands import add_num_threads

    add_num_threads(p, default="1, whatever the machine, so that the numbers do not depend on its cores")
    p.set_defaults(func=run)


def _choose(spec):
    from calibkit.calibrators import CALIBRATORS

    if spec is None:  # the opt-in calibrators run only when named
        from calibkit.calibrators.registry import default_names

        return default_names()
    names = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [n for n in names if n not in CALIBRATORS]
    if bad or not names:
        raise UserError(f"unknown calibrator {', '.join(map(repr, bad)) or '(none given)'}; expected one of "
                         f"{', '.join(CALIBRATORS)}")
    return list(dict.fromkeys(names))


def _check_args(args, names):
    from calibkit.bootstrap import MIN_RESAMPLES
    from calibkit.commands.calibsources import check_sources

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
    from calibkit.report.fits import torch_threads

    with torch_threads(args.num_threads or 1):  # restored afterwards (a Python caller's setting is its own)
        return _run(args)


def _run(args) -> int:
    import json
    from pathlib import Path

    from calibkit.calibrators.selection import SelectionRule

    names = _choose(args.calibrators)
    _check_args(args, names)
    rule = SelectionRule(select_by=args.select_by, acc_tolerance=args.acc_tolerance / 100, n_folds=args.folds,
                         n_bins=args.n_bins)
    from calibkit.commands.calibsources import read_sources

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

    from calibkit.report import posthoc
    from calibkit.report.tables import md_code

    timer = _Timer()
    sel, probs, seconds = _select_and_predict(val_x, val_y, test_x, names, rule, timer, args.jobs)
    if args.save and args.save not in CHOSEN_NAMES and args.save not in sel.fitted:  # its fit failed on a fold
        raise UserError(f"--save {args.save!r}: {sel.scores[args.save].error}")
    rows, rec = _test_numbers(sel, probs, test_y, seconds, args, timer, len(val_y))
    from calibkit.report import sets

    shown = _shown(probs, sel.chosen, args.full_report)
    with timer("sets"):
        set_res = sets.calibrator_sets((val_x, val_y), (test_x, test_y), shown, alpha=args.alpha,
                                       n_boot=args.n_boot, seed=args.seed)
    text = "\n\n".join([posthoc.recommendation_text(rec), posthoc.validation_table(sel),
                        posthoc.test_table(rows, sel.chosen), sets.calibrator_sets_table(set_res, args.alpha)])
    print(f"fitted on {src.val_name} ({len(val_y)} rows, {src.val_src}); scored on {src.test_name} ({len(test_y)} "
          f"rows, {src.test_src})\n")
    print(text)

    from calibkit.commands import calibout
    from calibkit.commands.calibsources import default_out

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
    import warnings

    from calibkit.calibrators.evidence import thin_warning, unestimable
    from calibkit.calibrators.selection import unfittable

    n, k = val_x.shape[0], 2 if val_x.dim() == 1 else val_x.shape[1]
    refused = {name: why for name in names if (why := unfittable(name, n, k) or unestimable(name, val_y, k))}
    if args.save in refused:  # (CHOSEN_NAMES are never refused: the chosen one was fitted)
        raise UserError(f"--save {args.save!r}: {refused[args.save]}")
    if val_x.dim() == 2 and n < ROWS_PER_CLASS * k:  # binary scores: temperature-like maps only
        skipped = f"; not fitted: {', '.join(refused)} (fewer rows than classes)" if refused else ""
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
    import warnings

    classes = val_y.unique()
    if len(classes) == 1:
        warnings.warn(f"{args.val_name}: validation labels hold one class ({int(classes[0])}) only: every "
                      f"calibrator is fitted and chosen without an example of the other {k - 1} class(es), so the "
                      "fits and the choice say little; use a validation split with every class", stacklevel=2)


def _warn_same_data(args, src) -> None:
    """Warn when ``--val`` and ``--test`` are one file, or the two sides hold the same logits and labels
    (a split of one file has disjoint rows; its ``val_*`` and ``test_*`` entries may still be equal)."""
    import warnings
    from pathlib import Path

    import torch

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
    import os

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
        import contextlib
        import time

        @contextlib.contextmanager
        def span():
            start = time.perf_counter()
            try:
                yield
            finally:
                self.spent[phase] = self.spent.get(phase, 0.0) + time.perf_counter() - start

        return span()


def _select_and_predict(val_x, val_y, test_x, names, rule, timer, jobs=None):
    """The cross-fitted selection on the validation rows, then every fitted calibrator on the test rows."""
    import torch

    from calibkit.calibrators import pool
    from calibkit.calibrators.selection import NONE, choose, cross_fit

    k = 2 if val_x.dim() == 1 else val_x.shape[1]
    jobs = pool.auto_jobs(val_x.shape[0], k, len(names)) if jobs is None else min(jobs, max(1, len(names)))
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
    from calibkit.bootstrap import bootstrap_cis
    from calibkit.metrics import evaluate
    from calibkit.report import posthoc

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
    from calibkit.calibrators.selection import NONE
    from calibkit.report.posthoc import REFERENCE

    return probs if full else {n: p for n, p in probs.items() if n in (NONE, REFERENCE, chosen)}


def _figures(report, probs, labels, args) -> None:
    from calibkit import plots

    for name, p in probs.items():
        ax = plots.reliability_diagram(p, labels, n_bins=args.n_bins, title=name)
        ax.figure.savefig(report / f"reliability_{name}.png", dpi=args.dpi, bbox_inches="tight")
