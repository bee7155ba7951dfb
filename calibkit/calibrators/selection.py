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

**The rule** (:class:`SelectionRule`, ``docs/calibrators.md``). Temperature scaling is the default:
one parameter, no prediction changed, the baseline the literature compares against. Another
calibrator replaces it only on significant validation evidence:

* **guards.** Temperature scaling is eligible when its cross-fitted accuracy is within
  ``acc_tolerance`` of the uncalibrated model's (always: it never changes a prediction) and, under
  the ECE rule, its cross-fitted NLL is not above the uncalibrated NLL; otherwise the default is the
  uncalibrated model (``"none"``). Any other calibrator is eligible when its cross-fitted accuracy is
  at most ``acc_tolerance`` (default 0.5 points) below the uncalibrated accuracy (a calibrator is
  meant to fix confidences, not predictions: binning maps that lose several points are stopped, the
  affine maps' small two-way changes pass) and, under the ECE rule, its cross-fitted NLL is not above
  the default's (ECE alone can be driven down by a map that is sharp in the wrong places; a map with
  a worse proper score than the one-parameter map is not trusted on its ECE);
* **significance.** An eligible challenger wins only when the paired bootstrap interval (``level``,
  ``n_boot`` resamples of the validation rows, the same draws for every calibrator, basic interval)
  of its cross-fitted ``select_by`` metric minus the default's lies wholly below 0. Among such
  challengers the lowest cross-fitted metric wins; with none, the default stays. Scores without
  resampled values (hand-made) are compared on their point estimates.

On the real-outputs test bed a plain "lowest cross-fitted ECE" chose, on two models of eight, a
calibrator whose test ECE was significantly above temperature scaling's: differences of ECE of a few
tenths of a point between calibrators are mostly noise at 5,000 validation rows, and the
significance step is what keeps such a difference from deciding (``benchmarks/real_outputs.py``).
``select_by="nll"`` or ``"brier"`` ranks by a proper score instead (accuracy guard and significance
step unchanged).
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field

import torch

from calibkit.calibrators.registry import CALIBRATORS
from calibkit.errors import UserError

__all__ = ["NONE", "NOT_FITTED", "SELECT_BY", "SelectionRule", "CrossFitScore", "Selection", "folds", "cross_fit",
           "choose", "select_calibrator", "mean_scores", "unfittable"]

NONE = "none"  # the uncalibrated model, always a candidate
SELECT_BY = ("ece", "nll", "brier")
NOT_FITTED = "not fitted: "  # the start of the error of a calibrator refused before any fit (:func:`unfittable`)


def unfittable(name: str, n_rows: int, k: int) -> str | None:
    """Why calibrator ``name`` is not fitted on ``n_rows`` validation rows of ``k`` classes, or ``None``.

    A map with a K x K weight (matrix scaling, Dirichlet calibration: K^2 + K parameters) is refused
    when there are fewer rows than classes: some classes have no validation row, the map has more
    than K parameters per row, and its fit costs grow with K^2 (Dirichlet calibration at K = 1000
    takes over a minute whatever the rows).
    """
    from calibkit.calibrators.scaling import DirichletCalibration, MatrixScaling

    if n_rows < k and issubclass(CALIBRATORS[name], (MatrixScaling, DirichletCalibration)):
        return (f"{NOT_FITTED}{n_rows} validation rows for K = {k} classes; its K x K map ({k * k + k} parameters) "
                "cannot be fitted from fewer rows than classes")
    return None


@dataclass(frozen=True)
class SelectionRule:
    """How the calibrator is chosen (module docstring).

    Attributes:
        select_by: ``"ece"`` (guarded by accuracy and NLL), ``"nll"`` or ``"brier"`` (guarded by accuracy).
        acc_tolerance: largest accepted drop of cross-fitted accuracy below the uncalibrated one
            (0.005 = 0.5 points).
        n_folds: cross-fitting folds (>= 2).
        n_bins: equal-width bins of the ECE.
        seed: seed of the fold permutation and of the validation bootstrap.
        default: the calibrator kept unless significantly beaten (``"none"`` when it is not among
            the candidates or fails a guard).
        level: level of the paired validation interval of the significance step.
        n_boot: resamples of that interval.
    """

    select_by: str = "ece"
    acc_tolerance: float = 0.005
    n_folds: int = 5
    n_bins: int = 15
    seed: int = 0
    default: str = "temperature"
    level: float = 0.95
    n_boot: int = 1000

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

    def describe(self) -> str:
        """The rule in one sentence."""
        guard = f"cross-fitted accuracy at most {100 * self.acc_tolerance:g} points below the uncalibrated model's"
        if self.select_by == "ece":
            guard += " and cross-fitted NLL not above the default's"
        return (f"{self.default} unless another calibrator, with {guard}, has a significantly lower "
                f"{self.n_folds}-fold cross-fitted {self.select_by.upper()} on the validation split (paired "
                f"bootstrap, {100 * self.level:g}% interval below 0); then the lowest such")

    def to_dict(self) -> dict:
        return {"select_by": self.select_by, "acc_tolerance": self.acc_tolerance, "n_folds": self.n_folds,
                "n_bins": self.n_bins, "seed": self.seed, "default": self.default, "level": self.level,
                "n_boot": self.n_boot}


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

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("acc", "ece", "nll", "brier", "changed", "seconds", "error")}
        out["samples"] = None if self.samples is None else self.samples.tolist()
        return out

    @classmethod
    def from_dict(cls, d: dict) -> CrossFitScore:
        d = dict(d)
        samples = d.pop("samples", None)
        return cls(**d, samples=None if samples is None else torch.tensor(samples, dtype=torch.float64))


@dataclass
class Selection:
    """The outcome of :func:`choose`.

    Attributes:
        rule: the rule applied.
        scores: ``{name: CrossFitScore}``, ``"none"`` first.
        chosen: the selected name (``"none"``: keep the uncalibrated probabilities).
        ranking: the eligible names, best first (``ranking[0] == chosen``).
        excluded: ``{name: reason}`` of the candidates the guards (or a failed fit) ruled out.
        default: the default after its guards (``rule.default`` or ``"none"``).
        notes: ``{name: text}`` of eligible challengers that did not beat the default significantly.
        fitted: ``{name: calibrator fitted on the whole validation split}`` (from :func:`select_calibrator`).
    """

    rule: SelectionRule
    scores: dict[str, CrossFitScore]
    chosen: str
    ranking: list[str]
    excluded: dict[str, str]
    default: str = NONE
    notes: dict = field(default_factory=dict)
    fitted: dict = field(default_factory=dict)

    @property
    def runner_up(self) -> str | None:
        return self.ranking[1] if len(self.ranking) > 1 else None

    def to_dict(self) -> dict:
        scores = {k: {n: v for n, v in s.to_dict().items() if n != "samples"} for k, s in self.scores.items()}
        return {"rule": self.rule.to_dict(), "chosen": self.chosen, "default": self.default,
                "ranking": list(self.ranking), "excluded": dict(self.excluded), "notes": dict(self.notes),
                "scores": scores}


def folds(n: int, n_folds: int, seed: int) -> list[torch.Tensor]:
    """``n_folds`` disjoint sorted index sets covering ``range(n)`` (a seeded permutation cut into near-equal parts)."""
    if n < n_folds:
        raise UserError(f"cross-fitting needs at least n_folds = {n_folds} validation rows, got {n}")
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
    cls = CALIBRATORS[name]
    # the protocol requires fit(logits, labels) only: a registered calibrator without a warm start is fitted cold
    warm = {"init": full} if "init" in inspect.signature(cls.fit).parameters else {}
    for held in parts:
        keep = torch.ones(x.shape[0], dtype=torch.bool)
        keep[held] = False
        cal = cls().fit(x[everything[keep]], y[keep], **warm)
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
        fitted on all rows (a name whose fit raised ``ValueError`` or ``RuntimeError``, or that
        :func:`unfittable` refuses, gets a score with ``error`` set and no fitted entry).
    """
    x = torch.as_tensor(logits).double().cpu()
    y = torch.as_tensor(labels).long().cpu()
    names = list(CALIBRATORS) if names is None else list(names)
    unknown = [n for n in names if n not in CALIBRATORS]
    if unknown:
        raise UserError(f"unknown calibrator {', '.join(map(repr, unknown))}; expected one of {', '.join(CALIBRATORS)}")
    parts = folds(x.shape[0], rule.n_folds, rule.seed)
    base = _two_column(_uncalibrated(x))
    base_pred = base.argmax(1)
    scores, oof = {NONE: _score(base, y, base_pred, rule.n_bins, 0.0)}, {NONE: base}
    fitted = dict(fitted or {})
    k = 2 if x.dim() == 1 else x.shape[1]
    for name in names:
        start = time.perf_counter()
        refused = unfittable(name, x.shape[0], k)
        if refused is not None:
            fitted.pop(name, None)
            scores[name] = CrossFitScore(error=refused)
            continue
        try:
            if name not in fitted:
                fitted[name] = CALIBRATORS[name]().fit(x, y)
            oof[name] = _two_column(_out_of_fold(name, x, y, parts, fitted[name]))
        except (ValueError, RuntimeError) as exc:  # as the report's calibrated tables: a failing entry is named
            fitted.pop(name, None)
            scores[name] = CrossFitScore(error=(str(exc).splitlines() or [type(exc).__name__])[0])
            continue
        scores[name] = _score(oof[name], y, base_pred, rule.n_bins, time.perf_counter() - start)
    return _with_samples(scores, oof, y, rule), fitted


def _with_samples(scores: dict, oof: dict, y: torch.Tensor, rule: SelectionRule) -> dict:
    """Attach each candidate's resampled cross-fitted metric (one draw shared by all, seeded by ``rule.seed``)."""
    from dataclasses import replace

    from calibkit.bootstrap import bootstrap_cis

    cis, _ = bootstrap_cis(rule.select_by, oof, y, n_resamples=rule.n_boot, seed=rule.seed, n_bins=rule.n_bins)
    return {n: replace(s, samples=cis[n].samples) if n in cis else s for n, s in scores.items()}


def _below(challenger: CrossFitScore, default: CrossFitScore, rule: SelectionRule) -> tuple[bool, str]:
    """Whether ``challenger``'s metric is significantly below ``default``'s, and the interval as text."""
    from calibkit.bootstrap import bootstrap_interval

    est = getattr(challenger, rule.select_by) - getattr(default, rule.select_by)
    scale, unit = (100, " x100") if rule.select_by == "ece" else (1, "")
    a, b = challenger.samples, default.samples
    if a is None or b is None or a.shape != b.shape:
        return est < 0, f"{scale * est:+.4f}{unit} (no resamples: point estimates)"
    lo, hi = bootstrap_interval(a - b, est, rule.level, "basic")
    return hi < 0, f"{scale * est:+.4f} [{scale * lo:+.4f}, {scale * hi:+.4f}]{unit}"


def _guard(name: str, s: CrossFitScore, ref: CrossFitScore, nll_ref: float, rule: SelectionRule) -> str | None:
    """Why ``name`` is not eligible (None when it is)."""
    if s.error is not None:
        return s.error if s.error.startswith(NOT_FITTED) else f"fit failed: {s.error}"
    if name == NONE:
        return None
    if s.acc < ref.acc - rule.acc_tolerance - 1e-12:
        return (f"accuracy {100 * s.acc:.2f}% is {100 * (ref.acc - s.acc):.2f} points below the uncalibrated "
                f"{100 * ref.acc:.2f}% (tolerance {100 * rule.acc_tolerance:g})")
    if rule.select_by == "ece" and not s.nll <= nll_ref + 1e-12:
        return f"NLL {s.nll:.4f} is above {nll_ref:.4f}"
    return None


def choose(scores: dict[str, CrossFitScore], rule: SelectionRule = SelectionRule()) -> Selection:
    """Apply ``rule`` to cross-fitted ``scores`` (``"none"`` must be among them; module docstring).

    Works on any scores of the same rows, e.g. the seed-averaged scores of :func:`mean_scores`.
    ``Selection.excluded`` names the guard each excluded candidate failed, or the interval by which
    an eligible challenger failed to beat the default.
    """
    if NONE not in scores:
        raise UserError("the scores must include the uncalibrated model ('none')")
    ref = scores[NONE]
    default = rule.default if rule.default in scores else NONE
    excluded = {}
    if default != NONE:
        why = _guard(default, scores[default], ref, ref.nll, rule)
        if why is not None:
            excluded[default], default = why, NONE
    nll_ref = scores[default].nll
    eligible = [default]
    for name, s in scores.items():
        if name == default or name in excluded:
            continue
        why = _guard(name, s, ref, nll_ref, rule)
        if why is None:
            eligible.append(name)
        else:
            excluded[name] = why
    order = {n: i for i, n in enumerate(scores)}
    by_metric = sorted(eligible, key=lambda n: (getattr(scores[n], rule.select_by), order[n]))
    winners: list[str] = []
    beaten: dict[str, str] = {}
    for name in by_metric:
        if name == default:
            continue
        below, text = _below(scores[name], scores[default], rule)
        (winners.append(name) if below else beaten.__setitem__(name, text))
    chosen = winners[0] if winners else default
    ranking = [chosen] + [n for n in by_metric if n != chosen]
    notes = {n: f"not significantly below {default}: difference {t}" for n, t in beaten.items()}
    return Selection(rule=rule, scores=dict(scores), chosen=chosen, ranking=ranking, excluded=excluded,
                     default=default, notes=notes)


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
