"""The numbers of the report: per-method summaries of the database rows and the paired ECE differences.

Everything here is computed from the results database rows (and the logits files they point to);
formatting is in :mod:`calibkit.report.tables`.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from calibkit.bench.grid import BENCH_METHODS, REFERENCE
from calibkit.errors import UserError
from calibkit.grouped_bootstrap import paired_grouped_ece_diff
from calibkit.metrics import paired_bootstrap_diff
from calibkit.rundir import read_tensors
from calibkit.seed_bootstrap import MIN_SEEDS, auto_levels, seed_paired_interval


def label(method: str) -> str:
    """The printed name of a grid method (its key when unknown)."""
    return BENCH_METHODS[method].label if method in BENCH_METHODS else method


def _order(methods) -> list[str]:
    known = [m for m in BENCH_METHODS if m in methods]
    return known + sorted(m for m in methods if m not in BENCH_METHODS)


def _run_values(row: dict) -> dict:
    """The flat per-run numbers the tables average: ``before.*``, ``after.*`` and ``extra.*``."""
    metrics = row.get("metrics") or {}
    out = {f"before.{k}": v for k, v in (metrics.get("before") or {}).items()}
    out.update({f"after.{k}": v for k, v in (metrics.get("after") or {}).items()})
    out["after.temperature"] = metrics.get("temperature")
    ood = row.get("ood") or {}
    out["extra.auroc_entropy"] = ood.get("auroc_entropy")
    out["extra.auroc_maxconf"] = ood.get("auroc_maxconf")
    overall = (row.get("robustness") or {}).get("overall") or {}
    out["extra.shift_acc"] = overall.get("acc")
    out["extra.shift_ece"] = overall.get("ece")
    out["extra.train_time_s"] = row.get("train_time_s")
    return out


# The JSON fields of a row the report reads, and what each must be (None: absent, always allowed).
_DICT_FIELDS = ("metrics", "metrics.before", "metrics.after", "ood", "robustness", "robustness.overall")


def row_problem(row: dict) -> str | None:
    """Why the report cannot use a finished row, as ``"field: reason"``; None when it can.

    A field is corrupt when it has the wrong kind (``metrics`` not an object, a metric that is
    text or not finite, a temperature that is not a positive number), when the store could not
    decode it (``row["corrupt"]``: ``{field: reason}``, filled by a store that keeps reading past
    a damaged cell), or when the run's logits file is missing.
    """
    for field_name, why in (row.get("corrupt") or {}).items():
        return f"{field_name}: {why}"
    for name in _DICT_FIELDS:
        value: object = row
        for part in name.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None and not isinstance(value, dict):
            return f"{name}: expected an object, got {value!r:.40}"
    metrics = row.get("metrics") or {}
    for side in ("before", "after"):
        for key, value in (metrics.get(side) or {}).items():
            if isinstance(value, (bool, str)) or (isinstance(value, float) and not math.isfinite(value)):
                return f"metrics.{side}.{key}: expected a finite number, got {value!r:.40}"
    t = metrics.get("temperature")
    if t is not None and (isinstance(t, (bool, str)) or not isinstance(t, (int, float)) or not t > 0
                          or not math.isfinite(t)):
        return f"metrics.temperature: expected a positive number, got {t!r:.40}"
    path = row.get("logits_path")
    if path and not os.path.isfile(path):
        return f"logits_path: {path} not found"
    return None


def usable_rows(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """The rows the report can use, and one line per finished row it leaves out (run key, field, why)."""
    good, skipped = [], []
    for row in rows:
        problem = row_problem(row) if row.get("status") == "done" else None
        if problem:
            skipped.append(f"{row.get('run_key')}: {problem}")
        else:
            good.append(row)
    return good, skipped


def mean_std(xs) -> tuple[float, float, int]:
    """``(mean, std, n)`` with the sample std (``ddof=1``; NaN for a single value)."""
    xs = [float(x) for x in xs]
    return float(np.mean(xs)), float(np.std(xs, ddof=1)) if len(xs) > 1 else float("nan"), len(xs)


def summarize(rows: list[dict]) -> dict:
    """Per method (grid order): seeds, runs, and ``(mean, std, n)`` of every per-run number.

    Only rows with status ``done`` count.
    """
    by_method: dict[str, list[dict]] = {}
    for row in rows:
        if row["status"] == "done":
            by_method.setdefault(row["method"], []).append(row)
    out = {}
    for method in _order(by_method):
        runs = sorted(by_method[method], key=lambda r: r["seed"])
        values = [_run_values(r) for r in runs]
        stats = {}
        for key in sorted({k for v in values for k in v}):
            xs = [v[key] for v in values if isinstance(v.get(key), (int, float))]
            if xs:
                stats[key] = mean_std(xs)
        out[method] = {"seeds": [r["seed"] for r in runs], "stats": stats, "runs": runs}
    return out


def ranking(summary: dict, key: str = "before.ece") -> list[tuple[int, str]]:
    """``(rank, method)`` sorted by the mean of ``key`` (lowest first), ties sharing a rank.

    Methods without the number come last, unranked (rank 0). Equal means keep the grid order.
    """
    scored = [(summary[m]["stats"][key][0], i, m) for i, m in enumerate(summary) if key in summary[m]["stats"]]
    scored.sort()
    out, prev, rank = [], None, 0
    for pos, (value, _, method) in enumerate(scored, start=1):
        if value != prev:
            rank, prev = pos, value
        out.append((rank, method))
    return out + [(0, m) for m in summary if key not in summary[m]["stats"]]


def fmt(stat, scale: float, decimals: int, pm: str = "+-") -> str:
    """``mean +- std`` of a ``(mean, std, n)`` triple, scaled; ``-`` when missing."""
    if stat is None:
        return "-"
    mean, std, n = stat
    text = f"{mean * scale:.{decimals}f}"
    if n > 1 and not math.isnan(std):
        text += f" {pm} {std * scale:.{decimals}f}"
    return text


#: Marks of a paired difference whose interval excludes 0: significantly better / worse.
BETTER_MARK, WORSE_MARK = "*", "!"
#: Metrics where a larger value is better (every other metric is an error: lower is better).
HIGHER_IS_BETTER = frozenset({"acc"})


def direction(lo: float, hi: float, metric: str = "ece") -> str | None:
    """``"better"`` / ``"worse"`` when the interval ``[lo, hi]`` of a difference ``a - b`` excludes
    0, else None: wholly below 0 is better for an error and worse for accuracy, wholly above 0 the
    other way round (an interval touching 0 is not significant)."""
    if lo <= 0.0 <= hi:
        return None
    below = hi < 0.0
    return "better" if below != (metric in HIGHER_IS_BETTER) else "worse"


def fmt_delta(delta: dict | None, metric: str | None = None) -> str:
    """``-3.12 [-3.50, -2.70]*`` (x100) for a difference ``a - b`` and its interval.

    The mark says which way a significant difference goes: :data:`BETTER_MARK` (``*``) when ``a``
    is significantly better than ``b``, :data:`WORSE_MARK` (``!``) when significantly worse. For
    an error (ECE, NLL, ...) better is an interval wholly below 0; for accuracy (``metric="acc"``,
    or the delta's own ``"metric"``) wholly above 0.
    """
    if not delta:
        return "-"
    way = direction(delta["lo"], delta["hi"], metric or delta.get("metric") or "ece")
    mark = {"better": BETTER_MARK, "worse": WORSE_MARK}.get(way or "", "")
    return f"{delta['diff'] * 100:+.2f} [{delta['lo'] * 100:+.2f}, {delta['hi'] * 100:+.2f}]{mark}"


def fmt_interval(ci: dict | None) -> str:
    """``3.12 [2.80, 3.50]`` (x100) for a value and its interval."""
    if not ci:
        return "-"
    return f"{ci['value'] * 100:.2f} [{ci['lo'] * 100:.2f}, {ci['hi'] * 100:.2f}]"


#: The paired columns of :func:`calibkit.report.paired.comparisons` whose deltas :func:`interval_note` reads.
_PAIRED_COLUMNS = ("acc_vs_ce", "vs_ce_ts", "ts_vs_ce_ts")


def interval_note(deltas: dict, comps: dict | None = None) -> str | None:
    """What the report's paired intervals cover, from the ``"seeds"`` / ``"levels"`` of its
    differences (:func:`ece_deltas`, and the paired columns of ``comps``); None when no difference
    carries them.

    A method comparison over at least 3 shared seeds resampled seeds and test samples (levels 2):
    its interval covers seed and test-set variation. One over fewer seeds resampled the test set
    only: it covers test-set noise, and a significant difference speaks about the trained models
    compared, not the methods. A one-level difference over 3 or more seeds compared a method with
    itself after a calibrator (the same runs on both sides).
    """
    found = [(m, d) for m, d in deltas.items() if isinstance(d, dict) and "levels" in d]
    for method, row in (comps or {}).items():
        found += [(method, row[c]) for c in _PAIRED_COLUMNS if isinstance(row.get(c), dict) and "levels" in row[c]]
    if not found:
        return None
    two = {m: d["seeds"] for m, d in found if d["levels"] == 2}
    few = {m: d["seeds"] for m, d in found if d["levels"] == 1 and d["seeds"] < MIN_SEEDS}
    same = any(d["levels"] == 1 and d["seeds"] >= MIN_SEEDS for _, d in found)
    names = ", ".join
    counts = sorted(set(two.values())) or [0]
    over = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
    lines = []
    if two and not few:
        lines.append(f"The paired intervals resample the {over} seeds each comparison shares as well as the test "
                     "samples (a two-level bootstrap), so they cover the variation between training seeds and "
                     "test-set noise.")
    elif few and not two:
        lines.append(f"Fewer than {MIN_SEEDS} seeds are shared, so the paired intervals resample the test set of "
                     "these trained models only: they cover test-set noise, not the variation between training "
                     "seeds, and a significant difference is evidence about these models, not about the methods. "
                     f"With {MIN_SEEDS} or more shared seeds the seeds are resampled too.")
    elif few and two:
        lines.append(f"The paired intervals of {names(label(m) for m in two)} ({over} shared seeds) resample the "
                     "seeds as well as the test samples and cover seed and test-set variation; those of "
                     f"{names(label(m) for m in few)} (fewer than {MIN_SEEDS} shared seeds) cover test-set noise "
                     "only, so a significant difference there is evidence about the trained models compared, not "
                     "about the methods.")
    if same:
        lines.append("A method compared with itself after a calibrator (the same runs on both sides) resamples "
                     "the test set only.")
    return " ".join(lines) or None


def load_probs(row: dict) -> tuple[np.ndarray, np.ndarray, float]:
    """Test probabilities ``(N, K)``, labels ``(N,)`` and the fitted temperature of a finished run."""
    path = row.get("logits_path")
    if not path:
        raise UserError(f"run {row['run_key']} has no logits_path in the database")
    tensors = read_tensors(path)
    logits = tensors["test_logits"].double()
    return (logits.softmax(1).numpy(), tensors["test_labels"].long().numpy(),
            float((row.get("metrics") or {}).get("temperature") or 1.0))


def load_groups(row: dict) -> np.ndarray | None:
    """The test image of every stored test pixel of a segmentation run (None for classification)."""
    tensors = read_tensors(row["logits_path"])
    return tensors["test_image"].numpy() if "test_image" in tensors else None


def same_runs(pairs) -> bool:
    """Both sides of every ``(run_a, run_b)`` pair are one run (the same object or run key): a
    comparison of post-hoc calibrators on the same models, which keeps the one-level bootstrap."""
    return all(a is b or (a.get("run_key") is not None and a.get("run_key") == b.get("run_key")) for a, b in pairs)


def paired_ece_delta(runs_a: list[dict], runs_b: list[dict], n_boot: int = 1000, seed: int = 0,
                     level: float = 0.95, probs=None) -> dict | None:
    """Paired bootstrap of the seed-averaged test ECE of ``runs_a`` minus that of ``runs_b``.

    The runs are paired by seed (seeds present on one side only are left out). Every resample
    draws one set of test indices, applied to both runs of a seed; all seeds use the same
    bootstrap seed, so they draw the same index sets (same generator, same N) and averaging their
    resampled differences gives the resampled seed-averaged difference. The interval is the
    **basic** bootstrap interval around it (the default of
    :func:`~calibkit.metrics.paired_bootstrap_diff`; it corrects the bias of a difference of two
    binned ECEs). Segmentation runs (``test_image`` in their logits file) are compared on their
    stored test pixel samples with an **image-level** paired bootstrap
    (:func:`calibkit.grouped_bootstrap.paired_grouped_ece_diff`): pixels of one image are not
    independent, so whole images are resampled.

    With at least 3 shared seeds (and different runs on the two sides) every resample also draws
    the seeds with replacement: the two-level bootstrap of :mod:`calibkit.seed_bootstrap`, whose
    interval covers the variation between training seeds as well as test-set noise; with fewer
    seeds the interval covers test-set noise only (a statement about these trained models).

    Args:
        runs_a, runs_b: database rows (``Store.runs``) of two methods.
        probs: ``row -> (probs, labels, temperature)`` (default :func:`load_probs`; a caching
            function when many pairs share runs).

    Returns:
        ``{"diff", "lo", "hi", "significant", "direction", "seeds", "levels", "identical"}``
        (``direction``: ``"better"`` when the interval lies wholly below 0, ``"worse"`` wholly
        above, else None; ``seeds``: shared seeds; ``levels``: 2 when seeds were resampled too,
        else 1; ``identical``: the test probabilities are equal in every shared seed), or None
        when no seed is shared.

    Raises:
        ValueError: two runs of one seed were tested on different test sets.
    """
    probs = probs or load_probs
    by_seed = {r["seed"]: r for r in runs_b}
    pairs = [(r, by_seed[r["seed"]]) for r in runs_a if r["seed"] in by_seed]
    if not pairs:
        return None
    diffs, estimates, identical = [], [], True
    for run, other in pairs:
        pa, la, _ = probs(run)
        pb, lb, _ = probs(other)
        if not np.array_equal(la, lb):
            raise UserError(f"{run['run_key']} and {other['run_key']} were tested on different test sets")
        identical = identical and np.array_equal(pa, pb)
        groups = load_groups(run)
        if groups is not None:  # pixels: resample whole test images (calibkit.grouped_bootstrap)
            g = paired_grouped_ece_diff(torch.from_numpy(pa), torch.from_numpy(pb), torch.from_numpy(la),
                                        groups, n_resamples=n_boot, seed=seed)
            diffs.append(g["samples"])
            estimates.append(g["estimate"])
            continue
        res = paired_bootstrap_diff(torch.from_numpy(pa), torch.from_numpy(pb), torch.from_numpy(la), "ece",
                                    n_resamples=n_boot, seed=seed, level=level)
        diffs.append(res.samples)
        estimates.append(res.estimate)
    ci = seed_paired_interval(estimates, torch.stack(diffs), level, seed, auto_levels(len(pairs), same_runs(pairs)))
    lo, hi = ci["lo"], ci["hi"]
    return {"diff": ci["estimate"], "lo": lo, "hi": hi, "significant": not (lo <= 0.0 <= hi),
            "direction": direction(lo, hi, "ece"), "seeds": len(pairs), "levels": ci["levels"],
            "identical": identical}


def ece_deltas(summary: dict, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict:
    """:func:`paired_ece_delta` of each method against CE (the report's "dECE vs CE" column).

    Returns:
        ``{method: {"diff", "lo", "hi", "significant", "direction", "seeds", "levels", "identical"}}``.
        Methods sharing no seed with CE, and CE itself, are left out.
    """
    if REFERENCE not in summary:
        return {}
    cache: dict[str, tuple] = {}

    def probs(row):
        if row["run_key"] not in cache:
            cache[row["run_key"]] = load_probs(row)
        return cache[row["run_key"]]

    out = {}
    for method, entry in summary.items():
        if method == REFERENCE:
            continue
        delta = paired_ece_delta(entry["runs"], summary[REFERENCE]["runs"], n_boot, seed, level, probs)
        if delta is not None:
            out[method] = delta
    return out
