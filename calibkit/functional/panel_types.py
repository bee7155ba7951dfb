"""The result type of the metric panel's per-batch statistics, shared by the CPU path
(:mod:`calibkit.functional.panel`) and the device path (:mod:`calibkit.functional.panel_device`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from calibkit._validation import prob_sum_tol
from calibkit.functional.binning import BinSums

__all__ = ["PanelSums", "max_entries_above"]


@dataclass
class PanelSums:
    """What the panel metrics need from ``(probs, labels)``, see :func:`panel_sums`.

    Tensors live on the input's device.

    Attributes:
        top: top-label equal-width sums, shape ``(B,)``.
        conf: ``(N,)`` float64 top-label confidence (the exact upcast of ``max_k p_ik``).
        correct: ``(N,)`` bool, ``argmax_k p_ik == y_i`` (first index on ties).
        pred: ``(N,)`` int64 ``argmax_k p_ik``.
        labels: ``(N,)`` int64 labels of the rows (clamped to ``[0, K)`` on the device path).
        n: number of samples that count (python int, or a 0-dim float64 tensor on the device path).
        weight: ``(N,)`` float64 0/1 weight of each row (device path with ``ignore_index``), else ``None``.
        check: ``(5,)`` float64 ``[min p, max p, max |row sum - 1|, min label, max label]`` over the
            rows that count, when the values are still to be checked (device path), else ``None``.
        classwise: classwise equal-width sums ``(K, B)``, or ``None``.
        nll: 0-dim float64 ``sum_i -log max(p_{i, y_i}, tiny)``, or ``None``.
        brier: 0-dim float64 ``sum_i (sum_k p_ik^2 - 2 p_{i, y_i} + 1)``, or ``None``.
        dense, binary: the input layout (see :class:`calibkit.functional.inputs.Rows`).
        k: the number of classes ``K``.
        dtype: the dtype of the probabilities (their row-sum tolerance depends on it).
        pending: the top label's bins, the classwise sums, NLL and Brier still being computed on
            helper threads (``panel_sums(..., defer=True)`` on the CPU; ``top`` is ``None`` until
            then), else ``None``: see :meth:`settle`.
    """

    top: BinSums
    conf: torch.Tensor
    correct: torch.Tensor
    pred: torch.Tensor
    labels: torch.Tensor
    n: int | torch.Tensor
    weight: torch.Tensor | None = None
    check: torch.Tensor | None = None
    classwise: BinSums | None = None
    nll: torch.Tensor | None = None
    brier: torch.Tensor | None = None
    dense: bool = False
    binary: bool = False
    k: int = 0
    dtype: torch.dtype = torch.float32
    pending: Any = None

    def settle(self) -> PanelSums:
        """Wait for the pending part, if any, and fill ``top``, ``classwise``, ``nll`` and ``brier``."""
        if self.pending is not None:
            self.top, self.classwise, self.nll, self.brier = self.pending.result()
            self.pending = None
        return self


def max_entries_above(n_bins: int, dtype: torch.dtype) -> int:
    """Most entries above ``1 / B`` that a row summing to at most ``1 + tol`` can hold:
    ``c`` of them sum to more than ``c / B``, so ``c < B (1 + tol)``."""
    return math.ceil(n_bins * (1 + prob_sum_tol(dtype))) - 1
