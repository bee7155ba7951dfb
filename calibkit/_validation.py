"""Input checks shared by metrics, losses and calibrators.

Every public function validates its inputs here so that bad input fails early with a
``ValueError`` that names the argument and the problem, instead of a silent wrong number.
"""

from __future__ import annotations

import contextlib
import math
import threading

import numpy as np
import torch

from calibkit.errors import UserError

# Rows of a probability matrix must sum to 1 within ``prob_sum_tol(dtype)``: this base
# tolerance, widened to 2 machine epsilons for half-precision types (see prob_sum_tol).
PROB_SUM_TOL = 1e-3


def prob_sum_tol(dtype: torch.dtype) -> float:
    """Largest accepted ``|row sum - 1|`` of a probability matrix of ``dtype``.

    ``max(1e-3, 2 * finfo(dtype).eps)``: 1e-3 for float32/float64, 1.95e-3 for float16 and
    0.0156 for bfloat16. Rounding each entry of a genuine softmax row to bfloat16 moves the row
    sum by up to ``2^-8`` (measured: 3.1e-3 at K = 10), and a softmax evaluated in bfloat16
    arithmetic by up to 6.1e-3 (measured, K = 2 to 1000); two epsilons cover both, while rows of
    logits or of unnormalised scores are still off by far more.
    """
    return max(PROB_SUM_TOL, 2 * torch.finfo(dtype).eps)


_TRUST = threading.local()


@contextlib.contextmanager
def trusted_inputs():
    """Within this block, the checks that must read tensor values are skipped.

    Reading a value (``bool(...)``, ``int(...)``) of a tensor on an accelerator waits for every
    queued kernel: a host synchronisation. The training loop calls the losses under this block for
    every batch but the first of each epoch, so their inputs are still checked once per epoch and
    non-finite results are caught by the loop's own device-side check. The checks that read only
    shapes and dtypes still run. The public functions called outside the block validate as always.
    """
    before = getattr(_TRUST, "on", False)
    _TRUST.on = True
    try:
        yield
    finally:
        _TRUST.on = before


def trusting() -> bool:
    """True inside :func:`trusted_inputs`."""
    return getattr(_TRUST, "on", False)


def _expected(name: str) -> str:
    """What an input named ``name`` must hold, for the message of a non-numeric one."""
    if "label" in name or "target" in name:  # labels are always integers: floats are refused too
        return "integer class indices; map string labels to integers first"
    if "preds" in name:
        return "floating-point probabilities or integer class predictions"
    return "floating-point numbers"


def as_tensor(x, name: str) -> torch.Tensor:
    """Return ``x`` as a torch tensor (numpy arrays and lists are converted, no copy when possible)."""
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray):
        if x.dtype.kind in "USOa":  # strings, bytes, objects: no tensor dtype
            raise UserError(f"{name} must be numeric ({_expected(name)}), got a numpy array of dtype {x.dtype}")
        return torch.from_numpy(x)
    try:
        return torch.as_tensor(x)
    except Exception as exc:
        raise UserError(f"{name}: cannot convert {type(x).__name__} to a numeric tensor ({exc}); it must hold "
                         f"{_expected(name)}") from exc


_INT64_MAX = torch.iinfo(torch.int64).max
# unsigned integer dtypes wider than uint8 (torch >= 2.3 has them; their min/max are not implemented)
_WIDE_UNSIGNED = tuple(getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n))


def _signed_labels(labels, name: str):
    """Unsigned integer labels (uint16/32/64, numpy or torch) as int64; a value above the int64
    range is refused. Anything else is returned unchanged."""
    if isinstance(labels, np.ndarray) and labels.dtype.kind == "u" and labels.dtype.itemsize > 1:
        if labels.size and int(labels.max()) > _INT64_MAX:
            raise UserError(f"{name} holds {int(labels.max())}, above the int64 range: not a class index")
        return labels.astype(np.int64)
    if isinstance(labels, torch.Tensor) and labels.dtype in _WIDE_UNSIGNED:
        if labels.dtype != torch.uint64:
            return labels.to(torch.int64)
        wide = labels.view(torch.int64)  # values above the int64 range read as negative
        if labels.numel() and not trusting() and bool((wide < 0).any()):
            big = int(labels[wide < 0][0].item())
            raise UserError(f"{name} holds {big}, above the int64 range: not a class index")
        return wide
    return labels


def check_labels(labels, num_classes: int | None, n: int | None, name: str = "labels") -> torch.Tensor:
    """Integer class labels of shape (N,), each in [0, num_classes).

    Unsigned integer labels are accepted and returned as int64 (values above the int64 range refused).
    """
    labels = as_tensor(_signed_labels(labels, name), name)
    if labels.dim() != 1:
        raise UserError(f"{name} must have shape (N,), got {tuple(labels.shape)}")
    if labels.dtype.is_floating_point or labels.dtype == torch.bool or labels.dtype.is_complex:
        raise UserError(f"{name} must hold integer class indices, got dtype {labels.dtype}")
    if n is not None and labels.shape[0] != n:
        raise UserError(f"{name} has {labels.shape[0]} entries but the predictions have {n} rows")
    if labels.numel() and num_classes is not None and not trusting():
        # numpy on the CPU: one thread, instead of waking torch's intra-op threads for two reductions
        values = labels.detach().numpy() if labels.device.type == "cpu" else labels
        lo, hi = int(values.min()), int(values.max())
        if lo < 0 or hi >= num_classes:
            bad = lo if lo < 0 else hi
            raise UserError(f"{name} out of range: found {bad}, expected values in [0, {num_classes - 1}]")
    return labels.long()


def _check_layout(x, name: str) -> torch.Tensor:
    """The checks of a (N, K) matrix that do not read its values: type, shape, dtype, N and K."""
    x = as_tensor(x, name)
    if x.dim() != 2:
        raise UserError(f"{name} must have shape (N, K), got {tuple(x.shape)}")
    if not x.dtype.is_floating_point:
        raise UserError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.shape[0] == 0:
        raise UserError(f"{name} is empty (N = 0): no samples to evaluate")
    if x.shape[1] < 2:
        raise UserError(f"{name} must have at least 2 classes (K >= 2), got K = {x.shape[1]}")
    return x


def _check_finite(x, lo, hi, name: str) -> None:
    """Raise if the minimum ``lo`` or maximum ``hi`` of ``x`` shows a NaN (propagated) or +-inf."""
    if not (bool(torch.isfinite(lo)) and bool(torch.isfinite(hi))):
        n_bad = int((~torch.isfinite(x)).sum())
        raise UserError(f"{name} contains {n_bad} NaN or infinite value(s)")


def _check_matrix(x, name: str) -> torch.Tensor:
    x = _check_layout(x, name)
    if trusting():
        return x
    # One min/max pass finds NaN (propagated by aminmax) and +-inf; isfinite().all() would
    # materialise an (N, K) bool tensor and is ~20x slower on large inputs.
    _check_finite(x, *torch.aminmax(x), name)
    return x


def probs_within_tolerance(lo, hi, worst_row_dev, dtype: torch.dtype = torch.float32) -> bool:
    """True when the minimum ``lo``, maximum ``hi`` and largest ``|row sum - 1|`` of a probability
    matrix of ``dtype`` pass :func:`check_probs` (False for NaN). For callers that compute these
    statistics in their own pass over the matrix; on False they call :func:`check_probs` for the error."""
    return bool(lo >= 0) and bool(hi <= 1) and bool(worst_row_dev <= prob_sum_tol(dtype))


def probs_error(name: str, lo: float, hi: float, worst: float, dtype: torch.dtype, n_bad=None):
    """The ``ValueError`` of :func:`check_probs` for a matrix with minimum ``lo``, maximum ``hi``
    and largest ``|row sum - 1|`` ``worst`` (python floats), or ``None`` when they pass."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        count = "" if n_bad is None else f"{n_bad} "
        return UserError(f"{name} contains {count}NaN or infinite value(s)")
    if lo < 0 or hi > 1:
        return UserError(f"{name} has entries outside [0, 1]: these look like logits; pass softmax(logits) "
                          "instead (sigmoid(logits) for 1-D binary input)")
    tol = prob_sum_tol(dtype)
    if not worst <= tol:
        return UserError(f"{name} rows must sum to 1 (largest deviation {worst:.3g} > {tol:.3g} for {dtype}); "
                          "if these are logits, pass softmax(logits) instead")
    return None


def check_probs(probs, labels=None, name: str = "probs"):
    """Validate a probability matrix (N, K) and, if given, its labels (N,).

    Probabilities are never guessed from logits: rows must be non-negative, at most 1 and
    sum to 1 within ``prob_sum_tol(probs.dtype)``; otherwise the error says to apply softmax first.
    Returns ``probs`` (unchanged dtype) or ``(probs, labels)``.

    Cost: one ``aminmax`` pass (finiteness and range) and one float32 row sum.
    """
    probs = _check_layout(probs, name)
    if trusting():
        return probs if labels is None else (probs, check_labels(labels, probs.shape[1], probs.shape[0]))
    lo, hi = torch.aminmax(probs)
    _check_finite(probs, lo, hi, name)
    # Row sums in float32 (half upcast) are accurate to ~1e-6, far inside the tolerance, and
    # avoid a float64 copy of the whole (N, K) matrix.
    worst = 0.0
    if lo >= 0 and hi <= 1:
        worst = float((upcast(probs).sum(dim=1) - 1).abs().max())
    err = probs_error(name, float(lo), float(hi), worst, probs.dtype)
    if err is not None:
        raise err
    if labels is None:
        return probs
    return probs, check_labels(labels, probs.shape[1], probs.shape[0])


def check_probs_layout(probs, labels, name: str = "probs"):
    """:func:`check_probs` without the checks that read the probabilities, ``(probs, labels)``.

    For a caller that reads every entry anyway (:func:`calibkit.functional.panel.panel_sums`)
    and tests the values in that same pass with :func:`probs_within_tolerance`. The errors and
    their order are those of :func:`check_probs`: when the labels are bad, the matrix is checked
    in full first, so a bad matrix is still reported before bad labels.
    """
    probs = _check_layout(probs, name)
    try:
        labels = check_labels(labels, probs.shape[1], probs.shape[0])
    except ValueError:
        check_probs(probs, name=name)
        raise
    return probs, labels


def check_logits(logits, targets=None, name: str = "logits"):
    """Validate a logit matrix (N, K) and, if given, integer targets (N,).

    Returns ``logits`` or ``(logits, targets)``.
    """
    logits = _check_matrix(logits, name)
    if targets is None:
        return logits
    return logits, check_labels(targets, logits.shape[1], logits.shape[0], name="targets")


def check_n_bins(n_bins) -> int:
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise UserError(f"n_bins must be an integer >= 1, got {n_bins!r}")
    return int(n_bins)


def upcast(x: torch.Tensor) -> torch.Tensor:
    """Half precision (float16/bfloat16) -> float32 before a softmax or a log; wider types unchanged."""
    if x.dtype in (torch.float16, torch.bfloat16):
        return x.float()
    return x
