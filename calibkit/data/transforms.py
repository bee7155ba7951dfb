"""Batched tensor transforms: augmentation, normalisation, resizing, Mixup and RegMixup.

All functions work on whole batches and on any device, so the training loop can keep the data
set as uint8 on the accelerator and augment there. Randomness comes only from the ``generator``
argument, so a seeded generator gives the same batch every time.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from calibkit._validation import trusting
from calibkit.errors import UserError


def _check_images(x: torch.Tensor, name: str = "x") -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise UserError(f"{name} must be a tensor of shape (N, C, H, W), got {shape}")


def _rand_device(generator: torch.Generator | None, x: torch.Tensor) -> torch.device:
    # Random numbers are drawn where the generator lives, then moved to the data.
    return generator.device if generator is not None else x.device


def augment(x: torch.Tensor, crop_pad: int, hflip: bool, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random crop with zero padding and random horizontal flip, for a whole batch at once.

    Each image is padded by ``crop_pad`` zeros on every side and a window of the original size is
    cut at a random offset in ``[0, 2 * crop_pad]`` (the usual ``RandomCrop(H, padding=p)``); then,
    if ``hflip``, mirrored left-right with probability 1/2. Both steps are one gather, so the cost
    is one read of the batch. Draw order: offsets (N, 2), then flips (N,).

    Args:
        x: uint8 (or any dtype) tensor (N, C, H, W).
        crop_pad: padding in pixels, >= 0; 0 disables cropping.
        hflip: whether to flip.
        generator: torch generator for reproducible draws.

    Returns:
        Tensor of the same shape, dtype and device as ``x``.
    """
    _check_images(x)
    if crop_pad < 0:
        raise UserError(f"crop_pad must be >= 0, got {crop_pad}")
    n, c, h, w = x.shape
    if n == 0 or (crop_pad == 0 and not hflip):
        return x.clone()
    dev = _rand_device(generator, x)
    offsets = torch.randint(0, 2 * crop_pad + 1, (n, 2), generator=generator, device=dev).to(x.device)
    padded = F.pad(x, (crop_pad, crop_pad, crop_pad, crop_pad)) if crop_pad else x
    rows = offsets[:, 0:1] + torch.arange(h, device=x.device)  # (N, H) rows of the padded image
    cols = offsets[:, 1:2] + torch.arange(w, device=x.device)  # (N, W)
    if hflip:
        flip = torch.rand(n, generator=generator, device=dev).to(x.device) < 0.5
        cols = torch.where(flip[:, None], cols.flip(1), cols)
    idx_n = torch.arange(n, device=x.device)[:, None, None, None]
    idx_c = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[idx_n, idx_c, rows[:, None, :, None], cols[:, None, None, :]]


def normalize(x: torch.Tensor, mean, std) -> torch.Tensor:
    """uint8 images -> float32, ``(x / 255 - mean) / std`` per channel.

    Args:
        x: uint8 (N, C, H, W).
        mean, std: C floats in [0, 1] pixel units (``DataBundle.mean`` / ``.std``).

    Returns:
        float32 (N, C, H, W) on the device of ``x``.
    """
    _check_images(x)
    if x.dtype != torch.uint8:
        raise UserError(f"normalize expects uint8 images (0..255), got {x.dtype}")
    mean_t = torch.as_tensor(mean, dtype=torch.float32, device=x.device).reshape(-1)
    std_t = torch.as_tensor(std, dtype=torch.float32, device=x.device).reshape(-1)
    if mean_t.numel() != x.shape[1] or std_t.numel() != x.shape[1]:
        raise UserError(f"mean/std have {mean_t.numel()}/{std_t.numel()} entries for {x.shape[1]} channels")
    if (std_t <= 0).any():
        raise UserError(f"std must be positive, got {std_t.tolist()}")
    return (x.float().div_(255.0) - mean_t[:, None, None]) / std_t[:, None, None]


def resize(images: torch.Tensor, size: tuple[int, int], channels: int) -> torch.Tensor:
    """Resize uint8 images and convert their channel count (1 <-> 3).

    Bilinear with antialiasing when shrinking; grey -> RGB repeats the channel, RGB -> grey uses
    ITU-R 601 luma weights (0.299, 0.587, 0.114).

    Args:
        images: uint8 (N, C, H, W) with C in {1, 3}.
        size: target (H', W').
        channels: target C' in {1, 3}.

    Returns:
        uint8 (N, C', H', W').
    """
    _check_images(images, "images")
    c = images.shape[1]
    if c not in (1, 3) or channels not in (1, 3):
        raise UserError(f"resize converts between 1 and 3 channels, got {c} -> {channels}")
    x = images.float()
    if tuple(x.shape[-2:]) != tuple(size):
        shrink = size[0] < x.shape[-2] or size[1] < x.shape[-1]
        x = F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=False, antialias=shrink)
    if c == 1 and channels == 3:
        x = x.expand(-1, 3, -1, -1)
    elif c == 3 and channels == 1:
        w = torch.tensor([0.299, 0.587, 0.114], device=x.device)
        x = (x * w[None, :, None, None]).sum(dim=1, keepdim=True)
    return x.round().clamp(0, 255).to(torch.uint8).contiguous()


def _beta(alpha: float, generator: torch.Generator | None) -> float | torch.Tensor:
    """One draw of ``Beta(alpha, alpha)``: a float from a CPU generator, a device scalar otherwise.

    CPU generator (or none): a seed is drawn from the generator and NumPy's Beta sampler draws
    from it (torch's Beta sampler takes no generator), so the whole transform is reproducible from
    that one generator. Accelerator generator: :func:`beta_on_device`, which never waits for the
    device (reading a seed back to the host would be a synchronisation every batch).
    """
    if generator is not None and generator.device.type != "cpu":
        return beta_on_device(alpha, generator)
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    return float(np.random.default_rng(seed).beta(alpha, alpha))


def beta_on_device(alpha: float, generator: torch.Generator) -> torch.Tensor:
    """``Beta(alpha, alpha)`` drawn where ``generator`` lives, without a host synchronisation.

    ``t = G1 / (G1 + G2)`` with independent ``G1, G2 ~ Gamma(alpha, 1)`` is ``Beta(alpha, alpha)``
    distributed (the gamma representation of the Beta law). The gamma draws use torch's sampler
    with the given generator and are made in float64, so that for small ``alpha`` (whose draws
    crowd near 0) neither underflows to 0.

    Args:
        alpha: the Beta parameter, > 0.
        generator: a torch generator (any device; the draw is made on its device).

    Returns:
        float64 0-dim tensor in [0, 1] on the generator's device.
    """
    g = torch._standard_gamma(torch.full((2,), float(alpha), dtype=torch.float64, device=generator.device),
                              generator=generator)
    return g[0] / g.sum()


def _check_mix_args(x, labels, num_classes, alpha):
    _check_images(x)
    if not x.dtype.is_floating_point:
        raise UserError(f"mixup expects normalised float images, got {x.dtype}; call normalize first")
    if alpha <= 0:
        raise UserError(f"alpha must be > 0, got {alpha}")
    if labels.dim() != 1 or labels.shape[0] != x.shape[0]:
        raise UserError(f"labels must have shape ({x.shape[0]},), got {tuple(labels.shape)}")
    # Reading the labels' range is a host synchronisation: skipped where the caller vouches for them.
    if labels.numel() and not trusting() and (labels.min() < 0 or labels.max() >= num_classes):
        raise UserError(f"labels out of range [0, {num_classes - 1}]")


def mixup(
    x: torch.Tensor, labels: torch.Tensor, num_classes: int, alpha: float = 0.2,
    generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixup (Zhang et al., ICLR 2018): ``x~ = t x_i + (1 - t) x_j``, same for one-hot labels.

    As in the reference implementations, one ``t ~ Beta(alpha, alpha)`` is drawn per batch and the
    partner ``j`` of sample ``i`` is given by a random permutation of the batch. With a generator
    on an accelerator, ``t`` is drawn there (:func:`beta_on_device`) and the batch is mixed without
    any host synchronisation; with a CPU generator the draw is NumPy's (see ``_beta``).

    Args:
        x: float (N, C, H, W) normalised images.
        labels: int64 (N,).
        num_classes: K.
        alpha: Beta parameter (0.2 is calibkit's default for Mixup).
        generator: torch generator (draw order: the Beta seed, then the permutation).

    Returns:
        (x_mix float (N, C, H, W), soft_targets float (N, K)); each target row sums to 1.
    """
    _check_mix_args(x, labels, num_classes, alpha)
    t = _beta(alpha, generator)
    if isinstance(t, torch.Tensor):
        t = t.to(x.dtype)
    perm = torch.randperm(x.shape[0], generator=generator, device=_rand_device(generator, x)).to(x.device)
    onehot = F.one_hot(labels, num_classes).to(x.dtype)
    return t * x + (1 - t) * x[perm], t * onehot + (1 - t) * onehot[perm]


def regmixup(
    x: torch.Tensor, labels: torch.Tensor, num_classes: int, alpha: float = 20.0,
    generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """RegMixup (Pinto et al., NeurIPS 2022): the clean batch followed by its Mixup copy.

    The RegMixup objective is ``CE(clean) + CE(mixed)`` (weight 1), i.e. twice the mean soft-label
    cross-entropy over the returned 2N rows. ``alpha`` = 20 for CIFAR-10, 10 for CIFAR-100.

    Returns:
        (x_cat float (2N, C, H, W), soft_targets float (2N, K)): rows [0, N) clean (one-hot
        targets), rows [N, 2N) mixed.
    """
    _check_mix_args(x, labels, num_classes, alpha)
    x_mix, t_mix = mixup(x, labels, num_classes, alpha, generator)
    onehot = F.one_hot(labels, num_classes).to(x.dtype)
    return torch.cat([x, x_mix]), torch.cat([onehot, t_mix])
