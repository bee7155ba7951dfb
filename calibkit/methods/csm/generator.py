"""Class-conditional EDM denoiser used by CSM to draw semantic mixes.

The network is a diffusers ``UNet2DModel`` whose class input is a *vector*: a linear layer maps a
(soft) one-hot ``y`` of shape (B, K) to the time-embedding width and the UNet adds it to the time
embedding (``class_embed_type="identity"``). Mixing two classes is therefore feeding
``lam * onehot(c1) + (1 - lam) * onehot(c2)``; the zero vector is the unconditional input used for
classifier-free guidance.

Preconditioning and training objective follow EDM (Karras et al., "Elucidating the Design Space of
Diffusion-Based Generative Models", NeurIPS 2022, Table 1)::

    D(x; sigma, y) = c_skip(sigma) x + c_out(sigma) F(c_in(sigma) x; c_noise(sigma), y)
    c_skip = sd^2 / (sigma^2 + sd^2)      c_out = sigma sd / sqrt(sigma^2 + sd^2)
    c_in   = 1 / sqrt(sigma^2 + sd^2)     c_noise = ln(sigma) / 4
    loss   = E[ w(sigma) ||D(x + sigma n; sigma, y) - x||^2 ],  w = (sigma^2 + sd^2) / (sigma sd)^2
    ln(sigma) ~ N(P_mean = -1.2, P_std = 1.2),  sd = sigma_data = 0.5

Images live in [-1, 1]. When ``image_size > data_size`` the inputs are padded with the background
value -1 (black, the background of Fashion-MNIST) so the UNet's downsampling divides the grid, and
cropped back after sampling (:func:`to_uint8`); ``calibkit csm train-generator`` pads only when it
must (Fashion-MNIST's 28x28 runs natively: 28 -> 14 -> 7).

The paper (CSM, Calibration-aware semantic mixing, ICML 2025) uses pretrained EDM checkpoints;
calibkit cannot download them and trains this small generator itself (see ``docs/csm.md``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save
from torch import nn

from calibkit.errors import UserError

CONFIG_NAME = "generator.json"
WEIGHTS_NAME = "generator.safetensors"


@dataclasses.dataclass
class GeneratorConfig:
    """Architecture and EDM constants of a :class:`CondDenoiser` (saved as JSON beside the weights)."""

    num_classes: int = 10
    in_channels: int = 1
    data_size: int = 28  # size of the real images (cropped back to this after sampling)
    image_size: int = 32  # UNet grid; data is padded with ``pad_value`` up to this size (>= data_size)
    block_out_channels: tuple = (32, 64, 64)
    layers_per_block: int = 1
    attention_levels: tuple = (False, False, True)  # attention only at the coarsest (8x8) level
    norm_num_groups: int = 8
    attention_head_dim: int = 8
    sigma_data: float = 0.5
    pad_value: float = -1.0

    def __post_init__(self):
        self.block_out_channels = tuple(int(c) for c in self.block_out_channels)
        self.attention_levels = tuple(bool(a) for a in self.attention_levels)
        if len(self.attention_levels) != len(self.block_out_channels):
            raise UserError(
                f"attention_levels has {len(self.attention_levels)} entries but block_out_channels "
                f"has {len(self.block_out_channels)}"
            )
        if self.num_classes < 2:
            raise UserError(f"num_classes must be >= 2, got {self.num_classes}")
        if self.data_size > self.image_size or (self.image_size - self.data_size) % 2:
            raise UserError(
                f"image_size ({self.image_size}) must equal data_size ({self.data_size}) or exceed it by an even margin"
            )
        if self.image_size % 2 ** (len(self.block_out_channels) - 1):
            raise UserError(f"image_size {self.image_size} is not divisible by the UNet's downsampling")

    @classmethod
    def for_images(cls, num_classes: int, in_channels: int, size: int, channels=(32, 64, 64)) -> GeneratorConfig:
        """The UNet for square images of ``size`` pixels: run on the native size when the
        downsampling divides it (28 -> 14 -> 7 for three levels, attention at the coarsest level),
        else padded with the background value up to the next size it divides (30 -> 32)."""
        channels = tuple(int(c) for c in channels)
        factor = 2 ** (len(channels) - 1)
        image_size = -(-(size + 2) // factor) * factor if size % factor else size
        return cls(num_classes=num_classes, in_channels=in_channels, data_size=size, image_size=image_size,
                   block_out_channels=channels, attention_levels=(False,) * (len(channels) - 1) + (True,))

    @classmethod
    def from_dict(cls, d: dict) -> GeneratorConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise UserError(f"unknown generator config keys: {sorted(unknown)}")
        return cls(**d)


class CondDenoiser(nn.Module):
    """EDM-preconditioned class-conditional denoiser ``D(x; sigma, y)``.

    Args:
        config: architecture (see :class:`GeneratorConfig`).

    Shapes: ``x`` (B, C, S, S) with S = ``config.image_size``; ``sigma`` (B,) or a scalar;
    ``y`` (B, K) soft one-hot (rows of zeros = unconditional).
    """

    def __init__(self, config: GeneratorConfig):
        super().__init__()
        from diffusers import UNet2DModel  # noqa: PLC0415 (optional extra csm; callers require it)

        self.config = config
        ch = config.block_out_channels
        down = tuple("AttnDownBlock2D" if a else "DownBlock2D" for a in config.attention_levels)
        up = tuple("AttnUpBlock2D" if a else "UpBlock2D" for a in reversed(config.attention_levels))
        self.unet = UNet2DModel(
            sample_size=config.image_size,
            in_channels=config.in_channels,
            out_channels=config.in_channels,
            block_out_channels=ch,
            layers_per_block=config.layers_per_block,
            down_block_types=down,
            up_block_types=up,
            norm_num_groups=config.norm_num_groups,
            attention_head_dim=config.attention_head_dim,
            class_embed_type="identity",
        )
        # UNet2DModel's time embedding is 4x the first channel count; the class vector joins it there.
        self.class_proj = nn.Linear(config.num_classes, 4 * ch[0])

    # --- EDM preconditioning (Karras et al. 2022, Table 1) ---------------------------------
    def precond(self, sigma: torch.Tensor):
        """Return ``(c_skip, c_out, c_in, c_noise)`` for noise levels ``sigma`` (any shape)."""
        sd = self.config.sigma_data
        s2 = sigma**2 + sd**2
        return sd**2 / s2, sigma * sd / s2.sqrt(), 1.0 / s2.sqrt(), sigma.log() / 4

    def forward(self, x: torch.Tensor, sigma, y: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        sigma = torch.as_tensor(sigma, dtype=x.dtype, device=x.device).reshape(-1).expand(b)
        if y.shape != (b, self.config.num_classes):
            raise UserError(f"y must have shape ({b}, {self.config.num_classes}), got {tuple(y.shape)}")
        c_skip, c_out, c_in, c_noise = (c.view(b, 1, 1, 1) for c in self.precond(sigma))
        # diffusers types UNet2DModel without a __call__ signature mypy can see
        f = self.unet(c_in * x, c_noise.view(b), class_labels=self.class_proj(y.to(x.dtype))).sample  # type: ignore[operator]
        return c_skip * x + c_out * f


def class_vector(c1, c2, lam, num_classes: int) -> torch.Tensor:
    """Mixed class condition ``lam * onehot(c1) + (1 - lam) * onehot(c2)``, shape (N, K).

    ``lam = 1`` gives exactly ``onehot(c1)`` (and ``lam = 0`` exactly ``onehot(c2)``): the terms
    multiplied by 0 vanish and 1 * 1.0 is exact in floating point.
    """
    c1 = torch.as_tensor(c1).reshape(-1).long()
    c2 = torch.as_tensor(c2).reshape(-1).long()
    lam = torch.as_tensor(lam, dtype=torch.float32).reshape(-1)
    n = max(len(c1), len(c2), len(lam))
    c1, c2, lam = c1.expand(n), c2.expand(n), lam.expand(n)
    if ((c1 < 0) | (c1 >= num_classes) | (c2 < 0) | (c2 >= num_classes)).any():
        raise UserError(f"class indices must lie in [0, {num_classes})")
    if ((lam < 0) | (lam > 1)).any():
        raise UserError("lam must lie in [0, 1]")
    eye = torch.eye(num_classes)
    return lam[:, None] * eye[c1] + (1 - lam[:, None]) * eye[c2]


def edm_loss(model: CondDenoiser, x0: torch.Tensor, y: torch.Tensor, gen: torch.Generator | None = None,
             p_mean: float = -1.2, p_std: float = 1.2) -> torch.Tensor:
    """EDM training loss (mean over batch and pixels), ``x0`` (B, C, S, S) in [-1, 1], ``y`` (B, K)."""
    b = x0.shape[0]
    ln_sigma = torch.randn(b, generator=gen) * p_std + p_mean
    sigma = ln_sigma.exp().to(x0)
    noise = torch.randn(x0.shape, generator=gen).to(x0)
    sd = model.config.sigma_data
    weight = (sigma**2 + sd**2) / (sigma * sd) ** 2
    err = (model(x0 + sigma.view(b, 1, 1, 1) * noise, sigma, y) - x0) ** 2
    return (weight.view(b, 1, 1, 1) * err).mean()


def to_model_space(images: torch.Tensor, config: GeneratorConfig) -> torch.Tensor:
    """uint8 (N, C, H, W) with H = W = data_size -> float in [-1, 1], padded to image_size."""
    if images.dtype != torch.uint8:
        raise UserError(f"images must be uint8, got {images.dtype}")
    if tuple(images.shape[1:]) != (config.in_channels, config.data_size, config.data_size):
        raise UserError(
            f"images must have shape (N, {config.in_channels}, {config.data_size}, {config.data_size}), "
            f"got {tuple(images.shape)}"
        )
    x = images.float() / 127.5 - 1.0
    p = (config.image_size - config.data_size) // 2
    return nn.functional.pad(x, (p, p, p, p), value=config.pad_value)


def to_uint8(x: torch.Tensor, config: GeneratorConfig) -> torch.Tensor:
    """Model-space samples (N, C, S, S) -> uint8 (N, C, data_size, data_size), centre-cropped."""
    p = (config.image_size - config.data_size) // 2
    x = x[..., p : p + config.data_size, p : p + config.data_size]
    return ((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def save_generator(model: CondDenoiser, out_dir, extra: dict | None = None, half: bool = False) -> None:
    """Write ``generator.safetensors`` (+ ``generator.json``) atomically; ``half`` stores fp16 weights."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: (v.half() if half and v.is_floating_point() else v).contiguous().cpu()
             for k, v in model.state_dict().items()}
    _atomic_write_bytes(out_dir / WEIGHTS_NAME, save(state))
    meta = {"config": dataclasses.asdict(model.config), **(extra or {})}
    _atomic_write_bytes(out_dir / CONFIG_NAME, json.dumps(meta, indent=2).encode())


def load_generator(path) -> CondDenoiser:
    """Load a generator directory written by :func:`save_generator` (weights cast to float32)."""
    path = Path(path)
    if not (path / CONFIG_NAME).is_file() or not (path / WEIGHTS_NAME).is_file():
        raise FileNotFoundError(f"{path} is not a generator directory (needs {CONFIG_NAME} and {WEIGHTS_NAME}); "
                                "give the --out folder of `calibkit csm train-generator`")
    meta = json.loads((path / CONFIG_NAME).read_text())
    model = CondDenoiser(GeneratorConfig.from_dict(meta["config"]))
    state = {k: v.float() for k, v in load_file(path / WEIGHTS_NAME).items()}
    model.load_state_dict(state)
    return model.eval().requires_grad_(False)


def generator_hash(path) -> str:
    """Short SHA-256 of a generator's weights file, recorded with every generated image."""
    return hashlib.sha256((Path(path) / WEIGHTS_NAME).read_bytes()).hexdigest()[:16]


def state_hash(model: nn.Module) -> str:
    """Short SHA-256 of a network's weights as :func:`save_generator` would store them (float32).

    Identifies an in-memory generator the way :func:`generator_hash` identifies a saved one; the
    two differ for the same weights because the file also holds the safetensors header.
    """
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]
