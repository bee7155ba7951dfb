"""The soft-label losses of the image-level methods (Mixup, RegMixup, CSM): ``(N, K)`` logits and
rows of probabilities as targets, never per pixel. Re-exported by :mod:`calibkit.functional.losses`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from calibkit._arrays import array_io
from calibkit._validation import check_logits, check_probs, upcast
from calibkit.errors import UserError
from calibkit.functional._loss_parts import _dense


def _prepare_soft(logits, soft_targets):
    if _dense(logits):
        raise UserError(f"logits have shape {tuple(logits.shape)}: the soft-label losses serve image-level "
                         "methods (Mixup, RegMixup, CSM) and take (N, K) logits; they are not defined per pixel")
    logits = upcast(check_logits(logits))
    soft = check_probs(soft_targets, name="soft_targets")
    if soft.shape != logits.shape:
        raise UserError(f"soft_targets has shape {tuple(soft.shape)} but logits have {tuple(logits.shape)}")
    return logits, soft.to(device=logits.device, dtype=logits.dtype)


@array_io
def soft_cross_entropy(logits, soft_targets) -> torch.Tensor:
    """Cross-entropy with soft labels ``mean_i(-sum_k y_ik log p_ik)`` (Mixup, RegMixup).

    Args:
        logits: (N, K). soft_targets: (N, K), rows are probability vectors.
    """
    logits, soft = _prepare_soft(logits, soft_targets)
    return -(soft * F.log_softmax(logits, dim=1)).sum(dim=1).mean()


@array_io
def soft_l2(logits, soft_targets) -> torch.Tensor:
    """CSM's loss on generated samples ``mean_i sum_k (p_ik - y_ik)^2`` (Luo et al., ICML 2025).

    Args:
        logits: (N, K). soft_targets: (N, K), rows are probability vectors.
    """
    logits, soft = _prepare_soft(logits, soft_targets)
    return (F.softmax(logits, dim=1) - soft).pow(2).sum(dim=1).mean()
