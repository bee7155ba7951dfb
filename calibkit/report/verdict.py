"""The bench's verdict: each method's calibrator and the method + calibrator pair, chosen on validation.

Every run's saved validation logits are cross-fitted through every calibrator
(:func:`calibkit.calibrators.selection.cross_fit`, the rule of ``calibkit calibrate``); a method's
scores are the mean over its seeds (:func:`~calibkit.calibrators.selection.mean_scores`), and its
calibrator is chosen from them by :func:`~calibkit.calibrators.selection.choose`. The test split
takes no part in any choice.

**The pair.** The default is CE with its own chosen calibrator (by the rule, usually SMS, or
temperature scaling where the report does not fit SMS): what a user has without a training-time
method. Another (method, calibrator) pair, with the calibrator eligible for its method, must pass
the rule's guards against CE (mean cross-fitted validation accuracy at most ``acc_tolerance``
below CE's uncalibrated accuracy; under the ECE rule, cross-fitted NLL not above the default
pair's), and replaces the default only when its
cross-fitted ``select_by`` metric is significantly below the default pair's: the paired bootstrap
interval of the seed-averaged difference lies wholly below 0 (each run's validation resamples use
the rule's seed, so runs of one seed on the same validation rows share their draws, and the seed
mean is taken resample by resample). Among such pairs the lowest metric wins.

The recommendation then *reports* the pair's test numbers (ECE, NLL, accuracy with seed-averaged
bootstrap intervals) and its paired difference from CE + temperature scaling, the baseline every
training-time method has to beat (:func:`calibkit.report.paired.paired_delta`; with 3 or more shared
seeds its intervals resample seeds too).

**Rows.** A run with more than :data:`MAX_SELECTION_ROWS` validation rows (in practice the pixel
sample of a segmentation run, up to 200,000 pixels) is cross-fitted on a draw of that many rows,
which depends only on the row count (the same rows for every run of a seed, so pairs stay paired).
Cross-fitting ten calibrators five times on every pixel would dominate the report's time, and pixels
of one image are not independent samples anyway. ``calibkit calibrate`` uses every row.

Cross-fitted scores are cached under ``DIR/cache/selection/``, keyed as the calibrated
probabilities are (:mod:`calibkit.report.calibrated`) by content: the digest of the run's validation
logits and labels, the calibrators' names and hyperparameters, the rule's fields that the scores
depend on (:func:`rule_key`), the row cap, the cache format and the calibkit version. A rebuilt
report, a copied bench directory and a rule that differs only in how it chooses from the scores
(``acc_tolerance``, ``default``, ``level``, ``significance``) reuse them. When the report has
already fitted a calibrator on the run's whole validation split (its calibrated tables), the
cross-fitting starts from that fit (:meth:`~calibkit.report.calibrated.CalibratedProbs.fitted`)
instead of fitting it again: the same fit on the same rows, so the same scores.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from calibkit.bench.grid import REFERENCE
from calibkit.calibrators.registry import CALIBRATORS
from calibkit.calibrators.selection import (
    NONE,
    CrossFitScore,
    SelectionRule,
    _below,
    choose,
    cross_fit,
    mean_scores,
)
from calibkit.report.calibrated import CalibratedProbs, NoValidationLogits, cache_file
from calibkit.report.confirm import (
    confirmatory,
    confirmatory_lines,
    confirmed_better,
    p_text,
    power_line,
    validation_power,
)
from calibkit.report.data import BETTER_MARK, WORSE_MARK, direction, label
from calibkit.report.paired import paired_delta, seed_interval
from calibkit.report.tables import Table
from calibkit.rundir import atomic_write

#: The bench report's rule: SMS unless significantly beaten. ``calibkit calibrate``'s own default anchors at
#: the stack (:mod:`calibkit.calibrators.stack`); the report's calibrated tables and caches hold one
#: calibrator per name, fitted on the run's validation split, and have no stack yet, so each method's
#: calibrator is chosen among the single maps as before (docs/calibrators.md, "The stack").
DEFAULT_RULE = SelectionRule(default="sms")
#: Validation rows a run is cross-fitted on at most (module docstring, "Rows").
MAX_SELECTION_ROWS = 10_000


def rule_key(rule: SelectionRule) -> dict:
    """The rule's fields that cross-fitted scores depend on: the folds and their seed, the ECE's bins,
    and the metric, count and seed of the resamples. The others only choose from the scores."""
    return {k: v for k, v in rule.to_dict().items() if k in ("select_by", "n_folds", "n_bins", "seed", "n_boot")}


def _cache_file(cache_dir: Path | None, row: dict, rule: SelectionRule, probs: CalibratedProbs) -> Path | None:
    if cache_dir is None:
        return None

    names = ",".join(f"{n}={CALIBRATORS[n]()!r}" for n in probs.names[1:])
    ident = (f"{probs.digest(row, ('val_logits', 'val_labels'))}|{names}|{json.dumps(rule_key(rule), sort_keys=True)}|"
             f"{MAX_SELECTION_ROWS}")
    return cache_file(cache_dir, row, "crossfit", ident, "json")


def selection_rows(n: int, cap: int | None = None):
    """Sorted indices of the ``cap`` (default :data:`MAX_SELECTION_ROWS`) rows cross-fitted out of
    ``n``, or None for all.

    The draw is seeded by the row count alone, so runs on the same validation rows use the same rows.
    """
    cap = MAX_SELECTION_ROWS if cap is None else cap
    if n <= cap:
        return None
    return torch.randperm(n, generator=torch.Generator().manual_seed(n)).narrow(0, 0, cap).sort().values


def run_scores(row: dict, probs: CalibratedProbs, rule: SelectionRule = DEFAULT_RULE,
               cache_dir: Path | None = None) -> dict[str, CrossFitScore]:
    """Cross-fitted validation scores of one run (``"none"`` and every calibrator of ``probs.names``)."""
    path = _cache_file(cache_dir, row, rule, probs)
    if path is not None and path.is_file():
        try:
            return {k: CrossFitScore.from_dict(v) for k, v in json.loads(path.read_text()).items()}
        except (ValueError, TypeError):
            pass  # a damaged cache file is recomputed, never trusted
    t = probs.logits(row)
    if not {"val_logits", "val_labels"} <= set(t):
        raise NoValidationLogits(f"{row['logits_path']}: no validation logits to choose a calibrator on")
    x, y = t["val_logits"], t["val_labels"].long()
    rows = selection_rows(len(y))
    names = probs.names[1:]
    if rows is None:  # the calibrators the report already fitted on these very rows are not refitted
        scores, _ = cross_fit(x, y, names, rule=rule, fitted=probs.fitted(row))
    else:
        scores, _ = cross_fit(x[rows], y[rows], names, rule=rule)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({k: v.to_dict() for k, v in scores.items()})
        atomic_write(path, lambda tmp: Path(tmp).write_text(text))
    return scores


def method_selections(summary: dict, probs: CalibratedProbs, rule: SelectionRule = DEFAULT_RULE,
                      cache_dir: Path | None = None) -> dict:
    """``{method: Selection}``: each method's calibrator chosen on its seeds' mean cross-fitted scores."""
    return {m: choose(mean_scores([run_scores(r, probs, rule, cache_dir) for r in e["runs"]]), rule)
            for m, e in summary.items()}


def choose_pair(selections: dict, rule: SelectionRule = DEFAULT_RULE) -> dict | None:
    """The method + calibrator pair (module docstring), or None without CE runs.

    Returns:
        ``{"pair", "default", "ranking", "notes"}``: the chosen ``(method, calibrator)``; the
        default pair, CE with its own chosen calibrator; every eligible pair, chosen first, then by
        the cross-fitted metric; ``{pair: text}`` for eligible pairs that did not beat the default
        significantly.
    """
    if REFERENCE not in selections:
        return None
    ce = selections[REFERENCE]
    default = (REFERENCE, ce.chosen)
    base, d_score = ce.scores[NONE], ce.scores[ce.chosen]
    eligible: list[tuple[float, int, str, str]] = []  # (score, order seen, method, calibrator)
    for m, sel in selections.items():
        for c in sel.ranking:
            s = sel.scores[c]
            if (m, c) != default and (s.acc < base.acc - rule.acc_tolerance - 1e-12
                                      or (rule.select_by == "ece" and not s.nll <= d_score.nll + 1e-12)):
                continue
            eligible.append((getattr(s, rule.select_by), len(eligible), m, c))
    ranked = [(m, c) for _, _, m, c in sorted(eligible)]
    winners, notes = [], {}
    for m, c in ranked:
        if (m, c) == default:
            continue
        below, text = _below(selections[m].scores[c], d_score, rule, f"{label(REFERENCE)} + {ce.chosen}")
        if below:
            winners.append((m, c))
        else:
            notes[(m, c)] = text
    pair = winners[0] if winners else default
    return {"pair": pair, "default": default, "ranking": [pair] + [p for p in ranked if p != pair], "notes": notes}


def _interval(runs, probs, metric, after, n_boot, seed):
    return seed_interval(runs, probs, metric, after=after, n_boot=n_boot, seed=seed)


def recommendation(summary: dict, probs: CalibratedProbs, selections: dict, rule: SelectionRule = DEFAULT_RULE,
                   n_boot: int = 1000, seed: int = 0) -> dict | None:
    """The pair, its test evidence and the confirmatory comparisons (None without CE runs).

    The pair is the validation choice (:func:`choose_pair`) unless the confirmatory comparisons
    (:func:`calibkit.report.confirm.confirmatory`) confirm on test that some methods + their
    calibrators beat CE + temperature scaling and the validation pair is not among them: then the
    recommendation is the confirmed pair with the lowest cross-fitted validation metric (the test
    split says *whether* a method beats CE + TS, validation still ranks), and ``basis`` says so.
    """
    choice = choose_pair(selections, rule)
    if choice is None:
        return None
    conf = confirmatory(summary, probs, selections, rule.select_by, n_boot, seed)
    better = confirmed_better(conf)
    val_pair = choice["pair"]
    basis = "validation"
    if better and val_pair not in [(m, selections[m].chosen) for m in better]:
        metric_of = lambda m: getattr(selections[m].scores[selections[m].chosen], rule.select_by)  # noqa: E731
        best = min(better, key=lambda m: (metric_of(m), better.index(m)))
        method, cal, basis = best, selections[best].chosen, "confirmatory"
    else:
        method, cal = val_pair
        if better:
            basis = "validation and confirmatory"
    ranked = choice["ranking"]
    runs, ce_runs = summary[method]["runs"], summary[REFERENCE]["runs"]
    t = probs.logits(runs[0])
    out = {"method": method, "calibrator": cal, "runner_up": ranked[1] if len(ranked) > 1 else None,
           "rule": rule, "seeds": len(runs), "val": selections[method].scores[cal], "default": choice["default"],
           "runner_up_note": choice["notes"].get(ranked[1]) if len(ranked) > 1 else None,
           "val_pair": val_pair, "basis": basis, "confirmatory": conf,
           "val_rows": min(len(t["val_labels"]), MAX_SELECTION_ROWS) if "val_labels" in t else None,
           "power": validation_power(selections, val_pair, ranked[1] if len(ranked) > 1 else None)}
    for metric in dict.fromkeys(("ece", "nll", "acc", rule.select_by)):
        out[metric] = _interval(runs, probs, metric, cal, n_boot, seed)
        out[f"d_{metric}"] = (None if (method, cal) == (REFERENCE, "temperature") else
                              paired_delta(runs, ce_runs, probs, metric, after_a=cal, after_b="temperature",
                                           n_boot=n_boot, seed=seed))
    out["sentence"] = sentence(out)
    return out


def sentence(rec: dict) -> str:
    """One plain sentence of what the evidence supports (it never contradicts the confirmatory results)."""
    method, cal = rec["method"], rec["calibrator"]
    metric = rec["rule"].select_by if "rule" in rec else "ece"
    d, name = rec.get(f"d_{metric}"), metric.upper()
    pair = f"{label(method)} + {cal}"
    levels = ("seeds and test samples" if (d or {}).get("levels") == 2 else "test samples only")
    conf = rec.get("confirmatory")
    better = confirmed_better(conf)
    if better:
        assert conf is not None  # confirmed_better finds none without the confirmatory block
        t = conf["tests"][method]
        n = len(conf["tests"])
        why = (f"its confirmatory test {name} difference from CE + temperature scaling is {t['diff']:+.4g} "
               f"({p_text('Holm-adjusted p', t['p_holm'], conf.get('n_boot'), n)} over {n} method(s))")
        if rec.get("basis") == "confirmatory":
            vm, vc = rec["val_pair"]
            return (f"{pair} beats CE + temperature scaling on test: {why}. The validation split could not "
                    f"separate it (it chose {label(vm)} + {vc}); the test comparison was declared before the test "
                    "split was read and was read once, so it is the stronger evidence.")
        return f"{pair} was chosen on validation and is confirmed on test: {why}."
    if method == REFERENCE:
        tested = "" if not conf else " nor in the Holm-corrected confirmatory tests on test"
        if cal == "temperature":
            return (f"No training-time method beats CE + temperature scaling, on validation{tested}: train with CE "
                    "and apply temperature scaling.")
        return (f"No training-time method beats CE on validation{tested}; its best calibrator is {cal} (on test "
                f"{_delta_words(d, metric)} CE + temperature scaling in {name}; intervals cover {levels}).")
    way = direction(d["lo"], d["hi"], metric) if d else None
    if way == "better":
        return (f"{pair} was chosen on validation and has a significantly lower test {name} than CE + temperature "
                f"scaling (intervals cover {levels}), but the Holm-corrected confirmatory test over all methods does "
                "not confirm it.")
    if way == "worse":
        return (f"{pair} was chosen on validation but its test {name} is significantly above CE + temperature "
                f"scaling's (intervals cover {levels}): the validation split did not separate them; CE + temperature "
                "scaling is the safer choice.")
    return (f"{pair} was chosen on validation, but on test it is not distinguishable from CE + temperature scaling "
            f"(intervals cover {levels}): the evidence does not show that a training-time method beats CE + "
            "temperature scaling here.")


def _delta_words(d: dict | None, metric: str = "ece") -> str:
    if not d:
        return "it equals"
    way = direction(d["lo"], d["hi"], metric) or ""
    return {"better": "it is significantly below", "worse": "it is significantly above"}.get(way, "it is "
                                                                                               "indistinguishable from")


def _ci(ci: dict | None, scale: float, digits: int) -> str:
    if not ci:
        return "-"
    return f"{scale * ci['value']:.{digits}f} [{scale * ci['lo']:.{digits}f}, {scale * ci['hi']:.{digits}f}]"


def _d(d: dict | None, scale: float, digits: int) -> str:
    if not d:
        return "-"
    mark = {"better": BETTER_MARK, "worse": WORSE_MARK}.get(direction(d["lo"], d["hi"], d["metric"]) or "", "")
    return f"{scale * d['diff']:+.{digits}f} [{scale * d['lo']:+.{digits}f}, {scale * d['hi']:+.{digits}f}]{mark}"


def _trade_off(rec: dict, select_by: str) -> str | None:
    """A line for a recommended pair that is significantly worse than CE + temperature scaling on
    test in a metric the rule did not choose by (the choice stands: it was made on validation)."""
    names = METRIC_FORMAT
    worse = [(m, d) for m in ("ece", "nll", "brier") if m != select_by and (d := rec.get(f"d_{m}"))
             and direction(d["lo"], d["hi"], d["metric"]) == "worse"]
    if not worse:
        return None
    parts = ", ".join(f"{names[m][0]} {_d(d, names[m][1], names[m][2])}" for m, d in worse)
    return (f"- Trade-off: on test this pair is significantly worse than CE + temperature scaling in {parts}, "
            f"while the choice is by {names[select_by][0]}. The metrics measure different things and can disagree: "
            "NLL and the Brier score are proper scores (calibration and sharpness together), the ECE one aspect of "
            "calibration. Every pair's test ECE is in the methods x post-hoc calibrators tables.")


def recommendation_text(rec: dict) -> str:
    """The block at the top of the bench report (Markdown; the terminal strips its marks)."""
    rule, v = rec["rule"], rec["val"]
    pair = f"{label(rec['method'])} + {rec['calibrator']}"
    d_m, d_c = rec["default"]
    metric = rule.select_by.upper()
    value = getattr(v, rule.select_by) * (100 if rule.select_by == "ece" else 1)
    nll = " or raising NLL" if rule.select_by == "ece" else ""
    val_text = (f"cross-fitted {metric} {value:.{2 if rule.select_by == 'ece' else 4}f}"
                f"{' x100' if rule.select_by == 'ece' else ''}")
    how = {"confirmatory": f"confirmed better than CE + temperature scaling on the test split ({val_text} on "
                           "validation)",
           "validation and confirmatory": f"chosen on the validation split ({val_text}) and confirmed on test"
           }.get(rec.get("basis", "validation"), f"chosen on the validation split ({val_text})")
    lines = [f"**Use: {pair}**, {how}.",
             "",
             _how(rule, metric, nll, f"{label(d_m)} + {d_c}") + " Then each method + its calibrator is compared "
             "with CE + temperature scaling on test, once, Holm-corrected over the methods (confirmatory); a method "
             "it confirms better is recommended even where validation could not separate it.",
             "",
             "Evidence: validation chooses (the test split takes no part in any choice, so its numbers are not "
             "selected on); the test split tests the comparisons fixed by those choices, each read once and "
             "corrected for their number, so a confirmed difference is not luck of the choosing.",
             "",
             f"- Test, mean over {rec['seeds']} seed(s), 95% intervals: ECE x100 {_ci(rec['ece'], 100, 2)}, "
             f"NLL {_ci(rec['nll'], 1, 4)}, accuracy % {_ci(rec['acc'], 100, 2)}."]
    if rec.get("d_ece") is not None:
        lines += ["", f"- Minus CE + temperature scaling (paired by seed, test): ECE x100 {_d(rec['d_ece'], 100, 2)}, "
                      f"NLL {_d(rec['d_nll'], 1, 4)}, accuracy points {_d(rec['d_acc'], 100, 2)}."]
        trade = _trade_off(rec, rule.select_by)
        if trade:
            lines += ["", trade]
    lines += ["", _validation_line(rec)]
    power = power_line(rec)
    if power:
        lines += ["", power]
    conf = confirmatory_lines(rec.get("confirmatory"))
    if conf:
        lines += [""] + conf
    lines += ["", rec["sentence"]]
    return "\n".join(lines)


def _validation_line(rec: dict) -> str:
    """The validation ranking's line: its runner-up, or, when the test comparisons decided the
    recommendation, validation's own choice first (so the line never names the recommended pair as
    validation's runner-up without saying what validation chose)."""
    ru = rec["runner_up"]
    note = f" ({rec['runner_up_note']})" if rec.get("runner_up_note") else ""
    runner_up = f"{label(ru[0]) + ' + ' + ru[1] if ru else '(none eligible)'}{note}"
    if rec.get("basis") == "confirmatory" and rec.get("val_pair"):
        vm, vc = rec["val_pair"]
        return f"- Validation's own choice: {label(vm)} + {vc}; runner-up there: {runner_up}."
    return f"- Runner-up on validation: {runner_up}."


def _how(rule: SelectionRule, metric: str, nll: str, default_pair: str) -> str:
    keep = f"without losing accuracy ({100 * rule.acc_tolerance:g} points){nll}"
    if rule.uses_significance:
        return (f"How: each method's calibrator is {rule.anchor_text()} unless another one has a significantly lower "
                f"{rule.n_folds}-fold cross-fitted validation {metric} {keep}; the pair is {default_pair} unless "
                "another pair is significantly better in the same way.")
    return (f"How: each method's calibrator is the one with the lowest {rule.n_folds}-fold cross-fitted validation "
            f"{metric} {keep} ({rule.anchor} on ties); the pair is the lowest such pair ({default_pair} on ties).")


def validation_table(selections: dict):
    """Methods x calibrators: the mean cross-fitted validation score each method's calibrator is
    chosen on (the rule's metric: NLL, Brier score, or ECE x100); the chosen calibrator of each
    method is marked (the row mark), excluded ones are in parentheses."""
    methods = list(selections)
    first = next(iter(selections.values()), None)
    names = list(first.scores) if first else []
    metric = first.rule.select_by if first else "nll"
    _, scale, digits = METRIC_FORMAT[metric]
    rows, chosen = [], set()
    for i, m in enumerate(methods):
        sel = selections[m]
        cells = []
        for j, n in enumerate(names):
            s = sel.scores.get(n)
            if s is None or s.error is not None:
                cells.append("-")
                continue
            text = f"{scale * getattr(s, metric):.{digits}f}"
            cells.append(f"({text})" if n in sel.excluded else text)
            if n == sel.chosen:
                chosen.add((i, j + 1))
        rows.append([label(m)] + cells)
    return Table([f"Method (val {metric_name(metric)}, cross-fitted)"] + names, rows, set(), row_best=chosen)


#: ``{metric: (name, scale, digits)}``: how the block and the tables print a selection metric.
METRIC_FORMAT = {"ece": ("ECE x100", 100, 2), "nll": ("NLL", 1, 4), "brier": ("Brier", 1, 4)}


def metric_name(metric: str) -> str:
    """``"NLL"``, ``"Brier"`` or ``"ECE x100"``: a selection metric as the tables print it."""
    return METRIC_FORMAT[metric][0] if metric in METRIC_FORMAT else metric
