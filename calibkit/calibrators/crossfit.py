"""Cross-fitted scores of post-hoc calibrators on the validation split, and the rule's settings.

:func:`cross_fit` scores every calibrator **out of fold** (the protocol is described in
:mod:`calibkit.calibrators.selection`, which chooses from these scores and re-exports every name
here): the validation rows are cut into parts by a seeded permutation (:func:`folds`), each part
is predicted by the calibrator fitted on the others, and the pooled held-out predictions are scored
(:class:`CrossFitScore`), with resampled values of the rule's metric for the significance step.
:func:`mean_scores` averages the scores of several runs (the seeds of one method).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from calibkit import functional as F
from calibkit.bootstrap import bootstrap_cis
from calibkit.calibrators import pool
from calibkit.calibrators.evidence import NOT_FITTED, unestimable
from calibkit.calibrators.folds import folds
from calibkit.calibrators.folds import out_of_fold as _out_of_fold
from calibkit.calibrators.folds import two_column as _two_column
from calibkit.calibrators.folds import uncalibrated as _uncalibrated
from calibkit.calibrators.registry import CALIBRATORS, default_names
from calibkit.calibrators.scaling import DirichletCalibration, MatrixScaling
from calibkit.calibrators.stack import NAME as STACK
from calibkit.calibrators.stack import PARTS as STACK_PARTS
from calibkit.calibrators.stack import StackedCalibration, cross_fitted_mixture
from calibkit.errors import UserError

NONE = "none"  # the uncalibrated model, always a candidate
SELECT_BY = ("ece", "nll", "brier")
#: The calibrator each rule keeps unless significantly beaten (``SelectionRule.default`` left empty): the
#: stack of the smooth maps under NLL (:mod:`calibkit.calibrators.stack`; the lowest test-NLL regret on the
#: real-outputs test bed, ``docs/calibrators.md``), SMS under the Brier score, temperature scaling under the
#: ECE rule (whose NLL guard is the default's NLL).
ANCHOR = {"nll": STACK, "brier": "sms", "ece": "temperature"}
#: The default's stand-in when it is not among the candidates or fails a guard; then ``"none"``.
FALLBACK = "temperature"
#: Stand-ins tried before :data:`FALLBACK`, by default: where the stack is not among the candidates
#: (a report that fits some calibrators only) or fails a guard, SMS, then temperature scaling.
STAND_INS = {STACK: ("sms",)}


def unfittable(name: str, n_rows: int, k: int) -> str | None:
    """Why calibrator ``name`` is not fitted on ``n_rows`` validation rows of ``k`` classes, or ``None``.

    A map with a K x K weight (matrix scaling, Dirichlet calibration: K^2 + K parameters) is refused
    when there are fewer rows than classes: some classes have no validation row, the map has more
    than K parameters per row, and its fit costs grow with K^2 (Dirichlet calibration at K = 1000
    takes over a minute whatever the rows).

    Matrix scaling, which is unregularised, is also refused with fewer rows than its ``K^2 + K``
    parameters (at K = 100: 10,100). calibkit's rule of thumb, not a theorem: on the three CIFAR-100
    models of the real-outputs test bed (5,000 validation rows, two splits each) every matrix fit
    ran to its 100-iteration cap and its test NLL was above temperature scaling's on all six splits
    (1.64-3.94 against 0.86-3.81), never the best in hindsight; its fits were a fifth of
    ``calibrate``'s time there (docs/calibrators.md, "Speed"). Dirichlet calibration, the
    regularised K x K map, stays.
    """
    cls = CALIBRATORS[name]
    if n_rows < k and issubclass(cls, (MatrixScaling, DirichletCalibration)):
        return (f"{NOT_FITTED}{n_rows} validation rows for K = {k} classes; its K x K map ({k * k + k} parameters) "
                "cannot be fitted from fewer rows than classes")
    if n_rows < k * k + k and issubclass(cls, MatrixScaling):
        return (f"{NOT_FITTED}{n_rows} validation rows for its {k * k + k} unregularised parameters (K = {k}): "
                "fewer rows than parameters (calibkit's rule; dirichlet is the regularised K x K map)")
    return None


@dataclass(frozen=True)
class SelectionRule:
    """How the calibrator is chosen (:mod:`calibkit.calibrators.selection`).

    Attributes:
        select_by: ``"ece"`` (guarded by accuracy and NLL), ``"nll"`` or ``"brier"`` (guarded by accuracy).
        acc_tolerance: largest accepted drop of cross-fitted accuracy below the uncalibrated one
            (0.005 = 0.5 points).
        n_folds: cross-fitting folds (>= 2).
        n_bins: equal-width bins of the ECE.
        seed: seed of the fold permutation and of the validation bootstrap.
        default: the calibrator kept unless significantly beaten; empty (the default) or ``None``:
            the rule's own (:data:`ANCHOR`: SMS under NLL and Brier, temperature scaling under
            ECE); :attr:`anchor` is the one in force.
            When it is not among the candidates or fails a guard, temperature scaling
            (:data:`FALLBACK`) stands in, and ``"none"`` when that fails too.
        level: level of the paired validation interval of the significance step.
        n_boot: resamples of that interval.
        significance: whether a challenger must beat the default significantly (the paired
            interval wholly below 0); ``False``: the lowest cross-fitted metric among the eligible
            candidates wins, the default on ties. ``None`` (the default): every rule has the step
            (:attr:`uses_significance`; the measured reasons are in ``docs/calibrators.md``).
    """

    select_by: str = "nll"
    acc_tolerance: float = 0.005
    n_folds: int = 5
    n_bins: int = 15
    seed: int = 0
    default: str = ""  # "" (or None): ANCHOR[select_by], read through the property anchor
    level: float = 0.95
    n_boot: int = 1000
    significance: bool | None = None

    def __post_init__(self):
        if self.select_by not in SELECT_BY:
            raise UserError(f"select_by must be one of {', '.join(SELECT_BY)}, got {self.select_by!r}")
        if isinstance(self.n_folds, bool) or not isinstance(self.n_folds, int) or self.n_folds < 2:
            raise UserError(f"n_folds must be an integer >= 2, got {self.n_folds!r}")
        if not (isinstance(self.acc_tolerance, (int, float)) and 0 <= self.acc_tolerance <= 1):
            raise UserError(f"acc_tolerance must be a number in [0, 1], got {self.acc_tolerance!r}")
        if isinstance(self.n_bins, bool) or not isinstance(self.n_bins, int) or self.n_bins < 1:
            raise UserError(f"n_bins must be an integer >= 1, got {self.n_bins!r}")
        if isinstance(self.n_boot, bool) or not isinstance(self.n_boot, int) or self.n_boot < 10:
            raise UserError(f"n_boot must be an integer >= 10, got {self.n_boot!r}")
        if not (isinstance(self.level, float) and 0.5 <= self.level < 1):
            raise UserError(f"level must be a float in [0.5, 1), got {self.level!r}")
        if self.significance is not None and not isinstance(self.significance, bool):
            raise UserError(f"significance must be True, False or None (the rule's own), got {self.significance!r}")
        if self.default is None:
            object.__setattr__(self, "default", "")
        elif not isinstance(self.default, str):
            raise UserError(f"default must be a calibrator name, got {self.default!r}")

    @property
    def anchor(self) -> str:
        """The calibrator kept unless significantly beaten: ``default``, or when that is empty the
        rule's own (:data:`ANCHOR`). Resolved at each read, not stored, so that
        ``dataclasses.replace(rule, select_by="ece")`` of a rule with the empty default gets the ECE
        rule's anchor (temperature scaling), as ``SelectionRule(select_by="ece")`` does."""
        return self.default or ANCHOR[self.select_by]

    def anchor_text(self) -> str:
        """:attr:`anchor` with its stand-in, as the rule's sentences print it ("none" has none:
        :func:`calibkit.calibrators.selection._default`)."""
        if self.anchor in (FALLBACK, NONE):
            return self.anchor
        chain = " then ".join((*STAND_INS.get(self.anchor, ()), f"{FALLBACK} scaling"))
        return f"{self.anchor} ({chain} where {self.anchor} is not fitted or fails a guard)"

    @property
    def uses_significance(self) -> bool:
        """Whether the significance step applies: ``significance``, or for ``None`` every rule.

        Under the proper scores the default is SMS, and on the real-outputs test bed keeping it
        unless a challenger's cross-fitted score is significantly lower had the lowest test-NLL
        regret of the rules measured (0.0007 against 0.0019 without the step;
        ``benchmarks/selection_regret.py``, ``docs/calibrators.md``): the lowest cross-fitted NLL
        alone moved to maps whose small validation edge did not hold on test. The ECE rule keeps the
        step, which stopped it from choosing calibrators whose test ECE was significantly above
        temperature scaling's."""
        return True if self.significance is None else self.significance

    def describe(self) -> str:
        """The rule in one sentence."""
        guard = f"cross-fitted accuracy at most {100 * self.acc_tolerance:g} points below the uncalibrated model's"
        if self.select_by == "ece":
            guard += " and cross-fitted NLL not above the default's"
        metric = f"{self.n_folds}-fold cross-fitted {self.select_by.upper()} on the validation split"
        default = self.anchor_text()
        if not self.uses_significance:
            return (f"the lowest {metric} among {default} and the calibrators with {guard} "
                    f"({self.anchor} on ties)")
        return (f"{default} unless another calibrator, with {guard}, has a significantly lower "
                f"{metric} (paired bootstrap, {100 * self.level:g}% interval below 0); then the lowest such")

    def to_dict(self) -> dict:
        return {"select_by": self.select_by, "acc_tolerance": self.acc_tolerance, "n_folds": self.n_folds,
                "n_bins": self.n_bins, "seed": self.seed, "default": self.anchor, "level": self.level,
                "n_boot": self.n_boot, "significance": self.uses_significance}


@dataclass(frozen=True)
class CrossFitScore:
    """Out-of-fold scores of one calibrator on the validation split (``error`` set when a fit failed)."""

    acc: float = float("nan")
    ece: float = float("nan")
    nll: float = float("nan")
    brier: float = float("nan")
    changed: float = float("nan")  # share of rows whose predicted class differs from the uncalibrated one
    seconds: float = 0.0
    error: str | None = None
    samples: torch.Tensor | None = None  # (n_boot,) resampled values of the rule's metric (shared draws)
    fit_seconds: float | None = None  # the fit on all the rows alone (None: that fit was given); not saved

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("acc", "ece", "nll", "brier", "changed", "seconds", "error")}
        out["samples"] = None if self.samples is None else self.samples.tolist()
        return out

    @classmethod
    def from_dict(cls, d: dict) -> CrossFitScore:
        d = dict(d)
        samples = d.pop("samples", None)
        return cls(**d, samples=None if samples is None else torch.tensor(samples, dtype=torch.float64))


def _score(probs: torch.Tensor, labels: torch.Tensor, base_pred: torch.Tensor, n_bins: int,
           seconds: float, fit_seconds: float | None = None) -> CrossFitScore:
    p = _two_column(probs)
    return CrossFitScore(acc=float(F.accuracy(p, labels)), ece=float(F.ece(p, labels, n_bins=n_bins)),
                         nll=float(F.nll(p, labels)), brier=float(F.brier(p, labels)),
                         changed=float((p.argmax(1) != base_pred).double().mean()), seconds=seconds,
                         fit_seconds=fit_seconds)


@dataclass(frozen=True)
class Candidate:
    """One calibrator cross-fitted (:func:`candidate`): fitted on all the rows, its out-of-fold
    probabilities (two columns for binary), or why it has none."""

    fitted: Any = None
    oof: torch.Tensor | None = None
    error: str | None = None
    fit_seconds: float | None = None  # the fit on all the rows (None: it was given)
    seconds: float = 0.0  # that fit and the fold fits


def candidate(name: str, x: torch.Tensor, y: torch.Tensor, parts: list[torch.Tensor], k: int,
              given=None) -> Candidate:
    """Cross-fit calibrator ``name`` on ``(x, y)`` over the folds ``parts`` (``given``: its fit on all
    the rows, else fitted here first). A refusal (:func:`unfittable`, ``unestimable``) or a fit
    raising ``ValueError``/``RuntimeError`` gives a :class:`Candidate` with ``error`` set."""
    start = time.perf_counter()
    refused = unfittable(name, x.shape[0], k) or unestimable(name, y, k)
    if refused is not None:
        return Candidate(error=refused)
    try:
        fit_seconds = None
        if given is None:
            given = CALIBRATORS[name]().fit(x, y)
            fit_seconds = time.perf_counter() - start
        oof = _two_column(_out_of_fold(name, x, y, parts, given))
    except (ValueError, RuntimeError) as exc:  # as the report's calibrated tables: a failing entry is named
        return Candidate(error=(str(exc).splitlines() or [type(exc).__name__])[0])
    return Candidate(given, oof, None, fit_seconds, time.perf_counter() - start)


def _candidates(names: list[str], x, y, parts, k: int, given: dict, jobs: int) -> dict[str, Candidate]:
    """:func:`candidate` of each name, in this process (``jobs`` 1) or shared with ``jobs - 1``
    started ones (:func:`calibkit.calibrators.pool.run`: the same numbers), keyed in the order of ``names``."""
    ordered = pool.order(names) if jobs > 1 else list(names)
    done = pool.run(candidate, [(n, x, y, parts, k, given.get(n)) for n in ordered], jobs)
    by_name = dict(zip(ordered, done))
    return {n: by_name[n] for n in names}


def cross_fit(logits, labels, names=None, rule: SelectionRule = SelectionRule(),
              fitted: dict | None = None, jobs: int = 1) -> tuple[dict[str, CrossFitScore], dict]:
    """Out-of-fold scores of every calibrator in ``names`` (default: the registry less its opt-in
    calibrators) and of ``"none"``.

    Args:
        logits: ``(N, K)`` (or binary ``(N,)``) validation logits; labels: ``(N,)``.
        names: calibrator names of :data:`calibkit.calibrators.CALIBRATORS`.
        rule: gives the folds, their seed and the ECE's bins.
        fitted: ``{name: calibrator already fitted on these rows}`` (skips the full fit).
        jobs: worker processes that fit the candidates (1: this process; the same numbers,
            :mod:`calibkit.calibrators.pool`).

    Returns:
        ``(scores, fitted)``: ``{name: CrossFitScore}`` with ``"none"`` first, and the calibrators
        fitted on all rows (a name whose fit raised ``ValueError`` or ``RuntimeError``, or that
        :func:`unfittable` refuses, gets a score with ``error`` set and no fitted entry).
    """
    scores, fitted, oof, y = cross_fit_predictions(logits, labels, names, rule, fitted, jobs)
    return with_samples(scores, oof, y, rule), fitted


def cross_fit_predictions(logits, labels, names=None, rule: SelectionRule = SelectionRule(), fitted: dict | None = None,
                          jobs: int = 1) -> tuple[dict[str, CrossFitScore], dict, dict, torch.Tensor]:
    """:func:`cross_fit` without the resamples: ``(scores, fitted, oof, labels)``.

    ``oof`` is ``{name: (N, K) float64 out-of-fold probabilities}`` of every candidate scored
    (``"none"``: the uncalibrated probabilities); :func:`with_samples` attaches the resampled values
    of any rule's metric to ``scores``, so one cross-fitting serves several rules (the ECE of the
    scores uses ``rule.n_bins``; only the folds, their seed and the bins of ``rule`` matter here).
    """
    x = torch.as_tensor(logits).double().cpu()
    y = torch.as_tensor(labels).long().cpu()
    if names is None:  # the registry without the opt-in calibrators, which run only when named; the stack
        names = default_names() + [STACK]
    names = list(names)
    stack = STACK in names  # built from the other candidates' predictions once they are cross-fitted
    names = [n for n in names if n != STACK]
    unknown = [n for n in names if n not in CALIBRATORS]
    if unknown:
        raise UserError(f"unknown calibrator {', '.join(map(repr, unknown))}; expected one of {', '.join(CALIBRATORS)}")
    parts = folds(x.shape[0], rule.n_folds, rule.seed)
    base = _two_column(_uncalibrated(x))
    base_pred = base.argmax(1)
    scores, oof = {NONE: _score(base, y, base_pred, rule.n_bins, 0.0)}, {NONE: base}
    fitted = dict(fitted or {})
    k = 2 if x.dim() == 1 else x.shape[1]
    for name, c in _candidates(names, x, y, parts, k, fitted, jobs).items():
        if c.error is not None or c.oof is None:  # a candidate without an error has its predictions
            fitted.pop(name, None)
            scores[name] = CrossFitScore(error=c.error)
            continue
        fitted[name], oof[name] = c.fitted, c.oof
        scores[name] = _score(c.oof, y, base_pred, rule.n_bins, c.seconds, c.fit_seconds)
    if stack:
        scores[STACK] = _stack(x, y, parts, oof, fitted, base_pred, rule)
    return scores, fitted, oof, y


def _stack(x, y, parts, oof: dict, fitted: dict, base_pred, rule: SelectionRule) -> CrossFitScore:
    """The stack's score from the components' out-of-fold predictions (no fit of its own:
    :func:`calibkit.calibrators.stack.cross_fitted_mixture`); adds it to ``oof`` and ``fitted``."""
    names = [n for n in STACK_PARTS if n in oof]
    if len(names) < 2:
        return CrossFitScore(error=f"{NOT_FITTED}a stack needs two of {', '.join(STACK_PARTS)} (got "
                                   f"{', '.join(names)})")
    start = time.perf_counter()
    weights, mixed = cross_fitted_mixture([oof[n] for n in names], y, parts)
    k = 2 if x.dim() == 1 else x.shape[1]
    fitted[STACK] = StackedCalibration.from_parts({n: fitted.get(n) for n in names}, weights, k, x.dim() == 1,
                                                  n_folds=rule.n_folds, seed=rule.seed)
    oof[STACK] = mixed
    seconds = time.perf_counter() - start
    return _score(mixed, y, base_pred, rule.n_bins, seconds, seconds)


def with_samples(scores: dict, oof: dict, y: torch.Tensor, rule: SelectionRule) -> dict:
    """Attach each candidate's resampled cross-fitted metric (one draw shared by all, seeded by ``rule.seed``)."""
    cis, _ = bootstrap_cis(rule.select_by, oof, y, n_resamples=rule.n_boot, seed=rule.seed, n_bins=rule.n_bins)
    return {n: replace(s, samples=cis[n].samples) if n in cis else s for n, s in scores.items()}


def mean_scores(runs: list[dict[str, CrossFitScore]]) -> dict[str, CrossFitScore]:
    """Scores averaged over runs (e.g. the seeds of one method), name by name.

    Resampled values are averaged resample by resample (runs on the same validation rows with the
    same seed share their draws, so this is the bootstrap of the seed mean); they are dropped when
    a run lacks them or their lengths differ. A name that failed in any run keeps that run's error;
    names missing from some run are dropped.
    """
    if not runs:
        raise UserError("no runs to average")
    names = [n for n in runs[0] if all(n in r for r in runs)]
    out = {}
    for n in names:
        errors = [r[n].error for r in runs if r[n].error is not None]
        if errors:
            out[n] = CrossFitScore(error=errors[0])
            continue
        samples = [s for r in runs if (s := r[n].samples) is not None]
        same = len(samples) == len(runs) and all(x.shape == samples[0].shape for x in samples)
        out[n] = CrossFitScore(**{k: sum(getattr(r[n], k) for r in runs) / len(runs)
                                  for k in ("acc", "ece", "nll", "brier", "changed", "seconds")},
                               samples=torch.stack(samples).mean(0) if same else None)
    return out
