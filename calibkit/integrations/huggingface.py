"""``compute_metrics`` for the Hugging Face ``transformers.Trainer``: logits in, calibration panel out.

``Trainer(..., compute_metrics=compute_metrics)`` calls it with an ``EvalPrediction`` (or a
``(predictions, label_ids)`` tuple) of numpy arrays after each evaluation; the Trainer adds the
``eval_`` prefix to the keys. Nothing here imports ``transformers``.

Layouts of ``predictions`` (logits, never probabilities):

* ``(N, K)``: sequence/image classification, ``softmax`` over the classes;
* ``(N,)`` or ``(N, 1)``: one logit (binary head), ``sigmoid``, scored as binary;
* ``(N, T, K)``: token classification (classes last, Hugging Face's layout), scored per token;
  labels ``(N, T)`` with ``-100`` for tokens to skip (the default ``ignore_index``);
* ``(N, K, *spatial)`` with 4 or more dims: dense, classes at dim 1 (labels of shape
  ``(N, *spatial)``).

A tuple of predictions (e.g. logits and hidden states) is reduced to its first element.
"""

from __future__ import annotations

import numpy as np
import torch

from calibkit.metrics import evaluate

__all__ = ["compute_metrics", "make_compute_metrics"]


def _logits_and_labels(eval_pred):
    if hasattr(eval_pred, "predictions"):
        preds, labels = eval_pred.predictions, eval_pred.label_ids
    else:
        preds, labels = eval_pred
    if isinstance(preds, (tuple, list)):
        preds = preds[0]
    if isinstance(labels, (tuple, list)):
        labels = labels[0]
    return torch.as_tensor(np.asarray(preds)), torch.as_tensor(np.asarray(labels))


def make_compute_metrics(n_bins: int = 15, ignore_index: int | None = -100):
    """A ``compute_metrics(eval_pred) -> dict[str, float]`` with these settings.

    Args:
        n_bins: bins of the binned metrics.
        ignore_index: label of samples to skip (``-100``, Hugging Face's padding label), or ``None``.
    """

    def compute_metrics(eval_pred) -> dict[str, float]:
        logits, labels = _logits_and_labels(eval_pred)
        z = logits.double()  # softmax in float64 whatever the evaluation dtype
        if z.dim() == 2 and z.shape[1] == 1:
            z = z[:, 0]
        if z.dim() == 1:
            probs = torch.sigmoid(z)
        else:
            if z.dim() == 3:
                z = z.movedim(-1, 1)  # (N, T, K) -> (N, K, T)
            probs = torch.softmax(z, dim=1)
        return evaluate(probs, labels, n_bins=n_bins, ignore_index=ignore_index)

    return compute_metrics


#: ``make_compute_metrics()``: 15 bins, ``ignore_index=-100``.
compute_metrics = make_compute_metrics()
