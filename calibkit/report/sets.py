"""The report's selective-prediction and conformal-set numbers: does a method (or a calibrator)
help a user who abstains, or who predicts sets?

**Selective prediction.** AURC, AUGRC (:mod:`calibkit.functional.selective`, confidence = the
top-label probability) of every method's test probabilities before any calibrator (``none``) and
after temperature scaling, fitted on the run's validation logits as everywhere in the report.

**Conformal sets.** Split conformal APS sets (:class:`calibkit.conformal.SplitConformal`,
randomised, at ``alpha``, default 0.1) need a calibration split that neither trained the model nor
fitted the calibrator, and that is not the test split. The report therefore splits each run's
validation rows in two halves by one seeded permutation (:func:`split_validation`; the same for every
method and calibrator of a run with that many rows): the calibrator is fitted on the first half,
the conformal quantile on the second half (after that calibrator), and the sets are scored on the
test rows. So the coverage guarantee holds exactly (given the first half, the second half and the
test rows are exchangeable), at the price of a calibrator fitted on half the rows: these
calibrators differ slightly from those of the other tables, fitted on every validation row.
Columns: ``none``, temperature scaling, and each method's own calibrator chosen on validation
(:mod:`calibkit.report.verdict`), when it is neither.

**Intervals.** Each method after temperature scaling against CE after temperature scaling
(CE + TS), paired by seed: AURC and the mean set size, from the same test resamples as the other
intervals of the report (:func:`calibkit.bootstrap.count_draws`), seed-averaged, two levels from 3
shared seeds on (:mod:`calibkit.seed_bootstrap`), basic interval.

Segmentation runs are left out of this section (their rows are pixels of a few images: the
per-row resampling would not be the image-level bootstrap their other intervals use).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from calibkit.bench.grid import REFERENCE
from calibkit.calibrators.crossfit import SelectionRule, cross_fit_predictions
from calibkit.calibrators.io import calibrator_class
from calibkit.calibrators.stack import NAME as STACK
from calibkit.calibrators.stack import PARTS as STACK_PARTS
from calibkit.conformal import SplitConformal, TooFewCalibrationRows
from calibkit.errors import UserError
from calibkit.functional.selective import augrc, aurc
from calibkit.report.calibrated import FIT_AND_TEST, NONE, CalibratedProbs, cache_file, calibrator_names
from calibkit.report.data import BETTER_MARK, WORSE_MARK, direction, label, same_runs
from calibkit.report.tables import Table, text_table
from calibkit.resampling import count_draws
from calibkit.rundir import read_tensors, write_tensors
from calibkit.seed_bootstrap import auto_levels, seed_paired_interval
from calibkit.selective_bootstrap import SelectiveRows, resampled_selective

ALPHA = 0.1  # the default miscoverage of the conformal sets
SCORE = "aps"  # the conformal score of the report's sets
TS = "temperature"


def split_validation(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(fit_rows, conformal_rows)``: a seeded permutation of ``range(n)`` cut in two halves (the
    second gets the odd row). The permutation is ``numpy.random.default_rng([seed, n])``'s."""
    if n < 4:
        raise UserError(f"{n} validation rows: too few to split between a calibrator and a conformal quantile")
    perm = np.random.default_rng([seed, n]).permutation(n)
    return np.sort(perm[: n // 2]), np.sort(perm[n // 2:])


def two_columns(p: torch.Tensor) -> torch.Tensor:
    """``(N, K)`` probabilities as they are; binary ``(N,)`` positive-class probabilities as ``(1 - p, p)``."""
    return torch.stack([1 - p, p], 1) if p.dim() == 1 else p


def _rows_of(logits: torch.Tensor) -> torch.Tensor:
    """Uncalibrated probabilities: the softmax of ``(N, K)`` logits, the sigmoid of binary ``(N,)`` ones."""
    return two_columns(torch.sigmoid(logits)) if logits.dim() == 1 else logits.softmax(1)


#: Folds of the stack's cross-fitting when it is refitted on half the validation rows for the sets.
STACK_SET_FOLDS = 2


def _fit_half(calibrator: str, x: torch.Tensor, y: torch.Tensor, jobs: int, stack_parts=None):
    """``calibrator`` fitted on the rows ``x, y`` (one half of the validation rows). The stack is
    built as a selection builds it, on these rows alone: its components cross-fitted in ``jobs``
    processes (:func:`calibkit.calibrators.crossfit.cross_fit_predictions`), then mixed; over
    :data:`STACK_SET_FOLDS` folds, not the selection's five (calibkit's choice: the half refit is
    the sets' stand-in for the chosen calibrator, and two folds halve its cost). ``stack_parts``:
    the components of the stack to refit (those of the chosen one; None: the default ones)."""
    if calibrator != STACK:
        return calibrator_class(calibrator)().fit(x, y)
    names = [n for n in (stack_parts or STACK_PARTS) if n != NONE] + [STACK]
    _, fitted, _, _ = cross_fit_predictions(x, y, names, SelectionRule(n_folds=STACK_SET_FOLDS), jobs=jobs)
    if STACK not in fitted:
        raise UserError("the stack could not be built on half the validation rows (fewer than two components fitted)")
    return fitted[STACK]


def conformal_rows(val_logits, val_labels, test_logits, test_labels, calibrator: str = NONE,
                   alpha: float = ALPHA, seed: int = 0, jobs: int = 1, stack_parts=None) -> dict:
    """``{"covered": (N,) bool, "size": (N,) int64}`` on the test rows: APS sets at ``alpha``, the
    calibrator (``none``: the softmax) fitted on the first half of the validation rows and the
    conformal quantile on the second (module docstring). Logits ``(N, K)``, or binary ``(N,)``
    positive-class logits (sets of the two classes). ``jobs``, ``stack_parts``: the processes that fit
    the stack's components, and which components (:func:`_fit_half`)."""
    val_logits, test_logits = torch.as_tensor(val_logits).double(), torch.as_tensor(test_logits).double()
    val_labels, test_labels = torch.as_tensor(val_labels).long(), torch.as_tensor(test_labels).long()
    fit_rows, cal_rows = (torch.as_tensor(i) for i in split_validation(len(val_labels), seed))
    if calibrator == NONE:
        val_p, test_p = (_rows_of(x) for x in (val_logits[cal_rows], test_logits))
    else:
        cal = _fit_half(calibrator, val_logits[fit_rows], val_labels[fit_rows], jobs, stack_parts)
        val_p, test_p = (two_columns(torch.as_tensor(cal.predict_proba(x)).double())
                         for x in (val_logits[cal_rows], test_logits))
    sets = SplitConformal(SCORE, alpha=alpha, seed=seed).fit(val_p, val_labels[cal_rows]).predict_set(test_p)
    return {"covered": sets[torch.arange(len(test_labels)), test_labels], "size": sets.sum(1)}


@dataclass
class SetRows:
    """Per-row test quantities of runs, computed once per report and cached on disk.

    Args:
        probs: the report's calibrated probabilities (its saved logits and the ``none`` / TS test probabilities).
        alpha: miscoverage of the conformal sets.
        cache_dir: where conformal rows are kept between reports (None: memory only).
    """

    probs: CalibratedProbs
    alpha: float = ALPHA
    cache_dir: Path | None = None
    failures: dict = field(default_factory=dict)  # (method, calibrator) -> why it has no sets
    _mem: dict = field(default_factory=dict)

    def conformal(self, row: dict, calibrator: str) -> dict:
        key = ("sets", row["run_key"], calibrator)
        if key not in self._mem:
            self._mem[key] = self._cached(row, calibrator)
        return self._mem[key]

    def _cached(self, row: dict, calibrator: str) -> dict:
        path = self._cache_path(row, calibrator)
        if path is not None and path.is_file():
            try:
                t = read_tensors(path)
                return {"covered": t["covered"].bool(), "size": t["size"].long()}
            except (ValueError, KeyError):
                pass  # damaged: recomputed
        t = self.probs.logits(row)
        out = conformal_rows(t["val_logits"], t["val_labels"], t["test_logits"], t["test_labels"], calibrator,
                             self.alpha)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_tensors(path, {"covered": out["covered"].to(torch.uint8), "size": out["size"]})
        return out

    def _cache_path(self, row: dict, calibrator: str) -> Path | None:
        """Keyed by the content of the run's saved tensors, as :mod:`calibkit.report.calibrated`'s cache."""
        if self.cache_dir is None:
            return None

        what = repr(calibrator_class(calibrator)()) if calibrator != NONE else NONE
        ident = f"{self.probs.digest(row, FIT_AND_TEST + ('test_labels',))}|{what}|{SCORE}|{self.alpha!r}"
        return cache_file(self.cache_dir, row, calibrator, ident, "safetensors")

    def selective(self, row: dict, calibrator: str):
        """:class:`calibkit.selective_bootstrap.SelectiveRows` of the run's test probabilities after ``calibrator``."""
        key = ("sel", row["run_key"], calibrator)
        if key not in self._mem:
            p, labels = self.probs(row, calibrator)
            self._mem[key] = SelectiveRows(p.max(1).values, (p.argmax(1) != labels).double())
        return self._mem[key]

    def aurc_samples(self, row: dict, calibrator: str, n_boot: int, seed: int) -> torch.Tensor:
        """``(n_boot,)`` AURC of the run's test rows after ``calibrator`` on the report's resamples."""
        key = ("aurc*", row["run_key"], calibrator, n_boot, seed)
        if key not in self._mem:
            self._mem[key] = resampled_selective([self.selective(row, calibrator)], n_boot, seed, ("aurc",))["aurc"][0]
        return self._mem[key]


def _mean(values) -> float:
    return float(np.mean([float(v) for v in values]))


def _paired(pairs, estimate, samples, n_boot, seed, level) -> dict:
    """Seed-averaged paired interval of ``estimate(a) - estimate(b)`` over the ``(a, b)`` run pairs."""
    est = [estimate(a) - estimate(b) for a, b in pairs]
    res = seed_paired_interval(est, torch.stack([samples(a) - samples(b) for a, b in pairs]), level, seed,
                               auto_levels(len(pairs), same_runs(pairs)))
    return {"diff": res["estimate"], "lo": res["lo"], "hi": res["hi"], "levels": res["levels"], "seeds": len(pairs)}


def _size_samples(sets: SetRows, row: dict, calibrator: str, n_boot: int, seed: int) -> torch.Tensor:
    """``(n_boot,)`` mean set size of the run's test rows on the report's resamples (computed once
    per run: CE's runs are the reference of every method)."""
    key = ("size*", row["run_key"], calibrator, n_boot, seed)
    if key not in sets._mem:
        size = sets.conformal(row, calibrator)["size"].double()
        sets._mem[key] = torch.cat([W @ size / len(size) for _, W in count_draws(len(size), n_boot, seed)])
    return sets._mem[key]


def method_sets(summary: dict, sets: SetRows, selections: dict | None = None, n_boot: int = 1000, seed: int = 0,
                level: float = 0.95, conformal: bool = True) -> dict:
    """Per method (segmentation methods left out): ``{"chosen", "aurc", "augrc", "coverage", "size",
    "d_aurc", "d_size"}``. ``aurc``, ``augrc``: ``{calibrator: seed mean}`` for ``none`` and TS;
    ``coverage``, ``size``: the same for every calibrator of the report (one that cannot be fitted
    on half a run's validation rows is left out, its error in ``sets.failures``); ``d_aurc``, ``d_size``: the method
    after TS minus CE + TS, ``{"diff", "lo", "hi", "levels", "seeds"}`` (None for CE itself, or
    without CE runs sharing a seed). ``conformal=False``: the selective numbers only (``coverage`` and
    ``size`` empty, ``d_size`` None), for validation splits too small for a conformal threshold."""
    ref = summary.get(REFERENCE, {}).get("runs") or []
    out = {}
    for method, entry in summary.items():
        runs = entry["runs"]
        if any(sets.probs.groups(r) is not None for r in runs):
            continue
        chosen = selections[method].chosen if selections and method in selections else None
        cell: dict = {"chosen": chosen, "aurc": {}, "augrc": {}, "coverage": {}, "size": {}, "d_aurc": None,
                      "d_size": None}
        for c in (NONE, TS):
            cell["aurc"][c] = _mean(aurc(*sets.probs(r, c)) for r in runs)
            cell["augrc"][c] = _mean(augrc(*sets.probs(r, c)) for r in runs)
        for c in sets.probs.names if conformal else ():
            try:
                rows = [sets.conformal(r, c) for r in runs]
            except (ValueError, RuntimeError) as exc:  # this calibrator cannot be fitted on half the rows
                if c in (NONE, TS):
                    raise
                sets.failures[(method, c)] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                continue
            cell["coverage"][c] = _mean(r["covered"].double().mean() for r in rows)
            cell["size"][c] = _mean(r["size"].double().mean() for r in rows)
        by_seed = {r["seed"]: r for r in ref}
        pairs = [(r, by_seed[r["seed"]]) for r in runs if r["seed"] in by_seed]
        if method != REFERENCE and pairs:
            for a, b in pairs:
                if not torch.equal(sets.probs(a, NONE)[1], sets.probs(b, NONE)[1]):
                    raise UserError(f"{a['run_key']} and {b['run_key']} were tested on different test sets")
            cell["d_aurc"] = _paired(pairs, lambda r: float(aurc(*sets.probs(r, TS))),
                                     lambda r: sets.aurc_samples(r, TS, n_boot, seed), n_boot, seed, level)
            if conformal:
                cell["d_size"] = _paired(pairs, lambda r: float(sets.conformal(r, TS)["size"].double().mean()),
                                         lambda r: _size_samples(sets, r, TS, n_boot, seed), n_boot, seed, level)
        out[method] = cell
    return out


def method_sets_or_selective(summary: dict, sets: SetRows, selections: dict | None, n_boot: int):
    """``(cells, None)`` of :func:`method_sets`; ``(its selective cells, why)`` when the validation
    half is below the conformal minimum (:class:`calibkit.conformal.TooFewCalibrationRows`)."""
    try:
        return method_sets(summary, sets, selections, n_boot=n_boot), None
    except TooFewCalibrationRows as exc:
        return method_sets(summary, sets, selections, n_boot=n_boot, conformal=False), str(exc)


def _fmt_d(d: dict | None, scale: float, digits: int) -> str:
    if not d:
        return "-"
    mark = {"better": BETTER_MARK, "worse": WORSE_MARK}.get(direction(d["lo"], d["hi"], "ece") or "", "")
    return f"{d['diff'] * scale:+.{digits}f} [{d['lo'] * scale:+.{digits}f}, {d['hi'] * scale:+.{digits}f}]{mark}"


def selective_table(cells: dict):
    """Methods x (AURC, AURC after TS, its difference from CE + TS, AUGRC after TS), x100."""
    rows = [[label(m), f"{c['aurc'][NONE] * 100:.2f}", f"{c['aurc'][TS] * 100:.2f}", _fmt_d(c["d_aurc"], 100, 2),
             f"{c['augrc'][TS] * 100:.2f}"] for m, c in cells.items()]
    return Table(["Method", "AURC", "AURC (TS)", "dAURC (TS) vs CE+TS", "AUGRC (TS)"], rows)


def sets_table(cells: dict, alpha: float):
    """Methods x (coverage %, mean set size) before and after TS and the method's own calibrator."""
    rows = []
    for m, c in cells.items():
        own = c["chosen"]
        own_cells = (["= TS" if own == TS else own or "-", "", ""] if own in (None, NONE, TS) else
                     [own, f"{c['coverage'][own] * 100:.1f}", f"{c['size'][own]:.2f}"])
        if own == NONE:
            own_cells = [NONE, "", ""]
        rows.append([label(m), f"{c['coverage'][NONE] * 100:.1f}", f"{c['size'][NONE]:.2f}",
                     f"{c['coverage'][TS] * 100:.1f}", f"{c['size'][TS]:.2f}", _fmt_d(c["d_size"], 1, 2), *own_cells])
    target = f"{(1 - alpha) * 100:g}"
    return Table(["Method", f"cov % ({target})", "size", "cov % (TS)", "size (TS)", "dsize (TS) vs CE+TS",
                  "own calibrator", "cov %", "size"], rows)


def sets_grid_table(cells: dict, names=None):
    """Methods x calibrators (``names``, ``"none"`` first; default :func:`calibrator_names`): mean APS
    set size and, in parentheses, coverage %; each method's own calibrator in italics
    (``row_best``), ``-`` where a calibrator could not be fitted."""
    names = calibrator_names() if names is None else list(names)
    rows, marks = [], set()
    for i, (m, c) in enumerate(cells.items()):
        rows.append([label(m)] + [f"{c['size'][n]:.2f} ({c['coverage'][n] * 100:.1f})" if n in c["size"] else "-"
                                  for n in names])
        if c["chosen"] in names:
            marks.add((i, names.index(c["chosen"]) + 1))
    return Table(["Method (set size (cov %))"] + names, rows, set(), row_best=marks)


def section_text(n_seeds: int, n_boot: int, alpha: float) -> tuple[str, str]:
    """The section's explanation (report) and its short form (terminal)."""
    target = f"{(1 - alpha) * 100:g}%"
    text = (f"Test set, mean over {n_seeds} seed(s). **Selective prediction**: answer on the most confident "
            "rows, abstain on the rest (confidence = the top-label probability). AURC = the mean error rate among "
            "the accepted rows over all coverage levels, AUGRC = the same for the share of rows accepted and "
            "wrong (Traub et al. 2024); x100, lower is better; ties averaged over their orderings. "
            f"**Conformal sets**: split conformal APS sets (randomised) at alpha = {alpha:g}, which contain the "
            f"true class with probability at least {target}. Each run's validation rows are cut in two halves by "
            "one seeded permutation: the calibrator is fitted on the first, the conformal threshold on the second "
            "(after the calibrator), and the sets are scored on the test rows, so the guarantee holds exactly; "
            "`cov %` = the share of test rows whose set holds the true class, `size` = the mean number of classes "
            "per set (smaller sets at the same coverage are more useful). `own calibrator` = the method's "
            "calibrator chosen on validation (Methods x post-hoc calibrators). "
            f"`d... (TS) vs CE+TS` = the method after temperature scaling minus CE after temperature scaling, paired "
            f"bootstrap ({n_boot} resamples), 95% basic interval, seeds resampled too from 3 shared seeds on; "
            f"`{BETTER_MARK}` = significantly lower (better), `{WORSE_MARK}` = significantly higher. The last table: "
            "the mean set size (coverage %) after every calibrator, each fitted on the first half, for reference "
            "(italics: the method's own calibrator). Segmentation runs are not in this section.")
    short = (f"Test, mean over {n_seeds} seed(s). AURC/AUGRC x100 (selective prediction, lower is better). "
             f"APS conformal sets at alpha = {alpha:g} (calibrator on one half of validation, threshold on the "
             f"other): coverage % (target {target}) and mean set size. d... vs CE+TS: paired bootstrap, 95% "
             f"interval, {BETTER_MARK} = significantly lower, {WORSE_MARK} = higher. Last table: set size (cov %) "
             "after every calibrator, for reference.")
    return text, short


def calibrator_sets(val: tuple[torch.Tensor, torch.Tensor], test: tuple[torch.Tensor, torch.Tensor], test_probs: dict,
                    alpha: float = ALPHA, n_boot: int = 1000, seed: int = 0, level: float = 0.95,
                    jobs: int = 1, stack_parts=None) -> dict:
    """``calibkit calibrate``'s numbers: for each calibrator of ``test_probs`` (``{name: test
    probabilities after it}``, ``none`` included), AURC and AUGRC of those probabilities, and the
    coverage and mean size of APS sets (the calibrator refitted on half the validation rows, the
    threshold on the other half, :func:`conformal_rows`), with paired intervals of AURC and set size
    against temperature scaling (one level: one model). ``val``, ``test``: ``(logits, labels)``.

    ``jobs``, ``stack_parts``: as :func:`conformal_rows` (the stack's refit).

    Returns ``{name: {"aurc", "augrc", "coverage", "size", "d_aurc", "d_size"}}`` (the differences
    None for TS itself, or when TS is not among ``test_probs``)."""
    labels = torch.as_tensor(test[1]).long()
    stats = {}
    for name, p in test_probs.items():
        p = two_columns(torch.as_tensor(p).double())
        st: dict = {"aurc": float(aurc(p, labels)), "augrc": float(augrc(p, labels)), "coverage": None, "size": None,
                    "sets_error": None, "_sel": SelectiveRows(p.max(1).values, (p.argmax(1) != labels).double())}
        try:  # a calibrator that cannot be fitted on half the rows has no sets; the rest is reported
            sets = conformal_rows(*val, *test, name, alpha, seed, jobs, stack_parts)
            st |= {"coverage": float(sets["covered"].double().mean()), "size": float(sets["size"].double().mean()),
                   "_size": sets["size"].double()}
        except (ValueError, RuntimeError) as exc:
            st["sets_error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        stats[name] = st
    samples: dict = {name: {"aurc": [], "size": []} for name in stats}
    for _, W in count_draws(len(labels), n_boot, seed):
        for name, st in stats.items():
            samples[name]["aurc"].append(st["_sel"].aurc(W))
            if "_size" in st:
                samples[name]["size"].append(W @ st["_size"] / len(labels))
    out = {}
    for name, st in stats.items():
        out[name] = {k: st[k] for k in ("aurc", "augrc", "coverage", "size", "sets_error")} | {"d_aurc": None,
                                                                                               "d_size": None}
        if TS in stats and name != TS:
            for m in ("aurc", "size"):
                if not samples[name][m] or not samples[TS][m]:
                    continue
                d = torch.cat(samples[name][m]) - torch.cat(samples[TS][m])
                res = seed_paired_interval([st[m] - stats[TS][m]], d.view(1, -1), level, seed, levels=1)
                out[name][f"d_{m}"] = {"diff": res["estimate"], "lo": res["lo"], "hi": res["hi"]}
    return out


def calibrator_sets_table(res: dict, alpha: float) -> str:
    """The terminal table of :func:`calibrator_sets`."""
    target = f"{(1 - alpha) * 100:g}"
    rows = [[name, f"{r['aurc'] * 100:.2f}", _fmt_d(r["d_aurc"], 100, 2), f"{r['augrc'] * 100:.2f}",
             "-" if r["coverage"] is None else f"{r['coverage'] * 100:.1f}",
             "-" if r["size"] is None else f"{r['size']:.2f}", _fmt_d(r["d_size"], 1, 2)] for name, r in res.items()]
    failed = "; ".join(f"{name}: {r['sets_error']}" for name, r in res.items() if r.get("sets_error"))
    head = (f"Selective prediction and conformal sets (test, for reference): AURC/AUGRC x100 (lower is better); "
            f"APS sets at alpha = {alpha:g}, each calibrator refitted on one half of the validation rows and the "
            f"threshold on the other: coverage % (target {target}) and mean set size; d... vs TS = paired "
            "bootstrap, 95% interval, * = significantly lower, ! = higher.")
    if failed:
        head += f" No sets (shown as -): {failed}."
    return head + "\n\n" + text_table(Table(["calibrator", "AURC", "dAURC vs TS", "AUGRC", "cov %", "size",
                                               "dsize vs TS"], rows))
