"""``calibkit calibrate --val VAL --test TEST --out DIR``: every post-hoc calibrator on a trained model's logits."""

from __future__ import annotations

import argparse

from calibkit.errors import UserError

EPILOG = """\
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
is fitted on K-1 folds and scored on the held-out fold. Default rule (--select-by ece): the lowest
cross-fitted ECE among the calibrators whose cross-fitted accuracy is at most --acc-tolerance points
(default 0.5) below the uncalibrated model's and whose cross-fitted NLL is not above it; the
uncalibrated model is always a candidate. --select-by nll|brier ranks by a proper score instead.
The output starts with the recommendation (test ECE, NLL, accuracy with bootstrap intervals, the
paired difference from temperature scaling, the runner-up), then the validation table the choice
was made on, then every calibrator's test numbers for reference (never a ranking): ECE x100 with
its interval, the paired difference from TS (* significantly lower, ! higher), classwise ECE, NLL
(flagged when rows get a zero true-class probability), accuracy, its change and the share of
predictions the calibrator changed. Then, for reference, each calibrator's selective prediction
(AURC, AUGRC) and APS conformal sets at --alpha (default 0.1): the calibrator refitted on one half of
the validation rows, the set threshold on the other half, coverage and mean set size on test, with
paired intervals against TS. Writes DIR/report/calibrators.md, results.json, selection.json, sets.json
and reliability_<name>.png; --save NAME also writes DIR/NAME.safetensors + DIR/NAME.json for
`calibkit apply` and calibkit.calibrators.load. Bad files change nothing on disk.

example:
  calibkit calibrate --val val.npz --test test.npz --out calib --save dirichlet
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "calibrate", help="fit every post-hoc calibrator on validation logits, choose one on validation, score on test",
        description="Fit every post-hoc calibrator on a trained model's validation logits, choose one by "
        "cross-fitting on the validation split, and report it and every other calibrator on the test logits "
        "with bootstrap intervals and the paired difference from temperature scaling; write DIR/report/.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--val", required=True, metavar="FILE", help="validation logits/probs + labels (fitting)")
    p.add_argument("--test", required=True, metavar="FILE", help="test logits/probs + labels (scoring)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--calibrators", metavar="A,B", help="comma-separated subset of the registry (default: all)")
    p.add_argument("--save", metavar="NAME", help="store this fitted calibrator as DIR/NAME.safetensors + .json")
    p.add_argument("--n-bins", type=int, default=15, help="bins of the binned errors (default 15)")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed, an integer >= 0 (default 0)")
    p.add_argument("--dpi", type=int, default=120, help="resolution of the reliability diagrams (default 120)")
    p.add_argument("--select-by", choices=("ece", "nll", "brier"), default="ece",
                   help="cross-fitted validation metric that chooses the calibrator (default ece, guarded by "
                        "accuracy and NLL)")
    p.add_argument("--acc-tolerance", type=float, default=0.5, metavar="POINTS",
                   help="largest accepted drop of cross-fitted accuracy, in points (default 0.5)")
    p.add_argument("--folds", type=int, default=5, help="cross-fitting folds of the validation split (default 5)")
    p.add_argument("--alpha", type=float, default=0.1,
                   help="miscoverage of the conformal prediction sets, in (0, 1) (default 0.1: 90%% coverage)")
    p.add_argument("--timings", action="store_true", help="print where the time went")
    from calibkit.commands import add_num_threads

    add_num_threads(p)
    p.set_defaults(func=run)


def read_scores(path, require_labels: bool = True):
    """``(logits, labels, source)`` of a ``.npz`` / ``.safetensors`` / ``.pt`` file.

    ``logits``: float64 ``(N, K)`` or binary ``(N,)``; from ``probs`` when the file has no
    ``logits`` (``log``, or ``logit`` for 1-D, of the probabilities raised to at least 1e-300);
    ``labels``: int64 ``(N,)`` in ``[0, K)`` (``None`` when absent and not required);
    ``source``: ``"logits"`` or ``"probs"``. Raises ``ValueError`` / ``FileNotFoundError`` naming the file
    (a folder, a damaged or pickled file, both ``logits`` and ``probs``, fewer than 2 columns, ...).
    """
    from pathlib import Path

    import numpy as np
    import torch

    from calibkit._validation import check_labels, check_probs
    from calibkit.data.tensors import check_is_file

    path = Path(path)
    check_is_file(path)
    data = _read_file(path)
    if "logits" in data and "probs" in data:
        raise UserError(f"{path}: holds both 'logits' and 'probs'; keep one of them (calibkit never guesses "
                         "which one you meant)")
    key = "logits" if "logits" in data else "probs" if "probs" in data else None
    if key is None:
        raise UserError(f"{path}: no 'logits' or 'probs' entry (found: {', '.join(sorted(data)) or 'nothing'})")
    try:
        x = torch.as_tensor(np.asarray(data[key])) if not isinstance(data[key], torch.Tensor) else data[key]
    except (TypeError, ValueError) as exc:
        raise UserError(f"{path}: '{key}' is not a numeric array ({exc})") from None
    if not x.dtype.is_floating_point or x.dim() not in (1, 2) or x.shape[0] == 0:
        raise UserError(f"{path}: '{key}' must be a non-empty float array of shape (N, K) or (N,), "
                         f"got {x.dtype} {tuple(x.shape)}")
    if x.dim() == 2 and x.shape[1] < 2:
        what = "no classes (0 columns)" if x.shape[1] == 0 else "a single column"
        raise UserError(f"{path}: '{key}' has {what}, shape {tuple(x.shape)}; expected (N, K) with K >= 2 classes, "
                         "or binary positive-class scores as a 1-D (N,) array")
    x = x.double()
    if not bool(torch.isfinite(x).all()):
        raise UserError(f"{path}: '{key}' contains {int((~torch.isfinite(x)).sum())} NaN or infinite value(s)")
    if key == "probs":
        try:
            check_probs(torch.stack([1 - x, x], 1) if x.dim() == 1 else x, name=f"{path}: 'probs'")
        except ValueError as exc:
            raise UserError(str(exc)) from None
        p = x.clamp(min=1e-300)
        x = torch.log(p) - torch.log((1 - x).clamp(min=1e-300)) if x.dim() == 1 else torch.log(p)
    labels = data.get("labels")
    if labels is None:
        if require_labels:
            raise UserError(f"{path}: no 'labels' entry")
        return x, None, key
    y = np.asarray(labels) if not isinstance(labels, torch.Tensor) else labels
    k = 2 if x.dim() == 1 else x.shape[1]
    try:
        y = check_labels(y, k, x.shape[0])
    except ValueError as exc:
        raise UserError(f"{path}: {exc}") from None
    return x, y, key


def _read_file(path):
    from calibkit.data.tensors import read_npz, read_pt

    suffix = path.suffix.lower()
    if suffix == ".npz":
        return read_npz(path)
    if suffix == ".pt":
        return read_pt(path)
    if suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as exc:  # the reader raises its own types for a damaged file
            reason = (str(exc).strip().splitlines() or [""])[0][:120]
            raise UserError(f"{path}: not a readable .safetensors file ({type(exc).__name__}: {reason})") from None
    raise UserError(f"{path}: unsupported file type {suffix or '(none)'}; use .npz, .safetensors or .pt")


def _choose(spec):
    from calibkit.calibrators import CALIBRATORS

    if spec is None:
        return list(CALIBRATORS)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [n for n in names if n not in CALIBRATORS]
    if bad or not names:
        raise UserError(f"unknown calibrator {', '.join(map(repr, bad)) or '(none given)'}; expected one of "
                         f"{', '.join(CALIBRATORS)}")
    return list(dict.fromkeys(names))


def _check_args(args, names):
    from calibkit.bootstrap import MIN_RESAMPLES
    from calibkit.commands import check_paths_given

    check_paths_given(val=args.val, test=args.test, out=args.out)
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
    if args.save is not None and args.save not in names:
        raise UserError(f"--save {args.save!r}: not among the calibrators fitted here ({', '.join(names)})")


def run(args) -> int:
    import json
    from pathlib import Path

    from calibkit.calibrators.selection import SelectionRule

    names = _choose(args.calibrators)
    _check_args(args, names)
    rule = SelectionRule(select_by=args.select_by, acc_tolerance=args.acc_tolerance / 100, n_folds=args.folds,
                         n_bins=args.n_bins)
    val_x, val_y, val_src = read_scores(args.val)
    test_x, test_y, test_src = read_scores(args.test)
    if val_x.dim() != test_x.dim() or (val_x.dim() == 2 and val_x.shape[1] != test_x.shape[1]):
        shape = lambda x: "binary (N,)" if x.dim() == 1 else f"K = {x.shape[1]}"  # noqa: E731
        raise UserError(f"{args.val} has {shape(val_x)} but {args.test} has {shape(test_x)}: "
                         "validation and test must come from the same model")
    if len(val_y) < args.folds:
        raise UserError(f"{args.val}: {len(val_y)} validation rows, fewer than --folds {args.folds}")
    _check_rows(args, val_x, val_y, names)
    _warn_one_class(args, val_y, 2 if val_x.dim() == 1 else val_x.shape[1])
    _warn_same_data(args, (val_x, val_y), (test_x, test_y))

    from calibkit.report import posthoc
    from calibkit.report.tables import md_code

    timer = _Timer()
    sel, probs, seconds = _select_and_predict(val_x, val_y, test_x, names, rule, timer)
    if args.save and args.save not in sel.fitted:  # its fit failed on a fold: nothing to save
        raise UserError(f"--save {args.save!r}: {sel.scores[args.save].error}")
    rows, rec = _test_numbers(sel, probs, test_y, seconds, args, timer)
    from calibkit.report import sets

    with timer("sets"):
        set_res = sets.calibrator_sets((val_x, val_y), (test_x, test_y), probs, alpha=args.alpha,
                                       n_boot=args.n_boot, seed=args.seed)
    text = "\n\n".join([posthoc.recommendation_text(rec), posthoc.validation_table(sel),
                        posthoc.test_table(rows, sel.chosen), sets.calibrator_sets_table(set_res, args.alpha)])
    print(f"fitted on {args.val} ({len(val_y)} rows, {val_src}); scored on {args.test} ({len(test_y)} rows, "
          f"{test_src})\n")
    print(text)

    out = Path(args.out)
    report = out / "report"
    report.mkdir(parents=True, exist_ok=True)
    with timer("figures"):
        _figures(report, probs, test_y, args)
    (report / "calibrators.md").write_text(
        f"# Post-hoc calibrators\n\nFitted and chosen on {md_code(args.val)} ({len(val_y)} rows), scored on "
        f"{md_code(args.test)} "
        f"({len(test_y)} rows); {args.n_boot} bootstrap resamples, 95% intervals, ECE with {args.n_bins} bins.\n\n"
        f"{text}\n\n" + "\n".join(f"![{n}](reliability_{n}.png)" for n in probs) + "\n")
    (report / "results.json").write_text(json.dumps(
        [dict(posthoc.jsonable_row(r), selected=r["calibrator"] == sel.chosen) for r in rows], indent=2))
    (report / "selection.json").write_text(json.dumps(sel.to_dict(), indent=2))
    (report / "sets.json").write_text(json.dumps({"alpha": args.alpha, "score": sets.SCORE, "calibrators": set_res},
                                                 indent=2))
    if args.save:
        from calibkit.calibrators import save

        st, js = save(sel.fitted[args.save], out / args.save)
        print(f"\nsaved {args.save}: {st} + {js}")
    print(f"\nreport: {report / 'calibrators.md'}")
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
    if args.save in refused:
        raise UserError(f"--save {args.save!r}: {refused[args.save]}")
    if val_x.dim() == 2 and n < ROWS_PER_CLASS * k:  # binary scores: temperature-like maps only
        skipped = f"; not fitted: {', '.join(refused)} (fewer rows than classes)" if refused else ""
        warnings.warn(f"{args.val}: {n} validation rows for K = {k} classes (fewer than {ROWS_PER_CLASS} per class): "
                      "the calibrators with K or K x K parameters (vector: 2K; matrix, dirichlet: K^2 + K) cannot be "
                      f"fitted reliably, and their fits may be slow{skipped}", stacklevel=2)
    if (text := thin_warning(val_y, k, args.val)) is not None:
        warnings.warn(text, stacklevel=2)


def _warn_one_class(args, val_y, k: int) -> None:
    """Warn when every validation label is one class: the calibrators can be fitted (temperature
    scaling then only reaches its bound), but neither the fits nor the choice learn anything about
    the other classes."""
    import warnings

    classes = val_y.unique()
    if len(classes) == 1:
        warnings.warn(f"{args.val}: validation labels hold one class ({int(classes[0])}) only: every calibrator is "
                      f"fitted and chosen without an example of the other {k - 1} class(es), so the fits and the "
                      "choice say little; use a validation split with every class", stacklevel=2)


def _warn_same_data(args, val, test) -> None:
    """Warn when ``--val`` and ``--test`` are one file, or hold the same logits and labels."""
    import warnings
    from pathlib import Path

    import torch

    if same_file(Path(args.val), Path(args.test)):
        what = "are the same file"
    elif all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(val, test)):
        what = "hold identical logits and labels"
    else:
        return
    warnings.warn(f"--val {args.val} and --test {args.test} {what}: calibration and evaluation use the same "
                  "data, so the test numbers are not held out", stacklevel=2)


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


def _select_and_predict(val_x, val_y, test_x, names, rule, timer):
    """The cross-fitted selection on the validation rows, then every fitted calibrator on the test rows."""
    import time

    import torch

    from calibkit.calibrators import CALIBRATORS
    from calibkit.calibrators.evidence import unestimable
    from calibkit.calibrators.selection import NONE, choose, cross_fit, unfittable

    fitted, seconds = {}, {}
    k = 2 if val_x.dim() == 1 else val_x.shape[1]
    for name in names:  # the full fits first, timed alone (the "fit s" column)
        if unfittable(name, val_x.shape[0], k) is not None or unestimable(name, val_y, k) is not None:
            continue  # cross_fit gives it its reason
        start = time.perf_counter()
        with timer(f"fit {name}"):
            fitted[name] = CALIBRATORS[name]().fit(val_x, val_y)
        seconds[name] = time.perf_counter() - start
    with timer("cross-fitting"):
        scores, fitted = cross_fit(val_x, val_y, names, rule, fitted=fitted)
    sel = choose(scores, rule)
    sel.fitted = fitted
    probs = {NONE: torch.sigmoid(test_x) if test_x.dim() == 1 else torch.softmax(test_x, 1)}
    with timer("predict"):
        for name in names:
            if name in fitted:  # not those refused or failed in cross-fitting (their reason is in the tables)
                probs[name] = fitted[name].predict_proba(test_x).double()
    return sel, probs, seconds


def _test_numbers(sel, probs, test_y, seconds, args, timer):
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
        extra = {"d_ece": diffs.get(sel.chosen) if sel.chosen != ref else None, "d_nll": None, "d_acc": None}
        for m in ("nll", "acc"):
            cis, d = bootstrap_cis(m, pair, test_y, reference=ref if ref in pair else None, **boot)
            extra[f"{m}_ci"], extra[f"d_{m}"] = cis[sel.chosen], d.get(sel.chosen) if sel.chosen != ref else None
    rows = posthoc.test_rows(probs, test_y, intervals, diffs, panels, seconds)
    return rows, posthoc.recommendation(sel, rows, extra)


def _figures(report, probs, labels, args) -> None:
    from calibkit import plots

    for name, p in probs.items():
        ax = plots.reliability_diagram(p, labels, n_bins=args.n_bins, title=name)
        ax.figure.savefig(report / f"reliability_{name}.png", dpi=args.dpi, bbox_inches="tight")
