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

Everything here is a pure function of tensors: no state, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "BinSums",
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
    # bucketize(right=False) returns i with inner[i-1] < v <= inner[i]: exactly (lo, hi].
    return torch.bucketize(values, inner.to(values.dtype), right=False)


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
