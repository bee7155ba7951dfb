"""Binning shared by the calibration metrics, the streaming accumulator and the plots.

Conventions (see ``docs/metrics.md``):

* **Equal-width bins.** ``B`` bins on ``[0, 1]`` with edges ``e_j = j / B``. Membership is
  ``(e_{j}, e_{j+1}]`` with 0 in the first bin and 1.0 in the last one (no phantom extra bin).
  Confidences are compared with the edges **represented in the confidence's own dtype**
  (``float64(j / B)`` rounded to that dtype), so a value that equals an edge in its dtype goes
  to the lower bin in float16, bfloat16, float32 and float64 alike.
* **Equal-mass bins.** Edges are the sorted confidences linearly interpolated at the positions
  ``linspace(0, N, B + 1)`` (clamped to the last element, as ``numpy.interp`` does); the same
  ``(lo, hi]`` rule then assigns samples, so tied confidences always share a bin. These edges
  are computed and compared in float64 (the confidences are upcast exactly): an interpolated edge
  is generally not representable in float32, and rounding it would move a sample across it.
* **Sums.** Per-bin count, sum of confidences and sum of correct predictions, all float64.

Everything here is a pure function of tensors: no state, no I/O. :func:`panel_sums` is the fused
entry point of the metrics: it validates its input and returns every statistic of the panel from
one pass over the matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from calibkit._validation import check_probs, check_probs_layout, probs_within_tolerance, upcast

__all__ = [
    "BinSums",
    "PanelSums",
    "panel_sums",
    "equal_width_edges",
    "bin_indices",
    "equal_width_bins",
    "equal_mass_edges",
    "equal_mass_bins",
    "bin_sums",
    "top_label",
    "classwise_bin_sums",
    "binned_errors",
]


@dataclass
class BinSums:
    """Per-bin sufficient statistics, each a float64 tensor of shape ``(B,)`` (or ``(K, B)``).

    Attributes:
        count: number of samples in the bin, ``n_b``.
        conf: sum of the confidences in the bin, ``n_b * conf_b``.
        correct: sum of the 0/1 correctness in the bin, ``n_b * acc_b``.
    """

    count: torch.Tensor
    conf: torch.Tensor
    correct: torch.Tensor


def equal_width_edges(n_bins: int, dtype: torch.dtype = torch.float64, device=None) -> torch.Tensor:
    """Edges ``j / B`` for ``j = 0..B``, shape ``(B + 1,)``, rounded to ``dtype``.

    ``j / B`` is computed by a correctly rounded float64 division (not ``start + j * step``,
    which gives 0.30000000000000004 for the 4th of 11 points) and then cast to ``dtype``, so the
    edge equals the literal ``j / B`` written in that dtype, e.g. ``torch.tensor(0.3, dtype)``.
    """
    return (torch.arange(n_bins + 1, dtype=torch.float64, device=device) / n_bins).to(dtype)


def bin_indices(values: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """Bin index of each value under ``(lo, hi]`` membership, shape like ``values``, int64.

    A value ``v`` goes to bin ``b`` with ``edges[b] < v <= edges[b + 1]``; values at or below
    ``edges[1]`` go to bin 0 and values above ``edges[-2]`` to the last bin, so the outer edges
    never create an extra bin. ``edges`` must be sorted and of the same dtype as ``values``.
    """
    inner = edges[1:-1]
    if inner.numel() == 0:  # a single bin
        return torch.zeros(values.shape, dtype=torch.long, device=values.device)
    if values.device.type == "cpu" and values.dtype in (torch.float32, torch.float64):
        v = values.detach().numpy()
        return torch.from_numpy(_count_below(v, inner.to(values.dtype).numpy()).astype(np.int64))
    # bucketize(right=False) returns i with inner[i-1] < v <= inner[i]: exactly (lo, hi].
    return torch.bucketize(values, inner.to(values.dtype), right=False)


def _count_below(values: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """Number of ``inner`` edges strictly below each value: the ``(lo, hi]`` bin index.

    Equals ``np.searchsorted(inner, values, side="left")``; for up to 254 edges one vectorised
    comparison per edge into a uint8 counter is ~25x faster than the binary search (1.4 ms
    instead of 40 ms for 10^6 values and 14 edges). ``values`` and ``inner`` share a dtype.
    """
    if len(inner) > 254:
        return np.searchsorted(inner, values, side="left")
    out = np.zeros(values.shape, np.uint8)
    for edge in inner:
        out += values > edge
    return out


def equal_width_bins(values: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Equal-width bin indices with the edges represented in ``values.dtype``."""
    return bin_indices(values, equal_width_edges(n_bins, values.dtype, values.device))


def _order_statistics(values: torch.Tensor, ranks: torch.Tensor) -> torch.Tensor:
    """``sort(values)[ranks]`` in float64, without a full sort on the CPU (introselect)."""
    if values.device.type == "cpu":
        arr = values.detach().numpy()
        kth = np.unique(ranks.numpy())
        part = np.partition(arr, kth)
        return torch.from_numpy(part[ranks.numpy()].astype(np.float64))
    return values.sort().values[ranks.to(values.device)].double().cpu()


def equal_mass_edges(values: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Equal-mass edges, float64, shape ``(B + 1,)``.

    ``edges = interp(linspace(0, N, B + 1), arange(N), sort(values))`` with positions past the
    last index clamped to the largest value (the convention of ``numpy.interp``). Where two
    neighbouring sorted values are equal the edge equals them exactly, so ties are never split.
    """
    n = values.numel()
    pos = torch.arange(n_bins + 1, dtype=torch.float64) * n / n_bins
    lo = pos.floor().clamp(max=n - 1)
    frac = torch.where(pos >= n - 1, torch.zeros_like(pos), pos - lo)
    lo = lo.long()
    hi = (lo + 1).clamp(max=n - 1)
    stats = _order_statistics(values.reshape(-1), torch.cat([lo, hi]))
    s_lo, s_hi = stats[: n_bins + 1], stats[n_bins + 1 :]
    # s_lo + frac * (s_hi - s_lo) returns s_lo exactly when the two are tied or frac == 0.
    return (s_lo + frac * (s_hi - s_lo)).to(values.device)


def equal_mass_bins(values: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Equal-mass bin indices: :func:`equal_mass_edges` then ``(lo, hi]`` in float64."""
    return bin_indices(values.double(), equal_mass_edges(values, n_bins))


def bin_sums(bins: torch.Tensor, conf: torch.Tensor, correct: torch.Tensor, n_bins: int) -> BinSums:
    """Per-bin count, confidence sum and correct sum (float64, shape ``(B,)``).

    Args:
        bins: ``(N,)`` int64 bin index of each sample.
        conf: ``(N,)`` top-label confidence.
        correct: ``(N,)`` bool or 0/1 correctness of the top-label prediction.
        n_bins: number of bins ``B``.
    """
    return BinSums(
        count=torch.bincount(bins, minlength=n_bins).double(),
        conf=torch.bincount(bins, weights=conf.double(), minlength=n_bins),
        correct=torch.bincount(bins, weights=correct.double(), minlength=n_bins),
    )


def top_label(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-label confidence ``max_k p_ik`` and prediction ``argmax_k p_ik`` (first index on ties)."""
    conf, pred = probs.max(dim=1)
    return conf, pred


def _column_sums(probs: torch.Tensor, block: int = 16) -> torch.Tensor:
    """``probs.sum(0)`` accumulated in float64, shape ``(K,)``.

    Blocks of ``block`` rows are summed in float32 (relative error ~1e-7 of a block's sum,
    i.e. ~1e-8 absolute) and the ``N / block`` block sums are added in float64. This is about
    10x faster than casting the whole (N, K) matrix to float64, whose column reduction is slow.
    """
    if probs.dtype == torch.float64:
        return probs.sum(0)
    n, k = probs.shape
    full = n // block * block
    total = torch.zeros(k, dtype=torch.float64, device=probs.device)
    if full:
        part = probs[:full].reshape(-1, block, k)
        total += part.sum(1, dtype=torch.float32).double().sum(0)
    if full < n:
        total += probs[full:].double().sum(0)
    return total


def classwise_bin_sums(probs: torch.Tensor, labels: torch.Tensor, n_bins: int, top=None) -> BinSums:
    """Classwise equal-width statistics, each float64 of shape ``(K, B)``.

    For class ``k`` every sample's ``p_ik`` is binned (edges in ``probs.dtype``); ``count[k, b]``
    and ``conf[k, b]`` are the number and the sum of the ``p_ik`` in bin ``b``, and
    ``correct[k, b]`` is the number of those samples whose label is ``k``.

    Why it is fast: a row sums to 1, so at most ``B - 1`` of its entries exceed ``t = 1 / B``.
    Only those entries are located and binned; bin 0 is the column total minus the rest. A row
    whose maximum ``m`` satisfies ``m >= 1 - t + 2e-3`` (the margin covers rows that sum to 1
    only within the 1e-3 validation tolerance) has exactly one such entry, its maximum, so only
    the other rows are searched; the cost therefore falls as the model gets confident. The
    labelled entries ``p_{i, y_i}`` (N of them) give ``correct`` directly.

    Args:
        probs: ``(N, K)`` probabilities; labels: ``(N,)`` int64.
        n_bins: ``B``.
        top: optional ``(conf, pred)`` from :func:`top_label`, to avoid recomputing it.
    """
    n, k = probs.shape
    edges = equal_width_edges(n_bins, probs.dtype, probs.device)
    count = torch.zeros(k * n_bins, dtype=torch.float64, device=probs.device)
    conf = torch.zeros(k * n_bins, dtype=torch.float64, device=probs.device)
    if n_bins > 1:
        thr = edges[1]
        m, pred = top if top is not None else top_label(probs)
        single = m.double() >= 1 - float(thr) + 2e-3
        if int(single.sum()) > n // 2:  # measured: at ~40% single rows both branches cost the same
            rest = (~single).nonzero().squeeze(1)
            sub = probs[rest]
            hit = torch.where(sub.reshape(-1) > thr)[0]  # compared in probs.dtype
            vals = torch.cat([m[single], sub.reshape(-1)[hit]])
            cols = torch.cat([pred[single], hit % k])
        else:  # mostly diffuse rows: one search over the whole matrix is cheaper than a gather
            flat = probs.reshape(-1)
            hit = torch.where(flat > thr)[0]
            vals, cols = flat[hit], hit % k
        slot = cols * n_bins + bin_indices(vals, edges)
        count += torch.bincount(slot, minlength=k * n_bins).double()
        conf += torch.bincount(slot, weights=vals.double(), minlength=k * n_bins)
    count, conf = count.view(k, n_bins), conf.view(k, n_bins)
    count[:, 0] = n - count[:, 1:].sum(1)
    conf[:, 0] = _column_sums(probs) - conf[:, 1:].sum(1)
    p_y = probs.gather(1, labels.view(-1, 1)).squeeze(1)
    hit_slot = labels * n_bins + bin_indices(p_y, edges)
    correct = torch.bincount(hit_slot, minlength=k * n_bins).double().view(k, n_bins)
    return BinSums(count=count, conf=conf, correct=correct)


def binned_errors(sums: BinSums, debias: bool = False) -> dict[str, torch.Tensor]:
    """Equal-width style calibration errors from per-bin sums of shape ``(..., B)``.

    With ``N = sum_b n_b`` and the per-bin gap ``g_b = acc_b - conf_b``:

    * ``ece   = sum_b (n_b / N) |g_b|`` (= ``sum_b |correct_b - conf_b| / N``, no division per bin)
    * ``mce   = max_{b: n_b > 0} |g_b|`` (empty bins have ``g_b = 0`` and cannot raise the max)
    * ``rmsce = sqrt(sum_b (n_b / N) g_b^2)``; with ``debias=True`` each bin's squared gap is
      reduced by ``acc_b (1 - acc_b) / (n_b - 1)`` (unbiased for the binomial noise of
      ``acc_b``; bins with ``n_b < 2`` get no correction) and the sum is clipped at 0 before
      the square root.
    * ``o_ece = sum_b (n_b / N) max(-g_b, 0)``, ``u_ece = sum_b (n_b / N) max(g_b, 0)``.

    Leading dimensions (e.g. bootstrap resamples) are kept. Returns float64 tensors of shape
    ``(...)``: 0-dim for ``(B,)`` input.
    """
    count = sums.count
    n = count.sum(-1)
    many = count > 1
    safe = count.clamp(min=1)
    diff = sums.correct - sums.conf  # n_b * (acc_b - conf_b)
    gap = diff / safe  # 0 for empty bins
    sq = count * gap**2
    if debias:
        acc = sums.correct / safe
        corr = acc * (1 - acc) / torch.where(many, count - 1, torch.ones_like(count))
        sq = sq - torch.where(many, count * corr, torch.zeros_like(corr))
    return {
        "ece": diff.abs().sum(-1) / n,
        "mce": gap.abs().amax(-1),
        "rmsce": (sq.sum(-1) / n).clamp(min=0).sqrt(),
        "o_ece": (-diff).clamp(min=0).sum(-1) / n,
        "u_ece": diff.clamp(min=0).sum(-1) / n,
    }


@dataclass
class PanelSums:
    """What the panel metrics need from ``(probs, labels)``, see :func:`panel_sums`.

    Attributes:
        top: top-label equal-width sums, shape ``(B,)``.
        conf: ``(N,)`` float64 top-label confidence (the exact upcast of ``max_k p_ik``).
        correct: ``(N,)`` bool, ``argmax_k p_ik == y_i`` (first index on ties).
        classwise: classwise equal-width sums ``(K, B)`` (as :func:`classwise_bin_sums`), or ``None``.
        nll: 0-dim float64 ``sum_i -log max(p_{i, y_i}, tiny)``, or ``None``.
        brier: 0-dim float64 ``sum_i (sum_k p_ik^2 - 2 p_{i, y_i} + 1)``, or ``None``.
    """

    top: BinSums
    conf: torch.Tensor
    correct: torch.Tensor
    classwise: BinSums | None = None
    nll: torch.Tensor | None = None
    brier: torch.Tensor | None = None


# A block of rows this large stays in a core's L2 cache (2 MiB per core on the benchmark machine)
# while the ~10 reductions of a block read it again.
_BLOCK_BYTES = 1 << 20


def panel_sums(probs, labels, n_bins: int, full: bool = True) -> PanelSums:
    """Validate ``probs`` ``(N, K)`` and ``labels`` ``(N,)`` and compute the panel's statistics.

    Same checks and errors as :func:`calibkit._validation.check_probs`. With ``full=False`` only
    the top-label part (``top``, ``conf``, ``correct``) is computed; ``full=True`` adds the
    classwise sums, the NLL and the Brier sums. Every value equals what the separate functions of
    this module give (:func:`top_label`, :func:`bin_sums`, :func:`classwise_bin_sums`) up to the
    float64 summation order; precision is that of ``docs/metrics.md``: per-row reductions in the
    input precision (at least float32), every sum over samples or bins in float64.

    **CPU: one pass over blocks of rows.** Each block (about 1 MiB, so it stays in cache) is
    read by a few single-threaded numpy reductions, instead of a dozen passes over the whole
    matrix with torch's multi-threaded kernels (which stall on a loaded machine, where one of
    their threads is often descheduled). Per block:

    * validation: the minimum entry, the row sums (float32 for half and float32 input) and the
      row maxima; a block outside the tolerance hands over to ``check_probs`` for the error;
    * top label: ``argmax`` per row (first index on ties), the maximum gathered from it;
    * ``full``: ``p_y`` gathered (NLL; Brier as ``sum p^2 - 2 p_y + 1``, the sum of squares per
      row in the input precision), the classwise sums of the entries above ``1 / B`` only (at
      most ``B - 1`` per row; bin 0 of a class is its column total minus its other bins, as in
      :func:`classwise_bin_sums`), the labelled entries' bins, and the column totals as sums of
      16-row float32 groups added in float64 (the grouping of :func:`_column_sums`).

    Half-precision blocks are upcast to float32 and compared with the edges rounded to the input
    dtype (then upcast, exactly), which gives the bins of the input dtype. Tensors on other
    devices take the whole-tensor torch path (the functions above), with the same results.

    Args:
        probs: ``(N, K)`` probabilities (tensor or numpy array).
        labels: ``(N,)`` integer labels.
        n_bins: ``B``, already checked by the caller.
        full: also compute the classwise, NLL and Brier sums.
    """
    probs, labels = check_probs_layout(probs, labels)
    if probs.device.type != "cpu":
        return _panel_sums_torch(probs, labels, n_bins, full)
    n, k = probs.shape
    work = torch.float32 if probs.dtype in (torch.float16, torch.bfloat16) else probs.dtype
    inner = equal_width_edges(n_bins, probs.dtype)[1:-1].to(work).numpy()  # inner edges
    tiny = torch.finfo(probs.dtype).tiny
    y_all = labels.cpu().numpy()
    rows = max(16, _BLOCK_BYTES // (k * work.itemsize) // 16 * 16)  # a multiple of 16
    conf, correct = np.empty(n, np.float64), np.empty(n, bool)
    kb = k * n_bins
    cw_count, cw_hit = np.zeros(kb, np.int64), np.zeros(kb, np.int64)
    cw_conf, col_total = np.zeros(kb), np.zeros(k)
    nll = brier = 0.0
    src = probs.detach()
    for start in range(0, n, rows):
        x = np.ascontiguousarray(src[start : start + rows].to(work).numpy())
        y = y_all[start : start + rows]
        r = x.shape[0]
        at = np.arange(r)
        pred = x.argmax(1)  # first index of the maximum; NaN wins, and fails the check below
        m = x[at, pred]
        dev = np.abs(np.einsum("ij->i", x) - 1).max()
        if not probs_within_tolerance(x.min(), m.max(), dev):
            check_probs(probs)  # raises its error (unless a rounding tie at the tolerance flips it)
        conf[start : start + r] = m
        correct[start : start + r] = pred == y
        if not full:
            continue
        p_y = x[at, y]
        p_y64 = p_y.astype(np.float64)
        nll -= np.log(np.maximum(p_y64, tiny)).sum()
        brier += (np.einsum("ij,ij->i", x, x).astype(np.float64) - 2 * p_y64 + 1).sum()
        if n_bins > 1:
            hit = np.flatnonzero(x > inner[0])  # the entries above 1 / B, compared in `work`
            vals = x.reshape(-1)[hit]
            slot = hit % k * n_bins + _count_below(vals, inner)
            cw_count += np.bincount(slot, minlength=kb)
            cw_conf += np.bincount(slot, weights=vals, minlength=kb)
        cw_hit += np.bincount(y * n_bins + _count_below(p_y, inner), minlength=kb)
        grouped = r // 16 * 16
        col_total += x[:grouped].reshape(-1, 16, k).sum(1).astype(np.float64).sum(0)
        col_total += x[grouped:].astype(np.float64).sum(0)
    bins = _count_below(conf, inner.astype(np.float64))  # exact upcasts: same bins
    top = BinSums(
        count=torch.from_numpy(np.bincount(bins, minlength=n_bins).astype(np.float64)),
        conf=torch.from_numpy(np.bincount(bins, weights=conf, minlength=n_bins)),
        correct=torch.from_numpy(np.bincount(bins, weights=correct, minlength=n_bins)),
    )
    out = PanelSums(top=top, conf=torch.from_numpy(conf), correct=torch.from_numpy(correct))
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


def _panel_sums_torch(probs, labels, n_bins, full) -> PanelSums:
    """:func:`panel_sums` on any device with whole-tensor torch operations."""
    check_probs(probs)
    conf, pred = top_label(probs)
    correct = pred == labels
    out = PanelSums(
        top=bin_sums(equal_width_bins(conf, n_bins), conf, correct, n_bins),
        conf=conf.double(),
        correct=correct,
    )
    if full:
        out.classwise = classwise_bin_sums(probs, labels, n_bins, top=(conf, pred))
        p_y = probs.gather(1, labels.view(-1, 1)).squeeze(1).double()
        out.nll = -p_y.clamp(min=torch.finfo(probs.dtype).tiny).log().sum()
        sq = torch.linalg.vector_norm(upcast(probs), dim=1).double() ** 2
        out.brier = (sq - 2 * p_y + 1).sum()
    return out
