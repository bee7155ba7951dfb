"""Corruptions: determinism, monotonicity in severity, shapes, and parity with reference tools."""

import colorsys
import io

import numpy as np
import pytest
import torch

from calibkit.data import load, resize
from calibkit.data.corruptions import CORRUPTIONS, SEVERITIES, corrupt, corrupt_split, quant_table


@pytest.fixture(scope="module")
def digits():
    """Real images: 120 digits as 1x28x28 and as 3x32x32 (the two shapes calibkit's data take)."""
    images = load("digits").test.images[:120]
    return {"grey28": images, "rgb32": resize(images, (32, 32), 3)}


def _change(a, b):
    return (a.float() - b.float()).abs().mean().item()


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_deterministic_shape_dtype(name, digits):
    x = digits["rgb32"][:16]
    a, b = corrupt(x, name, 3, seed=4), corrupt(x, name, 3, seed=4)
    assert a.dtype == torch.uint8 and a.shape == x.shape and torch.equal(a, b)
    assert not torch.equal(a, x), "every corruption changes the images at severity 3"
    if name.endswith("_noise"):  # random corruptions follow the seed
        assert not torch.equal(a, corrupt(x, name, 3, seed=5))


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
@pytest.mark.parametrize("kind", ["grey28", "rgb32"])
def test_monotone_in_severity(name, kind, digits):
    x = digits[kind]
    changes = [_change(corrupt(x, name, s, seed=0), x) for s in range(1, 6)]
    if name == "pixelate" and kind == "grey28":
        # at 28 px, severities 1 and 2 shrink to 26 and 25 px and change the images equally
        # (Pillow's BOX pixelation gives the same tie); from there on the change grows
        assert changes[0] == pytest.approx(changes[1], rel=0.05)
        changes = changes[1:]
    assert all(b > a for a, b in zip(changes, changes[1:])), f"{name}: {changes}"


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_any_size_and_grey(name, gen):
    x = torch.randint(0, 256, (3, 1, 13, 21), dtype=torch.uint8, generator=gen)
    assert corrupt(x, name, 5).shape == x.shape


def test_bad_arguments():
    x = torch.zeros(2, 3, 8, 8, dtype=torch.uint8)
    with pytest.raises(ValueError, match="gaussian_noise"):
        corrupt(x, "fog", 1)
    with pytest.raises(ValueError, match="severity"):
        corrupt(x, "contrast", 6)
    with pytest.raises(ValueError, match="uint8"):
        corrupt(x.float(), "contrast", 1)
    with pytest.raises(ValueError, match="channels"):
        corrupt(torch.zeros(2, 2, 8, 8, dtype=torch.uint8), "jpeg", 1)


def test_hand_values():
    x = torch.tensor([[[[0, 100], [200, 255]]]], dtype=torch.uint8)
    # contrast 0.15 around the mean 138.75
    expect = ((x.double() - 138.75) * 0.15 + 138.75).round()
    assert torch.equal(corrupt(x, "contrast", 5).double(), expect)
    # brightness on grey: value + 0.2 (x 255 = 51), clipped at 255
    assert corrupt(x, "brightness", 4)[0, 0].flatten().tolist() == [51, 151, 251, 255]
    # impulse noise only ever writes 0 or 255
    y = corrupt(torch.full((4, 3, 16, 16), 77, dtype=torch.uint8), "impulse_noise", 5)
    assert set(y.unique().tolist()) <= {0, 77, 255}
    frac = (y != 77).double().mean().item()
    assert abs(frac - SEVERITIES["impulse_noise"][4]) < 0.02


def test_noise_statistics():
    x = torch.full((64, 1, 32, 32), 128, dtype=torch.uint8)
    noise = corrupt(x, "gaussian_noise", 5).double() - 128
    assert noise.std().item() == pytest.approx(0.10 * 255, rel=0.02)  # no clipping at mid-grey
    shot = corrupt(x, "shot_noise", 5).double() / 255
    # Poisson(c * x) / c has variance x / c
    assert shot.var().item() == pytest.approx((128 / 255) / 50, rel=0.05)


def test_brightness_matches_hsv(gen):
    x = torch.randint(0, 256, (1, 3, 6, 6), dtype=torch.uint8, generator=gen)
    x[0, :, 0, 0] = 0  # a black pixel
    out = corrupt(x, "brightness", 4)
    for i in range(6):
        for j in range(6):
            h, s, v = colorsys.rgb_to_hsv(*(x[0, :, i, j].double() / 255).tolist())
            ref = colorsys.hsv_to_rgb(h, s, min(v + 0.2, 1.0))
            assert np.allclose(out[0, :, i, j].numpy(), np.round(np.array(ref) * 255), atol=1)


def test_blur_matches_scipy(digits):
    from scipy.ndimage import gaussian_filter

    x = digits["grey28"][:4]
    ref = np.stack([gaussian_filter(im[0].double().numpy() / 255, sigma=1.0, mode="nearest", truncate=4.0)
                    for im in x])  # fmt: skip
    out = corrupt(x, "gaussian_blur", 5)[:, 0].double().numpy()
    assert np.abs(out - np.round(ref * 255)).max() <= 1


def _pil_roundtrip(x, fn):
    Image = pytest.importorskip("PIL.Image")
    outs = []
    for im in x:
        arr = im.permute(1, 2, 0).numpy()
        outs.append(np.asarray(fn(Image.fromarray(arr if arr.shape[2] == 3 else arr[:, :, 0]), Image)))
    out = torch.from_numpy(np.stack(outs).astype(np.float64))
    return out.permute(0, 3, 1, 2) if out.dim() == 4 else out[:, None]


def test_pixelate_matches_pillow_box(digits):
    x = digits["rgb32"][:20]
    for s, c in enumerate(SEVERITIES["pixelate"], 1):
        n = int(32 * c)
        ref = _pil_roundtrip(x, lambda im, Image, n=n: im.resize((n, n), Image.BOX).resize((32, 32), Image.BOX))
        # Pillow rounds to uint8 between the two resizes; calibkit does not
        assert _change(corrupt(x, "pixelate", s), ref) < 0.3
        assert _change(ref, x) > 1.0


def test_jpeg_close_to_a_real_encoder(digits):
    x = digits["rgb32"][:30]
    for s, q in enumerate(SEVERITIES["jpeg"], 1):
        def encode(im, Image, q=q):
            buf = io.BytesIO()
            im.save(buf, "JPEG", quality=q)
            return Image.open(buf).convert("RGB")

        ref = _pil_roundtrip(x, encode)
        ours = corrupt(x, "jpeg", s)
        # the difference to libjpeg is a fraction of the corruption itself
        assert _change(ours, ref) < 0.2 * _change(ref, x)  # measured: about 0.1


def test_quant_table_scaling():
    assert quant_table([16] * 64, 50)[0, 0] == 16
    assert quant_table([16] * 64, 80)[0, 0] == 6  # floor((16 * 40 + 50) / 100)
    assert quant_table([16] * 64, 100)[0, 0] == 1
    assert quant_table([99] * 64, 10)[0, 0] == 255  # clipped


def test_corrupt_split_keeps_labels():
    b = load("digits")
    c = corrupt_split(b.test, "gaussian_noise", 2, seed=1)
    assert torch.equal(c.labels, b.test.labels) and c.images.shape == b.test.images.shape


# ------------------------------------------------------------- exact values of each step


def test_noise_is_the_documented_draw_from_the_seeded_generator():
    x = torch.randint(0, 256, (3, 2, 5, 7), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(3)
    noisy = (x.float() / 255.0 + 0.06 * torch.randn(x.shape, generator=g)).clamp(0, 1)
    assert torch.equal(corrupt(x, "gaussian_noise", 2, seed=3), (noisy * 255.0).round().to(torch.uint8))
    g = torch.Generator().manual_seed(3)
    hit = torch.rand(x.shape, generator=g) < 0.07
    salt = torch.rand(x.shape, generator=g) < 0.5
    expected = torch.where(hit, salt.to(torch.uint8) * 255, x)
    got = corrupt(x, "impulse_noise", 5, seed=3)
    assert torch.equal(got, expected) and (got[hit] == 0).any() and (got[hit] == 255).any()
    for name in ("gaussian_noise", "impulse_noise"):  # the default seed is 0
        assert torch.equal(corrupt(x, name, 1), corrupt(x, name, 1, seed=0))


def test_contrast_is_per_image_and_channel_over_every_chunk():
    n = 1100  # more than one chunk of 1024 images
    x = torch.zeros(n, 2, 1, 2, dtype=torch.uint8)
    x[:, 0, 0, 0] = torch.arange(n) % 200
    x[:, 1, 0, 1] = 100 + torch.arange(n) % 150
    v = x.double() / 255
    mean = v.mean(dim=(2, 3), keepdim=True)
    expected = ((v - mean) * 0.75 + mean).clamp(0, 1) * 255
    assert (corrupt(x, "contrast", 1).double() - expected).abs().max() <= 0.5 + 1e-4  # rounded in float32


def test_gaussian_kernel_is_truncated_at_four_sigma():
    from calibkit.data.corruptions import _gaussian_kernel

    for sigma in (0.2, 0.4, 0.7, 1.0):
        radius = max(1, int(np.ceil(4 * sigma)))
        t = np.arange(-radius, radius + 1)
        k = np.exp(-0.5 * (t / sigma) ** 2)
        got = _gaussian_kernel(sigma, "cpu")
        assert got.numel() == 2 * radius + 1 and np.allclose(got.numpy(), k / k.sum(), rtol=1e-6, atol=0)


def test_blur_keeps_a_flat_image_flat_to_its_edges():
    x = torch.full((1, 3, 5, 9), 77, dtype=torch.uint8)
    for s in range(1, 6):
        assert torch.equal(corrupt(x, "gaussian_blur", s), x)


def test_box_weights_are_pillows():
    from calibkit.data.corruptions import _box_resize

    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(0)
    # (3 -> 2, 6 -> 4, 4 -> 6): a pixel centre on the edge of two boxes goes to the first
    for n_in, n_out in ((3, 2), (6, 4), (2, 3), (4, 6), (7, 3), (5, 8), (32, 24), (24, 32)):
        x = (rng.random((2, n_in)) * 255).astype(np.float32)
        ref = np.asarray(Image.fromarray(x).resize((n_out, 2), Image.BOX))
        got = _box_resize(torch.from_numpy(x)[None, None], 2, n_out)[0, 0].numpy()
        assert np.abs(got - ref).max() < 1e-3, (n_in, n_out)
    tiny = torch.tensor([[[[0, 100], [200, 255]]]], dtype=torch.uint8)
    assert (corrupt(tiny, "pixelate", 5) == 139).all()  # 2 px * 0.65 -> 1 px: the mean 138.75 everywhere


def test_quant_table_by_hand():
    assert quant_table([1] * 64, 1)[0, 0] == 50  # floor((1 * 5000 + 50) / 100)
    assert quant_table([54] * 64, 11)[0, 0] == 245  # floor((54 * 5000 / 11 + 50) / 100) = floor(245.95)
    assert torch.equal(quant_table(list(range(64)), 0), quant_table(list(range(64)), 1))
    assert torch.equal(quant_table(list(range(64)), 150), quant_table(list(range(64)), 100))


def dc_only(value, q):
    """JPEG of a flat plane: only the DC coefficient 8 (v - 128) is non-zero, quantised by q."""
    return 128 + np.round(8 * (value - 128) / q) * q / 8


def test_jpeg_of_flat_images_by_hand():
    from calibkit.data.corruptions import _CHROMA_Q, _LUMA_Q

    for h, w in ((12, 16), (16, 12)):  # padding to whole blocks in one direction only
        flat = torch.full((1, 1, h, w), 128, dtype=torch.uint8)
        assert torch.equal(corrupt(flat, "jpeg", 3), flat)  # edge padding keeps the blocks flat
    grey = torch.full((1, 1, 8, 8), 200, dtype=torch.uint8)
    assert (corrupt(grey, "jpeg", 1) == round(dc_only(200, 6))).all()  # quality 80: Q[0, 0] = 6
    colours = [(200, 100, 50), (30, 160, 220)]
    x = torch.tensor(colours, dtype=torch.uint8)[:, :, None, None].expand(2, 3, 9, 11).contiguous()  # odd sizes
    lq, cq = float(quant_table(_LUMA_Q, 80)[0, 0]), float(quant_table(_CHROMA_Q, 80)[0, 0])
    out = corrupt(x, "jpeg", 1)
    for i, (r, g, b) in enumerate(colours):
        y = dc_only(0.299 * r + 0.587 * g + 0.114 * b, lq)
        cb = dc_only(-0.168736 * r - 0.331264 * g + 0.5 * b + 128, cq) - 128
        cr = dc_only(0.5 * r - 0.418688 * g - 0.081312 * b + 128, cq) - 128
        rgb = np.round(np.clip([y + 1.402 * cr, y - 0.344136 * cb - 0.714136 * cr, y + 1.772 * cb], 0, 255))
        assert (out[i].reshape(3, -1) == torch.tensor(rgb, dtype=torch.uint8)[:, None]).all(), (colours[i], rgb)


def upsample2(p):
    """Bilinear doubling with align_corners=False: output i samples the input at i/2 - 1/4 (clamped)."""
    def axis(a, n):
        src = np.clip(np.arange(2 * n) / 2 - 0.25, 0, n - 1)
        lo = np.floor(src).astype(int)
        hi = np.minimum(lo + 1, n - 1)
        f = src - lo
        return lo, hi, f

    (lo, hi, f), (lo2, hi2, f2) = axis(None, p.shape[0]), axis(None, p.shape[1])
    rows = p[lo] * (1 - f)[:, None] + p[hi] * f[:, None]
    return rows[:, lo2] * (1 - f2) + rows[:, hi2] * f2


def test_jpeg_chroma_is_subsampled_2x2_and_restored_bilinearly():
    from calibkit.data.corruptions import jpeg

    h, w = 16, 16
    r = np.tile(np.linspace(20, 230, w), (h, 1))  # smooth colour ramps: chroma changes across the image
    b = np.tile(np.linspace(200, 40, h)[:, None], (1, w))
    g = np.full((h, w), 120.0)
    x = torch.tensor(np.stack([r, g, b]).round() / 255.0, dtype=torch.float32)[None]
    v = (x[0].double().numpy() * 255).round()
    ycc = [0.299 * v[0] + 0.587 * v[1] + 0.114 * v[2],
           -0.168736 * v[0] - 0.331264 * v[1] + 0.5 * v[2], 0.5 * v[0] - 0.418688 * v[1] - 0.081312 * v[2]]
    cb, cr = (upsample2(c.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3))) for c in ycc[1:])
    y = ycc[0]
    ref = np.stack([y + 1.402 * cr, y - 0.344136 * cb - 0.714136 * cr, y + 1.772 * cb])
    out = jpeg(x, 100)[0].double().numpy() * 255  # quality 100: every quantiser is 1, so only rounding is lost
    assert np.abs(out - ref).max() < 2.0 and np.abs(out - ref).mean() < 0.5


def test_corrupt_messages_and_corrupt_split():
    x = torch.zeros(2, 3, 8, 8, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"^images must be a uint8 tensor \(N, C, H, W\), got ndarray$"):
        corrupt(np.zeros((2, 3, 8, 8), np.uint8), "contrast", 1)
    with pytest.raises(ValueError,
                       match=r"^images must be a uint8 tensor \(N, C, H, W\), got torch.float32 \(2, 3, 8, 8\)$"):
        corrupt(x.float(), "contrast", 1)
    for name in ("brightness", "jpeg"):
        with pytest.raises(ValueError, match=rf"^{name} needs 1 \(grey\) or 3 \(RGB\) channels, got 2$"):
            corrupt(torch.zeros(2, 2, 8, 8, dtype=torch.uint8), name, 1)
    from calibkit.data.bundle import Split

    split = Split(torch.randint(0, 256, (3, 1, 4, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(2)),
                  torch.tensor([0, 1, 2]))
    assert torch.equal(corrupt_split(split, "gaussian_noise", 2, seed=1).images,
                       corrupt(split.images, "gaussian_noise", 2, seed=1))
    assert torch.equal(corrupt_split(split, "gaussian_noise", 2).images, corrupt(split.images, "gaussian_noise", 2, 0))
