"""Calibration, accuracy and OOD metrics as pure functions.

Every metric takes **probabilities** and integer labels, as torch tensors or numpy arrays, and
returns a 0-dim float64 tensor (on the input's device). Accepted layouts
(:mod:`calibkit.functional.inputs`):

* ``(N, K)`` probabilities, ``(N,)`` labels in ``[0, K)``;
* binary: ``(N,)`` positive-class probabilities, ``(N,)`` 0/1 labels (scikit-learn's
  convention), scored as the two columns ``(1 - p, p)``: top-label confidence ``max(p, 1 - p)``;
* dense: ``(N, K, *spatial)`` probabilities, ``(N, *spatial)`` labels (one sample per pixel);

and every metric takes ``ignore_index`` (default ``None``): samples with that label are left out.

Nothing guesses whether an input holds logits: rows that do not sum to 1 (within a tolerance
that depends on the dtype) are rejected with a ``ValueError`` telling the caller to apply
softmax. A 1-D input is binary by contract, an ``(N, 2)`` input is a K = 2 problem (same
numbers), and a K-class batch whose labels happen to be only {0, 1} is still scored as K-class.
Binning conventions are those of :mod:`calibkit.functional.binning`; the definitions are
written out in ``docs/metrics.md``.

Example:
    >>> import torch
    >>> probs = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8]])
    >>> labels = torch.tensor([0, 1, 1])
    >>> round(float(ece(probs, labels, n_bins=2)), 4)
    0.1
    >>> round(float(ece(probs[:, 1], labels, n_bins=2)), 4)  # binary 1-D: the same problem
    0.1
"""

from __future__ import annotations

import math

import torch

from calibkit._arrays import array_io
from calibkit._validation import as_tensor, check_n_bins, check_probs, upcast
from calibkit.errors import UserError
from calibkit.functional.binning import binned_errors, equal_mass_sums
from calibkit.functional.inputs import to_rows
from calibkit.functional.iou import mean_iou
from calibkit.functional.panel import panel_sums, raise_for_check

__all__ = [
    "ece",
    "adaptive_ece",
    "classwise_ece",
    "mce",
    "rmsce",
    "over_under_ece",
    "nll",
    "brier",
    "accuracy",
    "mean_iou",
    "ood_auroc",
    "fpr_at_95_tpr",
    "entropy_score",
    "max_confidence_score",
]


def _sums(probs, labels, n_bins=1, full=False, ignore_index=None):
    """Validated :func:`panel_sums` (one pass over ``probs``); errors about ``probs`` come first."""
    try:
        check_n_bins(n_bins)
    except ValueError:
        _rows(probs, labels, ignore_index)
        raise
    s = panel_sums(probs, labels, n_bins, full=full, ignore_index=ignore_index)
    if s.check is not None:  # device path: the value checks were reduced on the device
        raise_for_check(s.check, as_tensor(probs, "probs").dtype, s.k)
        if float(s.n) == 0:
            raise UserError(f"no samples to evaluate: every label equals ignore_index={ignore_index}")
    return s


def _rows(probs, labels, ignore_index):
    """Validated rows ``(P, K)`` and labels ``(P,)`` (ignored samples removed)."""
    rows = to_rows(probs, labels, ignore_index, compact=True)
    if ignore_index is not None and rows.labels.numel() == 0:
        raise UserError(f"no samples to evaluate: every label equals ignore_index={ignore_index}")
    return check_probs(rows.probs, rows.labels)


def _equal_width(probs, labels, n_bins, ignore_index, debias=False):
    return binned_errors(_sums(probs, labels, n_bins, ignore_index=ignore_index).top, debias)


@array_io
def ece(probs, labels, n_bins: int = 15, ignore_index: int | None = None) -> torch.Tensor:
    """Expected calibration error, top label, equal-width bins.

    ``ECE = sum_b (n_b / N) |acc_b - conf_b|`` with ``B = n_bins`` bins ``(lo, hi]`` on [0, 1]
    (0 in the first bin, 1.0 in the last; edges in the confidence's dtype).

    Args:
        probs: ``(N, K)`` probabilities, ``(N,)`` positive-class probabilities (binary), or
            ``(N, K, *spatial)`` (dense).
        labels: ``(N,)`` (or ``(N, *spatial)``) integer labels in ``[0, K)``.
        n_bins: number of bins ``B >= 1``.
        ignore_index: label of samples to leave out (e.g. 255 for void pixels), or ``None``.
    """
    return _equal_width(probs, labels, n_bins, ignore_index)["ece"]


@array_io
def mce(probs, labels, n_bins: int = 15, ignore_index: int | None = None) -> torch.Tensor:
    """Maximum calibration error: ``max_b |acc_b - conf_b|`` over the non-empty equal-width bins."""
    return _equal_width(probs, labels, n_bins, ignore_index)["mce"]


@array_io
def rmsce(probs, labels, n_bins: int = 15, debias: bool = False, ignore_index: int | None = None) -> torch.Tensor:
    """Root-mean-square (L2) calibration error ``sqrt(sum_b (n_b/N)(acc_b - conf_b)^2)``.

    With ``debias=True`` this is the debiased L2 calibration error: every bin's squared gap is
    reduced by ``acc_b (1 - acc_b) / (n_b - 1)`` (the unbiased estimate of the sampling variance
    of ``acc_b``; bins with a single sample are left uncorrected) and the total is clipped at 0
    before the square root.
    """
    return _equal_width(probs, labels, n_bins, ignore_index, debias)["rmsce"]


@array_io
def over_under_ece(probs, labels, n_bins: int = 15,
                   ignore_index: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Over- and under-confidence parts of the ECE, ``(O-ECE, U-ECE)``; ``O + U = ECE``.

    ``O-ECE = sum_b (n_b/N) max(conf_b - acc_b, 0)``, ``U-ECE = sum_b (n_b/N) max(acc_b - conf_b, 0)``.
    """
    err = _equal_width(probs, labels, n_bins, ignore_index)
    return err["o_ece"], err["u_ece"]


@array_io
def adaptive_ece(probs, labels, n_bins: int = 15, ignore_index: int | None = None) -> torch.Tensor:
    """Adaptive (equal-mass) ECE.

    Edges are the sorted top-label confidences interpolated at ``linspace(0, N, B + 1)``; samples
    are assigned with the same ``(lo, hi]`` rule (in float64), so tied confidences always share a
    bin: under ties there are fewer non-empty bins, never a split tie and never a 0/0.
    """
    s = _sums(probs, labels, n_bins, ignore_index=ignore_index)
    return binned_errors(equal_mass_sums(s.conf, s.correct, n_bins, s.weight))["ece"]


@array_io
def classwise_ece(probs, labels, n_bins: int = 15, ignore_index: int | None = None) -> torch.Tensor:
    """Classwise ECE: the mean over classes of each class's equal-width ECE.

    For class ``k`` all ``N`` values ``p_ik`` are binned; the "accuracy" of a bin is the fraction
    of its samples labelled ``k``: ``cECE = (1/K) sum_k sum_b (n_kb / N) |acc_kb - conf_kb|``.
    """
    s = _sums(probs, labels, n_bins, full=True, ignore_index=ignore_index).classwise
    n_times_k = s.count.sum()  # every class bins all N samples
    return (s.correct - s.conf).abs().sum() / n_times_k


def _p_label(probs, labels) -> torch.Tensor:
    return probs.gather(1, labels.view(-1, 1)).squeeze(1)


@array_io
def nll(probs, labels, ignore_index: int | None = None) -> torch.Tensor:
    """Negative log-likelihood ``mean_i -log p_{i, y_i}``.

    ``p`` is clamped at the smallest normal number of the input dtype (``finfo(dtype).tiny``)
    so that a zero probability gives a large finite value, not ``inf``.
    """
    probs, labels = _rows(probs, labels, ignore_index)
    p_y = _p_label(probs, labels).double().clamp(min=torch.finfo(probs.dtype).tiny)
    return -p_y.log().mean()


@array_io
def brier(probs, labels, ignore_index: int | None = None) -> torch.Tensor:
    """Multiclass Brier score ``mean_i sum_k (p_ik - [y_i = k])^2``.

    Computed as ``sum_k p_ik^2 - 2 p_{i, y_i} + 1`` so no one-hot ``(N, K)`` matrix is built;
    the per-row sum of squares is taken in the input precision (at least float32) and the mean
    over samples in float64. Binary 1-D input: the two-class score, twice the usual binary
    ``mean (p - y)^2``.
    """
    probs, labels = _rows(probs, labels, ignore_index)
    sq = torch.linalg.vector_norm(upcast(probs), dim=1).double() ** 2
    return (sq - 2 * _p_label(probs, labels).double() + 1).mean()


@array_io
def accuracy(probs, labels, ignore_index: int | None = None) -> torch.Tensor:
    """Top-1 accuracy; the prediction is the first index of the maximum probability."""
    top = _sums(probs, labels, ignore_index=ignore_index).top
    return top.correct.sum() / top.count.sum()


def _check_scores(x, name: str) -> torch.Tensor:
    x = as_tensor(x, name)
    if x.dim() != 1:
        raise UserError(f"{name} must have shape (N,), got {tuple(x.shape)}")
    if x.numel() == 0:
        raise UserError(f"{name} is empty: no samples to evaluate")
    if not x.dtype.is_floating_point:
        x = x.double()
    if not bool(torch.isfinite(x).all()):
        raise UserError(f"{name} contains NaN or infinite value(s)")
    return x.double()


@array_io
def ood_auroc(scores_in, scores_out) -> torch.Tensor:
    """Area under the ROC curve for telling OOD (positive) from in-distribution (negative).

    Higher scores must mean "more likely OOD" (e.g. :func:`entropy_score`). Equals the
    probability that a random OOD sample scores higher than a random in-distribution one, ties
    counting 1/2 (Mann-Whitney U with average ranks).

    Args:
        scores_in: ``(N_in,)`` scores of in-distribution samples.
        scores_out: ``(N_out,)`` scores of OOD samples.
    """
    s_in, s_out = _check_scores(scores_in, "scores_in"), _check_scores(scores_out, "scores_out")
    n_in, n_out = s_in.numel(), s_out.numel()
    allv = torch.cat([s_in, s_out])
    order = allv.argsort()
    sorted_v = allv[order]
    # Average rank (1-based) of each run of tied values.
    _, inverse, counts = torch.unique_consecutive(sorted_v, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    avg_rank = ends - (counts.double() - 1) / 2
    ranks = torch.empty_like(allv)
    ranks[order] = avg_rank[inverse]
    u = ranks[n_in:].sum() - n_out * (n_out + 1) / 2
    return u / (n_in * n_out)


@array_io
def fpr_at_95_tpr(scores_in, scores_out, tpr: float = 0.95) -> torch.Tensor:
    """False-positive rate on in-distribution data at the threshold that catches ``tpr`` of OOD.

    OOD is the positive class and a sample is flagged when ``score >= t``. ``t`` is the largest
    threshold with ``TPR = #(out >= t) / N_out >= tpr`` (the first point of the ROC curve reaching
    ``tpr``), and the result is ``#(in >= t) / N_in``.
    """
    s_in, s_out = _check_scores(scores_in, "scores_in"), _check_scores(scores_out, "scores_out")
    if not 0 < tpr <= 1:
        raise UserError(f"tpr must be in (0, 1], got {tpr}")
    n_out = s_out.numel()
    need = math.ceil(tpr * n_out)
    while need > 1 and (need - 1) / n_out >= tpr:  # guard against tpr * n rounding up
        need -= 1
    t = s_out.sort(descending=True).values[need - 1]
    return (s_in >= t).double().mean()


def _score_rows(probs) -> torch.Tensor:
    p = as_tensor(probs, "probs")
    if p.dim() == 1:  # binary: positive-class probabilities
        p = to_rows(p, torch.zeros(p.shape[0], dtype=torch.long)).probs
    return check_probs(p)


@array_io
def entropy_score(probs) -> torch.Tensor:
    """Normalised predictive entropy ``H(p) / log K`` per sample, in [0, 1]; shape ``(N,)`` float64."""
    probs = _score_rows(probs)
    p = probs.double()
    return -torch.special.xlogy(p, p).sum(1) / math.log(probs.shape[1])


@array_io
def max_confidence_score(probs) -> torch.Tensor:
    """OOD score ``1 - max_k p_ik`` per sample (higher = less confident); shape ``(N,)`` float64."""
    probs = _score_rows(probs)
    return 1 - probs.amax(1).double()
