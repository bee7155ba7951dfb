"""One model's post-hoc calibrators on its test split: guards, the recommendation and the tables.

Used by ``calibkit calibrate``. The calibrator is chosen on the validation split
(:mod:`calibkit.calibrators.selection`); everything here only *reports* test numbers of that choice
and, for reference, of every other calibrator, never choosing by them.

Guards shown beside every test row (:func:`guard_stats`):

* ``changed``: the share of test rows whose predicted class differs from the uncalibrated model's,
  and ``d_acc``, the accuracy change it brings;
* ``zero_rows``: rows whose true class gets a probability below :data:`ZERO_P` (1e-12), and
  ``zero_share``, the share of the NLL sum that comes from them. calibkit reports the plain NLL
  (``calibkit.functional.nll``: probabilities floored at the smallest normal float, so a zero gives
  about 708 for float64, never ``inf``) and flags it (``NLL_FLAG``) when such rows exist: an NLL
  dominated by them measures how many rows a binning map sent to zero, not calibration.
"""

from __future__ import annotations

import math

import torch

from calibkit.calibrators.selection import NONE, Selection
from calibkit.report.confirm import ALPHA, POWER, detectable
from calibkit.report.data import BETTER_MARK, WORSE_MARK, direction

REFERENCE = "temperature"
ZERO_P = 1e-12
NLL_FLAG = "\u2020"  # dagger


def two_column(p: torch.Tensor) -> torch.Tensor:
    """``(N, K)`` float64 probabilities (binary ``(N,)`` positive-class probabilities as two columns)."""
    p = p.double()
    return torch.stack([1 - p, p], 1) if p.dim() == 1 else p


def guard_stats(probs: torch.Tensor, base_pred: torch.Tensor, labels: torch.Tensor, base_acc: float) -> dict:
    """``changed``, ``d_acc``, ``zero_rows`` and ``zero_share`` of one calibrator's test probabilities."""
    p = two_column(probs)
    pred = p.argmax(1)
    p_y = p.gather(1, labels.view(-1, 1)).squeeze(1)
    terms = -p_y.clamp(min=torch.finfo(torch.float64).tiny).log()
    zero = p_y < ZERO_P
    total = float(terms.sum())
    return {"changed": float((pred != base_pred).double().mean()),
            "d_acc": float((pred == labels).double().mean()) - base_acc,
            "zero_rows": int(zero.sum()),
            "zero_share": float(terms[zero].sum()) / total if total > 0 else 0.0}


def test_rows(probs: dict, labels: torch.Tensor, intervals: dict, diffs: dict, panels: dict,
              seconds: dict) -> list[dict]:
    """One dict per calibrator (``probs``' order): the test panel, the guards, the ECE interval, the
    paired difference from temperature scaling (None for itself or when it was not fitted)."""
    base = two_column(probs[NONE])
    base_pred = base.argmax(1)
    base_acc = float((base_pred == labels).double().mean())
    rows = []
    for name, p in probs.items():
        rows.append({"calibrator": name, "seconds": seconds.get(name, 0.0),
                     **{k: panels[name][k] for k in ("ece", "cece", "nll", "brier", "acc")},
                     **{f"{k}_gain": gain(panels[NONE][k], panels[name][k]) for k in ("nll", "brier")},
                     **guard_stats(p, base_pred, labels, base_acc),
                     "ece_ci": intervals[name], "vs_ts": diffs.get(name)})
    return rows


def gain(uncalibrated: float, calibrated: float) -> float:
    """The post-hoc improvement of a proper score: its relative decrease from the uncalibrated
    model's, ``(uncalibrated - calibrated) / uncalibrated`` (> 0: better; NaN when the uncalibrated
    score is 0), the figure the post-hoc benchmark literature compares calibrators by."""
    return (uncalibrated - calibrated) / uncalibrated if uncalibrated > 0 else float("nan")


def _ci(r, scale=100.0, digits=2) -> str:
    return f"{scale * r.estimate:.{digits}f} [{scale * r.low:.{digits}f}, {scale * r.high:.{digits}f}]"


def _diff(r, metric: str, scale=100.0, digits=2) -> str:
    mark = {"better": f" {BETTER_MARK}", "worse": f" {WORSE_MARK}"}.get(direction(r.low, r.high, metric) or "", "")
    return f"{scale * r.estimate:+.{digits}f} [{scale * r.low:+.{digits}f}, {scale * r.high:+.{digits}f}]{mark}"


def nll_text(row: dict) -> str:
    """The NLL with its flag when rows with a (near) zero true-class probability exist."""
    text = f"{row['nll']:.4f}"
    if row["zero_rows"]:
        text += f" {NLL_FLAG}{row['zero_rows']} ({100 * row['zero_share']:.0f}%)"
    return text


def sentence(chosen: str, vs_ts, ref_present: bool, metric: str = "nll") -> str:
    """What the evidence supports, in one plain sentence (``vs_ts``: the chosen calibrator's paired
    test difference from temperature scaling in ``metric``, the rule's metric)."""
    if chosen == NONE:
        return ("No calibrator improved on the uncalibrated model on validation under the rule: keep the model's own "
                "probabilities.")
    if chosen == REFERENCE:
        return ("Temperature scaling is the choice: no other calibrator did better on validation under the rule, "
                "and it never changes a prediction.")
    if not ref_present or vs_ts is None:
        return f"{chosen} is the choice on validation (temperature scaling was not among the calibrators fitted)."
    name = metric.upper()
    way = direction(vs_ts.low, vs_ts.high, metric)
    if way == "better":
        return (f"{chosen} was chosen on validation and also has a significantly lower test {name} "
                "than temperature scaling.")
    if way == "worse":
        return (f"{chosen} was chosen on validation but has a significantly higher test {name} than temperature "
                "scaling: the validation split did not separate them; temperature scaling is the safer choice.")
    return (f"{chosen} was chosen on validation; on test its {name} is not distinguishable from temperature "
            "scaling's, which keeps every prediction with one parameter: either is supported by this evidence.")


def choice_power(sel: Selection) -> dict | None:
    """The power of the validation split for the choice: the standard error of the cross-fitted
    difference ``other - temperature scaling`` in the rule's metric (the standard deviation of its
    paired resamples, one draw shared by every candidate) and the smallest difference it detects,
    :func:`calibkit.report.confirm.detectable` (2.80 standard errors).

    ``other`` is the chosen calibrator, or the runner-up when temperature scaling is chosen (the
    difference the choice turned on). ``{"other", "se", "detectable"}``, or None when temperature
    scaling was not fitted, there is no such ``other`` or a side has no resamples."""
    other = sel.runner_up if sel.chosen == REFERENCE else sel.chosen
    ts = sel.scores.get(REFERENCE)
    if other is None or ts is None or ts.error is not None:
        return None
    a, b = sel.scores[other].samples, ts.samples
    if a is None or b is None or a.shape != b.shape:
        return None
    se = float((a - b).std())
    return {"other": other, "se": se, "detectable": detectable(se)} if math.isfinite(se) else None


def power_text(power: dict | None, metric: str, val_rows: int | None) -> str | None:
    """The block's power line (None without ``power``): the smallest difference from temperature
    scaling, in the rule's metric, that the validation rows detect."""
    if not power:
        return None
    scale, digits, unit = (100, 2, " x100") if metric == "ece" else (1, 4, "")
    rows = f"with {val_rows} validation rows, " if val_rows else ""
    return (f"- power: {rows}the smallest {metric.upper()}{unit} difference from temperature scaling this "
            f"validation split detects (two-sided {100 * ALPHA:g}%, power {100 * POWER:g}%) is "
            f"{scale * power['detectable']:.{digits}f} (2.80 x the bootstrap standard error "
            f"{scale * power['se']:.{digits}f} of the cross-fitted {power['other']} minus temperature scaling); "
            "a smaller difference that is not significant means too little data to tell, not no difference")


def recommendation(sel: Selection, rows: list[dict], extra: dict) -> dict:
    """The recommendation block's numbers: ``extra`` holds the chosen calibrator's intervals
    (``"nll_ci"``, ``"acc_ci"``), its paired differences from TS (``"d_ece"``, ``"d_nll"``,
    ``"d_acc"``, ``"d_brier"``; None when it is TS or TS was not fitted) and optionally
    ``"val_rows"``; the sentence reads the difference in the rule's metric, ``"power"`` is
    :func:`choice_power`."""
    by = {r["calibrator"]: r for r in rows}
    chosen = by[sel.chosen]
    return {"chosen": sel.chosen, "rule": sel.rule.describe(), "runner_up": sel.runner_up,
            "row": chosen, "none": by[NONE], "select_by": sel.rule.select_by, "power": choice_power(sel), **extra,
            "sentence": sentence(sel.chosen, extra.get(f"d_{sel.rule.select_by}"), REFERENCE in by,
                                 sel.rule.select_by)}


def recommendation_text(rec: dict) -> str:
    """The block printed first by ``calibkit calibrate`` (markdown that reads as plain text)."""
    r, base = rec["row"], rec["none"]
    lines = ["## Recommendation", "",
             f"**Use: {rec['chosen']}** (chosen on validation: {rec['rule']}).", "",
             f"- test ECE x100 {_ci(r['ece_ci'])}, NLL {_ci(rec['nll_ci'], 1, 4)}, accuracy % "
             f"{_ci(rec['acc_ci'])}; uncalibrated: ECE x100 {100 * base['ece']:.2f}, NLL {base['nll']:.4f}, "
             f"accuracy {100 * base['acc']:.2f}%",
             f"- predictions changed on {100 * r['changed']:.2f}% of test rows "
             f"(accuracy {100 * r['d_acc']:+.2f} points)"]
    if rec.get("d_ece") is not None:
        lines.append(f"- minus temperature scaling (paired, test): ECE x100 {_diff(rec['d_ece'], 'ece')}, NLL "
                     f"{_diff(rec['d_nll'], 'nll', 1, 4)}, accuracy points {_diff(rec['d_acc'], 'acc')}")
    lines.append(f"- runner-up on validation: {rec['runner_up'] or '(none eligible)'}")
    power = power_text(rec.get("power"), rec.get("select_by", "nll"), rec.get("val_rows"))
    if power:
        lines.append(power)
    lines += ["", rec["sentence"]]
    return "\n".join(lines)


def validation_table(sel: Selection) -> str:
    """Cross-fitted validation scores of every candidate: the numbers the choice was made on."""
    head = ["calibrator", "ECE x100", "NLL", "Brier", "acc %", "changed %", "status"]
    lines = [f"## Validation ({sel.rule.n_folds}-fold cross-fitted): the choice", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rank = {n: i for i, n in enumerate(sel.ranking, 1)}
    for name, s in sel.scores.items():
        if name == sel.chosen:
            status = "**chosen**" + (" (the default)" if name == sel.default else "")
        elif name in sel.notes:
            status = sel.notes[name]
        elif name in rank:
            status = f"eligible, #{rank[name]}" + (" (the default)" if name == sel.default else "")
        else:
            status = f"excluded: {sel.excluded.get(name, '')}"
        if s.error is not None:
            lines.append(f"| {name} | - | - | - | - | - | {status} |")
            continue
        lines.append(f"| {name} | {100 * s.ece:.2f} | {s.nll:.4f} | {s.brier:.4f} | {100 * s.acc:.2f} | "
                     f"{100 * s.changed:.2f} | {status} |")
    return "\n".join(lines)


def test_table(rows: list[dict], chosen: str) -> str:
    """Test numbers, the chosen calibrator first, then the rest in registry order: for reference only."""
    head = ["calibrator", "ECE x100 [95% CI]", "dECE vs TS x100 [95% CI]", "cwECE x100", "NLL",
            "NLL / Brier gain %", "acc %", "d acc", "changed %", "fit s"]
    ordered = [r for r in rows if r["calibrator"] == chosen] + [r for r in rows if r["calibrator"] != chosen]
    lines = ["## Test split: every calibrator, for reference (not a ranking; the choice is made on validation)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ref_present = any(r["calibrator"] == REFERENCE for r in rows)
    for r in ordered:
        d = r["vs_ts"]
        delta = ("(reference)" if r["calibrator"] == REFERENCE else "-") if d is None else _diff(d, "ece")
        name = f"**{r['calibrator']}** (chosen)" if r["calibrator"] == chosen else r["calibrator"]
        lines.append(f"| {name} | {_ci(r['ece_ci'])} | {delta} | {100 * r['cece']:.2f} | {nll_text(r)} | "
                     f"{100 * r['nll_gain']:+.1f} / {100 * r['brier_gain']:+.1f} | "
                     f"{100 * r['acc']:.2f} | {100 * r['d_acc']:+.2f} | {100 * r['changed']:.2f} | "
                     f"{r['seconds']:.2f} |")
    notes = []
    if not ref_present:
        notes.append("Temperature scaling was not fitted, so there is no difference column.")
    if any(r["zero_rows"] for r in rows):
        notes.append(f"{NLL_FLAG}N (P%): N test rows give their true class a probability below {ZERO_P:g}, and "
                     "they make P% of the NLL sum (each such row adds about 708 = -log of the smallest float64).")
    notes.append("* / !: the paired 95% interval of the difference lies wholly below / above 0.")
    notes.append("NLL / Brier gain %: the post-hoc improvement of each proper score, 100 (uncalibrated - "
                 "calibrated) / uncalibrated, on test (> 0: better than the uncalibrated model).")
    return "\n".join(lines + [""] + notes)


def jsonable_row(r: dict) -> dict:
    """A test row as JSON (intervals as ``[low, high]`` and ``{"estimate", "low", "high"}``)."""
    out = {k: v for k, v in r.items() if k not in ("ece_ci", "vs_ts")}
    out["ece_ci"] = [r["ece_ci"].low, r["ece_ci"].high]
    out["vs_ts"] = None if r["vs_ts"] is None else {"estimate": r["vs_ts"].estimate, "low": r["vs_ts"].low,
                                                    "high": r["vs_ts"].high}
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}
