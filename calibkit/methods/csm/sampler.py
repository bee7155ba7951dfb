"""Deterministic 2nd-order Heun sampler of EDM, with optional classifier-free guidance.

Karras et al., "Elucidating the Design Space of Diffusion-Based Generative Models" (NeurIPS 2022),
Algorithm 1 (= Algorithm 2 with S_churn = 0). The probability-flow ODE is
``dx/dsigma = (x - D(x; sigma)) / sigma``, integrated from sigma_max to 0 on the time steps::

    t_i = (sigma_max^(1/rho) + i / (N - 1) (sigma_min^(1/rho) - sigma_max^(1/rho)))^rho,  t_N = 0

with an Euler step followed by a trapezoidal (Heun) correction except on the last step, i.e.
2N - 1 denoiser calls. CSM samples with sigma in [0.002, 80], rho = 7 and 20 steps at 32x32.

Guidance (a calibkit option, not part of the method as published): with weight ``w``,
``D = D(x; sigma, 0) + w (D(x; sigma, y) - D(x; sigma, 0))`` where the zero vector is the
unconditional input learned through class dropout; ``w = 1`` is plain conditional sampling and
costs one network call per evaluation, ``w != 1`` two (batched together).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from calibkit.errors import UserError

Denoiser = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def edm_sigmas(steps: int = 20, sigma_min: float = 0.002, sigma_max: float = 80.0, rho: float = 7.0,
               dtype=torch.float64) -> torch.Tensor:
    """The N + 1 noise levels: from ``t_0 = sigma_max`` down to ``t_{N-1} = sigma_min``, then ``t_N = 0``."""
    if steps < 1:
        raise UserError(f"steps must be >= 1, got {steps}")
    if not 0 < sigma_min < sigma_max:
        raise UserError(f"need 0 < sigma_min < sigma_max, got {sigma_min}, {sigma_max}")
    i = torch.arange(steps, dtype=dtype)
    denom = max(steps - 1, 1)
    t = (sigma_max ** (1 / rho) + i / denom * (sigma_min ** (1 / rho) - sigma_max ** (1 / rho))) ** rho
    return torch.cat([t, t.new_zeros(1)])


def guided(denoiser: Denoiser, guidance: float) -> Denoiser:
    """Wrap ``denoiser`` with classifier-free guidance of weight ``guidance`` (1 = unchanged)."""
    if guidance == 1.0:
        return denoiser

    def d(x, sigma, y):
        b = x.shape[0]
        out = denoiser(torch.cat([x, x]), torch.cat([sigma, sigma]), torch.cat([torch.zeros_like(y), y]))
        d_uncond, d_cond = out[:b], out[b:]
        return d_uncond + guidance * (d_cond - d_uncond)

    return d


@torch.no_grad()
def heun_sample(denoiser: Denoiser, noise: torch.Tensor, y: torch.Tensor, steps: int = 20,
                sigma_min: float = 0.002, sigma_max: float = 80.0, rho: float = 7.0,
                guidance: float = 1.0) -> torch.Tensor:
    """Integrate the probability-flow ODE from ``noise * sigma_max`` to sigma = 0.

    Args:
        denoiser: ``D(x (B, ...), sigma (B,), y (B, K)) -> (B, ...)``, e.g. a
            :class:`~calibkit.methods.csm.generator.CondDenoiser`.
        noise: standard normal initial noise (B, C, H, W); it is scaled by ``sigma_max`` here.
            Pass the same noise rows to get a group of images from one initial noise.
        y: class condition (B, K) (soft one-hot; zeros = unconditional).
        steps: N, the number of noise levels (2N - 1 denoiser evaluations).
        sigma_min, sigma_max, rho: EDM discretisation.
        guidance: classifier-free guidance weight w (1 = none).

    Returns:
        Samples (B, C, H, W) in the denoiser's data space (same dtype as ``noise``).
    """
    if noise.shape[0] != y.shape[0]:
        raise UserError(f"noise has {noise.shape[0]} rows but y has {y.shape[0]}")
    d_fn = guided(denoiser, guidance)
    t = edm_sigmas(steps, sigma_min, sigma_max, rho).tolist()
    b = noise.shape[0]
    x = noise * t[0]
    for i in range(steps):
        t_cur, t_next = t[i], t[i + 1]
        s_cur = torch.full((b,), t_cur, dtype=noise.dtype, device=noise.device)
        d_cur = (x - d_fn(x, s_cur, y)) / t_cur
        x_next = x + (t_next - t_cur) * d_cur
        if t_next > 0:  # 2nd-order correction, skipped on the final step to sigma = 0
            s_next = torch.full((b,), t_next, dtype=noise.dtype, device=noise.device)
            d_next = (x_next - d_fn(x_next, s_next, y)) / t_next
            x_next = x + (t_next - t_cur) * (0.5 * d_cur + 0.5 * d_next)
        x = x_next
    return x
