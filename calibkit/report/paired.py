"""Paired comparisons of the report: each method against CE and against CE + temperature scaling.

All statistics are seed-averaged and paired by seed, as :func:`calibkit.report.data.paired_ece_delta`:
every seed's resamples use the same bootstrap seed, so with the same test set they draw the same
index sets, and averaging the seeds' resampled values gives the resampled seed-averaged value. The
interval is the **basic** bootstrap interval (``calibkit.bootstrap``). A comparison of two methods
sharing at least :data:`calibkit.seed_bootstrap.MIN_SEEDS` (3) seeds also resamples the seeds (the
two-level bootstrap of :mod:`calibkit.seed_bootstrap`), so its interval covers training randomness
as well as test-set noise; with fewer seeds, or when both sides are the same runs (post-hoc
calibrators compared on one model per seed), it resamples test samples only. Every difference
says which in ``"levels"`` (1 or 2).

* :func:`paired_delta`: ``metric(a) - metric(b)`` for any panel metric of the bootstrap's fast
  path, ``a`` and ``b`` each the test probabilities of a run after a calibrator (or none).
* :func:`seed_interval`: the interval of one metric of one method (O-ECE, U-ECE).
* :func:`calibkit.report.data.direction`: ``"better"``, ``"worse"`` or ``None`` from an interval, knowing whether lower
  is better: an interval wholly below 0 is better for an error and worse for accuracy, and wholly
  above 0 the other way round.

Segmentation runs (``test_image`` in the logits file) are compared by ECE only, with the
image-level bootstrap of :mod:`calibkit.grouped_bootstrap`; other metrics give ``None`` for them.
"""

from __future__ import annotations

import textwrap

import numpy as np
import torch

from calibkit.bench.grid import REFERENCE
from calibkit.bootstrap import _RANGE, bootstrap_ci, bootstrap_interval, holding
from calibkit.calibrators import CALIBRATORS
from calibkit.errors import UserError
from calibkit.grouped_bootstrap import paired_grouped_ece_diff
from calibkit.metrics import evaluate, paired_bootstrap_diff
from calibkit.report.calibrated import NONE, CalibratedProbs, calibrator_names
from calibkit.report.data import BETTER_MARK, WORSE_MARK, direction, fmt_delta, same_runs
from calibkit.report.tables import Table, text_table
from calibkit.seed_bootstrap import MIN_SEEDS, auto_levels, seed_paired_interval


def _pairs(runs_a, runs_b):
    by_seed = {r["seed"]: r for r in runs_b}
    return [(r, by_seed[r["seed"]]) for r in runs_a if r["seed"] in by_seed]


def paired_delta(runs_a: list[dict], runs_b: list[dict], probs: CalibratedProbs, metric: str = "ece",
                 after_a: str = NONE, after_b: str = NONE, n_boot: int = 1000, seed: int = 0,
                 level: float = 0.95, with_samples: bool = False) -> dict | None:
    """Paired bootstrap of the seed-averaged ``metric`` of ``runs_a`` (after ``after_a``) minus
    that of ``runs_b`` (after ``after_b``).

    Two levels (seeds and test samples, :mod:`calibkit.seed_bootstrap`) when the two sides are
    different runs sharing at least 3 seeds; one level (test samples) otherwise. The outer seed
    draw uses ``seed`` too (its own child stream).

    Returns:
        ``{"diff", "lo", "hi", "significant", "direction", "seeds", "levels", "identical",
        "metric"}`` (``seeds``: shared seeds; ``levels``: 1 or 2; with ``with_samples``, also
        ``"samples"``, the ``(n_boot,)`` resampled differences), or None when no seed is shared
        (or a segmentation run is asked for a metric other than ECE).

    Raises:
        ValueError: two runs of one seed were tested on different test sets.
    """
    pairs = _pairs(runs_a, runs_b)
    if not pairs:
        return None
    diffs, estimates, identical = [], [], True
    for run, other in pairs:
        pa, la = probs(run, after_a)
        pb, lb = probs(other, after_b)
        if not torch.equal(la, lb):
            raise UserError(f"{run['run_key']} and {other['run_key']} were tested on different test sets")
        identical = identical and torch.equal(pa, pb)
        groups = probs.groups(run)
        if groups is not None:
            if metric != "ece":
                return None

            g = paired_grouped_ece_diff(pa, pb, la, groups, n_resamples=n_boot, seed=seed)
            diffs.append(torch.as_tensor(g["samples"]))
            estimates.append(g["estimate"])
            continue
        res = paired_bootstrap_diff(pa, pb, la, metric, n_resamples=n_boot, seed=seed, level=level)
        diffs.append(res.samples)
        estimates.append(res.estimate)
    ci = seed_paired_interval(estimates, torch.stack(diffs), level, seed, auto_levels(len(pairs), same_runs(pairs)))
    lo, hi = ci["lo"], ci["hi"]
    out = {"diff": ci["estimate"], "lo": lo, "hi": hi, "significant": not (lo <= 0.0 <= hi),
           "direction": direction(lo, hi, metric), "seeds": len(pairs), "levels": ci["levels"],
           "identical": identical, "metric": metric}
    if with_samples:
        out["samples"] = ci["samples"]
    return out


def seed_interval(runs: list[dict], probs: CalibratedProbs, metric: str, after: str = NONE, n_boot: int = 1000,
                  seed: int = 0, level: float = 0.95) -> dict | None:
    """Bootstrap interval of the seed-averaged ``metric`` of ``runs``: ``{"value", "lo", "hi"}``
    (basic interval, clipped to the metric's range and extended to hold ``value``), or None for
    segmentation runs."""
    samples, estimates = [], []
    for run in runs:
        if probs.groups(run) is not None:
            return None
        res = bootstrap_ci(metric, *probs(run, after), n_resamples=n_boot, seed=seed, level=level)
        samples.append(res.samples)
        estimates.append(res.estimate)
    if not samples:
        return None
    value = float(np.mean(estimates))
    bounds = _RANGE.get(metric, (-np.inf, np.inf))
    lo, hi = holding(*bootstrap_interval(torch.stack(samples).mean(0), value, level, "basic", bounds), value)
    return {"value": value, "lo": lo, "hi": hi}


def comparisons(summary: dict, probs: CalibratedProbs, n_boot: int = 1000, seed: int = 0,
                level: float = 0.95) -> dict:
    """The ranking's paired columns, per method.

    ``{method: {"acc_vs_ce", "vs_ce_ts", "ts_vs_ce_ts", "o_ece", "u_ece"}}``:

    * ``acc_vs_ce``: accuracy of the method minus CE's (paired);
    * ``vs_ce_ts``: ECE of the method (no calibrator) minus ECE of CE after temperature scaling;
    * ``ts_vs_ce_ts``: ECE of the method after its own temperature scaling minus the same;
    * ``o_ece``, ``u_ece``: seed-averaged intervals of the method's own O-ECE and U-ECE.

    Entries that cannot be computed (no CE runs, no shared seed, no ``"temperature"``
    calibrator) are None.
    """
    ref = summary.get(REFERENCE, {}).get("runs")
    ts = "temperature" if "temperature" in CALIBRATORS else None
    out = {}
    for method, entry in summary.items():
        runs = entry["runs"]
        kw: dict = {"n_boot": n_boot, "seed": seed, "level": level}  # n_boot, seed: int; level: float
        row = {"o_ece": seed_interval(runs, probs, "o_ece", **kw), "u_ece": seed_interval(runs, probs, "u_ece", **kw),
               "acc_vs_ce": None, "vs_ce_ts": None, "ts_vs_ce_ts": None}
        if ref and method != REFERENCE:
            row["acc_vs_ce"] = paired_delta(runs, ref, probs, "acc", **kw)
        if ref and ts:
            row["vs_ce_ts"] = paired_delta(runs, ref, probs, "ece", NONE, ts, **kw)
            if method != REFERENCE:
                row["ts_vs_ce_ts"] = paired_delta(runs, ref, probs, "ece", ts, ts, **kw)
        out[method] = row
    return out


#: The metrics ``calibkit compare`` reports: (panel key, printed name, scale).
COMPARE_METRICS = (("acc", "Acc", 100), ("ece", "ECE", 100), ("aece", "AECE", 100), ("cece", "cwECE", 100),
                   ("mce", "MCE", 100), ("rmsce", "RMSCE", 100), ("o_ece", "O-ECE", 100), ("u_ece", "U-ECE", 100),
                   ("nll", "NLL", 1), ("brier", "Brier", 1))


def compare_methods(summary: dict, a: str, b: str, probs: CalibratedProbs, after: str | None = None,
                    n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict:
    """``a`` against ``b`` on every metric of :data:`COMPARE_METRICS`, both after ``after`` (or none).

    Returns:
        ``{"a", "b", "after", "seeds", "levels", "rows": [{"metric", "name", "scale", "a", "b", "delta"}]}``
        with ``a``/``b`` the seed means, ``delta`` :func:`paired_delta` (None where not
        computable: segmentation runs beyond ECE) and ``levels`` its bootstrap levels (2: seeds
        and test samples resampled, from 3 shared seeds on; 1: test samples only).

    Raises:
        ValueError: an unknown method or calibrator, or no seed shared by ``a`` and ``b``.
    """
    for m in (a, b):
        if m not in summary:
            raise UserError(f"no finished runs of method {m!r}; found: {', '.join(summary)}")
    name = NONE if after is None else after
    if name not in calibrator_names():
        raise UserError(f"unknown calibrator {after!r}; expected one of {', '.join(calibrator_names()[1:])}")
    pairs = _pairs(summary[a]["runs"], summary[b]["runs"])
    if not pairs:
        raise UserError(f"{a} and {b} share no seed ({a}: {summary[a]['seeds']}, {b}: {summary[b]['seeds']})")
    runs_a, runs_b = [p[0] for p in pairs], [p[1] for p in pairs]
    panels_a = [evaluate(*probs(r, name)) for r in runs_a]
    panels_b = [evaluate(*probs(r, name)) for r in runs_b]
    rows = []
    for key, printed, scale in COMPARE_METRICS:
        delta = paired_delta(runs_a, runs_b, probs, key, name, name, n_boot=n_boot, seed=seed, level=level)
        rows.append({"metric": key, "name": printed, "scale": scale, "delta": delta,
                     "a": float(np.mean([p[key] for p in panels_a])), "b": float(np.mean([p[key] for p in panels_b]))})
    return {"a": a, "b": b, "after": name, "seeds": [r["seed"] for r in runs_a],
            "levels": auto_levels(len(pairs), same_runs(pairs)), "rows": rows}


def compare_text(res: dict, label=str, n_boot: int = 1000, width: int | None = 100) -> str:
    """The terminal table of :func:`compare_methods` (its explanation wrapped to ``width``)."""
    a, b = label(res["a"]), label(res["b"])
    after = "" if res["after"] == NONE else f", both after {res['after']}"
    seeds = ", ".join(map(str, res["seeds"]))
    if res.get("levels") == 2:
        how = (f"two-level paired bootstrap ({n_boot} resamples): each resample draws {len(res['seeds'])} of the "
               f"shared seeds {seeds} with replacement and one test-set resample applied to every drawn run, so "
               "the interval covers seed and test-set variation")
    else:
        why = "fewer than 3 shared seeds" if len(res["seeds"]) < MIN_SEEDS else "the same runs on both sides"
        how = (f"paired bootstrap over the test set ({n_boot} resamples, the same for every seed), seed-averaged "
               f"over seeds {seeds}; {why}, so the interval covers test-set noise only, not training randomness")
    head = (f"{a} vs {b}{after}: {how}; 95% basic interval of {a} - {b}; "
            f"{BETTER_MARK} = {a} significantly better, {WORSE_MARK} = significantly worse "
            "(higher Acc is better, lower is better for the rest). Acc and calibration errors x100.")
    rows = []
    for r in res["rows"]:
        dec = 2 if r["scale"] == 100 else 4
        d = r["delta"]
        if d is None:
            cell = "-"
        else:
            cell = fmt_delta(d, r["metric"]) if r["scale"] == 100 else _fmt_raw_delta(d, r["metric"])
        rows.append([r["name"], f"{r['a'] * r['scale']:.{dec}f}", f"{r['b'] * r['scale']:.{dec}f}", cell])
    head = textwrap.fill(head, width) if width else head
    return head + "\n\n" + text_table(Table(["Metric", a, b, f"{a} - {b} [95% CI]"], rows))


def _fmt_raw_delta(d: dict, metric: str) -> str:
    mark = {"better": BETTER_MARK, "worse": WORSE_MARK}.get(direction(d["lo"], d["hi"], metric) or "", "")
    return f"{d['diff']:+.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}]{mark}"
