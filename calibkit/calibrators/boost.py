"""Gradient-boosted calibration: a LightGBM classifier on the model's log-probabilities (the
boosted-tree calibrators of the ``probmetrics`` benchmark). Needs the optional extra
``calibkit[boost]`` (``pip install lightgbm``); without it ``fit`` raises a ``UserError`` naming it.

The rule: features ``log softmax(z)`` (``(N, K)``, clipped below at ``log`` of the smallest normal
float32, as the reference does; ``K = 2``: the one logit ``z_1 - z_0``), the multiclass (binary)
log-loss objective, trees of depth <= ``max_depth`` with <= ``num_leaves`` leaves, learning rate
0.1, at most ``n_rounds`` rounds. With ``n_folds >= 2`` the validation rows are split into
stratified folds (each class's rows shuffled by ``seed`` and dealt to the folds in turn); one model
is trained per fold on the other folds, stopped early when its held-out log-loss has not improved
for ``early_stopping`` rounds, and the prediction is the mean of the fold models' probabilities.
``n_folds = 0``: one model on every row, ``n_rounds`` rounds. Rows are floored at ``1e-12`` and
renormalised (:mod:`._ovr`).

Decisions: the defaults are the reference's (5 folds, depth 3, 8 leaves, 100 rounds, patience 50);
its folds come from scikit-learn's ``StratifiedKFold``, calibkit deals its own (no scikit-learn
dependency), so the two differ by the fold assignment (``docs/calibrators.md``). The features are
computed in float64; the reference casts the probabilities to float32 first, which merges values
near 1 and moves LightGBM's bins (with the features computed alike, one model of each gives the same
test NLL: ``tests/calibrators/test_reference.py``). LightGBM runs on one thread, deterministically
(measured: two OpenMP threads on a busy 2-core machine ran 60x slower).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from calibkit.calibrators._base import Calibrator
from calibkit.calibrators._ovr import ovr_rows
from calibkit.calibrators._state import state_names
from calibkit.errors import UserError
from calibkit.extras import available

__all__ = ["LightGBMCalibration", "stratified_folds", "OPT_IN"]

#: Registered calibrators fitted only when named (``calibkit calibrate --calibrators``; the bench
#: report leaves them out): LightGBM is an optional extra and fits 5 boosted models per fit
#: (measured 17 s for one fit at K = 10, N = 5,000 on a busy 2-core machine; ``calibrate`` fits
#: each calibrator 6 times and ``bench`` once per run).
OPT_IN = ("lightgbm",)

_LOG_TINY = math.log(float(np.finfo(np.float32).tiny))


def _lightgbm():
    if not available("lightgbm"):
        raise UserError("the lightgbm calibrator needs LightGBM: pip install 'calibkit[boost]' (or pip install "
                        "lightgbm), or leave it out (calibkit calibrate --calibrators ...)")
    import lightgbm  # noqa: PLC0415 (optional extra boost, checked above)

    return lightgbm


def stratified_folds(y: np.ndarray, n_folds: int, seed: int) -> np.ndarray:
    """Fold index ``(N,)`` of each row: each class's rows in a seeded random order, dealt to the folds
    in turn (fold sizes within a class differ by at most one)."""
    rng = np.random.default_rng(seed)
    fold = np.empty(len(y), dtype=np.int64)
    start = 0
    for c in np.unique(y):
        rows = rng.permutation(np.flatnonzero(y == c))
        fold[rows] = (start + np.arange(len(rows))) % n_folds
        start += len(rows)
    return fold


def _features(z: torch.Tensor) -> np.ndarray:
    if z.shape[1] == 2:
        return (z[:, 1:] - z[:, :1]).cpu().numpy()
    return torch.log_softmax(z, 1).clamp(min=_LOG_TINY).cpu().numpy()


class LightGBMCalibration(Calibrator):
    """LightGBM on the log-probabilities; the rule is in the module docstring.

    Args:
        n_folds: cross-fitted models with early stopping (default 5), or 0: one model on all rows.
        n_rounds: most boosting rounds per model (default 100).
        max_depth: tree depth (default 3).
        num_leaves: leaves per tree (default 8).
        early_stopping: patience in rounds on the held-out fold (default 50).
        seed: seed of the folds and of LightGBM (default 0).

    Attributes:
        models_: the fitted models as LightGBM's text format, one per fold (or one).
    """

    _STATE = state_names("lightgbm")

    def __init__(self, n_folds: int = 5, n_rounds: int = 100, max_depth: int = 3, num_leaves: int = 8,
                 early_stopping: int = 50, seed: int = 0):
        self.n_folds = n_folds
        self.n_rounds = n_rounds
        self.max_depth = max_depth
        self.num_leaves = num_leaves
        self.early_stopping = early_stopping
        self.seed = seed

    def _check_params(self):
        for name, least in (("n_rounds", 1), ("max_depth", 1), ("num_leaves", 2), ("early_stopping", 1), ("seed", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise UserError(f"{name} must be an integer >= {least}, got {v!r}")
        if isinstance(self.n_folds, bool) or not isinstance(self.n_folds, int) or self.n_folds == 1 or self.n_folds < 0:
            raise UserError(f"n_folds must be 0 (one model) or an integer >= 2, got {self.n_folds!r}")

    def _params(self, k: int) -> dict:
        p = {"objective": "binary" if k == 2 else "multiclass", "max_depth": self.max_depth,
             "num_leaves": self.num_leaves, "learning_rate": 0.1, "verbose": -1, "seed": self.seed,
             "deterministic": True, "force_row_wise": True, "num_threads": 1}
        if k > 2:
            p["num_class"] = k
        return p

    def _fit(self, z, y):
        lgb = _lightgbm()
        x, t, k = _features(z), y.cpu().numpy(), z.shape[1]
        params = self._params(k)
        if self.n_folds == 0:
            self.models_ = [lgb.train(params, lgb.Dataset(x, label=t), num_boost_round=self.n_rounds).model_to_string()]
            return
        if len(t) < self.n_folds:
            raise UserError(f"LightGBMCalibration: {len(t)} validation rows, fewer than n_folds = {self.n_folds}; "
                            "use n_folds=0 or more rows")
        fold = stratified_folds(t, self.n_folds, self.seed)
        models = []
        for f in range(self.n_folds):
            train, held = fold != f, fold == f
            dtrain = lgb.Dataset(x[train], label=t[train])
            dheld = lgb.Dataset(x[held], label=t[held], reference=dtrain)
            booster = lgb.train(params, dtrain, num_boost_round=self.n_rounds, valid_sets=[dheld],
                                callbacks=[lgb.early_stopping(self.early_stopping, verbose=False)])
            models.append(booster.model_to_string(num_iteration=booster.best_iteration or -1))
        self.models_ = models

    def _predict(self, z):
        lgb = _lightgbm()
        x = _features(z)
        boosters = getattr(self, "_boosters", None)
        if boosters is None or getattr(self, "_booster_src", None) is not self.models_:
            boosters = [lgb.Booster(model_str=m) for m in self.models_]
            self._boosters, self._booster_src = boosters, self.models_
        p = np.mean([b.predict(x, num_threads=1) for b in boosters], axis=0)
        g = torch.as_tensor(p, dtype=torch.float64, device=z.device)
        return ovr_rows(g[None, :] if z.shape[1] == 2 else g.T, z.shape[1])
