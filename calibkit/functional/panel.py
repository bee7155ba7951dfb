"""Every statistic of the metric panel from one pass over the probabilities.

:func:`panel_sums` is the fused entry point of the metrics: it accepts every input layout of
:mod:`calibkit.functional.inputs` (multiclass, binary 1-D, dense with ``ignore_index``) and
returns the per-bin sums, the per-sample top label and the NLL/Brier sums. CPU tensors take a
blocked numpy path (below); tensors on other devices take the whole-tensor torch path of
:mod:`calibkit.functional.panel_device`, which never waits for the device.
"""

from __future__ import annotations

import numpy as np
import torch

from calibkit._validation import check_probs, check_probs_layout, probs_error, probs_within_tolerance
from calibkit.errors import UserError
from calibkit.functional.binning import BinSums, _count_below, equal_width_edges
from calibkit.functional.inputs import to_rows
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
               allow_empty: bool = False, exact: bool = False) -> PanelSums | None:
    """Check the layout of ``(probs, labels)`` and compute the panel's statistics.

    Layouts: ``(N, K)``, binary ``(N,)``, dense ``(N, K, *spatial)`` (see
    :mod:`calibkit.functional.inputs`). On the CPU the values are validated here (the errors of
    :func:`calibkit._validation.check_probs`); on other devices they are reduced on the device
    into ``check`` for the caller to test when it next reads results (:func:`raise_for_check`).
    With ``full=False`` only the top-label part is computed. When every label equals
    ``ignore_index`` (CPU) this raises, or returns ``None`` with ``allow_empty``. ``exact``
    (device path only): the classwise gather reads its size from the device first
    (:func:`calibkit.functional.panel_device.classwise_torch`).
    """
    probe = probs if isinstance(probs, torch.Tensor) else torch.zeros(0)
    torch_path = use_torch_path(probe)
    rows = to_rows(probs, labels, ignore_index, compact=not torch_path)
    if torch_path:
        from calibkit.functional.panel_device import panel_sums_torch

        x, y = _layout(rows.probs, rows.labels)
        valid = None if rows.valid is None else rows.valid.to(x.device)  # labels may be on the host
        out = panel_sums_torch(x, y, n_bins, full, valid=valid, exact=exact)
    else:
        if ignore_index is not None and rows.labels.numel() == 0:
            if allow_empty:
                return None
            raise UserError(f"no samples to evaluate: every label equals ignore_index={ignore_index}")
        x, y = check_probs_layout(rows.probs, rows.labels)
        out = _panel_sums_cpu(x, y, n_bins, full)
    out.dense, out.binary, out.k, out.dtype = rows.dense, rows.binary, x.shape[1], x.dtype
    return out


def _layout(probs, labels):
    """Shape/dtype checks without reading values (no host synchronisation)."""
    from calibkit._validation import _check_layout

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
    from calibkit.functional.panel_device import classwise_torch

    return classwise_torch(probs, labels.long(), n_bins)


# A block of rows this large stays in a core's L2 cache (2 MiB per core on the benchmark machine)
# while the ~10 reductions of a block read it again.
_BLOCK_BYTES = 1 << 20


def _panel_sums_cpu(probs, labels, n_bins: int, full: bool) -> PanelSums:
    """The CPU path of :func:`panel_sums`: one pass over blocks of rows of ``probs`` ``(N, K)``.

    Each block (about 1 MiB, so it stays in cache) is read by a few numpy reductions
    (:func:`_cpu_block`), instead of a dozen passes over the whole matrix. Blocks are spread over
    ``torch.get_num_threads()`` threads (numpy releases the GIL in its loops); their partial
    sums are added in block order, so the result does not depend on the number of threads.
    Per block:

    * validation: the minimum entry, the row sums (float32 for half and float32 input) and the
      row maxima; a block outside the tolerance hands over to ``check_probs`` for the error;
    * top label: ``argmax`` per row (first index on ties), the maximum gathered from it;
    * ``full``: ``p_y`` gathered (NLL; Brier as ``sum p^2 - 2 p_y + 1``, the sum of squares per
      row in the input precision), the classwise sums of the entries above ``1 / B`` only (a row
      summing to 1 has fewer than ``B (1 + tol)`` of them; bin 0 of a class is its column total
      minus its other bins), the labelled entries' bins, and the column totals as sums of 16-row
      float32 groups added in float64.

    Half-precision blocks are upcast to float32 and compared with the edges rounded to the input
    dtype (then upcast, exactly), which gives the bins of the input dtype.
    """
    n, k = probs.shape
    work = torch.float32 if probs.dtype in (torch.float16, torch.bfloat16) else probs.dtype
    inner = equal_width_edges(n_bins, probs.dtype)[1:-1].to(work).numpy()  # inner edges
    y_all = labels.cpu().numpy()
    rows = max(16, _BLOCK_BYTES // (k * work.itemsize) // 16 * 16)  # a multiple of 16
    conf, correct, pred_all = np.empty(n, np.float64), np.empty(n, bool), np.empty(n, np.int64)
    kb = k * n_bins
    cw_count, cw_hit = np.zeros(kb, np.int64), np.zeros(kb, np.int64)
    cw_conf, col_total = np.zeros(kb), np.zeros(k)
    nll = brier = 0.0
    src = probs.detach()

    def block(start):
        return _cpu_block(src, y_all, start, rows, work, inner, probs, full, n_bins, conf, correct, pred_all)

    starts = range(0, n, rows)
    threads = min(torch.get_num_threads(), len(starts))
    if threads > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(threads) as pool:
            parts = list(pool.map(block, starts))  # in block order; the first failing block raises
    else:
        parts = [block(start) for start in starts]
    if full:
        for part in parts:  # in block order: the same sums for any number of threads
            nll += part["nll"]
            brier += part["brier"]
            if part["cw_count"] is not None:
                cw_count += part["cw_count"]
                cw_conf += part["cw_conf"]
            cw_hit += part["cw_hit"]
            col_total += part["col_total"]
    bins = _count_below(conf, inner.astype(np.float64))  # exact upcasts: same bins
    top = BinSums(
        count=torch.from_numpy(np.bincount(bins, minlength=n_bins).astype(np.float64)),
        conf=torch.from_numpy(np.bincount(bins, weights=conf, minlength=n_bins)),
        correct=torch.from_numpy(np.bincount(bins, weights=correct, minlength=n_bins)),
    )
    out = PanelSums(top=top, conf=torch.from_numpy(conf), correct=torch.from_numpy(correct),
                    pred=torch.from_numpy(pred_all), labels=labels, n=n)
    if full:
        count = cw_count.astype(np.float64).reshape(k, n_bins)
        conf_kb = cw_conf.reshape(k, n_bins)
        count[:, 0] = n - count[:, 1:].sum(1)
        conf_kb[:, 0] = col_total - conf_kb[:, 1:].sum(1)
        out.classwise = BinSums(
            count=torch.from_numpy(count),
            conf=torch.from_numpy(conf_kb),
            correct=torch.from_numpy(cw_hit.astype(np.float64).reshape(k, n_bins)),
        )
        out.nll = torch.tensor(nll, dtype=torch.float64)
        out.brier = torch.tensor(brier, dtype=torch.float64)
    return out


def _cpu_block(src, y_all, start, rows, work, inner, probs, full, n_bins, conf, correct, pred_all) -> dict:
    """One block of :func:`_panel_sums_cpu`: fills its rows of ``conf``, ``correct`` and
    ``pred_all`` and returns its partial sums."""
    x = np.ascontiguousarray(src[start : start + rows].to(work).numpy())
    y = y_all[start : start + rows]
    r, k = x.shape
    flat, at = x.reshape(-1), np.arange(0, r * k, k)  # gathers by flat index: a 1-D take is cheapest
    pred = x.argmax(1)  # first index of the maximum; NaN wins, and fails the check below
    m = flat.take(at + pred)
    dev = np.abs(np.einsum("ij->i", x) - 1).max()
    if not probs_within_tolerance(x.min(), m.max(), dev, probs.dtype):
        check_probs(probs)  # raises its error (unless a rounding tie at the tolerance flips it)
    conf[start : start + r] = m
    correct[start : start + r] = pred == y
    pred_all[start : start + r] = pred
    if not full:
        return {}
    kb = k * n_bins
    p_y = flat.take(at + y)
    p_y64 = p_y.astype(np.float64)
    part = {"nll": -np.log(np.maximum(p_y64, torch.finfo(probs.dtype).tiny)).sum(),
            "brier": (np.einsum("ij,ij->i", x, x).astype(np.float64) - 2 * p_y64 + 1).sum(),
            "cw_count": None, "cw_conf": None}
    if n_bins > 1:
        hit = np.flatnonzero(x > inner[0])  # the entries above 1 / B, compared in `work`
        vals = flat.take(hit)
        slot = hit % k * n_bins + _count_below(vals, inner)
        part["cw_count"] = np.bincount(slot, minlength=kb)
        part["cw_conf"] = np.bincount(slot, weights=vals, minlength=kb)
    part["cw_hit"] = np.bincount(y * n_bins + _count_below(p_y, inner), minlength=kb)
    grouped = r // 16 * 16
    part["col_total"] = (x[:grouped].reshape(-1, 16, k).sum(1).astype(np.float64).sum(0)
                         + x[grouped:].astype(np.float64).sum(0))
    return part
