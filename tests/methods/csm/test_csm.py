"""CSM units: EDM preconditioning and loss, Heun sampler, class vectors, reannotation math."""

import math

import pytest
import torch

pytest.importorskip("diffusers")

from calibkit.methods.csm.annotate import class_prototypes, reannotate  # noqa: E402
from calibkit.methods.csm.generate import class_pairs, group_conditions, group_noise, sample_groups  # noqa: E402
from calibkit.methods.csm.generator import (  # noqa: E402
    CondDenoiser,
    GeneratorConfig,
    class_vector,
    edm_loss,
    load_generator,
    save_generator,
    to_model_space,
    to_uint8,
)
from calibkit.methods.csm.sampler import edm_sigmas, guided, heun_sample  # noqa: E402

TINY = dict(block_out_channels=(8, 16, 16), norm_num_groups=4, attention_head_dim=4)


# Tiny networks run on one torch thread (see conftest.one_thread).
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return CondDenoiser(GeneratorConfig(**TINY)).eval()


def test_class_vector_endpoints_are_exact_one_hots():
    v = class_vector([2, 2, 2], [7, 7, 7], [1.0, 0.0, 0.25], 10)
    assert torch.equal(v[0], torch.eye(10)[2]) and torch.equal(v[1], torch.eye(10)[7])
    assert v[2, 2] == 0.25 and v[2, 7] == 0.75 and v[2].sum() == 1
    cond = group_conditions([0, 46], 10)  # group 46 cycles back to pair 46 % 45 = 1 -> (0, 2)
    assert torch.equal(cond["y"][7], torch.eye(10)[0]) and torch.equal(cond["y"][0], torch.eye(10)[1])
    assert (cond["c1"][8], cond["c2"][8]) == (0, 2)
    assert torch.equal(cond["lam"][:8], torch.linspace(0, 1, 8))
    with pytest.raises(ValueError, match="lam"):
        class_vector(0, 1, 1.5, 10)
    with pytest.raises(ValueError, match="class indices"):
        class_vector(0, 10, 0.5, 10)


def test_class_pairs_cover_all_unordered_pairs():
    pairs = class_pairs(10)
    assert len(pairs) == 45 == len(set(pairs)) and all(a < b for a, b in pairs)


def test_edm_preconditioning_values(tiny):
    sd = 0.5
    c_skip, c_out, c_in, c_noise = tiny.precond(torch.tensor([0.5]))
    assert c_skip.item() == pytest.approx(sd**2 / (0.25 + sd**2))
    assert c_out.item() == pytest.approx(0.5 * sd / math.sqrt(0.25 + sd**2))
    assert c_in.item() == pytest.approx(1 / math.sqrt(0.25 + sd**2))
    assert c_noise.item() == pytest.approx(math.log(0.5) / 4)
    # EDM's loss weight is 1 / c_out^2, so that the network's effective target has unit weight.
    s = torch.tensor([0.01, 1.0, 30.0])
    w = (s**2 + sd**2) / (s * sd) ** 2
    assert torch.allclose(w * tiny.precond(s)[1] ** 2, torch.ones(3))


def test_denoiser_returns_its_input_as_sigma_vanishes(tiny):
    x = torch.randn(3, 1, 32, 32)
    y = class_vector([0, 1, 2], [3, 4, 5], [0.2, 0.5, 1.0], 10)
    out = tiny(x, torch.full((3,), 1e-6), y)
    assert torch.allclose(out, x, atol=1e-4)
    far = tiny(x, torch.full((3,), 1.0), y)
    assert not torch.allclose(far, x, atol=1e-2)  # the network matters away from sigma = 0


def test_edm_loss_matches_hand_computation(tiny):
    x0 = torch.rand(4, 1, 32, 32) * 2 - 1
    y = torch.eye(10)[[1, 2, 3, 4]]
    loss = edm_loss(tiny, x0, y, torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)  # same draws, in the same order
    sigma = (torch.randn(4, generator=g) * 1.2 - 1.2).exp()
    n = torch.randn(x0.shape, generator=g)
    w = (sigma**2 + 0.25) / (sigma * 0.5) ** 2
    ref = (w.view(4, 1, 1, 1) * (tiny(x0 + sigma.view(4, 1, 1, 1) * n, sigma, y) - x0) ** 2).mean()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)


def test_edm_sigmas():
    t = edm_sigmas(20)
    assert len(t) == 21 and t[0] == pytest.approx(80) and t[19] == pytest.approx(0.002) and t[20] == 0
    assert (t[1:] < t[:-1]).all()
    with pytest.raises(ValueError):
        edm_sigmas(0)


def test_heun_lands_on_a_single_data_point():
    mu = torch.tensor([0.3, -0.7]).view(1, 2, 1, 1)
    noise = torch.randn(5, 2, 1, 1, dtype=torch.float64)
    x = heun_sample(lambda x, s, y: mu.to(x).expand_as(x), noise, torch.zeros(5, 1), steps=7)
    assert torch.allclose(x, mu.double().expand_as(x), atol=1e-9)


def test_heun_follows_the_gaussian_probability_flow():
    # Data N(mu, s^2): ideal denoiser mu + s^2 / (s^2 + sigma^2) (x - mu); the ODE solution from
    # x_T at sigma_max is mu + (x_T - mu) sqrt(s^2 + sigma^2) / sqrt(s^2 + sigma_max^2).
    mu, s = 0.4, 0.5
    noise = torch.randn(64, 1, 2, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def den(x, sigma, y):
        return mu + s**2 / (s**2 + sigma.view(-1, 1, 1, 1) ** 2) * (x - mu)

    expect = mu + (noise * 80 - mu) * s / math.sqrt(s**2 + 80**2)
    err = {n: (heun_sample(den, noise, torch.zeros(64, 1), steps=n) - expect).abs().max().item()
           for n in (20, 40, 80)}
    # Heun is second order: halving the step size divides the error by about 4.
    assert err[20] < 0.1 and err[40] < err[20] / 3 and err[80] < err[40] / 3 and err[80] < 5e-3


def test_guidance_combines_conditional_and_unconditional():
    def den(x, sigma, y):
        return x * 0 + y.sum(1).view(-1, 1, 1, 1)  # 0 when unconditional, 1 when conditional

    x, s, y = torch.zeros(2, 1, 2, 2), torch.ones(2), torch.eye(3)[[0, 1]]
    assert torch.allclose(guided(den, 3.0)(x, s, y), torch.full_like(x, 3.0))
    assert guided(den, 1.0) is den


def test_sampling_is_deterministic_and_groups_share_noise(tiny):
    a = sample_groups(tiny, [0, 5], seed=3, steps=2)
    b = sample_groups(tiny, [0, 5], seed=3, steps=2)
    c = sample_groups(tiny, [0, 5], seed=4, steps=2)
    assert a["images"].dtype == torch.uint8 and a["images"].shape == (16, 1, 28, 28)
    assert torch.equal(a["images"], b["images"]) and not torch.equal(a["images"], c["images"])
    n1 = group_noise(3, 5, (1, 1, 32, 32))
    assert torch.equal(n1, group_noise(3, 5, (1, 1, 32, 32)))
    assert not torch.equal(n1, group_noise(3, 6, (1, 1, 32, 32)))


def test_save_load_roundtrip(tiny, tmp_path):
    save_generator(tiny, tmp_path / "g", extra={"note": "x"})
    back = load_generator(tmp_path / "g")
    x, y = torch.randn(2, 1, 32, 32), torch.eye(10)[[0, 9]]
    assert torch.equal(back(x, torch.ones(2), y), tiny(x, torch.ones(2), y))
    save_generator(tiny, tmp_path / "h", half=True)
    assert torch.allclose(load_generator(tmp_path / "h")(x, torch.ones(2), y), tiny(x, torch.ones(2), y), atol=1e-2)
    with pytest.raises(FileNotFoundError, match="not a generator"):
        load_generator(tmp_path)


def test_model_space_roundtrip_and_padding():
    cfg = GeneratorConfig(**TINY)
    img = torch.randint(0, 256, (3, 1, 28, 28), dtype=torch.uint8)
    x = to_model_space(img, cfg)
    assert x.shape == (3, 1, 32, 32) and (x[..., :2, :] == -1).all()
    assert torch.equal(to_uint8(x, cfg), img)
    with pytest.raises(ValueError, match="uint8"):
        to_model_space(img.float(), cfg)


def test_reannotation_against_hand_computation():
    protos = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 5.0]])
    f = torch.tensor([[1.5, 3.0], [-4.0, 1.0], [0.0, 2.5]])
    c1, c2 = torch.tensor([1, 1, 2]), torch.tensor([0, 0, 0])
    out = reannotate(f, c1, c2, protos, sharpness=4.0)
    # lam_hat = <f - p0, p_c1 - p0> / ||p_c1 - p0||^2: 3/4, -8/4, 12.5/25
    assert torch.allclose(out["lam_hat"], torch.tensor([0.75, -2.0, 0.5]))
    lam = [1 / (1 + math.exp(-4 * (v - 0.5))) for v in (0.75, -2.0, 0.5)]
    assert torch.allclose(out["lam_annot"], torch.tensor(lam))
    soft = out["soft_labels"]
    assert soft[0, 1] == pytest.approx(lam[0]) and soft[0, 0] == pytest.approx(1 - lam[0])
    assert soft[2, 2] == pytest.approx(0.5) and soft[:, :].sum(1).allclose(torch.ones(3))
    # A very sharp sigmoid is the step 1[lam_hat > 1/2] (exactly 1/2 at the threshold): sigmoid(25)
    # rounds to 1 and sigmoid(-250) underflows to 0 in float32.
    assert reannotate(f, c1, c2, protos, sharpness=100.0)["lam_annot"].tolist() == [1.0, 0.0, 0.5]
    with pytest.raises(ValueError, match="differ"):
        reannotate(f, c1, c1, protos)


def test_class_prototypes():
    feats = torch.tensor([[1.0, 0.0], [3.0, 2.0], [5.0, 5.0]])
    p = class_prototypes(feats, torch.tensor([0, 0, 1]), 2)
    assert torch.allclose(p, torch.tensor([[2.0, 1.0], [5.0, 5.0]]))
    with pytest.raises(ValueError, match="classes \\[2\\]"):
        class_prototypes(feats, torch.tensor([0, 0, 1]), 3)
