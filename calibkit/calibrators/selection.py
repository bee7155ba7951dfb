"""Choosing a post-hoc calibrator on the validation split alone, by K-fold cross-fitting.

A calibrator is fitted on validation logits; scoring it on the same rows rewards over-fitting
(histogram binning memorises its bins), and scoring it on the test rows turns the test split into a
selection set, whose minimum over many calibrators is biased low. calibkit therefore scores every
calibrator **out of fold** on the validation split:

1. the validation rows are cut into ``n_folds`` parts by a seeded permutation (:func:`folds`), the
   same parts for every calibrator;
2. for each part, the calibrator is fitted on the other parts and predicts the held-out part; the
   held-out predictions of all parts form one out-of-fold prediction per validation row;
3. accuracy, ECE (equal-width bins), NLL, Brier and the share of rows whose predicted class moved
   are computed on those out-of-fold predictions, pooled over all rows (:class:`CrossFitScore`).

The fold fits start from the calibrator fitted on the whole validation split (a warm start; for
Dirichlet calibration this also reuses the whole split's regularisation strength instead of a
nested cross-validation, so the held-out part has a small say in that one choice; see
``docs/calibrators.md``). The test split is never read here.

**The rule** (:class:`SelectionRule`, ``docs/calibrators.md``): the uncalibrated model (``"none"``)
is always a candidate. A calibrator is eligible when

* its cross-fitted accuracy is at most ``acc_tolerance`` (default 0.5 points) below the
  uncalibrated accuracy on the same rows: a calibrator is meant to fix confidences, not
  predictions, and one that changes predictions (binning, scaling-binning, an over-fitted matrix)
  must not buy calibration with accuracy. 0.5 points lets the affine maps' small, two-way changes of
  the predicted class through and stops the binning maps' losses of several points (measured on the
  real-outputs test bed, ``benchmarks/real_outputs.py``);
* with ``select_by="ece"`` (the default) also its cross-fitted NLL is not above the uncalibrated NLL:
  ECE alone can be driven down by a map that is sharp in the wrong places (zero probabilities on
  some true classes); a proper score guards against that.

Among the eligible candidates, the lowest cross-fitted ``select_by`` metric wins; exact ties go to
the earlier name in the candidate order (the registry's order, which puts the simpler maps first).
``select_by="nll"`` or ``"brier"`` rank by a proper score instead (the accuracy guard still holds).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from calibkit.calibrators.registry import CALIBRATORS

__all__ = ["NONE", "SELECT_BY", "SelectionRule", "CrossFitScore", "Selection", "folds", "cross_fit", "choose",
           "select_calibrator", "mean_scores"]

NONE = "none"  # the uncalibrated model, always a candidate
SELECT_BY = ("ece", "nll", "brier")


@dataclass(frozen=True)
class SelectionRule:
    """How the calibrator is chosen (module docstring).

    Attributes:
        select_by: ``"ece"`` (guarded by accuracy and NLL), ``"nll"`` or ``"brier"`` (guarded by accuracy).
        acc_tolerance: largest accepted drop of cross-fitted accuracy below the uncalibrated one
            (0.005 = 0.5 points).
        n_folds: cross-fitting folds (>= 2).
        n_bins: equal-width bins of the ECE.
        seed: seed of the fold permutation.
    """

    select_by: str = "ece"
    acc_tolerance: float = 0.005
    n_folds: int = 5
    n_bins: int = 15
    seed: int = 0

    def __post_init__(self):
        if self.select_by not in SELECT_BY:
            raise ValueError(f"select_by must be one of {', '.join(SELECT_BY)}, got {self.select_by!r}")
        if isinstance(self.n_folds, bool) or not isinstance(self.n_folds, int) or self.n_folds < 2:
            raise ValueError(f"n_folds must be an integer >= 2, got {self.n_folds!r}")
        if not (isinstance(self.acc_tolerance, (int, float)) and 0 <= self.acc_tolerance <= 1):
            raise ValueError(f"acc_tolerance must be a number in [0, 1], got {self.acc_tolerance!r}")
        if isinstance(self.n_bins, bool) or not isinstance(self.n_bins, int) or self.n_bins < 1:
            raise ValueError(f"n_bins must be an integer >= 1, got {self.n_bins!r}")

    def describe(self) -> str:
        """The rule in one sentence."""
        guard = f"cross-fitted accuracy at most {100 * self.acc_tolerance:g} points below the uncalibrated model's"
        if self.select_by == "ece":
            guard += " and cross-fitted NLL not above it"
        return (f"lowest {self.n_folds}-fold cross-fitted {self.select_by.upper()} on the validation split among "
                f"the calibrators with {guard} (the uncalibrated model is always a candidate)")

    def to_dict(self) -> dict:
        return {"select_by": self.select_by, "acc_tolerance": self.acc_tolerance, "n_folds": self.n_folds,
                "n_bins": self.n_bins, "seed": self.seed}


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

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("acc", "ece", "nll", "brier", "changed", "seconds", "error")}


@dataclass
class Selection:
    """The outcome of :func:`choose`.

    Attributes:
        rule: the rule applied.
        scores: ``{name: CrossFitScore}``, ``"none"`` first.
        chosen: the selected name (``"none"``: keep the uncalibrated probabilities).
        ranking: the eligible names, best first (``ranking[0] == chosen``).
        excluded: ``{name: reason}`` of the candidates the guards (or a failed fit) ruled out.
        fitted: ``{name: calibrator fitted on the whole validation split}`` (from :func:`select_calibrator`).
    """

    rule: SelectionRule
    scores: dict[str, CrossFitScore]
    chosen: str
    ranking: list[str]
    excluded: dict[str, str]
    fitted: dict = field(default_factory=dict)

    @property
    def runner_up(self) -> str | None:
        return self.ranking[1] if len(self.ranking) > 1 else None

    def to_dict(self) -> dict:
        return {"rule": self.rule.to_dict(), "chosen": self.chosen, "ranking": list(self.ranking),
                "excluded": dict(self.excluded), "scores": {k: v.to_dict() for k, v in self.scores.items()}}


def folds(n: int, n_folds: int, seed: int) -> list[torch.Tensor]:
    """``n_folds`` disjoint sorted index sets covering ``range(n)`` (a seeded permutation cut into near-equal parts)."""
    if n < n_folds:
        raise ValueError(f"cross-fitting needs at least n_folds = {n_folds} validation rows, got {n}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return [part.sort().values for part in perm.tensor_split(n_folds)]


def _two_column(p: torch.Tensor) -> torch.Tensor:
    p = p.double()
    return torch.stack([1 - p, p], 1) if p.dim() == 1 else p


def _uncalibrated(logits: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(logits) if logits.dim() == 1 else torch.softmax(logits, 1)


def _score(probs: torch.Tensor, labels: torch.Tensor, base_pred: torch.Tensor, n_bins: int,
           seconds: float) -> CrossFitScore:
    from calibkit import functional as F

    p = _two_column(probs)
    return CrossFitScore(acc=float(F.accuracy(p, labels)), ece=float(F.ece(p, labels, n_bins=n_bins)),
                         nll=float(F.nll(p, labels)), brier=float(F.brier(p, labels)),
                         changed=float((p.argmax(1) != base_pred).double().mean()), seconds=seconds)


def _out_of_fold(name: str, x: torch.Tensor, y: torch.Tensor, parts: list[torch.Tensor], full) -> torch.Tensor:
    out = torch.empty((x.shape[0],) + tuple(x.shape[1:]), dtype=torch.float64)
    everything = torch.arange(x.shape[0])
    for held in parts:
        keep = torch.ones(x.shape[0], dtype=torch.bool)
        keep[held] = False
        cal = CALIBRATORS[name]().fit(x[everything[keep]], y[keep], init=full)
        out[held] = cal.predict_proba(x[held]).double()
    return out


def cross_fit(logits, labels, names=None, rule: SelectionRule = SelectionRule(),
              fitted: dict | None = None) -> tuple[dict[str, CrossFitScore], dict]:
    """Out-of-fold scores of every calibrator in ``names`` (default: the registry) and of ``"none"``.

    Args:
        logits: ``(N, K)`` (or binary ``(N,)``) validation logits; labels: ``(N,)``.
        names: calibrator names of :data:`calibkit.calibrators.CALIBRATORS`.
        rule: gives the folds, their seed and the ECE's bins.
        fitted: ``{name: calibrator already fitted on these rows}`` (skips the full fit).

    Returns:
        ``(scores, fitted)``: ``{name: CrossFitScore}`` with ``"none"`` first, and the calibrators
        fitted on all rows (a name whose fit raised ``ValueError`` gets a score with ``error`` set and
        no fitted entry).
    """
    x = torch.as_tensor(logits).double().cpu()
    y = torch.as_tensor(labels).long().cpu()
    names = list(CALIBRATORS) if names is None else list(names)
    unknown = [n for n in names if n not in CALIBRATORS]
    if unknown:
        raise ValueError(f"unknown calibrator {', '.join(map(repr, unknown))}; expected one of {', '.join(CALIBRATORS)}")
    parts = folds(x.shape[0], rule.n_folds, rule.seed)
    base = _two_column(_uncalibrated(x))
    base_pred = base.argmax(1)
    scores = {NONE: _score(base, y, base_pred, rule.n_bins, 0.0)}
    fitted = dict(fitted or {})
    for name in names:
        start = time.perf_counter()
        try:
            if name not in fitted:
                fitted[name] = CALIBRATORS[name]().fit(x, y)
            oof = _out_of_fold(name, x, y, parts, fitted[name])
        except ValueError as exc:
            fitted.pop(name, None)
            scores[name] = CrossFitScore(error=(str(exc).splitlines() or [type(exc).__name__])[0])
            continue
        scores[name] = _score(oof, y, base_pred, rule.n_bins, time.perf_counter() - start)
    return scores, fitted


def choose(scores: dict[str, CrossFitScore], rule: SelectionRule = SelectionRule()) -> Selection:
    """Apply ``rule`` to cross-fitted ``scores`` (``"none"`` must be among them).

    Works on any scores of the same rows, e.g. the seed-averaged scores of :func:`mean_scores`.
    """
    if NONE not in scores:
        raise ValueError("the scores must include the uncalibrated model ('none')")
    ref = scores[NONE]
    excluded, eligible = {}, []
    for name, s in scores.items():
        if s.error is not None:
            excluded[name] = f"fit failed: {s.error}"
        elif name != NONE and s.acc < ref.acc - rule.acc_tolerance - 1e-12:
            excluded[name] = (f"accuracy {100 * s.acc:.2f}% is {100 * (ref.acc - s.acc):.2f} points below the "
                              f"uncalibrated {100 * ref.acc:.2f}% (tolerance {100 * rule.acc_tolerance:g})")
        elif name != NONE and rule.select_by == "ece" and not s.nll <= ref.nll + 1e-12:
            excluded[name] = f"NLL {s.nll:.4f} is above the uncalibrated {ref.nll:.4f}"
        else:
            eligible.append(name)
    order = {n: i for i, n in enumerate(scores)}
    ranking = sorted(eligible, key=lambda n: (getattr(scores[n], rule.select_by), order[n]))
    return Selection(rule=rule, scores=dict(scores), chosen=ranking[0], ranking=ranking, excluded=excluded)


def select_calibrator(val_logits, val_labels, names=None, rule: SelectionRule = SelectionRule()) -> Selection:
    """Cross-fit every calibrator on the validation split and choose one by ``rule``.

    Example:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> z = torch.randn(3000, 5, generator=g) * 2
        >>> y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
        >>> sel = select_calibrator(3 * z, y, names=["temperature", "histogram"])
        >>> sel.chosen                 # the over-confident logits need a temperature
        'temperature'
        >>> sel.fitted["temperature"].temperature_ > 2
        True
    """
    scores, fitted = cross_fit(val_logits, val_labels, names, rule)
    sel = choose(scores, rule)
    sel.fitted = fitted
    return sel


def mean_scores(runs: list[dict[str, CrossFitScore]]) -> dict[str, CrossFitScore]:
    """Scores averaged over runs (e.g. the seeds of one method), name by name.

    A name that failed in any run keeps that run's error; names missing from some run are dropped.
    """
    if not runs:
        raise ValueError("no runs to average")
    names = [n for n in runs[0] if all(n in r for r in runs)]
    out = {}
    for n in names:
        errors = [r[n].error for r in runs if r[n].error is not None]
        if errors:
            out[n] = CrossFitScore(error=errors[0])
            continue
        out[n] = CrossFitScore(**{k: sum(getattr(r[n], k) for r in runs) / len(runs)
                                  for k in ("acc", "ece", "nll", "brier", "changed", "seconds")})
    return out
