"""The mean NLL of softmax logits with its gradient in closed form, for the L-BFGS fits of the
affine maps (vector, matrix, Dirichlet, structured scaling): no autograd graph per evaluation.

For logits ``L`` (``(N, K)``) and labels ``y``: ``f = -mean_i log softmax(L_i)_{y_i}`` (as
``torch.nn.functional.cross_entropy``) and ``df/dL = (softmax(L) - onehot(y)) / N``; a map's
gradient follows by the chain rule (``L = x W^T + b``: ``df/dW = G^T x``, ``df/db = sum_i G_i``).
"""

from __future__ import annotations

import torch

__all__ = ["nll_grad", "softmax_curvature"]


def nll_grad(logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(f, G)``: the mean NLL of ``logits`` at labels ``y`` (a 0-d tensor) and its gradient in the logits.

    One pass of ``exp`` over the ``(N, K)`` logits: ``e = exp(L - max_k L)``, ``f = mean(max + log sum e
    - L_y)``, ``G = (e / sum e - onehot(y)) / N`` (finite for any finite logits).
    """
    n = logits.shape[0]
    rows = torch.arange(n, device=logits.device)
    top = logits.amax(1, keepdim=True)
    e = torch.exp(logits - top)
    total = e.sum(1, keepdim=True)
    f = (top.squeeze(1) + total.log().squeeze(1) - logits[rows, y]).mean()
    g = e.div_(total)
    g[rows, y] -= 1.0
    return f, g.div_(n)


def softmax_curvature(logits: torch.Tensor) -> torch.Tensor:
    """``(N, K)`` ``p (1 - p) / N`` with ``p = softmax(logits)``: the diagonal of the mean NLL's Hessian
    in each row's logits (the Gauss-Newton diagonal of a preconditioner)."""
    p = torch.softmax(logits, 1)
    return p * (1 - p) / logits.shape[0]
