"""calibkit's calibrators and their counterparts in the reference package ``probmetrics``: the one
table of pairs, read by ``tests/calibrators/test_reference.py`` and
``benchmarks/real_outputs_calibrators.py``.

Each :class:`Pair` names a calibkit calibrator (its registry key and the hyperparameters that put it
on the reference's convention where calibkit has an option for it), a factory of a fresh
``probmetrics`` calibrator, the package that one needs beyond ``probmetrics``, the floor calibkit
puts under its rows, and whether the reference's features are computed in float64. Both are fitted
on the same validation rows (calibkit on ``log p``, the reference on ``p``) and applied to the same
test rows. Where calibkit has no option for the reference's convention, the reference is put on
calibkit's instead (docs/calibrators.md, "Against probmetrics"):

* **the floor**: the reference's rows are floored at calibkit's floor and renormalised ("both
  floored"; the reference floors its one-vs-rest rows at 1e-30, and not at all with K = 2);
* **float64 features** (``lightgbm``): the reference takes ``log p`` of ``p`` cast to float32, which
  merges probabilities near 1 that calibkit keeps apart, and LightGBM's bins then split elsewhere;
  :func:`fit_reference` runs it with the same ``log p`` computed in float64.

and calibkit is put on the reference's where it has the option:

* ``svs``, ``sms``: ``n_folds=0``, the reference's fixed strengths (``s = 1``) instead of calibkit's
  search over ``s``;
* ``lightgbm``: one model of 100 rounds on both sides (``n_folds=0``; the reference's
  ``use_cv=False``): with folds, the two libraries deal the rows differently (scikit-learn's
  ``StratifiedKFold`` against calibkit's own), which changes the fit;
* ``vector``, ``matrix``: ``max_iter=1000``, so that calibkit's L-BFGS runs towards its tolerance as
  the reference's BFGS does (the default cap of 100 is a time cap).

``probmetrics`` itself is imported only when a reference calibrator is built.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from calibkit.calibrators import CALIBRATORS
from calibkit.calibrators._ovr import FLOOR as OVR_FLOOR
from calibkit.calibrators._toplabel import DEFAULT_FLOOR

__all__ = ["PAIRS", "TINY", "Pair", "at_floor", "fit_ours", "fit_reference", "floored", "logits_of", "nll"]

#: The smallest normal float32: probabilities are raised to it before their log (the real outputs'
#: README; the reference clips its own logits there too).
TINY = float(np.finfo(np.float32).tiny)


def _pm():
    # probmetrics is optional (the test extra): imported when a reference calibrator is built
    import probmetrics.calibrators as pm
    from probmetrics.calibrators.factory import get_calibrator

    return pm, get_calibrator


@dataclass(frozen=True)
class Pair:
    """One calibkit calibrator and its reference (module docstring)."""

    #: a fresh probmetrics calibrator
    make: Callable[[], Any]
    #: the import name of the package the reference needs beyond probmetrics (None: none)
    needs: str | None = None
    #: calibkit's hyperparameters for the like-for-like comparison ({}: its defaults)
    ours: dict = field(default_factory=dict)
    #: calibkit's floor of the rows, put under the reference's rows too (None: no floor)
    floor: float | None = None
    #: the reference's log-probabilities computed in float64 instead of float32
    float64_features: bool = False


PAIRS: dict[str, Pair] = {
    "temperature": Pair(lambda: _pm()[1]("temp-scaling")),
    "vector": Pair(lambda: _pm()[0].VectorScalingCalibrator(), ours={"max_iter": 1000}),
    "matrix": Pair(lambda: _pm()[0].MatrixScalingCalibrator(), ours={"max_iter": 1000}),
    "ets": Pair(lambda: _pm()[0].ETSCalibrator()),
    "isotonic": Pair(lambda: _pm()[1]("isotonic"), floor=DEFAULT_FLOOR),
    "svs": Pair(lambda: _pm()[1]("svs", svs_print_init_info=False), ours={"n_folds": 0}),
    "sms": Pair(lambda: _pm()[1]("sms", sms_print_init_info=False), ours={"n_folds": 0}),
    "cir": Pair(lambda: _pm()[1]("cir"), needs="cir_model", floor=OVR_FLOOR),
    "venn_abers": Pair(lambda: _pm()[1]("ivap-ovr"), needs="venn_abers", floor=OVR_FLOOR),
    "spline_ovr": Pair(lambda: _pm()[0].MulticlassOneVsRestCalibrator(_pm()[0].CDFSplineCalibrator()),
                       floor=OVR_FLOOR),
    "lightgbm": Pair(lambda: _pm()[0].LightGBMCalibrator(use_cv=False), needs="lightgbm", ours={"n_folds": 0},
                     floor=OVR_FLOOR, float64_features=True),
}


def logits_of(probs: np.ndarray) -> torch.Tensor:
    """calibkit's input for probabilities ``probs``: ``log max(p, TINY)`` in float64 (softmax gives
    ``p`` back, up to the float32 floor)."""
    return torch.from_numpy(np.log(np.maximum(np.asarray(probs, dtype=np.float64), TINY)))


def fit_ours(name: str, probs: np.ndarray, labels: np.ndarray, test_probs: np.ndarray) -> np.ndarray:
    """calibkit's ``name`` with the pair's settings fitted on ``(probs, labels)``; its float64 test rows."""
    cal = CALIBRATORS[name](**PAIRS[name].ours).fit(logits_of(probs), torch.from_numpy(np.asarray(labels)))
    return cal.predict_proba(logits_of(test_probs)).numpy()


def _log64(probs: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.clip(np.log(np.asarray(probs, dtype=np.float64)), np.log(TINY), -np.log(TINY))


def _binary64(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(probs, dtype=np.float64)
    p = p[:, 1] if p.ndim == 2 else p
    with np.errstate(divide="ignore"):
        return _log64(p).reshape(-1, 1), np.clip(np.log1p(-p), np.log(TINY), -np.log(TINY)).reshape(-1, 1)


@contextmanager
def _float64_features():
    """The reference's tree calibrators with their log-probabilities in float64 (the same clipping
    at ``log TINY``); restored on exit."""
    import probmetrics.calibrators.trees as trees  # optional, as in _pm

    saved = trees.multiclass_probs_to_logits, trees.binary_probs_to_logits
    trees.multiclass_probs_to_logits, trees.binary_probs_to_logits = _log64, _binary64
    try:
        yield
    finally:
        trees.multiclass_probs_to_logits, trees.binary_probs_to_logits = saved


def fit_reference(name: str, probs: np.ndarray, labels: np.ndarray, test_probs: np.ndarray) -> np.ndarray:
    """The reference of ``name`` fitted on ``(probs, labels)``; its test rows as float64."""
    pair = PAIRS[name]
    with _float64_features() if pair.float64_features else _no_change():
        ref = pair.make().fit(np.asarray(probs, dtype=np.float64), np.asarray(labels))
        q = ref.predict_proba(np.asarray(test_probs, dtype=np.float64))
    return np.asarray(q, dtype=np.float64)


@contextmanager
def _no_change():
    yield


def floored(q: np.ndarray, floor: float | None) -> np.ndarray:
    """Rows ``max(q, floor) / sum_j max(q_j, floor)`` (calibkit's rule of its floored calibrators);
    ``q`` itself for ``floor=None``."""
    if floor is None:
        return q
    out = np.maximum(q, floor)
    return out / out.sum(1, keepdims=True)


def at_floor(q: np.ndarray, y: np.ndarray, floor: float | None) -> np.ndarray:
    """The rows whose true class is within 10x of the floor ``(N,)`` (none for ``floor=None``): a map
    gave it 0 (or less), and its ``-log q_y`` is the floor's, not a measurement."""
    if floor is None:
        return np.zeros(len(y), dtype=bool)
    return q[np.arange(len(y)), y] < 10 * floor


def nll(q: np.ndarray, y: np.ndarray) -> float:
    """Mean negative log-likelihood (an exact zero counts as ``-log(1e-300)``)."""
    return float(-np.log(np.maximum(q[np.arange(len(y)), y], 1e-300)).mean())
