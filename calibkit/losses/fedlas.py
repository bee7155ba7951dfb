"""FeDLaS: feature-modulated bidirectional label smoothing, with its trainable sign gate."""

from __future__ import annotations

from typing import cast

import torch
import torch.distributed as dist
from torch import nn

import calibkit.functional.losses as FL
from calibkit._validation import check_logits
from calibkit.errors import UserError
from calibkit.functional.pixels import check_ignore_index, dense_rows, feature_rows

from .basic import IGNORE_INDEX, _check_classes, _check_num_classes

_FEDLAS_DEFAULTS: dict[str, dict[str, float | None]] = {
    "ls": {"alpha": 0.05, "beta": 4.0, "theta": 0.95, "margin": None},
    "mbls": {"alpha": 0.1, "beta": 0.5, "theta": 0.95, "margin": 6.0},
}


class FeDLaS(nn.Module):
    """FeDLaS, feature-modulated bidirectional label smoothing (ECCV 2026), spec section 3.

    Per sample, from the detached penultimate features ``z_i`` and detached logits ``s_i``::

        gamma_i = (||z_i||_1 - mu) / (sigma + 1e-3)                        (NCI)
        psi_i   = sign(p1 - p0),  p = softmax(gate(s_i))                    (BCG, in {-1, +1})
        alpha_i = alpha * 2 * sigmoid(beta * psi_i * gamma_i)               (ASM, in (0, 2 alpha))
        LS   variant: mean_i[(1 - alpha_i) NLL_i + alpha_i mean_k(-log p_ik)]
        MbLS variant: mean_i[(1 - alpha_i) NLL_i] + mean_i[alpha_i mean_k relu(d_ik - margin)]

    ``gate`` is ``Linear(K, K//2) -> LeakyReLU(0.01) -> Linear(K//2, 2)``; the sign uses a
    straight-through estimator (forward ``sign``, backward identity); ``sign(0)`` is taken as +1.
    The gate has no loss of its own: its only training signal is the main loss through
    ``alpha_i``. **The trainer must optimise it**: build one optimizer over
    ``list(model.parameters()) + list(loss.parameters())`` (same lr, weight decay and schedule),
    and save ``loss.state_dict()`` (gate weights, ``mu``, ``sigma``) with the model. Under DDP the
    gate is not inside the wrapped model, so its gradients must be all-reduced like the model's
    (e.g. wrap the loss in ``DistributedDataParallel`` too, or all-reduce ``loss.parameters()``
    grads before the step).

    Running statistics (buffers ``mu`` = 20, ``sigma`` = 100 at start) are updated in training
    mode only, before normalising, with ``theta`` weighting the NEW batch::

        mu <- theta * mean_batch + (1 - theta) * mu;  sigma <- theta * std_batch + (1 - theta) * sigma

    ``std_batch`` is the unbiased std; for a batch of one sample (std undefined) sigma is left
    unchanged. When ``torch.distributed`` is initialised the batch mean/std are taken over the
    global batch (all-reduce of count, sum and sum of squares in float64), so every rank keeps
    identical buffers. ``beta = 0`` recovers the base loss with ``alpha_i = alpha``.

    Args:
        num_classes: K. variant: ``"ls"`` or ``"mbls"``.
        alpha, beta, theta, margin: ``None`` takes the variant's default (spec section 3):
            LS alpha 0.05, beta 4, theta 0.95; MbLS alpha 0.1, beta 0.5, theta 0.95, margin 6.
            ``margin`` applies to the MbLS variant only.
        ignore_index: target of unlabelled pixels in dense inputs (default 255).

    Dense prediction (segmentation): each valid pixel is a sample. With logits ``(N, K, *S)``
    the features must be ``(N, D, *S)`` at the same resolution -- the per-pixel penultimate
    features that a 1x1-convolution head maps to that pixel's logits, the exact analogue of the
    pooled feature vector a linear classification head reads. ``||z||_1`` is taken over ``D`` at
    each pixel, ``mu``/``sigma`` track the mean/std of these per-pixel norms over the valid pixels
    of the (global) batch, and the loss is the flat FeDLaS loss on the valid pixels.
    """

    needs_features = True
    mu: torch.Tensor  # buffers (register_buffer in __init__)
    sigma: torch.Tensor

    def __init__(self, num_classes: int, variant: str = "ls", alpha: float | None = None,
                 beta: float | None = None, theta: float | None = None, margin: float | None = None,
                 ignore_index: int | None = IGNORE_INDEX):
        super().__init__()
        self.ignore_index = check_ignore_index(ignore_index)
        self.num_classes = _check_num_classes(num_classes)
        if variant not in _FEDLAS_DEFAULTS:
            raise UserError(f"variant must be one of {sorted(_FEDLAS_DEFAULTS)}, got {variant!r}")
        if variant == "ls" and margin is not None:
            raise UserError("margin applies to FeDLaS variant 'mbls' only")
        d = _FEDLAS_DEFAULTS[variant]
        self.variant = variant
        self.alpha = FL._check_number(d["alpha"] if alpha is None else alpha, "alpha", 0.0)
        self.beta = FL._check_number(d["beta"] if beta is None else beta, "beta")
        self.theta = FL._check_number(d["theta"] if theta is None else theta, "theta", 0.0, 1.0)
        self.margin = None if variant == "ls" else FL._check_number(d["margin"] if margin is None else margin,
                                                                    "margin", 0.0)
        k = self.num_classes
        self.gate = nn.Sequential(nn.Linear(k, k // 2), nn.LeakyReLU(0.01), nn.Linear(k // 2, 2))
        self.register_buffer("mu", torch.tensor(20.0))
        self.register_buffer("sigma", torch.tensor(100.0))

    @torch.no_grad()
    def _update_stats(self, norms: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        # Shift by the current mu (identical on every rank) so the float64 sum of squares does not
        # cancel catastrophically; count, sum and sum of squares are all additive over ranks.
        # ``valid`` (dense inputs) leaves ignored pixels out of all three sums.
        shift = self.mu.double().to(norms.device)
        x = norms.double() - shift
        if valid is None:
            count = torch.tensor(float(x.numel()), dtype=torch.float64, device=x.device)
        else:
            x = torch.where(valid, x, torch.zeros((), dtype=x.dtype, device=x.device))
            count = valid.sum().double()
        stats = torch.stack([count, x.sum(), (x * x).sum()])
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(stats, op=dist.ReduceOp.SUM)
        n, s, sq = stats.unbind()
        mean = s / n.clamp_min(1)
        var = (sq - n * mean * mean) / (n - 1).clamp_min(1)
        std = torch.where(n > 1, var.clamp_min(0).sqrt(), self.sigma.double().to(x.device))
        mu = self.mu.double().to(x.device)  # no sample at all (every pixel ignored): mu unchanged
        self.mu.copy_(torch.where(n > 0, self.theta * (mean + shift) + (1 - self.theta) * mu, mu))
        self.sigma.copy_(self.theta * std + (1 - self.theta) * self.sigma.double().to(x.device))

    def sign_gate(self, logits: torch.Tensor) -> torch.Tensor:
        """psi in {-1, +1}, shape (N,), with a straight-through gradient to the gate's parameters."""
        w = cast(nn.Linear, self.gate[0]).weight  # Sequential indexing is typed as any Module
        p = torch.softmax(self.gate(logits.detach().to(w.dtype)), dim=1)
        diff = p[:, 1] - p[:, 0]
        hard = torch.where(diff >= 0, 1.0, -1.0).to(diff.dtype)
        return diff + (hard - diff).detach()  # forward: hard sign; backward: identity

    def sample_alphas(self, logits, features, valid: torch.Tensor | None = None) -> torch.Tensor:
        """alpha_i, shape (N,); updates ``mu``/``sigma`` first when in training mode.

        Dense inputs come as rows: logits (M, K), features (M, D) and the validity mask ``valid`` (M,).
        """
        norms = FL.feature_l1_norms(features)
        if norms.shape[0] != logits.shape[0]:
            raise UserError(f"features have {norms.shape[0]} rows but logits have {logits.shape[0]}")
        if self.training:
            self._update_stats(norms, valid)
        nci = FL.fedlas_nci(norms, self.mu.to(norms.device, norms.dtype), self.sigma.to(norms.device, norms.dtype))
        return FL.fedlas_alpha(nci, self.sign_gate(logits), self.alpha, self.beta)

    def forward(self, logits, targets, features=None):
        if features is None:
            raise UserError("FeDLaS needs the penultimate features: call "
                             "loss(logits, targets, features=model.forward_features(x)) "
                             "(FeDLaS.needs_features is True)")
        if isinstance(logits, torch.Tensor) and logits.dim() >= 3:  # every pixel a sample, void masked
            rows, _, valid = dense_rows(logits, targets, self.ignore_index)
            _check_classes(rows, self.num_classes, "FeDLaS")
            alpha = self.sample_alphas(rows, feature_rows(features, logits), valid).reshape(targets.shape)
            if self.variant == "ls":
                return FL.weighted_label_smoothing(logits, targets, alpha, ignore_index=self.ignore_index)
            return FL.weighted_mbls(logits, targets, alpha, self.margin, ignore_index=self.ignore_index)
        logits, targets = check_logits(logits, targets)
        _check_classes(logits, self.num_classes, "FeDLaS")
        alpha = self.sample_alphas(logits, features)
        if self.variant == "ls":
            return FL.weighted_label_smoothing(logits, targets, alpha)
        return FL.weighted_mbls(logits, targets, alpha, self.margin)

    def extra_repr(self) -> str:
        m = "" if self.margin is None else f", margin={self.margin}"
        return f"num_classes={self.num_classes}, variant={self.variant!r}, alpha={self.alpha}, " \
               f"beta={self.beta}, theta={self.theta}{m}"


def _fedlas_ls(num_classes: int, alpha: float = 0.05, beta: float = 4.0, theta: float = 0.95,
               ignore_index: int | None = IGNORE_INDEX) -> FeDLaS:
    return FeDLaS(num_classes, "ls", alpha=alpha, beta=beta, theta=theta, ignore_index=ignore_index)


def _fedlas_mbls(num_classes: int, alpha: float = 0.1, beta: float = 0.5, theta: float = 0.95,
                 margin: float = 6.0, ignore_index: int | None = IGNORE_INDEX) -> FeDLaS:
    return FeDLaS(num_classes, "mbls", alpha=alpha, beta=beta, theta=theta, margin=margin,
                  ignore_index=ignore_index)


