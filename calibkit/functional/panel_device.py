"""The panel's statistics with whole-tensor torch operations, for tensors on any device.

Designed for accelerators: a fixed number of kernels per call, every output of a size known in
advance, and **no host synchronisation** (no ``.item()``, no ``bool(tensor)``, no data-dependent
shapes such as ``nonzero`` or ``bincount`` on CUDA). Consequences:

* the value checks (range, row sums, label range) are reduced on the device into a ``check``
  vector that the caller tests when it next reads results (:func:`calibkit.functional.panel.raise_for_check`);
* per-bin sums are ``index_add_`` into ``L`` interleaved copies of the output (row ``i`` adds to
  copy ``i mod L``), summed at the end: fixed size, and ``L`` times less contention on the
  atomic additions of crowded bins (most confidences fall in the last bin);
* ignored rows (``ignore_index``) are not removed but weighted 0, their values replaced by 0
  before any sum (a NaN or an infinity there must not reach a sum: ``NaN * 0`` is NaN);
* the classwise entries above ``1 / B`` (at most ``c_max < B (1 + tol)`` per row) are gathered
  with ``torch.nonzero_static`` into a buffer of ``c_max`` slots per row, the unused slots
  weighted 0 and spread over all bins.

The results equal the CPU path's (same bins, float64 sums; the summation order differs, so sums
agree to float64 rounding), which the tests check by running these functions on CPU tensors.
"""

from __future__ import annotations

import torch

from calibkit._validation import upcast
from calibkit.functional.binning import BinSums, equal_width_edges, scatter_sums
from calibkit.functional.panel_types import PanelSums, max_entries_above

__all__ = ["panel_sums_torch", "classwise_torch", "scatter_sums"]

_SELECT_BUDGET = 1 << 24  # classwise slots gathered per chunk of rows (memory ~ 32 bytes each)


def _bins(values: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """``(lo, hi]`` bin of ``values`` (the input dtype or its float32 upcast) for ``edges`` in the input dtype."""
    inner = edges[1:-1]
    if inner.numel() == 0:
        return torch.zeros(values.shape, dtype=torch.long, device=values.device)
    # edges rounded to the input dtype, then upcast exactly: the bins of the input dtype
    return torch.bucketize(values, inner.to(values.dtype), right=False)


def _column_sums(x: torch.Tensor, block: int = 16) -> torch.Tensor:
    """``x.sum(0)`` in float64, ``(K,)``: 16-row groups summed in ``x``'s dtype, then float64."""
    if x.dtype == torch.float64:
        return x.sum(0)
    n, k = x.shape
    full = n // block * block
    total = torch.zeros(k, dtype=torch.float64, device=x.device)
    if full:
        total += x[:full].reshape(-1, block, k).sum(1).double().sum(0)
    if full < n:
        total += x[full:].double().sum(0)
    return total


def classwise_torch(probs, labels, n_bins, valid=None, x=None, exact: bool = False) -> BinSums:
    """Classwise equal-width sums ``(K, B)`` (see :func:`calibkit.functional.panel.classwise_bin_sums`).

    Only the entries above ``t = 1 / B`` are binned (gathered in chunks of rows); bin 0 of each
    class is its column total minus its other bins, as on the CPU. ``labels`` must lie in
    ``[0, K)``; rows with ``valid`` False count nowhere.

    The gather has a size fixed in advance, ``c_max`` slots per row (the most entries above ``t``
    a row summing to 1 can hold), so that nothing waits for the device; most slots are padding.
    ``exact=True`` reads the number of entries above ``t`` first (one host synchronisation per
    chunk) and gathers exactly those: about ten times less work on typical predictions, where
    a row has one or two such entries. Same sums either way.
    """
    n, k = probs.shape
    x = upcast(probs) if x is None else x
    dev, kb = x.device, k * n_bins
    edges = equal_width_edges(n_bins, probs.dtype, dev)
    if valid is not None:
        x = torch.where(valid[:, None], x, torch.zeros((), dtype=x.dtype, device=dev))
    count = torch.zeros(kb, dtype=torch.float64, device=dev)
    conf = torch.zeros(kb, dtype=torch.float64, device=dev)
    if n_bins > 1:
        thr = edges[1].to(x.dtype)
        c_max = min(k, max_entries_above(n_bins, probs.dtype))
        rows = max(1, _SELECT_BUDGET // c_max)
        for start in range(0, n, rows):
            flat = x[start : start + rows].reshape(-1)
            above = flat > thr
            if exact:
                idx = above.nonzero().squeeze(1)  # reads the count: one host synchronisation
                real = None
            else:
                size = (flat.numel() // k) * c_max
                idx = torch.nonzero_static(above, size=size, fill_value=-1).squeeze(1)
                real = idx >= 0
                idx = idx.clamp(min=0)
            vals = flat[idx]
            slot = (idx % k) * n_bins + _bins(vals, edges)
            if real is None:
                vals64 = vals.double()
                sums = scatter_sums(slot, torch.stack([torch.ones_like(vals64), vals64], 1), kb, lanes=4)
            else:
                position = torch.arange(size, device=dev)
                slot = torch.where(real, slot, position % kb)  # padding adds zeros, spread over all slots
                realf = real.double()
                sums = scatter_sums(slot, torch.stack([realf, vals.double() * realf], 1), kb, lanes=4,
                                    position=position)
            count += sums[:, 0]
            conf += sums[:, 1]
    count, conf = count.view(k, n_bins), conf.view(k, n_bins)
    n_rows = float(n) if valid is None else valid.double().sum()
    count[:, 0] = n_rows - count[:, 1:].sum(1)
    conf[:, 0] = _column_sums(x) - conf[:, 1:].sum(1)
    p_y = x.gather(1, labels.view(-1, 1)).squeeze(1)
    w = torch.ones(n, 1, dtype=torch.float64, device=dev) if valid is None else valid.double()[:, None]
    hits = scatter_sums(labels * n_bins + _bins(p_y, edges), w, kb)[:, 0]
    return BinSums(count=count, conf=conf, correct=hits.view(k, n_bins))


def panel_sums_torch(probs, labels, n_bins: int, full: bool = True, valid=None, exact: bool = False) -> PanelSums:
    """:func:`calibkit.functional.panel.panel_sums` for layout-checked ``probs`` ``(N, K)`` and
    ``labels`` ``(N,)`` int64 on one device, with optional ``valid`` ``(N,)`` bool row mask.

    Values are not checked here: ``check`` holds ``[min p, max p, max |row sum - 1|, min label,
    max label]`` over the valid rows. Labels are clamped to ``[0, K)`` before any gather, so an
    out-of-range label gives wrong sums but never an invalid memory access; the caller raises
    from ``check`` before using them. ``exact``: see :func:`classwise_torch` (one host
    synchronisation, much less work).
    """
    n, k = probs.shape
    dev = probs.device
    x = upcast(probs)
    conf_n, pred = probs.max(1)
    conf_w = conf_n.to(x.dtype)
    # the smallest entry: one reduction over the whole tensor unless rows are masked
    row_min = x.amin().view(1) if valid is None else x.amin(1)
    row_dev = (x.sum(1) - 1).abs()
    y_raw = labels
    if valid is not None:
        zero = torch.zeros((), dtype=x.dtype, device=dev)
        row_min, row_dev = torch.where(valid, row_min, zero), torch.where(valid, row_dev, zero)
        conf_chk = torch.where(valid, conf_w, zero)
        y_raw = torch.where(valid, labels, torch.zeros_like(labels))
    else:
        conf_chk = conf_w
    check = torch.stack([row_min.amin().double(), conf_chk.amax().double(), row_dev.amax().double(),
                         y_raw.amin().double(), y_raw.amax().double()])
    y = y_raw.clamp(0, k - 1)
    edges = equal_width_edges(n_bins, probs.dtype, dev)
    correct = pred == y
    conf64 = conf_chk.double()  # masked rows: 0, so that a NaN there reaches no sum
    w = None if valid is None else valid.double()
    ones = torch.ones(n, dtype=torch.float64, device=dev) if w is None else w
    src = torch.stack([ones, conf64 * ones, correct.double() * ones], 1)
    top = scatter_sums(_bins(conf_w, edges), src, n_bins)
    out = PanelSums(top=BinSums(top[:, 0], top[:, 1], top[:, 2]), conf=conf64, correct=correct, pred=pred,
                    labels=y, n=ones.sum(), weight=w, check=check)
    if full:
        p_y = x.gather(1, y.view(-1, 1)).squeeze(1).double()
        nll_i = -p_y.clamp(min=torch.finfo(probs.dtype).tiny).log()
        sq = torch.linalg.vector_norm(x, dim=1).double() ** 2
        brier_i = sq - 2 * p_y + 1
        if valid is not None:  # a select, not a product with the weight: NaN * 0 is NaN
            nll_i, brier_i = torch.where(valid, nll_i, 0.0), torch.where(valid, brier_i, 0.0)
        out.nll, out.brier = nll_i.sum(), brier_i.sum()
        out.classwise = classwise_torch(probs, y, n_bins, valid=valid, x=x, exact=exact)
    return out
