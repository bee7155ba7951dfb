"""Every statistic of the metric panel from one pass over the probabilities.

:func:`panel_sums` is the fused entry point of the metrics: it accepts every input layout of
:mod:`calibkit.functional.inputs` (multiclass, binary 1-D, dense with ``ignore_index``) and
returns the per-bin sums, the per-sample top label and the NLL/Brier sums. CPU tensors take a
blocked numpy path (:mod:`calibkit.functional.panel_cpu`); tensors on other devices take the whole-tensor torch path of
:mod:`calibkit.functional.panel_device`, which never waits for the device.
"""

from __future__ import annotations

import torch

from calibkit._validation import _check_layout, check_probs_layout, probs_error
from calibkit.errors import UserError
from calibkit.functional.binning import BinSums
from calibkit.functional.inputs import to_rows
from calibkit.functional.panel_cpu import panel_sums_cpu
from calibkit.functional.panel_device import classwise_torch, panel_sums_torch
from calibkit.functional.panel_types import PanelSums

__all__ = ["PanelSums", "panel_sums", "raise_for_check", "classwise_bin_sums"]

# Tests set this to drive the device path with CPU tensors.
_FORCE_TORCH_PATH = False


def raise_for_check(check, dtype: torch.dtype, num_classes: int, name: str = "probs") -> None:
    """Raise the error of :func:`calibkit._validation.check_probs` / ``check_labels`` for the
    statistics ``check`` of :class:`PanelSums` (moved to the host here), or return."""
    lo, hi, dev, y_lo, y_hi = (float(v) for v in check.cpu())
    err = probs_error(name, lo, hi, dev, dtype)
    if err is not None:
        raise err
    if y_lo < 0 or y_hi >= num_classes:
        bad = int(y_lo) if y_lo < 0 else int(y_hi)
        raise UserError(f"labels out of range: found {bad}, expected values in [0, {num_classes - 1}]")


def use_torch_path(t: torch.Tensor) -> bool:
    """True when ``t`` takes the whole-tensor torch path (any device but the CPU)."""
    return t.device.type != "cpu" or _FORCE_TORCH_PATH


def panel_sums(probs, labels, n_bins: int, full: bool = True, ignore_index: int | None = None,
               allow_empty: bool = False, exact: bool = False, defer: bool = False) -> PanelSums | None:
    """Check the layout of ``(probs, labels)`` and compute the panel's statistics.

    Layouts: ``(N, K)``, binary ``(N,)``, dense ``(N, K, *spatial)`` (see
    :mod:`calibkit.functional.inputs`). On the CPU the values are validated here (the errors of
    :func:`calibkit._validation.check_probs`); on other devices they are reduced on the device
    into ``check`` for the caller to test when it next reads results (:func:`raise_for_check`).
    With ``full=False`` only the top-label part is computed. When every label equals
    ``ignore_index`` (CPU) this raises, or returns ``None`` with ``allow_empty``. ``exact``
    (device path only): the classwise gather reads its size from the device first
    (:func:`calibkit.functional.panel_device.classwise_torch`). ``defer`` (CPU path, ``full``):
    the classwise sums, NLL and Brier may be left running on helper threads; call
    :meth:`PanelSums.settle` before reading them (:func:`calibkit.functional.panel_cpu.panel_sums_cpu`).
    """
    probe = probs if isinstance(probs, torch.Tensor) else torch.zeros(0)
    torch_path = use_torch_path(probe)
    rows = to_rows(probs, labels, ignore_index, compact=not torch_path)
    if torch_path:
        x, y = _layout(rows.probs, rows.labels)
        valid = None if rows.valid is None else rows.valid.to(x.device)  # labels may be on the host
        out = panel_sums_torch(x, y, n_bins, full, valid=valid, exact=exact)
    else:
        if ignore_index is not None and rows.labels.numel() == 0:
            if allow_empty:
                return None
            raise UserError(f"no samples to evaluate: every label equals ignore_index={ignore_index}")
        x, y = check_probs_layout(rows.probs, rows.labels)
        out = panel_sums_cpu(x, y, n_bins, full, defer=defer)
    out.dense, out.binary, out.k, out.dtype = rows.dense, rows.binary, x.shape[1], x.dtype
    return out


def _layout(probs, labels):
    """Shape/dtype checks without reading values (no host synchronisation)."""
    probs = _check_layout(probs, "probs")
    if labels.dim() != 1:
        raise UserError(f"labels must have shape (N,), got {tuple(labels.shape)}")
    if labels.dtype.is_floating_point or labels.dtype == torch.bool or labels.dtype.is_complex:
        raise UserError(f"labels must hold integer class indices, got dtype {labels.dtype}")
    if labels.shape[0] != probs.shape[0]:
        raise UserError(f"labels has {labels.shape[0]} entries but the predictions have {probs.shape[0]} rows")
    return probs, labels.to(probs.device).long()


def classwise_bin_sums(probs: torch.Tensor, labels: torch.Tensor, n_bins: int) -> BinSums:
    """Classwise equal-width statistics of valid ``probs`` ``(N, K)``, each float64 ``(K, B)``.

    ``count[k, b]`` and ``conf[k, b]`` are the number and the sum of the ``p_ik`` in bin ``b``
    (edges in ``probs.dtype``), ``correct[k, b]`` the number of those samples labelled ``k``.
    Whole-tensor torch implementation (:mod:`calibkit.functional.panel_device`).
    """
    return classwise_torch(probs, labels.long(), n_bins)
