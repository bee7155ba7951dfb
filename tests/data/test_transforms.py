"""Batched transforms (calibkit.data.transforms): draws against an explicit per-image loop, resizing
against a triangle filter written here, the checks' messages, defaults and devices."""

import re

import numpy as np
import pytest
import torch

from calibkit.data import augment, mixup, normalize, regmixup, resize
from calibkit.data.transforms import beta_on_device

META = torch.device("meta")  # shapes and devices only: any tensor made on the CPU and mixed in fails


def images(n=5, c=2, h=4, w=6, seed=0):
    return torch.randint(1, 256, (n, c, h, w), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def augment_by_loop(x, p, hflip, seed):
    """The documented draws (offsets (N, 2), then flips (N,)) applied image by image."""
    g = torch.Generator().manual_seed(seed)
    n, _, h, w = x.shape
    offsets = torch.randint(0, 2 * p + 1, (n, 2), generator=g)
    flips = torch.rand(n, generator=g) < 0.5 if hflip else torch.zeros(n, dtype=torch.bool)
    out = torch.empty_like(x)
    for i in range(n):
        padded = np.pad(x[i].numpy(), ((0, 0), (p, p), (p, p)))
        dy, dx = int(offsets[i, 0]), int(offsets[i, 1])
        crop = padded[:, dy:dy + h, dx:dx + w]
        out[i] = torch.from_numpy(np.ascontiguousarray(crop[:, :, ::-1] if flips[i] else crop))
    return out


@pytest.mark.parametrize("p,hflip", [(1, False), (2, True), (0, True), (3, False)])
def test_augment_follows_the_documented_draws(p, hflip):
    x = images()
    assert torch.equal(augment(x, p, hflip, torch.Generator().manual_seed(4)), augment_by_loop(x, p, hflip, 4))


def test_augment_of_one_image_and_without_a_generator():
    x = images(n=1)
    out = augment(x, 1, False, torch.Generator().manual_seed(4))
    assert torch.equal(out, augment_by_loop(x, 1, False, 4)) and not torch.equal(out, x)
    torch.manual_seed(3)  # no generator: the global one, drawn as a generator of the same seed would be
    assert torch.equal(augment(images(n=8), 2, True), augment_by_loop(images(n=8), 2, True, 3))


def test_disabled_augmentation_draws_nothing():
    g = torch.Generator().manual_seed(5)
    state = g.get_state().clone()
    x = images()
    out = augment(x, 0, False, g)
    assert torch.equal(out, x) and out.data_ptr() != x.data_ptr() and torch.equal(g.get_state(), state)
    empty = augment(x[:0], 3, True, g)
    assert empty.shape == (0, 2, 4, 6) and torch.equal(g.get_state(), state)


def test_augment_keeps_every_tensor_on_the_data_device():
    x = torch.zeros(3, 2, 4, 6, dtype=torch.uint8, device=META)
    for g in (None, torch.Generator().manual_seed(0)):  # a CPU generator: the draws move to the data
        out = augment(x, 2, True, g)
        assert out.device == META and out.shape == x.shape and out.dtype == torch.uint8


def test_image_checks_name_the_argument_and_what_came():
    def refused(got, name="x"):
        return "^" + re.escape(f"{name} must be a tensor of shape (N, C, H, W), got {got}") + "$"

    with pytest.raises(ValueError, match=refused("(2, 3)")):
        augment(torch.zeros(2, 3), 1, True)
    with pytest.raises(ValueError, match=refused("list")):
        augment([[1, 2]], 1, True)
    with pytest.raises(ValueError, match=refused("ndarray")):
        normalize(np.zeros((1, 1, 2, 2), np.uint8), [0.5], [0.5])
    with pytest.raises(ValueError, match=refused("(1, 4, 4)", "images")):
        resize(torch.zeros(1, 4, 4, dtype=torch.uint8), (2, 2), 1)
    with pytest.raises(ValueError, match=r"^crop_pad must be >= 0, got -1$"):
        augment(images(), -1, False)


def test_normalize_checks_and_float32_output():
    x = torch.tensor([0, 51, 255], dtype=torch.uint8).reshape(1, 1, 1, 3)
    out = normalize(x, np.array([0.2]), np.array([0.5]))  # float64 statistics: the output stays float32
    assert out.dtype == torch.float32
    torch.testing.assert_close(out[0, 0, 0], torch.tensor([-0.4, 0.0, 1.6]))
    rgb = torch.zeros(1, 3, 5, 2, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"^mean/std have 2/3 entries for 3 channels$"):
        normalize(rgb, (0.5, 0.5), (1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match=r"^mean/std have 3/1 entries for 3 channels$"):
        normalize(rgb, (0.5, 0.5, 0.5), (1.0,))
    with pytest.raises(ValueError, match=r"^std must be positive, got \[0.25, 0.0, 1.0\]$"):
        normalize(rgb, (0.5,) * 3, (0.25, 0.0, 1.0))
    with pytest.raises(ValueError, match=r"^normalize expects uint8 images \(0..255\), got torch.float32$"):
        normalize(rgb.float(), (0.5,) * 3, (1.0,) * 3)


def triangle_weights(n_in, n_out):
    """(n_out, n_in) weights of bilinear resampling with the filter widened by the shrink factor
    (antialiasing; for enlarging it is plain bilinear with align_corners=False), edges renormalised."""
    scale = n_in / n_out
    support = max(scale, 1.0)
    centre = (np.arange(n_out) + 0.5) * scale
    w = np.clip(1 - np.abs(np.arange(n_in)[None, :] + 0.5 - centre[:, None]) / support, 0, None)
    return w / w.sum(1, keepdims=True)


@pytest.mark.parametrize("src,size", [((8, 2), (4, 10)), ((2, 8), (10, 4)), ((8, 6), (2, 6)), ((7, 5), (3, 2))])
def test_resize_is_antialiased_bilinear_in_each_shrunk_axis(src, size):
    x = images(n=2, c=1, h=src[0], w=src[1], seed=1)
    x[:, :, ::2] = 0  # stripes: shrinking with and without antialiasing differ by far more than rounding
    ref = triangle_weights(src[0], size[0]) @ x[:, 0].double().numpy() @ triangle_weights(src[1], size[1]).T
    out = resize(x, size, 1)
    assert out.shape == (2, 1) + size and out.dtype == torch.uint8
    assert np.abs(out[:, 0].double().numpy() - ref).max() <= 0.5 + 1e-3


def test_resize_by_hand():
    up = resize(torch.tensor([0, 255], dtype=torch.uint8).reshape(1, 1, 1, 2), (1, 4), 1)
    assert up.flatten().tolist() == [0, 64, 191, 255]  # samples at -0.25, 0.25, 0.75, 1.25 (clamped)
    rgb = torch.tensor([10, 20, 30], dtype=torch.uint8).reshape(1, 3, 1, 1).expand(2, 3, 2, 2).contiguous()
    grey = resize(rgb, (2, 2), 1)
    assert grey.shape == (2, 1, 2, 2) and (grey == 18).all()  # 0.299*10 + 0.587*20 + 0.114*30 = 18.15
    assert torch.equal(resize(rgb, (2, 2), 3), rgb)  # RGB stays RGB
    with pytest.raises(ValueError, match=r"^resize converts between 1 and 3 channels, got 2 -> 3$"):
        resize(torch.zeros(1, 2, 2, 2, dtype=torch.uint8), (2, 2), 3)
    with pytest.raises(ValueError, match=r"^resize converts between 1 and 3 channels, got 3 -> 2$"):
        resize(rgb, (2, 2), 2)
    on_meta = resize(torch.zeros(1, 3, 4, 4, dtype=torch.uint8, device=META), (2, 2), 1)
    assert on_meta.device == META and on_meta.shape == (1, 1, 2, 2)


def test_mix_checks_messages():
    x, labels = torch.zeros(3, 2, 2, 2), torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match=r"^alpha must be > 0, got 0$"):
        mixup(x, labels, 3, alpha=0)
    with pytest.raises(ValueError, match=r"^labels must have shape \(3,\), got \(2,\)$"):
        mixup(x, labels[:2], 3)
    with pytest.raises(ValueError, match=r"^labels out of range \[0, 2\]$"):
        mixup(x, torch.tensor([0, 1, 3]), 3)  # the label K itself is out of range
    with pytest.raises(ValueError, match=r"^labels out of range \[0, 2\]$"):
        regmixup(x, torch.tensor([0, -1, 2]), 3)


def test_mixup_defaults_width_and_dtype():
    x = torch.randn(4, 1, 2, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 1, 0, 1])  # class 2 of K = 3 absent: the targets still have K columns
    x_mix, soft = mixup(x, labels, 3, generator=torch.Generator().manual_seed(2))
    ref_x, ref_soft = mixup(x, labels, 3, 0.2, torch.Generator().manual_seed(2))  # 0.2: calibkit's default
    assert torch.equal(x_mix, ref_x) and torch.equal(soft, ref_soft)
    assert soft.shape == (4, 3) and soft.dtype == torch.float64 and (soft[:, 2] == 0).all()
    x_cat, soft_cat = regmixup(x, labels, 3, generator=torch.Generator().manual_seed(2))
    ref_cat, ref_soft_cat = regmixup(x, labels, 3, 20.0, torch.Generator().manual_seed(2))  # 20: the default
    assert torch.equal(x_cat, ref_cat) and torch.equal(soft_cat, ref_soft_cat) and soft_cat.shape == (8, 3)
    torch.manual_seed(6)  # no generator: the global one
    free_x, free_soft = mixup(x, labels, 3)
    ref_x, ref_soft = mixup(x, labels, 3, generator=torch.Generator().manual_seed(6))
    assert torch.equal(free_x, ref_x) and torch.equal(free_soft, ref_soft)


def test_beta_on_device_is_the_first_gamma_over_their_sum():
    t = beta_on_device(0.7, torch.Generator().manual_seed(11))
    g = torch._standard_gamma(torch.full((2,), 0.7, dtype=torch.float64), generator=torch.Generator().manual_seed(11))
    assert float(t) == float(g[0] / (g[0] + g[1])) and float(t) != float(g[1] / (g[0] + g[1]))
