"""MaC-Cal's tensor pieces: the DropConnect mask, the keep-rate rule and the deployed predictor.

Everything here is a pure function of tensors (no training loop, no files); see
:mod:`calibkit.methods.maccal` for the method and ``docs/maccal.md`` for the decisions.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from calibkit.errors import UserError

__all__ = [
    "MC_SEED_OFFSET",
    "bernoulli_mask",
    "masked_linear",
    "update_keep_rate",
    "mc_predict_proba",
    "mc_logits",
    "deployed_proba",
]

# The Monte-Carlo masks of the deployed predictor come from their own stream, seeded with
# ``seed + MC_SEED_OFFSET``, so that they never coincide with the training masks of any seed.
MC_SEED_OFFSET = 1_000_003
# Largest (rows x S*K) block of masked-head logits computed at once by the deployed predictor.
_BLOCK_ELEMENTS = 1 << 22


def check_keep_rate(keep_rate, name: str = "keep_rate") -> float:
    """``keep_rate`` as a float in (0, 1]; ``ValueError`` naming ``name`` otherwise."""
    if isinstance(keep_rate, bool) or not isinstance(keep_rate, (int, float)):
        raise UserError(f"{name} must be a number in (0, 1], got {keep_rate!r}")
    keep_rate = float(keep_rate)
    if math.isnan(keep_rate) or not (0.0 < keep_rate <= 1.0):
        raise UserError(f"{name} must lie in (0, 1], got {keep_rate}")
    return keep_rate


def check_int(value, name: str, low: int) -> int:
    """``value`` as an int >= ``low``; ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise UserError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def bernoulli_mask(shape, keep_rate: float, generator: torch.Generator | None = None,
                   device=None, dtype=torch.float32) -> torch.Tensor:
    """An i.i.d. Bernoulli(keep_rate) 0/1 mask: ``M = [U < r]`` with ``U ~ Uniform[0, 1)``.

    Args:
        shape: shape of the mask, e.g. the head's weight shape ``(K, D)``.
        keep_rate: probability ``r`` in (0, 1] that an entry is kept (is 1).
        generator: source of randomness (its device must match ``device``); ``None`` uses the
            global generator.
        device, dtype: of the returned mask.

    Returns:
        Tensor of ``shape`` with entries in {0, 1}; all ones when ``keep_rate == 1`` (and then no
        random number is drawn, so ``r = 1`` is exactly plain training).
    """
    keep_rate = check_keep_rate(keep_rate)
    if keep_rate == 1.0:
        return torch.ones(shape, device=device, dtype=dtype)
    u = torch.rand(shape, generator=generator, device=device, dtype=torch.float32)
    return (u < keep_rate).to(dtype)


def masked_linear(features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  keep_rate: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Linear layer with a fresh DropConnect mask on the weight matrix.

    ``logits = features @ ((M * W) / r).T + b`` with ``M ~ Bernoulli(r)`` i.i.d. of shape
    ``(K, D)``, drawn anew on every call and shared by the ``N`` rows of ``features``. The
    ``1/r`` scaling makes the expected logit equal to the unmasked one:
    ``E[logits] = features @ W.T + b``. The bias is not masked. Gradients reach ``weight``
    only through kept entries (scaled by ``1/r``).

    Args:
        features: ``(N, D)`` penultimate features.
        weight: ``(K, D)`` head weight.
        bias: ``(K,)`` head bias or ``None``.
        keep_rate: ``r`` in (0, 1].
        generator: randomness for the mask (on ``weight``'s device).

    Returns:
        ``(N, K)`` logits.

    >>> f = torch.ones(1, 2); w = torch.tensor([[1.0, 2.0]]); b = torch.zeros(1)
    >>> masked_linear(f, w, b, 1.0)
    tensor([[3.]])
    """
    _check_shapes(features, weight)
    mask = bernoulli_mask(weight.shape, keep_rate, generator, weight.device, weight.dtype)
    return F.linear(features, weight * mask / float(keep_rate), bias)


def _check_shapes(features: torch.Tensor, weight: torch.Tensor) -> None:
    if features.dim() != 2 or weight.dim() != 2 or features.shape[1] != weight.shape[1]:
        raise UserError(
            f"features (N, D) and weight (K, D) must agree on D, got {tuple(features.shape)} "
            f"and {tuple(weight.shape)}"
        )


def update_keep_rate(r: float, conf: float, acc: float, eta: float = 1.0, r_min: float = 0.1) -> float:
    """calibkit's keep-rate rule: ``r' = clip(r - eta * (conf - acc), r_min, 1)``.

    ``conf`` and ``acc`` are the mean confidence and the accuracy of the deployed predictor on
    the validation split. Over-confidence (``conf > acc``) lowers the keep rate (more masking,
    which lowers the confidence of the mask-averaged predictor); under-confidence raises it.
    The paper's own update rule is not public; this is calibkit's documented rule.

    Args:
        r: current keep rate in (0, 1].
        conf: mean max-probability on the validation split, in [0, 1].
        acc: validation accuracy, in [0, 1].
        eta: step size (>= 0).
        r_min: floor of the keep rate, in (0, 1].

    >>> round(update_keep_rate(0.9, conf=0.95, acc=0.85, eta=1.0, r_min=0.1), 6)
    0.8
    >>> update_keep_rate(0.9, conf=0.5, acc=0.9)
    1.0
    """
    r = check_keep_rate(r, "r")
    r_min = check_keep_rate(r_min, "r_min")
    for name, v in (("conf", conf), ("acc", acc)):
        if not (0.0 <= float(v) <= 1.0):
            raise UserError(f"{name} must lie in [0, 1], got {v}")
    if not (float(eta) >= 0.0):
        raise UserError(f"eta must be >= 0, got {eta}")
    return float(min(1.0, max(r_min, r - float(eta) * (float(conf) - float(acc)))))


@torch.no_grad()
def mc_predict_proba(features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     keep_rate: float, mc_samples: int, seed: int = 0) -> torch.Tensor:
    """The deployed MaC-Cal predictor: probabilities averaged over ``S`` seeded masked heads.

    ``p(x) = (1/S) sum_s softmax(x @ ((M_s * W) / r).T + b)`` with ``M_s = [U_s < r]`` and
    ``U_1..U_S`` i.i.d. ``Uniform[0, 1)`` of shape ``(K, D)``, drawn from a CPU generator seeded
    with ``seed`` on every call. Hence the predictor is a fixed function of ``x``:

    * reproducible: the same call gives the same result, on any device (the masks are drawn on
      the CPU, then moved);
    * row by row: each mask is shared by all rows, so a row's prediction does not depend on the
      other rows (predicting in batches equals predicting at once, up to float rounding);
    * coupled across keep rates: ``M_s`` is monotone in ``r`` (the same ``U_s`` thresholded), so
      the predictor changes smoothly with ``r``; at ``r = 1`` it is exactly ``softmax(head(x))``.

    Probabilities are averaged, never logits. Cost: ``S`` head evaluations (``S * N * D * K``
    multiply-adds, done as one ``(N, D) x (D, S*K)`` product per block of rows) and ``S * K * D``
    uniform draws; the features are an input, computed once by the caller.

    Args:
        features: ``(N, D)``; weight ``(K, D)``; bias ``(K,)`` or None.
        keep_rate: ``r`` in (0, 1]; mc_samples: ``S >= 1``; seed: of the masks.

    Returns:
        ``(N, K)`` float32 probabilities (rows sum to 1).
    """
    keep_rate = check_keep_rate(keep_rate)
    check_int(mc_samples, "mc_samples", 1)
    _check_shapes(features, weight)
    if keep_rate == 1.0:  # every mask is all ones: the unmasked head, exactly
        return torch.softmax(F.linear(features, weight, bias).float(), dim=1)
    gen = torch.Generator().manual_seed(int(seed))
    K, D = weight.shape
    keep = torch.rand((mc_samples, K, D), generator=gen) < keep_rate  # M_1..M_S, drawn in order
    w = (weight.unsqueeze(0) * keep.to(device=weight.device, dtype=weight.dtype) / keep_rate).reshape(-1, D)
    b = None if bias is None else bias.repeat(mc_samples)
    # All S heads in one matrix product, (n, S*K) per block of rows (rows are independent).
    rows = max(1, _BLOCK_ELEMENTS // (mc_samples * K))
    out = [torch.softmax(F.linear(features[i:i + rows], w, b).float().view(-1, mc_samples, K), dim=2).mean(dim=1)
           for i in range(0, features.shape[0], rows)]
    return torch.cat(out) if out else features.new_zeros(0, K, dtype=torch.float32)


def mc_logits(probs: torch.Tensor) -> torch.Tensor:
    """Logits stored for a probability-valued predictor: ``log(max(p, tiny))``.

    Because the rows of ``probs`` sum to 1, ``softmax(log p) = p`` exactly (up to the clamp at
    float32's tiny), so every reader that applies softmax to stored logits recovers the
    averaged probabilities.
    """
    return torch.log(probs.float().clamp_min(torch.finfo(torch.float32).tiny))


@torch.no_grad()
def deployed_proba(features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   keep_rate: float, mc_samples: int, seed: int = 0) -> torch.Tensor:
    """What MaC-Cal deploys, as ``(N, K)`` float32 probabilities.

    ``mc_samples = S >= 1``: :func:`mc_predict_proba` at ``keep_rate`` with the masks of stream
    ``seed + MC_SEED_OFFSET``. ``mc_samples = 0``: the deterministic unmasked head,
    ``softmax(features @ W.T + b)`` (``keep_rate`` and ``seed`` unused).
    """
    check_int(mc_samples, "mc_samples", 0)
    if mc_samples == 0:
        _check_shapes(features, weight)
        return torch.softmax(F.linear(features, weight, bias).float(), dim=1)
    return mc_predict_proba(features, weight, bias, keep_rate, mc_samples, int(seed) + MC_SEED_OFFSET)
