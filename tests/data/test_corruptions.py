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
        ref = _pil_roundtrip(x, lambda im, Image: im.resize((n, n), Image.BOX).resize((32, 32), Image.BOX))
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
