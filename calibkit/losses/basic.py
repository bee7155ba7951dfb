"""The stateless losses: one call of a :mod:`calibkit.functional.losses` function each.

Each module also takes dense logits ``(N, K, *S)`` with targets ``(N, *S)``; pixels whose target
is ``ignore_index`` (default 255, an attribute of the module, given by the caller, not in the
spec: ``losses.build("ce", ignore_index=0)``) are left out and the loss is the mean over the valid
pixels.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

import calibkit.functional.losses as FL
from calibkit.errors import UserError
from calibkit.functional.pixels import check_ignore_index

IGNORE_INDEX = FL.IGNORE_INDEX


def _probe(fn, **hparams) -> None:
    """Validate hyperparameters at construction by one call on a 1 x 2 input (same checks as training)."""
    fn(torch.zeros(1, 2), torch.zeros(1, dtype=torch.long), **hparams)


class _Stateless(nn.Module):
    """Calls ``fn(logits, targets, **hparams, ignore_index=...)``; the hyperparameters are plain attributes.

    ``ignore_index`` (dense inputs only) is kept apart from ``hparams``: it describes the data,
    not the method.
    """

    # any loss function of calibkit.functional.losses; each subclass names its own
    fn: Callable[..., torch.Tensor] = staticmethod(FL.cross_entropy)
    needs_features = False

    def __init__(self, ignore_index: int | None = IGNORE_INDEX, **hparams):
        super().__init__()
        _probe(self.fn, **hparams)
        self.hparams = hparams
        self.ignore_index = check_ignore_index(ignore_index)

    def forward(self, logits, targets, features=None):  # features: accepted and ignored
        return self.fn(logits, targets, **self.hparams, ignore_index=self.ignore_index)

    def extra_repr(self) -> str:
        items = [f"{k}={v}" for k, v in self.hparams.items()]
        if self.ignore_index != IGNORE_INDEX:
            items.append(f"ignore_index={self.ignore_index}")
        return ", ".join(items)


class CrossEntropy(_Stateless):
    """Cross-entropy ``-log p_y``; see :func:`calibkit.functional.cross_entropy`."""

    fn = staticmethod(FL.cross_entropy)

    def __init__(self, ignore_index: int | None = IGNORE_INDEX):
        super().__init__(ignore_index)


class LabelSmoothing(_Stateless):
    """Label smoothing, default ``alpha=0.05``; see :func:`calibkit.functional.label_smoothing`."""

    fn = staticmethod(FL.label_smoothing)

    def __init__(self, alpha: float = 0.05, ignore_index: int | None = IGNORE_INDEX):
        super().__init__(ignore_index, alpha=alpha)


class Focal(_Stateless):
    """Focal loss, default ``gamma=3``; see :func:`calibkit.functional.focal`."""

    fn = staticmethod(FL.focal)

    def __init__(self, gamma: float = 3.0, ignore_index: int | None = IGNORE_INDEX):
        super().__init__(ignore_index, gamma=gamma)


class FLSD(_Stateless):
    """FLSD-53 (gamma 5 if detached ``p_y < 0.2`` else 3); see :func:`calibkit.functional.flsd`."""

    fn = staticmethod(FL.flsd)

    def __init__(self, ignore_index: int | None = IGNORE_INDEX):
        super().__init__(ignore_index)


class ECP(_Stateless):
    """Confidence penalty ``CE - beta H(p)/K``, default ``beta=0.1``; see :func:`calibkit.functional.ecp`."""

    fn = staticmethod(FL.ecp)

    def __init__(self, beta: float = 0.1, ignore_index: int | None = IGNORE_INDEX):
        super().__init__(ignore_index, beta=beta)


class MbLS(_Stateless):
    """Margin-based label smoothing, defaults ``margin=10, lam=0.1``; see :func:`calibkit.functional.mbls`."""

    fn = staticmethod(FL.mbls)

    def __init__(self, margin: float = 10.0, lam: float = 0.1, ignore_index: int | None = IGNORE_INDEX):
        super().__init__(ignore_index, margin=margin, lam=lam)


class ACLS(_Stateless):
    """ACLS, defaults ``alpha=0.1, lam1=1, lam2=0.1, margin=10``; see :func:`calibkit.functional.acls`."""

    fn = staticmethod(FL.acls)

    def __init__(self, alpha: float = 0.1, lam1: float = 1.0, lam2: float = 0.1, margin: float = 10.0,
                 ignore_index: int | None = IGNORE_INDEX):
        super().__init__(ignore_index, alpha=alpha, lam1=lam1, lam2=lam2, margin=margin)


class DualFocal(_Stateless):
    """Dual focal loss, default ``gamma=5``; see :func:`calibkit.functional.dual_focal`."""

    fn = staticmethod(FL.dual_focal)

    def __init__(self, gamma: float = 5.0, ignore_index: int | None = IGNORE_INDEX):
        super().__init__(ignore_index, gamma=gamma)


def _check_classes(logits: torch.Tensor, num_classes: int, who: str) -> None:
    if logits.shape[1] != num_classes:
        raise UserError(f"{who} was built for num_classes={num_classes} but logits have {logits.shape[1]} columns")


def _check_num_classes(num_classes) -> int:
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise UserError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    return num_classes


