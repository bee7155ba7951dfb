"""The rule ``calibkit tune`` selects a method's hyperparameters by, on validation numbers alone.

:func:`select` reads each candidate's recorded validation metrics (``acc``, the criterion's
metric, ``n``: what :func:`calibkit.bench.tune.val_metrics` records), so a recorded tuning (the
``tuning`` table of ``runs.db``, ``docs/tuning/default.json``) can be selected again from its
numbers alone, without its run directories.

The rule (:class:`Criterion`, recorded with every selection):

1. **The accuracy window.** Calibration is never bought with a real loss of accuracy, but a loss
   within the validation split's noise is no loss: a candidate is excluded only when its
   validation accuracy is below the method's most accurate candidate's by more than

       max(max_acc_drop, acc_z * sqrt(p_best (1 - p_best) / n_best + p (1 - p) / n))

   that is, by more than a fixed floor (1 point) **and** by more than ``acc_z`` (1.96) standard
   errors of the difference of the two accuracies. With 5,000 validation images the noise term
   is about 1.3 points near 88% accuracy; with 500 images near 96%, about 2.4 points, where
   1 point is 5 images.
2. **The objective.** The lowest validation ECE among the candidates in the window wins; values
   within ``tie`` of it are tied, and the tie goes to the value nearest the published one
   (``Axis.default``), then to the first in grid order.

Why this window (a calibkit decision):

* A fixed window in accuracy points is the wrong size for every split but one: with 500
  validation images 1 point is 5 images, well inside the noise, so the fixed rule excluded
  candidates for differences nobody can measure, and the lowest ECE left in the window could be
  many times the excluded candidate's (a selection that says more about the rule than about the
  method). The window must grow as the split shrinks; the binomial standard error does.
* ``acc_z`` = 1.96: a candidate is excluded when its accuracy differs from the best's at the
  two-sided 5% level. Two-sided, because which candidate is "the best" is decided after looking
  at the same numbers (the maximum of several noisy accuracies is itself biased upwards).
* Two independent proportions, not a paired test on the same images (McNemar on per-image
  correctness): the paired test needs every candidate's validation logits, and the rule must be
  re-derivable from the recorded metrics alone. Candidates scored on the same images usually
  make correlated errors, so the unpaired standard error is the larger one: the window errs
  towards keeping a candidate. That is the side to err on: excluding a candidate wrongly can
  cost many ECE points (the window's purpose), keeping one wrongly costs at most about two
  standard errors of accuracy.
* The floor ``max_acc_drop`` keeps the previous rule's window on large splits, where the noise
  term falls below 1 point; the rule never excludes what the previous rule kept.
* A candidate whose metrics do not record ``n`` (records written before ``n`` was recorded)
  gets the floor alone, as before.

Selections recorded before ``acc_z`` existed were made by the fixed window alone:
:meth:`Criterion.from_dict` reads such a record as ``acc_z`` = 0, which is that rule.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from calibkit.errors import UserError

# Below the window's threshold by no more than this: still inside (float rounding of the numbers).
_EPS = 1e-12


@dataclass(frozen=True)
class Criterion:
    """How a method's candidates are compared (see the module docstring for the rule and why).

    Attributes:
        metric: the validation metric minimised (a ``calibkit.metrics.evaluate`` key).
        n_bins: bins of the binned calibration errors.
        max_acc_drop: the accuracy window's floor: a candidate less than this below the method's
            most accurate candidate is never excluded (0.01 = 1 point).
        acc_z: standard errors of the accuracy difference (two independent binomial proportions
            on the candidates' ``n`` validation images) a candidate must lie below the best to be
            excluded, when that is more than ``max_acc_drop``; 1.96 = the two-sided 5% level, 0 =
            the floor alone (the rule of selections recorded without this field).
        tie: metric values within this of the best are tied (0.0001 = 0.01 ECE point x100).
    """

    metric: str = "ece"
    n_bins: int = 15
    max_acc_drop: float = 0.01
    acc_z: float = 1.96
    tie: float = 1e-4

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, recorded: dict | None) -> Criterion:
        """The criterion a recorded selection was made by (the ``criterion`` of a selected row).

        A record without ``acc_z`` was made by the fixed window alone, so it reads as
        ``acc_z`` = 0; other missing fields take their defaults, and fields this version does not
        know are ignored. ``None`` (no record) gives the default criterion.
        """
        if recorded is None:
            return cls()
        known = {f.name for f in fields(cls)}
        return cls(**{"acc_z": 0.0, **{k: v for k, v in recorded.items() if k in known}})

    def window(self, best: dict, other: dict) -> float:
        """How far (accuracy, as a fraction) ``other``'s metrics may lie below ``best``'s and
        stay eligible: the larger of the floor and ``acc_z`` standard errors of the difference
        (the floor alone when either record lacks ``n``)."""
        if "n" not in best or "n" not in other:
            return self.max_acc_drop
        p1, n1, p2, n2 = float(best["acc"]), int(best["n"]), float(other["acc"]), int(other["n"])
        se = math.sqrt(p1 * (1.0 - p1) / n1 + p2 * (1.0 - p2) / n2)
        return max(self.max_acc_drop, self.acc_z * se)

    def describe(self) -> str:
        """The accuracy window in words (the report's protocol line)."""
        floor = f"{100 * self.max_acc_drop:g} accuracy point"
        if not self.acc_z:
            return f"candidates > {floor} below the best excluded"
        return (f"candidates below the best by > {floor} and > {self.acc_z:g} standard errors of the "
                "accuracy difference excluded")


DEFAULT_CRITERION = Criterion()


def eligible(cands: list[dict], criterion: Criterion = DEFAULT_CRITERION) -> list[int]:
    """Indices of the candidates inside the accuracy window (step 1 of the rule), in order.

    Args:
        cands: ``[{"metrics": {"acc": ..., "n": ...}}, ...]``; the first most accurate candidate
            is the reference of the window.
    """
    if not cands:
        return []
    best = max(cands, key=lambda c: c["metrics"]["acc"])["metrics"]
    return [i for i, c in enumerate(cands)
            if c["metrics"]["acc"] >= best["acc"] - criterion.window(best, c["metrics"]) - _EPS]


def _distance(values: dict, space: dict) -> float:
    """Distance of a candidate from the published values, in grid-range units summed over axes."""
    total = 0.0
    for address, axis in space.items():
        span = (max(axis.values) - min(axis.values)) or 1.0
        total += abs(float(values[address]) - float(axis.default)) / span
    return total


def select(cands: list[dict], space: dict, criterion: Criterion = DEFAULT_CRITERION) -> int:
    """Index of the winning candidate (see the module docstring for the rule).

    Args:
        cands: ``[{"hparams": {address: value}, "metrics": {"acc": ..., "n": ...,
            criterion.metric: ...}}]`` in grid order.
        space: the method's search space (for the published values of the tie-break).
        criterion: the rule.

    Raises:
        ValueError: no candidates.
    """
    if not cands:
        raise UserError("no finished candidates to select from")
    inside = eligible(cands, criterion)
    best = min(cands[i]["metrics"][criterion.metric] for i in inside)
    tied = [i for i in inside if cands[i]["metrics"][criterion.metric] <= best + criterion.tie]
    return min(tied, key=lambda i: (_distance(cands[i]["hparams"], space), i))
