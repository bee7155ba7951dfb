"""Common corruptions in the style of CIFAR-10-C (Hendrycks & Dietterich, ICLR 2019), on tensors.

Eight corruptions, each with five severities whose parameters are those published for CIFAR-10-C
(``SEVERITIES``). They run batched in torch on uint8 images (N, C, H, W) with 1 or 3 channels and
any size, and are deterministic given ``seed``: the corrupted test set is regenerated from the
clean one instead of being stored. ``corrupt(images, name, severity, seed)`` is the entry point.

Differences from the reference generator (which used scikit-image, Wand and Pillow per image):

* ``gaussian_blur`` uses a separable Gaussian kernel truncated at 4 sigma with edge replication
  (scikit-image's defaults); the sigmas are in pixels for 32x32 images and used unchanged for
  other sizes.
* ``pixelate`` resamples with box-filter weights computed as Pillow's BOX filter does, both
  down to ``int(c * size)`` and back (without Pillow's intermediate rounding to uint8).
* ``jpeg`` is JPEG's lossy core written out: RGB -> YCbCr, 4:2:0 chroma subsampling, 8x8 block
  DCT-II, quantisation with the standard (Annex K) tables scaled by the IJG quality formula,
  dequantisation and the inverse transform. No entropy coding (it is lossless anyway), so the
  result is close to, not bit-identical with, a real JPEG encoder's.
* ``brightness`` adds to the HSV value channel; for RGB this is done without an HSV round trip,
  using the fact that at fixed hue and saturation the RGB values scale linearly with V.
* Noise is drawn with torch's generator, so the noise differs from the reference's numpy draws.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from calibkit.errors import UserError

from .bundle import Split

# Parameters of the five severities, as published for CIFAR-10-C.
SEVERITIES = {
    "gaussian_noise": (0.04, 0.06, 0.08, 0.09, 0.10),  # noise std (pixel range [0, 1])
    "shot_noise": (500, 250, 100, 75, 50),  # photons per unit intensity (Poisson rate = c * x)
    "impulse_noise": (0.01, 0.02, 0.03, 0.05, 0.07),  # fraction of values set to 0 or 1
    "gaussian_blur": (0.4, 0.6, 0.7, 0.8, 1.0),  # sigma in pixels
    "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),  # factor on the deviation from the per-channel mean
    "brightness": (0.05, 0.1, 0.15, 0.2, 0.3),  # added to the HSV value
    "pixelate": (0.95, 0.9, 0.85, 0.75, 0.65),  # resolution factor
    "jpeg": (80, 65, 58, 50, 40),  # JPEG quality
}

_CHUNK = 1024  # images per batch: bounds the float32 working memory


def gaussian_noise(x: torch.Tensor, c: float, gen: torch.Generator) -> torch.Tensor:
    """x + N(0, c^2), per value. x: float (N, C, H, W) in [0, 1]."""
    return x + c * torch.randn(x.shape, generator=gen, device=x.device)


def shot_noise(x: torch.Tensor, c: float, gen: torch.Generator) -> torch.Tensor:
    """Poisson(c * x) / c: photon noise, relatively stronger in dark regions."""
    return torch.poisson(x * c, generator=gen) / c


def impulse_noise(x: torch.Tensor, c: float, gen: torch.Generator) -> torch.Tensor:
    """Salt-and-pepper: each value is replaced with probability c, by 1 or 0 with equal odds."""
    hit = torch.rand(x.shape, generator=gen, device=x.device) < c
    salt = torch.rand(x.shape, generator=gen, device=x.device) < 0.5
    return torch.where(hit, salt.to(x.dtype), x)


def _gaussian_kernel(sigma: float, device) -> torch.Tensor:
    radius = max(1, int(math.ceil(4.0 * sigma)))
    t = torch.arange(-radius, radius + 1, dtype=torch.float32, device=device)
    k = torch.exp(-0.5 * (t / sigma) ** 2)
    return k / k.sum()


def gaussian_blur(x: torch.Tensor, c: float, gen: torch.Generator | None = None) -> torch.Tensor:
    """Separable Gaussian blur with standard deviation c pixels, edges replicated."""
    n, ch, h, w = x.shape
    k = _gaussian_kernel(c, x.device)
    r = (k.numel() - 1) // 2
    y = x.reshape(n * ch, 1, h, w)
    y = F.conv2d(F.pad(y, (r, r, 0, 0), mode="replicate"), k.view(1, 1, 1, -1))
    y = F.conv2d(F.pad(y, (0, 0, r, r), mode="replicate"), k.view(1, 1, -1, 1))
    return y.reshape(n, ch, h, w)


def contrast(x: torch.Tensor, c: float, gen: torch.Generator | None = None) -> torch.Tensor:
    """(x - m) * c + m with m the per-image, per-channel mean."""
    m = x.mean(dim=(2, 3), keepdim=True)
    return (x - m) * c + m


def brightness(x: torch.Tensor, c: float, gen: torch.Generator | None = None) -> torch.Tensor:
    """Add c to the HSV value V = max over channels (clipped at 1), keeping hue and saturation."""
    v = x.amax(dim=1, keepdim=True)
    v_new = (v + c).clamp(max=1.0)
    # RGB = V * f(H, S): scaling by V'/V keeps H and S; black pixels (V = 0) become grey V'
    scaled = x * (v_new / v.clamp_min(1e-12))
    return torch.where(v > 0, scaled, v_new.expand_as(x))


def _box_matrix(n_in: int, n_out: int, device) -> torch.Tensor:
    """(n_out, n_in) resampling weights of a box filter, the way Pillow's BOX filter computes them.

    Output pixel i covers input coordinates centre +- support with centre = (i + 0.5) * n_in / n_out
    and support = max(n_in / n_out, 1) / 2; it averages the input pixels whose centres fall inside,
    an input centre exactly on the lower edge excluded and one on the upper edge included (Pillow's
    box filter takes ``-1/2 < x <= 1/2``; e.g. 3 -> 2 pixels gives the middle one to the first output).
    Shrinking this way is area averaging; enlarging reduces to nearest neighbour.
    """
    scale = n_in / n_out
    centre = (torch.arange(n_out, dtype=torch.float64) + 0.5) * scale
    pos = torch.arange(n_in, dtype=torch.float64) + 0.5
    d = (pos[None, :] - centre[:, None]) / max(scale, 1.0)
    w = ((d > -0.5) & (d <= 0.5)).double()
    w[w.sum(1) == 0, (centre[w.sum(1) == 0].floor().long()).clamp(max=n_in - 1)] = 1.0  # never empty
    return (w / w.sum(1, keepdim=True)).float().to(device)


def _box_resize(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    a_h = _box_matrix(x.shape[-2], h, x.device)
    a_w = _box_matrix(x.shape[-1], w, x.device)
    return a_h @ x @ a_w.T


def pixelate(x: torch.Tensor, c: float, gen: torch.Generator | None = None) -> torch.Tensor:
    """Box-filter down to int(c * H) x int(c * W), box-filter back up (Pillow's BOX both ways)."""
    h, w = x.shape[-2:]
    return _box_resize(_box_resize(x, max(1, int(h * c)), max(1, int(w * c))), h, w)


# ---------------------------------------------------------------------------------- JPEG

_LUMA_Q = [
    16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55,
    14, 13, 16, 24, 40, 57, 69, 56, 14, 17, 22, 29, 51, 87, 80, 62,
    18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113, 92,
    49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99,
]  # fmt: skip
_CHROMA_Q = [
    17, 18, 24, 47, 99, 99, 99, 99, 18, 21, 26, 66, 99, 99, 99, 99,
    24, 26, 56, 99, 99, 99, 99, 99, 47, 66, 99, 99, 99, 99, 99, 99,
] + [99] * 32  # fmt: skip


def quant_table(base: list[int], quality: float) -> torch.Tensor:
    """IJG scaling of a base quantisation table: quality 50 = the table itself, higher = finer."""
    q = min(max(int(quality), 1), 100)
    scale = 5000 / q if q < 50 else 200 - 2 * q
    t = torch.tensor(base, dtype=torch.float32).view(8, 8)
    return torch.floor((t * scale + 50) / 100).clamp(1, 255)


def _dct_matrix(device) -> torch.Tensor:
    # orthonormal DCT-II: D[k, n] = a_k cos(pi (2n + 1) k / 16)
    n = torch.arange(8, dtype=torch.float32, device=device)
    d = torch.cos(math.pi * (2 * n[None, :] + 1) * n[:, None] / 16) * math.sqrt(2 / 8)
    d[0] /= math.sqrt(2)
    return d


def _quantise_plane(p: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """DCT -> round(coef / Q) * Q -> inverse DCT, on 8x8 blocks of planes p (M, H, W) in 0..255."""
    m, h, w = p.shape
    ph, pw = (-h) % 8, (-w) % 8
    if ph or pw:  # pad with edge values to whole blocks, as encoders do
        p = F.pad(p[:, None], (0, pw, 0, ph), mode="replicate")[:, 0]
    hh, ww = p.shape[-2:]
    blocks = (p - 128.0).reshape(m, hh // 8, 8, ww // 8, 8).permute(0, 1, 3, 2, 4)
    d = _dct_matrix(p.device)
    coef = d @ blocks @ d.T
    q = table.to(p.device)
    coef = torch.round(coef / q) * q
    out = (d.T @ coef @ d).permute(0, 1, 3, 2, 4).reshape(m, hh, ww) + 128.0
    return out[:, :h, :w]


def jpeg(x: torch.Tensor, c: float, gen: torch.Generator | None = None) -> torch.Tensor:
    """JPEG-like lossy compression at quality c (see the module docstring)."""
    n, ch, h, w = x.shape
    v = (x * 255.0).round()
    if ch == 1:
        out = _quantise_plane(v[:, 0], quant_table(_LUMA_Q, c))
        return out[:, None] / 255.0
    r, g, b = v[:, 0], v[:, 1], v[:, 2]
    y = 0.299 * r + 0.587 * g + 0.114 * b
    cb = -0.168736 * r - 0.331264 * g + 0.5 * b + 128.0
    cr = 0.5 * r - 0.418688 * g - 0.081312 * b + 128.0
    y = _quantise_plane(y, quant_table(_LUMA_Q, c))
    # 4:2:0: chroma kept at half resolution (2x2 means), restored bilinearly
    chroma = F.avg_pool2d(torch.stack([cb, cr], 1), 2, ceil_mode=True)
    hc, wc = chroma.shape[-2:]
    chroma = _quantise_plane(chroma.reshape(n * 2, hc, wc), quant_table(_CHROMA_Q, c)).reshape(n, 2, hc, wc)
    chroma = F.interpolate(chroma, size=(2 * hc, 2 * wc), mode="bilinear", align_corners=False)[..., :h, :w]
    cb, cr = chroma[:, 0] - 128.0, chroma[:, 1] - 128.0
    rgb = torch.stack([y + 1.402 * cr, y - 0.344136 * cb - 0.714136 * cr, y + 1.772 * cb], 1)
    return rgb / 255.0


CORRUPTIONS = {
    "gaussian_noise": gaussian_noise,
    "shot_noise": shot_noise,
    "impulse_noise": impulse_noise,
    "gaussian_blur": gaussian_blur,
    "contrast": contrast,
    "brightness": brightness,
    "pixelate": pixelate,
    "jpeg": jpeg,
}


def corrupt(images: torch.Tensor, name: str, severity: int, seed: int = 0) -> torch.Tensor:
    """Apply one corruption at one severity to a batch of images, deterministically.

    Args:
        images: uint8 (N, C, H, W), C in {1, 3} (``brightness`` and ``jpeg`` treat 3 channels as
            RGB; the others work per channel and accept any C).
        name: a ``CORRUPTIONS`` key.
        severity: 1 (mild) .. 5 (strong).
        seed: seeds the random corruptions (noise); the same seed, device and input give the
            same output.

    Returns:
        uint8 tensor of the same shape (values rounded and clipped to 0..255).

    >>> x = torch.full((1, 1, 4, 4), 100, dtype=torch.uint8)
    >>> corrupt(x, "brightness", 1)[0, 0, 0, 0].item()  # (100/255 + 0.05) * 255 = 112.75
    113
    """
    if name not in CORRUPTIONS:
        raise UserError(f"unknown corruption {name!r}; choose one of {sorted(CORRUPTIONS)}")
    if isinstance(severity, bool) or severity not in (1, 2, 3, 4, 5):
        raise UserError(f"severity must be an integer 1..5, got {severity!r}")
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or images.dim() != 4:
        got = f"{images.dtype} {tuple(images.shape)}" if isinstance(images, torch.Tensor) else type(images).__name__
        raise UserError(f"images must be a uint8 tensor (N, C, H, W), got {got}")
    if name in ("brightness", "jpeg") and images.shape[1] not in (1, 3):
        raise UserError(f"{name} needs 1 (grey) or 3 (RGB) channels, got {images.shape[1]}")
    fn, c = CORRUPTIONS[name], SEVERITIES[name][severity - 1]
    gen = torch.Generator(device=images.device).manual_seed(int(seed))
    out = torch.empty_like(images)
    for start in range(0, images.shape[0], _CHUNK):
        x = images[start : start + _CHUNK].float() / 255.0
        y = fn(x, c, gen)
        out[start : start + _CHUNK] = (y.clamp(0, 1) * 255.0).round().to(torch.uint8)
    return out


def corrupt_split(split: Split, name: str, severity: int, seed: int = 0) -> Split:
    """A corrupted copy of a split (labels unchanged), e.g. ``corrupt_split(bundle.test, "jpeg", 3)``."""
    return Split(corrupt(split.images, name, severity, seed), split.labels.clone())
