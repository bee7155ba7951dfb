"""Mean intersection over union (segmentation) from a confusion matrix.

With ``C[y, p]`` the number of samples (pixels) of label ``y`` predicted as ``p``,
``IoU_k = C[k, k] / (sum_p C[k, p] + sum_y C[y, k] - C[k, k])`` (true positives over true
positives + false positives + false negatives), and ``mIoU`` is the mean of ``IoU_k`` over the
classes that occur at all (in the labels or the predictions): a class absent from both has
``0 / 0`` and is left out of the mean, the convention of the PASCAL VOC and Cityscapes
evaluations (``nanmean``).
"""

from __future__ import annotations

import torch

from calibkit._arrays import array_io
from calibkit._validation import as_tensor, check_labels
from calibkit.errors import UserError
from calibkit.functional.panel_device import scatter_sums

__all__ = ["mean_iou", "confusion_matrix", "iou_from_confusion"]


def confusion_matrix(preds: torch.Tensor, labels: torch.Tensor, num_classes: int, weight=None) -> torch.Tensor:
    """``C[y, p]`` as float64 ``(K, K)`` from ``(P,)`` predictions and labels in ``[0, K)``.

    ``weight`` ``(P,)`` (0/1) leaves rows out without removing them; no host synchronisation.
    """
    w = torch.ones(preds.shape[0], 1, dtype=torch.float64, device=preds.device) if weight is None \
        else weight.double().view(-1, 1)
    slot = labels.long() * num_classes + preds.long()
    return scatter_sums(slot, w, num_classes * num_classes, lanes=8).view(num_classes, num_classes)


def iou_from_confusion(cm: torch.Tensor) -> torch.Tensor:
    """Mean IoU of a confusion matrix ``(K, K)`` (rows = labels); classes with no sample and no
    prediction are left out. Returns a 0-dim float64 tensor (NaN if the matrix is empty)."""
    cm = cm.double()
    tp = cm.diagonal()
    union = cm.sum(0) + cm.sum(1) - tp
    present = union > 0
    iou = tp / union.clamp(min=1)
    return (iou * present).sum() / present.sum()


def _predictions(x: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    if not x.dtype.is_floating_point:
        if x.dtype == torch.bool or x.dtype.is_complex:
            raise UserError(f"probs_or_preds must be probabilities, logits or integer predictions, got {x.dtype}")
        if tuple(x.shape) != tuple(labels.shape):
            raise UserError(f"integer predictions of shape {tuple(x.shape)} need labels of the same shape, "
                             f"got {tuple(labels.shape)}")
        return x
    if x.numel() and not bool(torch.isfinite(x).all()):
        raise UserError("probs_or_preds contains NaN or infinite value(s)")
    if x.dim() == 1:  # binary: positive-class probabilities
        if tuple(labels.shape) != tuple(x.shape):
            raise UserError(f"1-D probs_or_preds (binary) need labels of shape {tuple(x.shape)}, got "
                            f"{tuple(labels.shape)}")
        return (x > 0.5).long()
    if x.shape[1] != num_classes:
        raise UserError(f"probs_or_preds has {x.shape[1]} classes along dim 1 but num_classes={num_classes}")
    expected = x.shape[:1] + x.shape[2:]
    if tuple(labels.shape) != tuple(expected):
        raise UserError(f"probs_or_preds of shape {tuple(x.shape)} (N, K, *spatial) need labels of shape "
                         f"{tuple(expected)}, got {tuple(labels.shape)}")
    return x.argmax(1)


@array_io
def mean_iou(probs_or_preds, labels, num_classes: int, ignore_index: int | None = None) -> torch.Tensor:
    """Mean IoU over classes (module docstring for the definition).

    Args:
        probs_or_preds: class scores ``(N, K, *spatial)`` or ``(N, K)`` (probabilities or logits:
            the prediction is the argmax over dim 1, first index on ties), 1-D positive-class
            probabilities (binary, predicted positive when ``p > 0.5``), or integer predictions
            of the labels' shape.
        labels: integer labels ``(N, *spatial)`` / ``(N,)`` in ``[0, num_classes)`` or ``ignore_index``.
        num_classes: ``K`` (``2`` for binary input).
        ignore_index: label of pixels to leave out (e.g. 255), or ``None``.

    Returns:
        0-dim float64 tensor.
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise UserError(f"num_classes must be an integer >= 1, got {num_classes!r}")
    x, labels = as_tensor(probs_or_preds, "probs_or_preds"), as_tensor(labels, "labels")
    preds = _predictions(x, labels, num_classes).reshape(-1)
    y = labels.reshape(-1)
    if ignore_index is not None:
        check_labels(y, None, None)
        keep = y != ignore_index
        preds, y = preds[keep], y[keep]
    if y.numel() == 0:
        raise UserError("no samples to evaluate" + (f": every label equals ignore_index={ignore_index}"
                                                     if ignore_index is not None else ""))
    y = check_labels(y, num_classes, None)
    lo, hi = int(preds.min()), int(preds.max())
    if lo < 0 or hi >= num_classes:
        raise UserError(f"predictions out of range: found {lo if lo < 0 else hi}, expected [0, {num_classes - 1}]")
    return iou_from_confusion(confusion_matrix(preds, y, num_classes))
