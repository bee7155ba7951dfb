"""Selective prediction: risk-coverage curve, AURC, E-AURC, AUGRC and the selective risk.

A selective classifier answers on the rows it is most confident about and abstains on the
rest. Each row has a confidence ``s_i`` (default: the top-label probability ``max_k p_ik``; any
``(N,)`` score, higher = more confident, via ``confidence``) and an error
``e_i = [argmax_k p_ik != y_i]`` (first index on ties, as everywhere in calibkit). Rows are
ranked by ``s_i`` descending; the inputs are those of the metrics (``(N, K)``, binary ``(N,)``,
dense ``(N, K, *spatial)`` with ``ignore_index``).

**Ties.** The ``M`` distinct confidences form groups ``g = 1..M`` (descending) of ``n_g`` rows,
``err_g`` of them errors; ``C_g`` and ``E_g`` are the cumulative rows and errors up to and
including group ``g``. A threshold accepts a tied group together, so the risk-coverage curve
has one point per distinct confidence: ``(C_g / N, E_g / C_g)``. A coverage level ``k / N``
inside group ``g`` (``C_{g-1} < k <= C_g``, ``j = k - C_{g-1}``) is given the **expected**
number of accepted errors when the tied rows are accepted in a uniformly random order::

    E(k) = E_{g-1} + j * err_g / n_g

(linear between the curve's points, exact at them). So every value below is the average over
all orderings of the tied rows, does not depend on the row order, and equals the usual
definition when there are no ties; it is the convention of :func:`ood_auroc` (average ranks).

* ``selective_risk(coverage=c)``: ``E(k) / k`` with ``k = ceil(c N)``.
* ``aurc`` (Geifman, Uziel & El-Yaniv, ICLR 2019): ``(1/N) sum_{k=1}^N E(k) / k``, the mean
  selective risk over the coverage levels ``k / N``; so ``aurc = mean_k selective_risk(k / N)``.
* ``eaurc``: ``aurc - aurc*``, with ``aurc*`` the exact finite-N AURC of the oracle ranking
  (every correct row before every error) with the same ``N`` and ``N_err`` errors:
  ``aurc* = (1/N) sum_{k = N_c + 1}^{N} (k - N_c) / k = N_err / N - (N_c / N)(H_N - H_{N_c})``,
  ``N_c = N - N_err``, ``H_n`` the harmonic numbers. (The closed form
  ``r + (1 - r) ln(1 - r)`` is its large-N limit; the exact sum is used so that a perfect
  ranking scores exactly 0.) ``eaurc = 0`` exactly when every correct row is strictly more
  confident than every error.
* ``augrc`` (Traub et al., "Overcoming common flaws in the evaluation of selective
  classification systems", NeurIPS 2024): ``(1/N) sum_{k=1}^N E(k) / N``, the mean over the
  coverage levels of the generalized risk, the joint probability of being accepted and wrong.

Streaming: all of them rank the rows by confidence, so they need every row's confidence and
error (2 numbers per sample, as AECE), not fixed-bin sums; per-sample arrays of several batches
or processes can be concatenated and evaluated once. One sort of ``N`` confidences.

Example:
    >>> import torch
    >>> probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.6, 0.4], [0.3, 0.7]])
    >>> labels = torch.tensor([0, 1, 0, 0])          # errors at confidence 0.8 and 0.7
    >>> round(float(aurc(probs, labels)), 4)         # (0/1 + 1/2 + 2/3 + 2/4) / 4
    0.4167
    >>> round(float(augrc(probs, labels)), 4)        # (0 + 1 + 2 + 2) / 4^2
    0.3125
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable

import numpy as np
import torch

from calibkit._arrays import array_io
from calibkit._validation import as_tensor
from calibkit.errors import UserError
from calibkit.functional.metrics import _sums

__all__ = ["risk_coverage_curve", "aurc", "eaurc", "augrc", "selective_risk", "block_areas"]

_LEVELS = 1 << 22  # coverage levels expanded at a time: bounded memory for billions of pixels


def _rows(probs, labels, confidence, ignore_index):
    """Validated per-row ``(confidence, error)`` as float64 numpy arrays ``(P,)`` (ignored rows removed)."""
    s = _sums(probs, labels, 1, ignore_index=ignore_index)  # checks probs and labels, every layout
    keep_w = None if s.weight is None else s.weight.detach().cpu().numpy() > 0
    err = 1.0 - s.correct.detach().double().cpu().numpy()
    if keep_w is not None:
        err = err[keep_w]
    if confidence is None:
        conf = s.conf.detach().double().cpu().numpy()
        return (conf if keep_w is None else conf[keep_w]), err
    conf = as_tensor(confidence, "confidence")
    y = as_tensor(labels, "labels")
    if tuple(conf.shape) != tuple(y.shape):
        raise UserError(f"confidence must have the shape of labels, {tuple(y.shape)} (one score per "
                         f"sample), got {tuple(conf.shape)}")
    if conf.dtype == torch.bool or conf.dtype.is_complex:
        raise UserError(f"confidence must hold real numbers, got dtype {conf.dtype}")
    conf = conf.detach().reshape(-1).double().cpu()
    if not bool(torch.isfinite(conf).all()):
        raise UserError(f"confidence contains {int((~torch.isfinite(conf)).sum())} NaN or infinite value(s)")
    conf = conf.numpy()
    if ignore_index is not None:
        conf = conf[y.detach().reshape(-1).cpu().numpy() != ignore_index]
    return conf, err


#: fewer scored rows than this: no risk-coverage curve, AURC, E-AURC, AUGRC or selective risk (a
#: ranking needs two rows; one row's "curve" is the point (1, its error). docs/metrics.md).
MIN_SELECTIVE_ROWS = 2


def _groups(conf: np.ndarray, err: np.ndarray):
    """Tied groups in descending confidence: ``(values, n_g, err_g)`` float64 arrays ``(M,)``;
    refuses fewer than :data:`MIN_SELECTIVE_ROWS` rows."""
    if len(conf) < MIN_SELECTIVE_ROWS:
        raise UserError(f"{len(conf)} scored row(s): a risk-coverage curve and its areas need at least "
                        f"{MIN_SELECTIVE_ROWS} (they rank rows by confidence; one row has no ranking); give more rows")
    order = np.argsort(-conf, kind="stable")
    c, e = conf[order], err[order]
    starts = np.flatnonzero(np.concatenate([[True], c[1:] != c[:-1]]))
    n = np.diff(np.append(starts, len(c))).astype(np.float64)
    return c[starts], n, np.add.reduceat(e, starts)


def _level_sums(n: np.ndarray, e: np.ndarray) -> tuple[float, float]:
    """``sum_k E(k) / k`` and ``sum_k (E(k) - E*(k)) / k`` over the levels ``k = 1..N`` of the
    groups ``(n, e)`` (descending confidence), ``E*`` the oracle's errors (``max(k - N_c, 0)``).

    ``E(k)`` as in the module docstring. A group of one row has one level, ``k = C_g`` with
    ``E(k) = E_g``, taken as it is; the levels of the larger groups are expanded, ``2^22`` at a
    time, so the memory stays bounded when ``N`` counts the pixels of a whole data set.
    """
    cum_n, cum_e = np.cumsum(n), np.cumsum(e)
    n_correct = float(np.round(cum_n[-1])) - float(np.round(cum_e[-1]))
    one = n == 1
    parts: Iterable[tuple[np.ndarray, np.ndarray]] = [(cum_n[one], cum_e[one])]
    many = np.flatnonzero(~one)
    if many.size:
        n_m = n[many]
        parts = itertools.chain(parts, _expanded_levels(n_m, cum_n[many] - n_m, cum_e[many] - e[many], e[many] / n_m))
    risk = excess = 0.0
    for k, big_e in parts:
        risk += np.sum(big_e / k)
        # term by term, so a perfect ranking (E(k) = E*(k), integers) gives exactly 0
        excess += np.sum((big_e - np.maximum(k - n_correct, 0.0)) / k)
    return float(risk), float(excess)


def _expanded_levels(n, prev_n, prev_e, rate):
    """``(k, E(k))`` for every level of the groups ``n`` (levels ``prev_n + 1 .. prev_n + n``),
    ``E(k) = prev_e + j rate`` at the ``j``-th level of a group; ``2^22`` levels per item."""
    cum = np.cumsum(n)
    start = cum - n  # levels of the earlier groups, in this expansion
    total = int(round(cum[-1]))
    for lo in range(0, total, _LEVELS):
        hi = min(lo + _LEVELS, total)
        g0, g1 = np.searchsorted(cum, [lo + 1, hi], side="left")  # groups of expanded levels lo + 1 .. hi
        rows = np.minimum(cum[g0 : g1 + 1], hi) - np.maximum(start[g0 : g1 + 1], lo)
        gid = np.repeat(np.arange(g0, g1 + 1), rows.astype(np.int64))
        j = np.arange(lo + 1, hi + 1, dtype=np.float64) - start[gid]  # 1..n_g inside its group
        yield prev_n[gid] + j, prev_e[gid] + j * rate[gid]


def _areas(n: np.ndarray, e: np.ndarray) -> dict[str, float]:
    """AURC, E-AURC and AUGRC of the groups ``(n, e)`` (descending confidence), python floats."""
    n_total = float(np.sum(n))
    risk, excess = _level_sums(n, e)
    prev_e = np.cumsum(e) - e
    augrc = float(np.sum(n * prev_e + e * (n + 1) / 2) / n_total ** 2)
    return {"aurc": risk / n_total, "eaurc": max(excess / n_total, 0.0), "augrc": augrc}


def block_areas(values, count, correct) -> dict[str, float]:
    """``{"aurc", "eaurc", "augrc"}`` (maximum-probability confidence) of the ascending tie blocks
    of :func:`calibkit.functional.estimators.tie_blocks`: the metric panel's entries, with the
    panel's one sort. Equal to :func:`aurc`, :func:`eaurc` and :func:`augrc` of the same rows."""
    count = np.asarray(count, np.float64)
    return _areas(count[::-1], (count - np.asarray(correct, np.float64))[::-1])


def _out(value, probs) -> torch.Tensor:
    dev = probs.device if isinstance(probs, torch.Tensor) else "cpu"
    return torch.as_tensor(value, dtype=torch.float64, device=dev)


@array_io
def risk_coverage_curve(probs, labels, confidence=None,
                        ignore_index: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Risk-coverage curve ``(coverage, risk)``, two ``(M,)`` float64 tensors.

    One point per distinct confidence ``v_g`` (descending, so coverage increases): accepting
    every row with confidence ``>= v_g`` gives ``coverage = C_g / N`` and ``risk = E_g / C_g``,
    the 0/1 error of the argmax among the accepted rows. Tied rows are accepted together, so the
    curve does not depend on the row order; the last point is ``(1, error rate)``.

    Args:
        probs: ``(N, K)`` probabilities, ``(N,)`` positive-class probabilities (binary), or
            ``(N, K, *spatial)`` (dense).
        labels: integer labels, ``(N,)`` (or ``(N, *spatial)``).
        confidence: optional score per sample, the shape of ``labels``; higher = more confident.
            Default: the top-label probability ``max_k p_ik``.
        ignore_index: label of samples to leave out, or ``None``.

    Needs every sample's confidence and error (one sort); not computable from fixed-bin sums.
    """
    _, n, e = _groups(*_rows(probs, labels, confidence, ignore_index))
    cum_n = np.cumsum(n)
    return _out(cum_n / cum_n[-1], probs), _out(np.cumsum(e) / cum_n, probs)


@array_io
def aurc(probs, labels, confidence=None, ignore_index: int | None = None) -> torch.Tensor:
    """Area under the risk-coverage curve (Geifman et al., ICLR 2019), a 0-dim float64 tensor.

    ``AURC = (1/N) sum_{k=1}^N E(k) / k``: the mean of the selective risk over the coverage levels
    ``k / N``. ``E(k)`` is the number of errors among the ``k`` most confident rows; inside a
    group of tied confidences it is the expectation over random orderings of the group,
    ``E_{g-1} + j err_g / n_g`` for the ``j``-th row of group ``g`` (module docstring), so the
    value is the mean AURC over all tie-breakings. Lower is better. Arguments as
    :func:`risk_coverage_curve`. Needs the sort of all confidences (not streamable in fixed memory).
    """
    _, n, e = _groups(*_rows(probs, labels, confidence, ignore_index))
    return _out(_areas(n, e)["aurc"], probs)


@array_io
def eaurc(probs, labels, confidence=None, ignore_index: int | None = None) -> torch.Tensor:
    """Excess AURC: :func:`aurc` minus the AURC of the oracle ranking with the same errors.

    The oracle puts every correct row before every error; its AURC is the exact finite-N sum
    ``(1/N) sum_{k=N_c+1}^{N} (k - N_c)/k`` (``N_c`` correct rows), not the large-N closed form
    ``r + (1 - r) ln(1 - r)``. ``E-AURC >= 0``, and it is 0 exactly when every correct row is
    strictly more confident than every error (a tie between a correct row and an error costs, as
    a random order of the tie would). A 0-dim float64 tensor; arguments as :func:`aurc`; needs the sort.
    """
    _, n, e = _groups(*_rows(probs, labels, confidence, ignore_index))
    return _out(_areas(n, e)["eaurc"], probs)


@array_io
def augrc(probs, labels, confidence=None, ignore_index: int | None = None) -> torch.Tensor:
    """Area under the generalized risk-coverage curve (Traub et al., NeurIPS 2024).

    Generalized risk at coverage ``k / N`` = accepted errors / ``N`` (the joint probability that a
    row is accepted and wrong); ``AUGRC = (1/N) sum_{k=1}^N E(k) / N`` with ``E(k)`` as in
    :func:`aurc` (ties: expectation over random orderings of the tied rows). Computed per tied
    group as ``(1/N^2) sum_g [n_g E_{g-1} + err_g (n_g + 1) / 2]``. A 0-dim float64 tensor, in
    ``[0, error rate]``; lower is better; needs the sort of all confidences.
    """
    _, n, e = _groups(*_rows(probs, labels, confidence, ignore_index))
    return _out(_areas(n, e)["augrc"], probs)


@array_io
def selective_risk(probs, labels, coverage: float = 0.9, confidence=None,
                   ignore_index: int | None = None) -> torch.Tensor:
    """Risk (0/1 error of the argmax) among the ``k = ceil(coverage * N)`` most confident rows.

    When the ``k``-th row lies in a group of tied confidences that straddles the cut, the
    ``j = k - C_{g-1}`` rows taken from it carry the group's error rate: the result is
    ``(E_{g-1} + j err_g / n_g) / k``, the expected risk when the tie is broken at random (it
    never depends on the row order). ``coverage`` in ``(0, 1]``; ``k`` is computed so that
    ``k / N`` is the smallest level ``>= coverage`` (no rounding up of e.g. ``0.7 * 10``).
    A 0-dim float64 tensor; needs the sort of all confidences.
    """
    if isinstance(coverage, bool) or not isinstance(coverage, (int, float, np.floating, np.integer)) \
            or not 0 < coverage <= 1:
        raise UserError(f"coverage must be a number in (0, 1], got {coverage!r}")
    _, n, e = _groups(*_rows(probs, labels, confidence, ignore_index))
    n_total = int(n.sum())
    k = max(1, math.ceil(coverage * n_total))
    while k > 1 and (k - 1) / n_total >= coverage:  # guard against coverage * N rounding up
        k -= 1
    cum_n = np.cumsum(n)
    g = int(np.searchsorted(cum_n, k, side="left"))  # first group with C_g >= k
    prev_n = cum_n[g] - n[g]
    prev_e = float(np.sum(e[:g]))
    return _out((prev_e + (k - prev_n) * e[g] / n[g]) / k, probs)
