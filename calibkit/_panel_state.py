"""The mergeable state behind the panel: shared by :class:`calibkit.metrics.CalibrationAccumulator`
and the torchmetrics adapter (:mod:`calibkit.integrations.torchmetrics`).

State, all float64 on the device of the data:

* ``sums``: one flat vector, summed over batches and over processes (one all-reduce):
  ``[N, N_dense, sum correct, sum -log p_y, sum Brier]``, the equal-width top-label sums
  ``(3, B)`` (count, confidence, correct), the classwise sums ``(3, K, B)``, optionally the fine
  confidence histogram ``(3, FINE_BINS)`` (fixed-memory AECE) and the confusion matrix ``(K, K)``
  (mean IoU);
* ``check``: ``[-min p, max p, max |row sum - 1| / tol, -min label, max label]``, combined by
  maximum, for value checks deferred on accelerators (all entries -inf until a device batch);
* per sample (exact AECE only): top-label confidence, correctness and 0/1 weight.

The sort-based entries come from one sort of the confidences into blocks of ties
(:func:`calibkit.functional.estimators.tie_blocks`): smooth ECE, the sweep, KS, AURC, E-AURC and
AUGRC are functions of the blocks, and on the CPU AECE's equal-mass edges (order statistics) are
read from them instead of a second selection. This part runs on the calling thread. On the CPU
with two threads or more, a large batch's classwise sums, NLL and Brier are computed by helper
threads while the caller works out the top label and then this sort-based part
(:mod:`calibkit.functional.panel_cpu`): ``panel_from_state`` asks for the sums only once the
sort-based part is done. Measured on 2 cores (docs/performance.md): running the sort-based
estimators themselves as jobs on a thread pool cost more CPU time than it saved wall time (the
jobs hand the GIL back and forth between many short numpy calls), while the full part, a few long
numpy calls per 2 MiB block, overlaps well with them. Nothing process-global is changed here, so
the panel may run in several threads of the caller at once.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from calibkit._validation import prob_sum_tol, probs_error
from calibkit.errors import UserError
from calibkit.functional.binning import (
    FINE_BINS,
    BinSums,
    binned_errors,
    equal_mass_sums,
    fine_bin_index,
    weighted_equal_mass_bins,
)
from calibkit.functional.estimators import block_estimators, tie_blocks
from calibkit.functional.iou import confusion_matrix, iou_from_confusion
from calibkit.functional.panel_device import scatter_sums
from calibkit.functional.selective import block_areas

__all__ = ["Layout", "batch_vector", "fold_check", "neutral_check", "panel_from_state"]

_HEAD = 5  # N, N_dense, correct, nll, brier
_SPLIT_BLOCKS = 1 << 16  # tie blocks from which the sort-based part is split over two threads


class Layout:
    """Offsets of the parts of the flat ``sums`` vector for ``B`` bins and ``K`` classes."""

    def __init__(self, n_bins: int, k: int, hist: bool, confusion: bool):
        self.n_bins, self.k, self.hist, self.confusion = n_bins, k, hist, confusion
        sizes = {"head": _HEAD, "bins": 3 * n_bins, "classwise": 3 * k * n_bins,
                 "hist": 3 * FINE_BINS if hist else 0, "confusion": k * k if confusion else 0}
        self.slices, start = {}, 0
        for name, size in sizes.items():
            self.slices[name] = slice(start, start + size)
            start += size
        self.size = start

    def view(self, sums: torch.Tensor, name: str) -> torch.Tensor:
        part = sums[self.slices[name]]
        shapes = {"bins": (3, self.n_bins), "classwise": (3, self.k, self.n_bins), "hist": (3, FINE_BINS),
                  "confusion": (self.k, self.k)}
        return part.view(shapes[name]) if name in shapes else part


def neutral_check(device=None) -> torch.Tensor:
    return torch.full((5,), float("-inf"), dtype=torch.float64, device=device)


def fold_check(check: torch.Tensor, s) -> torch.Tensor:
    """Combine the running ``check`` with a batch's :class:`PanelSums` ``check`` (no host sync)."""
    lo, hi, dev, y_lo, y_hi = s.check.to(check.device).unbind()
    tol = prob_sum_tol(s.dtype)
    return torch.maximum(check, torch.stack([-lo, hi, dev / tol, -y_lo, y_hi]))


def batch_vector(layout: Layout, s) -> torch.Tensor:
    """A batch's contribution to ``sums`` (on the batch's device) from its :class:`PanelSums`."""
    dev = s.conf.device
    n = torch.as_tensor(s.n, dtype=torch.float64, device=dev).reshape(1)
    head = torch.cat([n, n * float(s.dense), torch.stack([s.top.correct.sum(), s.nll, s.brier])])
    parts = [head, torch.stack([s.top.count, s.top.conf, s.top.correct]).reshape(-1),
             torch.stack([s.classwise.count, s.classwise.conf, s.classwise.correct]).reshape(-1)]
    if layout.hist:
        w = torch.ones_like(s.conf) if s.weight is None else s.weight
        src = torch.stack([w, s.conf * w, s.correct.double() * w], 1)
        parts.append(scatter_sums(fine_bin_index(s.conf), src, FINE_BINS).T.reshape(-1))
    if layout.confusion:
        parts.append(confusion_matrix(s.pred, s.labels, layout.k, s.weight).reshape(-1))
    return torch.cat(parts)


def _hist_aece_sums(hist: torch.Tensor, n_bins: int) -> BinSums:
    """Equal-mass bins over the fine histogram: each fine bin is a block of tied confidences."""
    order = torch.arange(FINE_BINS, dtype=torch.float64, device=hist.device)
    bins = weighted_equal_mass_bins(order, hist[0][None], n_bins)[0]
    out = scatter_sums(bins, hist.T.contiguous(), n_bins, lanes=1)
    return BinSums(out[:, 0], out[:, 1], out[:, 2])


def panel_from_state(layout: Layout, sums, check, conf=(), correct=(), weight=()) -> dict[str, float]:
    """The panel (python floats) from the state; one device-to-host transfer.

    ``sums`` is the state's sums, or a callable returning them: on the CPU in the exact state (all
    values already checked) it is called after the sort-based part, so batches whose sums are
    still being computed on helper threads (:meth:`calibkit.metrics.CalibrationAccumulator.update`)
    finish meanwhile.
    """
    n_bins, k = layout.n_bins, layout.k
    c = ok = w = aece = done = None
    if not layout.hist:
        c, ok, w = _samples(conf, correct, weight, check.device)
        # the sort-based part first (see the docstring), unless a batch left its value checks
        # to be raised below (device path): bad values must raise before anything reads them
        if check.device.type == "cpu" and c.numel() and float(check[1]) == float("-inf"):
            done = _sorted_part(layout, None, c, ok, w, with_aece=True)
    sums = sums() if callable(sums) else sums
    device = sums.device.type
    if layout.hist:
        aece = _hist_aece_sums(layout.view(sums, "hist"), n_bins)
    else:
        assert c is not None and ok is not None
        if device != "cpu" or not c.numel():  # on the device, to come back in the one transfer
            zeros = BinSums(*torch.zeros(3, n_bins, dtype=torch.float64))
            aece = equal_mass_sums(c, ok, n_bins, w) if c.numel() else zeros
    parts = [sums, check.to(sums.device)]
    if aece is not None:
        parts.append(torch.stack([aece.count, aece.conf, aece.correct]).reshape(-1).to(sums.device))
    host = torch.cat(parts).cpu()  # the one transfer
    sums, check = host[: layout.size], host[layout.size : layout.size + 5]
    _raise_for(check, k, device)
    head = layout.view(sums, "head")
    n = float(head[0])
    if n == 0:
        raise UserError("no samples accumulated (N = 0): call update() with data first")
    if done is None:  # the one sort (exact state; a second transfer off the CPU), on this thread
        done = _sorted_part(layout, sums, c, ok, w, with_aece=aece is None)
    aece = BinSums(*host[layout.size + 5 :].view(3, n_bins)) if aece is not None else done["aece"]
    errors = binned_errors(BinSums(*layout.view(sums, "bins")))
    cw = layout.view(sums, "classwise")
    out = {"acc": float(head[2] / n), "ece": float(errors["ece"]), "aece": float(binned_errors(aece)["ece"]),
           "cece": float((cw[2] - cw[1]).abs().sum() / (n * k))}
    for key in ("mce", "rmsce", "o_ece", "u_ece"):
        out[key] = float(errors[key])
    out["nll"], out["brier"] = float(head[3] / n), float(head[4] / n)
    for key in ("smece", "ece_sweep", "ks"):
        out[key] = done[key]
    out.update(done["areas"])
    if layout.confusion and float(head[1]) > 0:
        out["miou"] = float(iou_from_confusion(layout.view(sums, "confusion")))
    return out


def _sorted_part(layout: Layout, host_sums, c, ok, w, with_aece: bool) -> dict:
    """Everything read from the tie blocks (one sort): smooth ECE, the sweep, KS, the selective
    areas, and with ``with_aece`` (CPU samples, exact state) AECE, whose equal-mass edges are
    order statistics."""
    blocks = _blocks(layout, host_sums, c, ok, w)

    def second():
        done = {"areas": block_areas(*blocks)}
        if with_aece:
            done["aece"] = equal_mass_sums(c, ok, layout.n_bins, w, blocks=None if w is not None else blocks)
        return done

    if torch.get_num_threads() > 1 and len(blocks[0]) > _SPLIT_BLOCKS:
        with ThreadPoolExecutor(1) as pool:
            half = pool.submit(second)
            done = block_estimators(*blocks)
            done.update(half.result())
        return done
    return {**block_estimators(*blocks), **second()}


def _samples(conf, correct, weight, device):
    """The exact state's per-sample arrays, concatenated: ``(conf, correct, weight or None)``."""
    c = _cat(conf, torch.float64, device)
    ok = _cat(correct, torch.bool, device)
    w = None
    if any(wi is not None for wi in weight):
        w = torch.cat([torch.ones_like(ci) if wi is None else wi for ci, wi in zip(conf, weight)])
    return c, ok, w


def _cat(parts, dtype, device) -> torch.Tensor:
    """``torch.cat(parts)``; one batch (:func:`calibkit.metrics.evaluate`) is returned as it is, not copied."""
    if len(parts) == 1:
        return parts[0]
    return torch.cat(list(parts)) if parts else torch.zeros(0, dtype=dtype, device=device)


def _blocks(layout: Layout, host_sums, c, ok, w):
    """Tie blocks of the top-label confidences for :func:`block_estimators`: from the samples
    (exact state; moved to the host in a second transfer), or the non-empty fine-histogram bins
    at their mean confidence (fixed state: exact when no fine bin holds two different values)."""
    if not layout.hist:
        return tie_blocks(c, ok, w)
    count, conf, correct = (t.numpy() for t in layout.view(host_sums, "hist"))
    keep = count > 0
    return conf[keep] / count[keep], count[keep], correct[keep]


def _raise_for(check: torch.Tensor, k: int, device: str) -> None:
    neg_lo, hi, ratio, neg_y_lo, y_hi = (float(v) for v in check)
    if hi == float("-inf"):  # no batch left its checks to the device
        return
    lo, y_lo = -neg_lo, -neg_y_lo
    err = probs_error("probs", lo, hi, 0.0, torch.float64)
    if err is None and not ratio <= 1:
        err = UserError(f"probs rows must sum to 1 (largest deviation {ratio:.3g} times the tolerance of their "
                         "dtype); if these are logits, pass softmax(logits) instead")
    if err is None and (y_lo < 0 or y_hi >= k):
        bad = int(y_lo) if y_lo < 0 else int(y_hi)
        err = UserError(f"labels out of range: found {bad}, expected values in [0, {k - 1}]")
    if err is not None:
        raise UserError(f"{err} [checked on the {device} device when computing; the state holds the bad batch: "
                         "reset it]")
