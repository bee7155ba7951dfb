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
``docs/calibrators.md``). The test split is never read here. The cross-fitting lives in
:mod:`calibkit.calibrators.crossfit` (its names are re-exported here); this module applies the rule.

**The rule** (:class:`SelectionRule`, ``docs/calibrators.md``). By default the rule is anchored at
the **stack** (:mod:`calibkit.calibrators.stack`: the smooth maps and the uncalibrated model mixed
with weights fitted on their out-of-fold log score) and decides by the cross-fitted **NLL** (a
proper score: it rewards calibration and sharpness together and, unlike the ECE, has no binning
bias): the stack is kept unless an eligible challenger's cross-fitted NLL is significantly lower.
Where the stack is not among the candidates (the bench report, which fits single maps) or fails a
guard, SMS (structured matrix scaling, which chooses its own regularisation on the validation rows)
stands in for it, then temperature scaling, then the uncalibrated model. ``select_by="brier"``
ranks by the Brier score anchored at SMS; ``select_by="ece"`` by the ECE, anchored at temperature
scaling and guarded by NLL:

* **guards.** The default is eligible when its cross-fitted accuracy is within ``acc_tolerance``
  of the uncalibrated model's (temperature scaling always is: it never changes a prediction) and,
  under the ECE rule, its cross-fitted NLL is not above the uncalibrated NLL. Any other calibrator
  is eligible when its cross-fitted accuracy is at most ``acc_tolerance`` (default 0.5 points)
  below the uncalibrated accuracy (a calibrator is
  meant to fix confidences, not predictions: binning maps that lose several points are stopped, the
  affine maps' small two-way changes pass) and, under the ECE rule, its cross-fitted NLL is not above
  the default's (ECE alone can be driven down by a map that is sharp in the wrong places; a map with
  a worse proper score than the one-parameter map is not trusted on its ECE);
* **significance** (every rule unless ``significance=False``). An eligible challenger wins only when
  the paired bootstrap interval (``level``, ``n_boot`` resamples of the validation rows, the same
  draws for every calibrator, basic interval) of its cross-fitted ``select_by`` metric minus the
  default's lies wholly below 0. Among such challengers the lowest cross-fitted metric wins; with
  none, the default stays. Scores without resampled values (hand-made) are compared on their point
  estimates.

On the real-outputs test bed a plain "lowest cross-fitted ECE" chose, on two models of eight, a
calibrator whose test ECE was significantly above temperature scaling's: differences of ECE of a few
tenths of a point between calibrators are mostly noise at 5,000 validation rows, and the
significance step is what keeps such a difference from deciding (``benchmarks/real_outputs.py``).
Under NLL, keeping the stack unless significantly beaten had the lowest test-NLL regret of the rules
measured on the same test bed, below always SMS (``benchmarks/selection_regret.py``, the table in
``docs/calibrators.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from calibkit.bootstrap import bootstrap_interval, holding
from calibkit.calibrators.crossfit import (
    FALLBACK,
    NONE,
    NOT_FITTED,
    SELECT_BY,
    STAND_INS,
    CrossFitScore,
    SelectionRule,
    cross_fit,
    folds,
    mean_scores,
    unfittable,
)
from calibkit.calibrators.wording import accuracy_below, comparison_note, nll_above
from calibkit.errors import UserError

__all__ = ["FALLBACK", "NONE", "NOT_FITTED", "SELECT_BY", "SelectionRule", "CrossFitScore", "Selection", "folds",
           "cross_fit", "choose", "select_calibrator", "mean_scores", "unfittable"]

DEFAULT_RULE = SelectionRule()  # frozen: one instance serves as every default
#: Metric differences of at most this size are ties (float rounding: two temperature-scaled copies
#: of one model differ by 1e-16), so they never make a challenger win.
TIE = 1e-12


@dataclass
class Selection:
    """The outcome of :func:`choose`.

    Attributes:
        rule: the rule applied.
        scores: ``{name: CrossFitScore}``, ``"none"`` first.
        chosen: the selected name (``"none"``: keep the uncalibrated probabilities).
        ranking: the eligible names, best first (``ranking[0] == chosen``).
        excluded: ``{name: reason}`` of the candidates the guards (or a failed fit) ruled out.
        default: the default after its guards (``rule.anchor``, its stand-in or ``"none"``).
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


def _below(challenger: CrossFitScore, default: CrossFitScore, rule: SelectionRule,
           default_name: str = "the default") -> tuple[bool, str]:
    """Whether ``challenger``'s metric is significantly below ``default``'s, and the status text
    (:func:`calibkit.calibrators.wording.comparison_note`)."""
    est = getattr(challenger, rule.select_by) - getattr(default, rule.select_by)
    scale, metric = {"ece": (100, "ECE x100"), "nll": (1, "NLL")}.get(rule.select_by, (1, rule.select_by.capitalize()))
    a, b = challenger.samples, default.samples
    below = est < -TIE  # a difference within float rounding is a tie, never a win
    if not rule.uses_significance:
        return below, comparison_note(default_name, metric, scale * est, why="the rule has no significance step")
    if a is None or b is None or a.shape != b.shape:
        return below, comparison_note(default_name, metric, scale * est)
    # the printed interval holds its estimate; widening never changes the decision (est < 0 there)
    lo, hi = holding(*bootstrap_interval(a - b, est, rule.level, "basic"), est)
    return below and hi < 0, comparison_note(default_name, metric, scale * est, scale * lo, scale * hi)


def _guard(name: str, s: CrossFitScore, ref: CrossFitScore, nll_ref: float, rule: SelectionRule,
           nll_name: str = "the default") -> str | None:
    """Why ``name`` is not eligible (None when it is); ``nll_name`` names whose NLL ``nll_ref`` is."""
    if s.error is not None:
        return s.error if s.error.startswith(NOT_FITTED) else f"fit failed: {s.error}"
    if name == NONE:
        return None
    if s.acc < ref.acc - rule.acc_tolerance - 1e-12:
        return accuracy_below(s.acc, ref.acc, rule.acc_tolerance)
    if rule.select_by == "ece" and not s.nll <= nll_ref + 1e-12:
        return nll_above(s.nll, nll_ref, nll_name)
    return None


def _default(scores: dict[str, CrossFitScore], rule: SelectionRule) -> tuple[str, dict[str, str]]:
    """The rule's default after its guards: ``rule.anchor``, else temperature scaling (:data:`FALLBACK`)
    when the default is not among ``scores`` or fails a guard, else ``"none"``; and why those failed."""
    excluded: dict[str, str] = {}
    ref = scores[NONE]
    for name in dict.fromkeys((rule.anchor, *STAND_INS.get(rule.anchor, ()), FALLBACK)):
        if name == NONE:
            return NONE, excluded
        if name not in scores:
            continue
        why = _guard(name, scores[name], ref, ref.nll, rule, "the uncalibrated model")
        if why is None:
            return name, excluded
        excluded[name] = why
    return NONE, excluded


def choose(scores: dict[str, CrossFitScore], rule: SelectionRule = DEFAULT_RULE) -> Selection:
    """Apply ``rule`` to cross-fitted ``scores`` (``"none"`` must be among them; module docstring).

    Works on any scores of the same rows, e.g. the seed-averaged scores of :func:`mean_scores`.
    ``Selection.excluded`` names the guard each excluded candidate failed, or the interval by which
    an eligible challenger failed to beat the default.
    """
    if NONE not in scores:
        raise UserError("the scores must include the uncalibrated model ('none')")
    ref = scores[NONE]
    default, excluded = _default(scores, rule)
    nll_ref = scores[default].nll
    eligible = [default]
    for name, s in scores.items():
        if name == default or name in excluded:
            continue
        why = _guard(name, s, ref, nll_ref, rule, default)
        if why is None:
            eligible.append(name)
        else:
            excluded[name] = why
    order = {n: i for i, n in enumerate(scores)}
    order[default] = -1  # the default first among equal metrics
    by_metric = sorted(eligible, key=lambda n: (getattr(scores[n], rule.select_by), order[n]))
    winners: list[str] = []
    beaten: dict[str, str] = {}
    for name in by_metric:
        if name == default:
            continue
        below, text = _below(scores[name], scores[default], rule, default)
        (winners.append(name) if below else beaten.__setitem__(name, text))
    chosen = winners[0] if winners else default
    ranking = [chosen] + [n for n in by_metric if n != chosen]
    notes = dict(beaten)
    return Selection(rule=rule, scores=dict(scores), chosen=chosen, ranking=ranking, excluded=excluded,
                     default=default, notes=notes)


def select_calibrator(val_logits, val_labels, names=None, rule: SelectionRule = DEFAULT_RULE) -> Selection:
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
