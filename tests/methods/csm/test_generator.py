"""CSM's class-conditional EDM denoiser pinned to independent expectations: the configuration's
acceptance rule against the UNet's repeated halving, the network's layout against the config, the
forward pass against EDM's preconditioning formula (Karras et al. 2022, Table 1) in float64, the
loss and the forward pass keeping the input's dtype and device, class vectors and uint8
conversion by hand, the saved files read back independently, and every error message in full."""

import hashlib
import json
import math

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")

from calibkit.methods.csm.generator import (  # noqa: E402
    CONFIG_NAME,
    WEIGHTS_NAME,
    CondDenoiser,
    GeneratorConfig,
    class_vector,
    edm_loss,
    generator_hash,
    load_generator,
    save_generator,
    state_hash,
    to_model_space,
    to_uint8,
)

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(block_out_channels=(8, 16, 16), norm_num_groups=4, attention_head_dim=4)


def tiny(**kw):
    """A denoiser of a few thousand parameters, 3 classes (each test builds its own)."""
    torch.manual_seed(0)
    return CondDenoiser(GeneratorConfig(num_classes=3, **{**TINY, **kw})).eval()


# ---------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------
def test_config_normalises_its_sequences():
    cfg = GeneratorConfig(block_out_channels=[8.0, 16, 16], attention_levels=[0, 0, 1])
    assert cfg.block_out_channels == (8, 16, 16) and cfg.attention_levels == (False, False, True)
    assert all(type(a) is bool for a in cfg.attention_levels)


def _halves_cleanly(size, times):
    for _ in range(times):
        if size % 2:
            return False
        size //= 2
    return True


def test_config_accepts_exactly_the_grids_the_unet_can_halve():
    # Accepted iff the data fits with the same padding on both sides (an even, non-negative
    # margin) and each of the UNet's L - 1 downsamplings halves the grid exactly.
    for levels in (1, 2, 3):
        chans = (8,) * levels
        for data in (26, 27, 28):
            for image in range(22, 42):
                ok = image >= data and (image - data) % 2 == 0 and _halves_cleanly(image, levels - 1)
                kw = dict(block_out_channels=chans, attention_levels=(False,) * levels,
                          data_size=data, image_size=image)
                if ok:
                    assert GeneratorConfig(**kw).image_size == image
                else:
                    with pytest.raises(ValueError, match="image_size"):
                        GeneratorConfig(**kw)


@pytest.mark.parametrize("kw, message", [
    (dict(attention_levels=(False, True)), "attention_levels has 2 entries but block_out_channels has 3"),
    (dict(num_classes=1), "num_classes must be >= 2, got 1"),
    (dict(data_size=34, image_size=32),
     "image_size (32) must equal data_size (34) or exceed it by an even margin"),
    (dict(data_size=28, image_size=31),
     "image_size (31) must equal data_size (28) or exceed it by an even margin"),
    (dict(data_size=28, image_size=30), "image_size 30 is not divisible by the UNet's downsampling"),
])
def test_config_errors_in_full(kw, message):
    with pytest.raises(ValueError) as err:
        GeneratorConfig(**kw)
    assert str(err.value) == message


def test_from_dict_round_trip_and_unknown_keys():
    import dataclasses

    cfg = GeneratorConfig(num_classes=4, **TINY)
    assert GeneratorConfig.from_dict(json.loads(json.dumps(dataclasses.asdict(cfg)))) == cfg
    with pytest.raises(ValueError) as err:
        GeneratorConfig.from_dict({"num_classes": 3, "zeta": 1, "bogus": 2})
    assert str(err.value) == "unknown generator config keys: ['bogus', 'zeta']"


# ---------------------------------------------------------------------------------------------
# the network
# ---------------------------------------------------------------------------------------------
def test_unet_layout_follows_the_config():
    m = tiny(data_size=28, image_size=28, layers_per_block=1)  # diffusers' own default is 2
    unet = m.unet
    # the UNet declares the grid it runs on (diffusers' tools size their inputs from it)
    assert unet.config.sample_size == 28
    # attention only where the config asks for it: the coarsest level, first on the way up
    assert [type(b).__name__ for b in unet.down_blocks] == ["DownBlock2D", "DownBlock2D", "AttnDownBlock2D"]
    assert [type(b).__name__ for b in unet.up_blocks] == ["AttnUpBlock2D", "UpBlock2D", "UpBlock2D"]
    # one resnet per level on the way down, one more (the skip) on the way up
    assert [len(b.resnets) for b in unet.down_blocks] == [1, 1, 1]
    assert [len(b.resnets) for b in unet.up_blocks] == [2, 2, 2]
    # heads of attention_head_dim = 4 channels each: 16 channels -> 4 heads
    heads = [a.heads for blk in (unet.down_blocks[2], unet.mid_block, unet.up_blocks[0]) for a in blk.attentions]
    assert heads and all(h == 16 // 4 for h in heads)
    # the class vector joins the time embedding, 4x the first channel count
    assert tuple(m.class_proj.weight.shape) == (4 * 8, 3)
    assert m(torch.zeros(2, 1, 28, 28), 1.0, torch.eye(3)[:2]).shape == (2, 1, 28, 28)


def test_unet_layout_with_two_layers_and_attention_first():
    m = tiny(block_out_channels=(8, 16), attention_levels=(True, False), layers_per_block=2)
    unet = m.unet
    assert unet.config.sample_size == 32
    assert [type(b).__name__ for b in unet.down_blocks] == ["AttnDownBlock2D", "DownBlock2D"]
    assert [type(b).__name__ for b in unet.up_blocks] == ["UpBlock2D", "AttnUpBlock2D"]
    assert [len(b.resnets) for b in unet.down_blocks] == [2, 2]
    assert all(a.heads == 8 // 4 for a in unet.down_blocks[0].attentions)


def test_forward_is_the_edm_formula_in_float64():
    # D(x; sigma, y) = c_skip x + c_out F(c_in x; ln(sigma) / 4, y), the constants in float64.
    m = tiny().double()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 1, 32, 32, generator=g, dtype=torch.float64)
    y = class_vector([0, 1, 2], [2, 0, 1], [0.25, 0.5, 1.0], 3)  # float32, as the sampler makes it
    sd = 0.5
    for sigma, s in ((0.7, [0.7] * 3), (torch.tensor([0.5, 2.0, 0.1]), [0.5, 2.0, float(np.float32(0.1))])):
        c_skip = torch.tensor([sd**2 / (v**2 + sd**2) for v in s], dtype=torch.float64).view(3, 1, 1, 1)
        c_out = torch.tensor([v * sd / math.sqrt(v**2 + sd**2) for v in s], dtype=torch.float64).view(3, 1, 1, 1)
        c_in = torch.tensor([1 / math.sqrt(v**2 + sd**2) for v in s], dtype=torch.float64).view(3, 1, 1, 1)
        c_noise = torch.tensor([math.log(v) / 4 for v in s], dtype=torch.float64)
        f = m.unet(c_in * x, c_noise, class_labels=m.class_proj(y.double())).sample
        out = m(x, sigma, y)
        assert out.dtype == torch.float64
        assert torch.allclose(out, c_skip * x + c_out * f, rtol=0, atol=1e-12)
        # and the network matters: F's term is not negligible at these noise levels
        assert (c_out * f).abs().max() > 1e-3


def test_forward_rejects_a_class_vector_of_the_wrong_shape():
    m = tiny()
    with pytest.raises(ValueError) as err:
        m(torch.zeros(2, 1, 32, 32), 1.0, torch.zeros(2, 4))
    assert str(err.value) == "y must have shape (2, 3), got (2, 4)"


def test_forward_and_loss_stay_on_the_inputs_device():
    # The meta device runs the network without values; a scalar or CPU sigma and the loss's
    # CPU-drawn noise levels and noise must follow x there (on an accelerator they would
    # otherwise meet x on another device).
    m = tiny().to("meta")
    x, y = torch.zeros(2, 1, 32, 32, device="meta"), torch.eye(3)[:2].to("meta")
    assert m(x, 0.5, y).device.type == "meta"
    assert m(x, torch.tensor([0.5, 1.0]), y).device.type == "meta"
    loss = edm_loss(m, x, y, torch.Generator().manual_seed(0))
    assert loss.device.type == "meta" and loss.shape == ()


def test_edm_loss_keeps_the_data_dtype():
    # In bfloat16 the noise levels, the noise and the loss weight are all bfloat16: the loss is
    # the hand computation with the same draws, bit for bit.
    m = tiny().to(torch.bfloat16)
    g = torch.Generator().manual_seed(3)
    x0 = (torch.rand(2, 1, 32, 32, generator=g) * 2 - 1).to(torch.bfloat16)
    y = torch.eye(3)[[0, 2]]
    loss = edm_loss(m, x0, y, torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)
    sigma = (torch.randn(2, generator=g) * 1.2 - 1.2).exp().to(torch.bfloat16)
    n = torch.randn(x0.shape, generator=g).to(torch.bfloat16)
    w = (sigma**2 + 0.25) / (sigma * 0.5) ** 2
    ref = (w.view(2, 1, 1, 1) * (m(x0 + sigma.view(2, 1, 1, 1) * n, sigma, y) - x0) ** 2).mean()
    assert loss.dtype == torch.bfloat16 and torch.equal(loss, ref)


# ---------------------------------------------------------------------------------------------
# class vectors
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, rows", [
    (([0, 1, 2], 2, 0.25), [[0.25, 0, 0.75], [0, 0.25, 0.75], [0, 0, 1]]),  # c1 the only vector
    ((0, [0, 1, 2], 0.5), [[1, 0, 0], [0.5, 0.5, 0], [0.5, 0, 0.5]]),  # c2 the only vector
    ((1, 2, [0.0, 0.5, 1.0]), [[0, 0, 1], [0, 0.5, 0.5], [0, 1, 0]]),  # lam the only vector
    ((1, 0, 0.25), [[0.75, 0.25, 0]]),  # class 0 is a valid second class
])
def test_class_vector_broadcasts_each_argument(args, rows):
    v = class_vector(*args, 3)
    assert v.dtype == torch.float32 and torch.equal(v, torch.tensor(rows, dtype=torch.float32))


def test_class_vector_is_float32_whatever_lam_is():
    lam32 = float(np.float32(0.1))  # 0.1 rounded to float32
    want = torch.tensor([[lam32, 1 - lam32]], dtype=torch.float32)
    for lam in (torch.tensor(0.1, dtype=torch.float64), np.float64(0.1), 0.1):
        v = class_vector(0, 1, lam, 2)
        assert v.dtype == torch.float32 and torch.equal(v, want)
    assert torch.equal(class_vector(0, 1, 1, 2), torch.tensor([[1.0, 0.0]]))  # an integer lam


@pytest.mark.parametrize("c1, c2", [(-1, 0), (3, 0), (0, -1), (0, 3), (3, 1), ([0, 4], 1)])
def test_class_vector_rejects_every_index_outside_the_classes(c1, c2):
    with pytest.raises(ValueError) as err:
        class_vector(c1, c2, 0.5, 3)
    assert str(err.value) == "class indices must lie in [0, 3)"


@pytest.mark.parametrize("lam", [-0.1, 1.5, [0.5, 1.01]])
def test_class_vector_rejects_lam_outside_the_unit_interval(lam):
    with pytest.raises(ValueError) as err:
        class_vector(0, 1, lam, 3)
    assert str(err.value) == "lam must lie in [0, 1]"


# ---------------------------------------------------------------------------------------------
# pixel conversions
# ---------------------------------------------------------------------------------------------
def test_to_uint8_saturates_outside_the_model_range():
    # The sampler's output may overshoot [-1, 1]; those pixels saturate at 0 and 255. Inside,
    # (v + 1) * 127.5 rounded half to even: 0 -> 127.5 -> 128, -0.5 -> 63.75 -> 64.
    cfg = GeneratorConfig(**TINY)
    vals = [-3.0, -1.5, -1.2, -1.0, -0.5, 0.0, 1.0, 1.2, 1.5, 3.0]
    want = [0, 0, 0, 0, 64, 128, 255, 255, 255, 255]
    x = torch.tensor(vals).view(-1, 1, 1, 1).expand(-1, 1, 32, 32)
    out = to_uint8(x, cfg)
    assert out.dtype == torch.uint8 and out.shape == (10, 1, 28, 28)
    assert torch.equal(out, torch.tensor(want, dtype=torch.uint8).view(-1, 1, 1, 1).expand(-1, 1, 28, 28))


def test_to_model_space_shape_error_in_full():
    cfg = GeneratorConfig(**TINY)
    with pytest.raises(ValueError) as err:
        to_model_space(torch.zeros(3, 1, 28, 27, dtype=torch.uint8), cfg)
    assert str(err.value) == "images must have shape (N, 1, 28, 28), got (3, 1, 28, 27)"


# ---------------------------------------------------------------------------------------------
# files and hashes
# ---------------------------------------------------------------------------------------------
def test_save_creates_missing_parents_and_half_stores_float16(tmp_path):
    from safetensors.torch import load_file

    m = tiny()
    state = m.state_dict()
    full, half = tmp_path / "a" / "b" / "full", tmp_path / "c" / "d" / "half"
    save_generator(m, full)
    save_generator(m, half, half=True)
    for d, dtype in ((full, torch.float32), (half, torch.float16)):
        stored = load_file(d / WEIGHTS_NAME)
        assert set(stored) == set(state)
        for k, v in stored.items():
            assert v.dtype == (dtype if state[k].is_floating_point() else state[k].dtype)
            assert torch.equal(v, state[k].to(v.dtype))
    # half the bytes, give or take the header
    assert (half / WEIGHTS_NAME).stat().st_size < 0.6 * (full / WEIGHTS_NAME).stat().st_size


def test_load_needs_both_files_and_returns_a_frozen_model(tmp_path):
    m = tiny()
    save_generator(m, tmp_path / "g")
    back = load_generator(tmp_path / "g")
    assert not back.training and not any(p.requires_grad for p in back.parameters())
    for missing in (WEIGHTS_NAME, CONFIG_NAME):
        d = tmp_path / f"no-{missing}"
        save_generator(m, d)
        (d / missing).unlink()
        with pytest.raises(FileNotFoundError) as err:
            load_generator(d)
        assert str(err.value) == (f"{d} is not a generator directory (needs {CONFIG_NAME} and {WEIGHTS_NAME}); "
                                  "give the --out folder of `calibkit csm train-generator`")


def test_hashes_by_hand(tmp_path):
    # state_hash: SHA-256 over the sorted keys, each followed by its float32 bytes, 16 hex digits.
    lin = torch.nn.Linear(1, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0], [-2.0]]))
        lin.bias.copy_(torch.tensor([0.5, 0.0]))
    h = hashlib.sha256()
    h.update(b"bias" + np.array([0.5, 0.0], dtype="<f4").tobytes())
    h.update(b"weight" + np.array([1.0, -2.0], dtype="<f4").tobytes())
    assert state_hash(lin) == h.hexdigest()[:16]
    assert state_hash(lin.double()) == h.hexdigest()[:16]  # stored as float32 either way
    m = tiny()
    save_generator(m, tmp_path / "g")
    whole = hashlib.sha256((tmp_path / "g" / WEIGHTS_NAME).read_bytes()).hexdigest()
    assert generator_hash(tmp_path / "g") == whole[:16] and len(state_hash(m)) == 16
