"""The folds of cross-fitting and the out-of-fold predictions of one calibrator.

Shared by :mod:`calibkit.calibrators.crossfit` (every candidate of a selection) and
:mod:`calibkit.calibrators.stack` (the stack's own fit), so both cut the rows and fit the folds the
same way.
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext

import torch

from calibkit.calibrators._base import lbfgs_ftol
from calibkit.calibrators.registry import CALIBRATORS
from calibkit.calibrators.structured import StructuredMatrixScaling, StructuredVectorScaling
from calibkit.errors import UserError

__all__ = ["FOLD_FTOL", "TO_TOLERANCE", "folds", "two_column", "uncalibrated", "out_of_fold"]

#: The fold fits' stop on the relative decrease of the objective (:func:`calibkit.calibrators._base.lbfgs_ftol`)
#: for the calibrators of :data:`TO_TOLERANCE`; every other fit keeps ``1e-12``. On the 8 real-outputs models
#: their cross-fitted NLL moved by at most 2.0e-5 and no choice changed (docs/calibrators.md, "Speed").
FOLD_FTOL = 1e-8
#: The calibrators whose fits run to the solver's tolerance (a strictly convex objective; ``max_iter`` a
#: safeguard), so that a looser stop of their warm-started fold fits only leaves them a little farther
#: from one optimum. The maps whose iteration cap is part of their definition (vector, matrix and Dirichlet
#: scaling stop at ``max_iter`` on real outputs) keep the full stop: on MNIST a looser one moved Dirichlet
#: calibration's cross-fitted NLL by 0.003 and changed the choice (docs/calibrators.md, "Speed").
TO_TOLERANCE = (StructuredVectorScaling, StructuredMatrixScaling)



def folds(n: int, n_folds: int, seed: int) -> list[torch.Tensor]:
    """``n_folds`` disjoint sorted index sets covering ``range(n)`` (a seeded permutation cut into near-equal parts)."""
    if n < n_folds:
        raise UserError(f"cross-fitting needs at least n_folds = {n_folds} validation rows, got {n}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return [part.sort().values for part in perm.tensor_split(n_folds)]


def two_column(p: torch.Tensor) -> torch.Tensor:
    """Float64 ``(N, K)`` probabilities; binary ``(N,)`` positive-class ones as ``(N, 2)``."""
    p = p.double()
    return torch.stack([1 - p, p], 1) if p.dim() == 1 else p


def uncalibrated(logits: torch.Tensor) -> torch.Tensor:
    """The model's own probabilities: softmax of ``(N, K)`` logits, sigmoid of binary ``(N,)`` ones."""
    return torch.sigmoid(logits) if logits.dim() == 1 else torch.softmax(logits, 1)


def out_of_fold(name: str, x: torch.Tensor, y: torch.Tensor, parts: list[torch.Tensor], full) -> torch.Tensor:
    """Out-of-fold probabilities of calibrator ``name``: each part of ``parts`` predicted by a fit on
    the other rows, warm-started from ``full`` (its fit on all the rows) where the class takes ``init``."""
    out = torch.empty((x.shape[0],) + tuple(x.shape[1:]), dtype=torch.float64)
    everything = torch.arange(x.shape[0])
    cls = CALIBRATORS[name]
    # the protocol requires fit(logits, labels) only: a registered calibrator without a warm start is fitted cold
    warm = {"init": full} if "init" in inspect.signature(cls.fit).parameters else {}
    for held in parts:
        keep = torch.ones(x.shape[0], dtype=torch.bool)
        keep[held] = False
        with lbfgs_ftol(FOLD_FTOL) if issubclass(cls, TO_TOLERANCE) else nullcontext():
            cal = cls().fit(x[everything[keep]], y[keep], **warm)
        out[held] = cal.predict_proba(x[held]).double()
    return out
