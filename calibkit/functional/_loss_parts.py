"""What the loss functions share: input preparation (dense pixels gathered into rows, ``ignore_index``
dropped), the mean over valid rows, argument checks, the logit-gap penalty.

Private to :mod:`calibkit.functional.losses`, :mod:`calibkit.functional.soft_losses` and
:mod:`calibkit.functional.fedlas`; the conventions they implement are in the docstring of
:mod:`calibkit.functional.losses`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from calibkit._validation import as_tensor, check_logits, trusting, upcast
from calibkit.errors import UserError
from calibkit.functional.pixels import dense_rows

IGNORE_INDEX = 255  # PASCAL VOC's "void" label; the default of every dense loss


def _rows(logits, targets, ignore_index):
    """Validated ``(logits (M, K), targets (M,), valid)``: the input itself (``valid`` None), or every
    pixel of a dense input as a row with its validity mask (:func:`calibkit.functional.pixels.dense_rows`)."""
    logits = as_tensor(logits, "logits")
    if logits.dim() >= 3:
        return dense_rows(logits, targets, ignore_index)
    logits, targets = check_logits(logits, targets)
    return logits, targets, None


def _prepare(logits, targets, ignore_index=IGNORE_INDEX):
    """Validate, upcast half precision; ``(logits, targets, log_probs, log_p_y, valid)`` over rows."""
    logits, targets, valid = _rows(logits, targets, ignore_index)
    logits = upcast(logits)
    targets = targets.to(logits.device)
    logp = F.log_softmax(logits, dim=1)  # (M, K)
    logp_y = logp.gather(1, targets[:, None]).squeeze(1)  # (M,)
    return logits, targets, logp, logp_y, valid


def _mean(x: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """Mean over rows, or over the valid rows of a dense input (0 with a zero gradient when none is).

    ``where`` (not a product with the mask) keeps a non-finite term of an ignored pixel out.
    """
    if valid is None:
        return x.mean()
    return torch.where(valid, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum() / valid.sum().clamp_min(1)


def _check_number(value, name: str, low: float | None = None, high: float | None = None) -> float:
    """A finite real hyperparameter inside ``[low, high]``; a clear error otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise UserError(f"{name} must be finite, got {value}")
    if (low is not None and value < low) or (high is not None and value > high):
        lo = "-inf" if low is None else low
        hi = "inf" if high is None else high
        raise UserError(f"{name} must lie in [{lo}, {hi}], got {value}")
    return value


def _per_sample(value, name: str, logits: torch.Tensor, dense_targets=None) -> torch.Tensor:
    """A scalar or a tensor of finite per-sample values -> (M,) as logits' dtype/device.

    ``logits`` are the validated rows (M, K). For a dense call, pass the original targets
    ``(N, *S)``: a value of that shape gives one value per pixel, like the rows.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = torch.tensor(float(value))
    value = as_tensor(value, name)
    if not value.dtype.is_floating_point:
        value = value.float()
    n = logits.shape[0]
    if value.dim() == 0:
        value = value.expand(n)
    elif dense_targets is not None:
        dense_targets = as_tensor(dense_targets, "targets")
        if value.shape != dense_targets.shape:
            raise UserError(f"{name} must be a scalar or have the targets' shape {tuple(dense_targets.shape)}, "
                             f"got {tuple(value.shape)}")
        value = value.reshape(-1)  # one value per pixel, like the rows
    if value.shape != (n,):
        raise UserError(f"{name} must be a scalar or have shape ({n},), got {tuple(value.shape)}")
    if not trusting() and not torch.isfinite(value).all():
        raise UserError(f"{name} contains NaN or infinite value(s)")
    return value.to(device=logits.device, dtype=logits.dtype)


def _dense(logits) -> bool:
    return isinstance(logits, torch.Tensor) and logits.dim() >= 3


def _one_minus(p: torch.Tensor) -> torch.Tensor:
    # Clamped away from 0 so that (1 - p)^g keeps a finite gradient for 0 < g < 1 when
    # p rounds to exactly 1; the change in value is below the dtype's resolution.
    return p.clamp_min(torch.finfo(p.dtype).tiny)


def _gap_penalty(logits: torch.Tensor, margin: float) -> torch.Tensor:
    """Per-sample ``mean_k relu(d_k - m)``, shape (N,). Gradient flows through the max logit too."""
    gaps = logits.max(dim=1, keepdim=True).values - logits  # (N, K), d_k >= 0
    return F.relu(gaps - margin).mean(dim=1)
