"""CSM's inputs, sampler, companion and generation pinned to independent expectations: the EDM noise
levels by their closed form, the sigmas the Heun sampler hands the denoiser, uint8 quantisation by
hand, the validation-split exclusion against the data loader's own splits, the companion's draws
and every error message in full."""

import json
from collections import Counter

import pytest
import torch

from calibkit.methods.csm.dataset import CSMCompanion
from calibkit.methods.csm.inputs import as_image_tensors, training_images_outside_validation
from calibkit.methods.csm.sampler import edm_sigmas, guided, heun_sample

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------
# sampler
# ---------------------------------------------------------------------------------------------
def test_edm_sigmas_closed_form():
    steps, lo, hi, rho = 5, 0.01, 10.0, 3.0
    t = edm_sigmas(steps, lo, hi, rho)
    want = [(hi ** (1 / rho) + i / (steps - 1) * (lo ** (1 / rho) - hi ** (1 / rho))) ** rho for i in range(steps)]
    assert t.dtype == torch.float64 and t.tolist()[-1] == 0.0 and len(t) == steps + 1
    for a, b in zip(t.tolist()[:-1], want):
        assert a == pytest.approx(b, rel=1e-12)
    # Defaults: 20 levels from 80 down to 0.002 with rho = 7 (the values CSM samples with).
    d = edm_sigmas()
    assert len(d) == 21 and d[0] == pytest.approx(80.0, rel=1e-12) and d[19] == pytest.approx(0.002, rel=1e-12)
    mid = (80 ** (1 / 7) + 10 / 19 * (0.002 ** (1 / 7) - 80 ** (1 / 7))) ** 7
    assert d[10].item() == pytest.approx(mid, rel=1e-12)
    assert edm_sigmas(3, dtype=torch.float32).dtype == torch.float32
    # Two steps: sigma_max, sigma_min, 0; one step: straight from sigma_max to 0.
    assert edm_sigmas(2, 0.5, 4.0).tolist() == [pytest.approx(4.0, rel=1e-12), pytest.approx(0.5, rel=1e-12), 0.0]
    assert edm_sigmas(1, 0.5, 4.0).tolist() == [pytest.approx(4.0, rel=1e-12), 0.0]


@pytest.mark.parametrize("kw, message", [
    (dict(steps=0), r"^steps must be >= 1, got 0$"),
    (dict(steps=2, sigma_min=0.0), r"^need 0 < sigma_min < sigma_max, got 0.0, 80.0$"),
    (dict(steps=2, sigma_min=3.0, sigma_max=3.0), r"^need 0 < sigma_min < sigma_max, got 3.0, 3.0$"),
    (dict(steps=2, sigma_min=-1.0), r"^need 0 < sigma_min < sigma_max, got -1.0, 80.0$"),
])
def test_edm_sigmas_errors(kw, message):
    with pytest.raises(ValueError, match=message):
        edm_sigmas(**kw)


def _recording(fn=None):
    calls = []

    def den(x, sigma, y):
        calls.append((sigma.clone(), y.clone(), x.shape[0]))
        return torch.zeros_like(x) if fn is None else fn(x, sigma, y)

    return den, calls


def test_heun_calls_the_denoiser_at_each_level_then_the_next():
    den, calls = _recording()
    noise = torch.randn(3, 1, 2, 2, generator=torch.Generator().manual_seed(0))
    y = torch.eye(4)[[0, 1, 3]]
    heun_sample(den, noise, y)
    t = edm_sigmas(20).tolist()
    # 2N - 1 calls: t_i for the Euler step, t_{i+1} for the correction, none at sigma = 0.
    want = [s for i in range(19) for s in (t[i], t[i + 1])] + [t[19]]
    assert len(calls) == 39
    for (sigma, yy, b), s in zip(calls, want):
        assert sigma.shape == (3,) and sigma.dtype == torch.float32 and b == 3
        assert torch.equal(sigma, torch.full((3,), s, dtype=torch.float32)) and torch.equal(yy, y)
    den, calls = _recording()
    heun_sample(den, noise.double(), y, steps=3, sigma_min=0.1, sigma_max=5.0, rho=2.0)
    t = edm_sigmas(3, 0.1, 5.0, 2.0).tolist()
    assert [c[0][0].item() for c in calls] == pytest.approx([t[0], t[1], t[1], t[2], t[2]], rel=1e-12)
    assert calls[0][0].dtype == torch.float64


def test_heun_on_a_zero_denoiser_is_exact_and_starts_at_sigma_max():
    # D = 0: dx/dsigma = x / sigma, so x(sigma) = noise * sigma; the final step lands on 0 and
    # the first denoiser input is noise * sigma_max.
    seen = []
    noise = torch.randn(2, 1, 1, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    def den(x, sigma, y):
        seen.append(x.clone())
        return torch.zeros_like(x)

    out = heun_sample(den, noise, torch.zeros(2, 1), steps=4, sigma_max=6.0)
    torch.testing.assert_close(seen[0], noise * 6.0, rtol=1e-12, atol=0)
    assert torch.allclose(out, torch.zeros_like(out), atol=1e-12)
    t = edm_sigmas(4, sigma_max=6.0).tolist()
    torch.testing.assert_close(seen[1], noise * t[1], rtol=1e-12, atol=1e-12)  # the Euler point


def test_heun_single_step_is_one_euler_step_to_zero():
    # With N = 1 the only step goes to sigma = 0 with no correction: x = D(noise * sigma_max).
    den, calls = _recording(lambda x, s, y: torch.full_like(x, 0.25))
    out = heun_sample(den, torch.ones(2, 1, 1, 1), torch.zeros(2, 1), steps=1)
    assert len(calls) == 1 and torch.allclose(out, torch.full_like(out, 0.25), atol=1e-6)


def test_heun_guidance_doubles_the_batch_and_mixes():
    den, calls = _recording(lambda x, s, y: x * 0 + 2 * y.sum(1).view(-1, 1, 1, 1) + 0.5)
    out = heun_sample(den, torch.zeros(2, 1, 1, 1), torch.eye(2), steps=1, guidance=2.5)
    assert len(calls) == 1 and calls[0][2] == 4 and torch.equal(calls[0][1][:2], torch.zeros(2, 2))
    assert torch.equal(calls[0][1][2:], torch.eye(2)) and torch.equal(calls[0][0], torch.full((4,), 80.0))
    assert torch.allclose(out, torch.full_like(out, 5.5))  # D_uncond + w (D_cond - D_uncond) = 0.5 + 2.5 (2.5 - 0.5)
    x = torch.zeros(2, 1, 1, 1)
    torch.testing.assert_close(guided(lambda a, s, y: a * 0 + y.sum(1).view(-1, 1, 1, 1), 0.0)(
        x, torch.ones(2), torch.eye(2)), torch.zeros_like(x))


def test_heun_rejects_mismatched_rows():
    with pytest.raises(ValueError, match=r"^noise has 3 rows but y has 2$"):
        heun_sample(lambda x, s, y: x, torch.zeros(3, 1, 1, 1), torch.zeros(2, 4))


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------
def test_float_images_are_quantised_by_hand():
    x = torch.tensor([0.0, 1.0, 0.2, 2.6 / 255, 2.4 / 255, 254.4 / 255]).view(1, 1, 2, 3)
    u8, y = as_image_tensors(x, [3])
    assert u8.dtype == torch.uint8 and u8.flatten().tolist() == [0, 255, 51, 3, 2, 254]
    assert y.dtype == torch.int64 and y.tolist() == [3]
    # (N, H, W) gets one channel; uint8 passes through unchanged; int32 labels become int64.
    img = torch.randint(0, 256, (4, 5, 6), dtype=torch.uint8)
    u8, y = as_image_tensors(img, torch.tensor([0, 1, 2, 3], dtype=torch.int32))
    assert u8.shape == (4, 1, 5, 6) and torch.equal(u8[:, 0], img) and y.dtype == torch.int64
    # The result is contiguous even for a strided input.
    u8, _ = as_image_tensors(torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8).transpose(2, 3), [0, 1])
    assert u8.is_contiguous()
    # Empty label tensors with empty images are accepted (no min to check).
    u8, y = as_image_tensors(torch.zeros(0, 1, 2, 2, dtype=torch.uint8), torch.zeros(0, dtype=torch.long))
    assert u8.shape == (0, 1, 2, 2) and y.shape == (0,)


class _Pairs(torch.utils.data.Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def test_dataset_items_are_stacked_in_order():
    a, b = torch.full((5, 6), 0.5), torch.ones(5, 6)
    u8, y = as_image_tensors(_Pairs([(a, 2), (b, torch.tensor(7))]))
    assert u8.shape == (2, 1, 5, 6) and y.tolist() == [2, 7] and y.dtype == torch.int64
    assert (u8[0] == 128).all() and (u8[1] == 255).all()  # round(127.5) = 128 (half to even)


@pytest.mark.parametrize("args, message", [
    ((torch.zeros(2, 1, 2, 2),), r"^labels are required when images is a tensor$"),
    ((_Pairs([(torch.zeros(2, 2), 0)]), [0]),
     r"^pass either \(images, labels\) tensors or a Dataset of \(image, label\) pairs$"),
    ((5,), r"^images must be a tensor or a map-style Dataset, got int$"),
    ((_Pairs([]),), r"^the Dataset is empty$"),
    ((torch.zeros(2, 1, 1, 2, 2), [0, 1]),
     r"^images must have shape \(N, C, H, W\) or \(N, H, W\), got \(2, 1, 1, 2, 2\)$"),
    ((torch.zeros(2, 2), [0, 1]), r"^images must have shape \(N, C, H, W\) or \(N, H, W\), got \(2, 2\)$"),
    ((torch.zeros(2, 1, 2, 2), [0.0, 1.0]), r"^labels must be integers of shape \(2,\), got torch.float32 \(2,\)$"),
    ((torch.zeros(2, 1, 2, 2), [0, 1, 2]), r"^labels must be integers of shape \(2,\), got torch.int64 \(3,\)$"),
    ((torch.zeros(2, 1, 2, 2), [[0, 1]]), r"^labels must be integers of shape \(2,\), got torch.int64 \(1, 2\)$"),
    ((torch.zeros(2, 1, 2, 2), [0, -3]), r"^labels must be >= 0, got -3$"),
    ((torch.zeros(2, 1, 2, 2, dtype=torch.int64), [0, 1]),
     r"^images must be uint8 or float in \[0, 1\], got torch.int64$"),
    ((torch.full((1, 1, 1, 2), -0.5), [0]),
     r"^images: float images must lie in \[0, 1\] \(got values in \[-0.5, -0.5\]\); "
                                            r"undo any normalisation first$"),
    ((torch.tensor([0.0, 1.5]).view(1, 1, 1, 2), [0]), r"^images: float images must lie in \[0, 1\] \(got values in "
                                                      r"\[0, 1.5\]\); undo any normalisation first$"),
    ((torch.tensor([0.0, float("nan")]).view(1, 1, 1, 2), [0]), r"float images must lie in \[0, 1\]"),
    ((torch.tensor([0.5, float("inf")]).view(1, 1, 1, 2), [0]), r"float images must lie in \[0, 1\]"),
])
def test_input_errors_in_full(args, message):
    with pytest.raises(ValueError, match=message):
        as_image_tensors(*args)


def _key(img, lab):
    return img.numpy().tobytes(), int(lab)


def test_training_images_outside_validation_against_the_loaders_splits():
    from calibkit.data import load

    images, labels, bundle, record = training_images_outside_validation("digits", [1, 0, 1])
    full = load("digits", seed=0, val_size=0).train
    vals = {s: load("digits", seed=s) for s in (0, 1)}
    # Every (image, label) of the official training split is distinct, so membership by content is exact.
    pool = Counter(_key(im, lab) for im, lab in zip(full.images, full.labels))
    assert len(pool) == len(full) == 1437
    held = {_key(im, lab) for s in (0, 1) for im, lab in zip(vals[s].val.images, vals[s].val.labels)}
    kept = Counter(_key(im, lab) for im, lab in zip(images, labels))
    assert set(kept) == set(pool) - held and max(kept.values()) == 1
    assert len(held) > 200  # the two seeds' splits differ
    # Kept in the official order.
    order = {k: i for i, k in enumerate(_key(im, lab) for im, lab in zip(full.images, full.labels))}
    pos = [order[_key(im, lab)] for im, lab in zip(images, labels)]
    assert pos == sorted(pos)
    assert bundle.num_classes == 10 and len(bundle.val) == 0
    assert record == {"excluded_val_seeds": [0, 1], "val_size": 200,
                      "rule": "class-stratified seeded draw from the official training split",
                      "val_checksums": {"0": vals[0].split["val_checksum"], "1": vals[1].split["val_checksum"]},
                      "official_train": 1437, "excluded": len(held), "train_images": 1437 - len(held),
                      "train_checksum": record["train_checksum"]}
    from calibkit.data.bundle import index_checksum

    assert record["train_checksum"] == index_checksum(torch.tensor(pos).numpy())


def test_training_images_outside_validation_with_another_val_size():
    from calibkit.data import load

    images, _, _, record = training_images_outside_validation("digits", [2], val_size=100)
    assert record["val_size"] == 100 and record["excluded"] == 100 and len(images) == 1337
    assert record["val_checksums"] == {"2": load("digits", seed=2, val_size=100).split["val_checksum"]}


def test_training_images_outside_validation_errors(monkeypatch):
    with pytest.raises(ValueError, match=r"^give at least one seed whose validation split is to be excluded$"):
        training_images_outside_validation("digits", [])
    import calibkit.data.bundle as bundle_mod

    monkeypatch.setattr(bundle_mod, "index_checksum", lambda idx: "bogus")
    with pytest.raises(RuntimeError, match=r"^digits: could not reproduce the validation split of seed 0; the split "
                                           r"rule of calibkit.data.load changed$"):
        training_images_outside_validation("digits", [0])


def test_fixed_validation_split_is_already_outside_training(monkeypatch):
    """A data set whose validation split is fixed by its protocol: the training split as it is."""
    import calibkit.data as data_pkg

    real = data_pkg.load
    calls = []

    def fixed(name, **kw):
        calls.append(kw)
        b = real(name, **kw)
        b.split = {**b.split, "rule": "fixed by the protocol"}
        return b

    monkeypatch.setattr(data_pkg, "load", fixed)
    images, labels, bundle, record = training_images_outside_validation("digits", [3, 1], data_dir=None)
    assert calls == [{"data_dir": None, "seed": 1, "val_size": None}]  # the smallest seed, loaded once
    assert torch.equal(images, bundle.train.images) and torch.equal(labels, bundle.train.labels)
    assert record == {"excluded_val_seeds": [1, 3], "rule": "fixed by the protocol",
                      "official_train": len(bundle.train),
                      "excluded": 0, "train_images": len(bundle.train)}


# ---------------------------------------------------------------------------------------------
# companion
# ---------------------------------------------------------------------------------------------
def _groups(pairs, k, c=1, hw=2):
    """Tensors of len(pairs) groups whose pixels encode (group, member)."""
    n = len(pairs) * 8
    code = torch.arange(n)
    images = code.to(torch.uint8).view(n, 1, 1, 1).expand(n, c, hw, hw).contiguous()
    c1 = torch.tensor([a for a, _ in pairs]).repeat_interleave(8)
    c2 = torch.tensor([b for _, b in pairs]).repeat_interleave(8)
    lam = torch.linspace(0, 1, 8).repeat(len(pairs))
    soft = torch.rand(n, k, generator=torch.Generator().manual_seed(0))
    return {"images": images, "c1": c1, "c2": c2, "lam": lam, "soft_labels": soft}


def test_companion_from_tensors_keeps_its_labels_and_draws_by_the_rule():
    src = _groups([(0, 1), (0, 2), (1, 2)], 3)
    comp = CSMCompanion(src, 3, seed=5)
    assert len(comp) == 24 and comp.group_size == 8 and comp.encoder is None
    assert comp.images.shape == (3, 8, 1, 2, 2) and comp.soft_labels.shape == (3, 8, 3)
    assert torch.equal(comp.soft_labels.reshape(24, 3), src["soft_labels"])
    assert comp.c1.tolist() == [0, 0, 1] and comp.c2.tolist() == [1, 2, 2]
    assert comp.count.tolist() == [2, 2, 2]
    labels = torch.tensor([0, 1, 2] * 100)
    images, soft = comp.draw(labels)
    code = images[:, 0, 0, 0].long()
    g, m = code // 8, code % 8
    b = len(labels)
    assert torch.equal(soft, src["soft_labels"][code])
    c1, c2 = comp.c1[g[:b]], comp.c2[g[:b]]
    assert ((c1 == labels) | (c2 == labels)).all() and torch.equal(m[:b], torch.where(c1 == labels, 7, 0))
    assert torch.equal(g[b:], g[:b]) and set(m[b:].tolist()) == set(range(1, 7))
    for y in range(3):  # both groups of each class are drawn
        assert len(set(g[:b][labels == y].tolist())) == 2
    # The companion's own generator, seeded: the same seed repeats the draws, the stream moves on.
    again = CSMCompanion(src, 3, seed=5)
    assert torch.equal(again.draw(labels)[0], images)
    assert not torch.equal(comp.draw(labels)[0], images)
    assert not torch.equal(CSMCompanion(src, 3, seed=6).draw(labels)[0], images)


def test_companion_lam_labels_from_tensors():
    src = _groups([(2, 0), (1, 2)], 3)
    del src["soft_labels"]
    comp = CSMCompanion(src, 3, labels="lam")
    lam = torch.linspace(0, 1, 8)
    want = torch.stack([1 - lam, torch.zeros(8), lam], 1)  # group 0: c1 = 2 gets lam, c2 = 0 gets 1 - lam
    assert torch.equal(comp.soft_labels[0], want) and comp.soft_labels.dtype == torch.float32


def test_companion_groups_table_lists_every_group_of_a_class():
    pairs = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3), (0, 1)]
    comp = CSMCompanion(_groups(pairs, 4), 4)
    assert comp.count.tolist() == [4, 4, 3, 3]
    assert comp.groups_of.shape == (4, 4) and comp.groups_of.dtype == torch.long
    assert comp.groups_of[0].tolist() == [0, 1, 2, 6] and comp.groups_of[1].tolist() == [0, 3, 4, 6]
    assert comp.groups_of[3, :3].tolist() == [2, 4, 5] and comp.groups_of[3, 3] == 0  # padding


@pytest.mark.parametrize("change, message", [
    (lambda s: s.pop("lam"), r"^the tensors lack \['lam'\] \(soft_labels come from csm.annotate\)$"),
    (lambda s: s.pop("soft_labels"), r"^the tensors lack \['soft_labels'\] \(soft_labels come from csm.annotate\)$"),
    (lambda s: s.update(images=s["images"].float()),
     r"^images must be uint8 \(G\*8, C, H, W\), got torch.float32 \(16, 1, 2, 2\)$"),
    (lambda s: s.update(images=s["images"][:, 0]),
     r"^images must be uint8 \(G\*8, C, H, W\), got torch.uint8 \(16, 2, 2\)$"),
    (lambda s: s.update(images=s["images"][:12]),
     r"^images must be uint8 \(G\*8, C, H, W\), got torch.uint8 \(12, 1, 2, 2\)$"),
    (lambda s: s.update(c1=s["c1"][:8]), r"^c1, c2 and lam must have shape \(16,\)$"),
    (lambda s: s.update(c2=s["c2"][:8]), r"^c1, c2 and lam must have shape \(16,\)$"),
    (lambda s: s.update(lam=s["lam"][:8]), r"^c1, c2 and lam must have shape \(16,\)$"),
    (lambda s: s["c1"].__setitem__(3, 2),
     r"^images must be in group order: 8 consecutive images share one class pair$"),
    (lambda s: s["c2"].__setitem__(9, 0),
     r"^images must be in group order: 8 consecutive images share one class pair$"),
    (lambda s: s.update(soft_labels=s["soft_labels"][:, :2]),
     r"^soft_labels must have shape \(16, 3\), got \(16, 2\)$"),
])
def test_companion_tensor_errors_in_full(change, message):
    src = _groups([(0, 1), (1, 2)], 3)
    change(src)
    with pytest.raises(ValueError, match=message):
        CSMCompanion(src, 3)


def test_companion_missing_class_and_bad_arguments():
    with pytest.raises(ValueError, match=r"^the tensors has no group for classes \[3\]; generate at least 6 groups so "
                                         r"every pair appears$"):
        CSMCompanion(_groups([(0, 1), (1, 2)], 4), 4)
    with pytest.raises(ValueError, match=r"^labels must be 'annotated' or 'lam', got 'soft'$"):
        CSMCompanion(_groups([(0, 1)], 2), 2, labels="soft")
    comp = CSMCompanion(_groups([(0, 1)], 2), 2)
    for bad in (torch.tensor([0, 2]), torch.tensor([-1, 0]), torch.tensor([[0, 1]])):
        with pytest.raises(ValueError, match=r"^labels must be \(B,\) class indices in \[0, 2\)$"):
            comp.draw(bad)
    for per in (0, 1, 3):
        with pytest.raises(ValueError, match=rf"^per_real must be an even number >= 2, got {per}$"):
            comp.draw(torch.tensor([0, 1]), per_real=per)
    # Boundary labels 0 and K - 1 are accepted; a list works too.
    images, soft = comp.draw([0, 1, 1])
    assert images.shape == (6, 1, 2, 2) and soft.shape == (6, 2)


# ---------------------------------------------------------------------------------------------
# generation
# ---------------------------------------------------------------------------------------------
TINY = dict(block_out_channels=(8, 16, 16), norm_num_groups=4, attention_head_dim=4)


@pytest.fixture(scope="module")
def tiny():
    pytest.importorskip("diffusers")
    from calibkit.methods.csm.generator import CondDenoiser, GeneratorConfig

    torch.manual_seed(0)
    return CondDenoiser(GeneratorConfig(num_classes=3, **TINY)).eval()


@pytest.fixture
def fake_heun(monkeypatch):
    """Replace the sampler inside generate with one that records its calls and returns the noise."""
    import importlib

    gen_mod = importlib.import_module("calibkit.methods.csm.generate")  # the package re-exports `generate`
    calls = []

    def fake(d, noise, y, steps, guidance):
        calls.append({"rows": len(noise), "steps": steps, "guidance": guidance, "y": y.clone(), "d": d,
                      "noise": noise.clone()})
        return noise.clamp(-1, 1)

    monkeypatch.setattr(gen_mod, "heun_sample", fake)
    return calls


def test_class_pairs_and_group_conditions_by_hand():
    from calibkit.methods.csm.generate import class_pairs, group_conditions

    assert class_pairs(2) == [(0, 1)] and class_pairs(4) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    cond = group_conditions([2, 4], 3)  # pairs (0,1), (0,2), (1,2): group 2 -> (1,2), group 4 -> 4 % 3 = 1 -> (0,2)
    assert cond["group"].tolist() == [2] * 8 + [4] * 8 and cond["member"].tolist() == list(range(8)) * 2
    assert cond["c1"].tolist() == [1] * 8 + [0] * 8 and cond["c2"].tolist() == [2] * 8 + [2] * 8
    torch.testing.assert_close(cond["lam"], torch.tensor([j / 7 for j in range(8)] * 2), rtol=0, atol=1e-7)
    assert cond["lam"].dtype == torch.float32 and cond["lam"][0] == 0 and cond["lam"][7] == 1
    for i in range(16):
        want = torch.zeros(3)
        want[int(cond["c2"][i])] += 1 - cond["lam"][i]
        want[int(cond["c1"][i])] += cond["lam"][i]
        torch.testing.assert_close(cond["y"][i], want)
    assert all(cond[k].dtype == torch.long for k in ("group", "member", "c1", "c2"))
    empty = group_conditions([], 3)  # no groups: empty integer columns all the same
    assert all(empty[k].shape == (0,) and empty[k].dtype == torch.long for k in ("group", "member", "c1", "c2"))
    assert empty["y"].shape == (0, 3)


def test_group_noise_follows_the_seeding_rule():
    import numpy as np

    from calibkit.methods.csm.generate import group_noise

    shape = (1, 2, 3, 3)
    n = group_noise(0, 2, shape)
    state = int(np.random.SeedSequence([0, 2]).generate_state(1, dtype=np.uint64)[0])
    assert state >= 2 ** 63  # this pair's state needs the top bit cleared to seed torch
    want = torch.randn(shape, generator=torch.Generator().manual_seed(state - 2 ** 63))
    assert n.dtype == torch.float32 and torch.equal(n, want)
    for s, g in ((2, 0), (1, 2), (0, 3)):
        assert not torch.equal(group_noise(s, g, shape), n)


def test_autocast_denoiser(tiny):
    from calibkit.methods.csm.generate import PRECISIONS, autocast_denoiser

    assert (PRECISIONS == ("fp32", "bf16") and autocast_denoiser(tiny) is tiny
            and autocast_denoiser(tiny, "fp32") is tiny)
    with pytest.raises(ValueError, match=r"^precision must be one of \('fp32', 'bf16'\), got 'fp16'$"):
        autocast_denoiser(tiny, "fp16")
    x = torch.randn(2, 1, 32, 32, generator=torch.Generator().manual_seed(0))
    s, y = torch.full((2,), 2.0), torch.eye(3)[[0, 2]]
    with torch.no_grad():
        ref, low = tiny(x, s, y), autocast_denoiser(tiny, "bf16")(x, s, y)
    assert low.dtype == torch.float32 and not torch.equal(low, ref)
    assert (low - ref).abs().max() < 0.1


def test_default_batch_size():
    from calibkit.methods.csm.generate import default_batch_size

    assert default_batch_size("cpu") == 64 and default_batch_size(torch.device("cpu")) == 64
    assert default_batch_size("cuda") == 4096 and default_batch_size(torch.device("cuda", 1)) == 4096


def test_sample_groups_members_and_batches(tiny):
    from calibkit.methods.csm.generate import sample_groups

    full = sample_groups(tiny, [1, 5], seed=2, steps=2, batch_size=1)
    ends = sample_groups(tiny, [1, 5], seed=2, steps=2, batch_size=1, members=[0, 7])
    keep = (full["member"] == 0) | (full["member"] == 7)
    for key in ("group", "member", "c1", "c2", "lam", "y", "images"):
        assert torch.equal(ends[key], full[key][keep]), key
    assert full["images"].shape == (16, 1, 28, 28) and full["images"].dtype == torch.uint8
    # Guidance and precision reach the sampler: each changes the images.
    for kw in ({"guidance": 3.0}, {"precision": "bf16"}):
        other = sample_groups(tiny, [1, 5], seed=2, steps=2, batch_size=1, **kw)
        assert not torch.equal(other["images"], full["images"]), kw
    with pytest.raises(ValueError, match=r"^batch_size must be positive, got -2$"):
        sample_groups(tiny, [0], seed=0, batch_size=-2)


def test_sample_groups_hands_the_sampler_consecutive_chunks(tiny, fake_heun):
    from calibkit.methods.csm.generate import group_conditions, group_noise, sample_groups

    out = sample_groups(tiny, [0, 4], seed=3, steps=5, guidance=1.5, batch_size=6)
    assert [c["rows"] for c in fake_heun] == [6, 6, 4]
    assert all(c["steps"] == 5 and c["guidance"] == 1.5 and c["d"] is tiny for c in fake_heun)
    y = torch.cat([c["y"] for c in fake_heun])
    assert torch.equal(y, group_conditions([0, 4], 3)["y"])
    noise = torch.cat([c["noise"] for c in fake_heun])
    want = torch.cat([group_noise(3, g, (1, 1, 32, 32)).expand(8, -1, -1, -1) for g in (0, 4)])
    assert torch.equal(noise, want) and out["images"].shape == (16, 1, 28, 28)
    fake_heun.clear()
    sample_groups(tiny, range(9), seed=0, steps=1)  # 72 images, default batch of 64 on the CPU
    assert [c["rows"] for c in fake_heun] == [64, 8]
    fake_heun.clear()
    sample_groups(tiny, [0], seed=0, precision="bf16")
    assert fake_heun[0]["d"] is not tiny and fake_heun[0]["steps"] == 20 and fake_heun[0]["guidance"] == 1.0


def test_generate_defaults_and_errors(tiny, fake_heun):
    from calibkit.methods.csm.generate import generate, sample_groups

    tiny.train()
    out = generate(tiny, 2)
    assert not tiny.training  # generation runs the network in eval mode
    assert [c["steps"] for c in fake_heun] == [20] and fake_heun[0]["guidance"] == 1.0
    assert torch.equal(out["images"], sample_groups(tiny, range(2), 0, 20)["images"])
    assert out["group"].tolist() == [0] * 8 + [1] * 8
    fake_heun.clear()
    generate(tiny, 1, seed=5, steps=3, guidance=2.0, batch_size=3)
    assert [c["rows"] for c in fake_heun] == [3, 3, 2] and fake_heun[0]["steps"] == 3
    assert fake_heun[0]["guidance"] == 2.0
    fake_heun.clear()
    generate(tiny, 1, precision="bf16")
    assert fake_heun[0]["d"] is not tiny
    fake_heun.clear()
    generate(tiny, 1, steps=1)  # one step is allowed
    assert fake_heun[0]["steps"] == 1
    for kw in ({"num_groups": 0}, {"num_groups": 1, "steps": 0}):
        with pytest.raises(ValueError, match=r"^num_groups and steps must be positive$"):
            generate(tiny, **kw)


def test_dist_env(monkeypatch):
    from calibkit.methods.csm.generate import _dist_env

    assert _dist_env((1, 3)) == (1, 3, False) and _dist_env(("2", "4")) == (2, 4, False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert _dist_env("env") == (0, 1, False) and _dist_env(None) == (0, 1, False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert _dist_env(None) == (0, 1, False)  # only "env" reads torchrun's variables
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert _dist_env("env") == (0, 1, False)


def test_dist_env_joins_an_existing_group(monkeypatch, tmp_path):
    import torch.distributed as dist

    from calibkit.methods.csm.generate import _dist_env

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert _dist_env("env") == (0, 1, False)  # already initialised: not initialised (nor destroyed) here
    finally:
        dist.destroy_process_group()


def test_resolve_generator(tiny, tmp_path, monkeypatch):
    from calibkit.methods.csm.generate import _resolve_generator
    from calibkit.methods.csm.generator import generator_hash, save_generator, state_hash

    tiny.train()
    model, name, h = _resolve_generator(tiny, "cpu")
    assert model is tiny and not tiny.training and name == "in-memory" and h == state_hash(tiny)
    save_generator(tiny, tmp_path / "g")
    model, name, h = _resolve_generator(tmp_path / "g", torch.device("cpu"))
    assert name == str(tmp_path / "g") and h == generator_hash(tmp_path / "g")
    assert next(model.parameters()).device.type == "cpu" and model.config.num_classes == 3
    model, name, _ = _resolve_generator(str(tmp_path / "g"), None)  # None: "auto"
    assert name == str(tmp_path / "g") and next(model.parameters()).device.type == "cpu"
    seen = []
    import calibkit.distributed as dist_mod

    monkeypatch.setattr(dist_mod, "resolve_device", lambda name, rank: seen.append((name, rank)) or torch.device("cpu"))
    monkeypatch.setenv("LOCAL_RANK", "3")
    _resolve_generator(tiny, None)
    _resolve_generator(tiny, "cpu")
    _resolve_generator(tiny, torch.device("cpu"))  # a torch.device is used as given
    assert seen == [("auto", 3), ("cpu", 3)]


def _manifest(num_groups, gps, **kw):
    from calibkit.methods.csm.store import STORE_FORMAT

    return {"format": STORE_FORMAT, "version": 1, "generator": "in-memory", "num_classes": 3,
            "image_shape": [1, 28, 28], "seed": kw.get("seed", 0), "steps": kw.get("steps", 20),
            "guidance": kw.get("guidance", 1.0), "sampler": "edm-heun sigma 0.002..80 rho 7", "group_size": 8,
            "groups_per_shard": gps, "num_groups": num_groups,
            "pairs": "all unordered (c1 < c2) in lexicographic order, cycled; lam = linspace(0, 1, 8)"}


def test_generate_store_manifest_index_and_progress(tiny, tmp_path, capsys, fake_heun):
    from calibkit.methods.csm.generate import generate_store
    from calibkit.methods.csm.generator import state_hash
    from calibkit.methods.csm.store import MANIFEST, load_store, shard_paths

    man = generate_store(tiny, tmp_path / "a" / "s", 3, groups_per_shard=2, distributed=None, device="cpu")
    want = {**_manifest(3, 2), "generator_hash": state_hash(tiny)}
    assert man == want and json.loads((tmp_path / "a" / "s" / MANIFEST).read_text()) == want
    assert [c["steps"] for c in fake_heun] == [20, 20] and {c["guidance"] for c in fake_heun} == {1.0}
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "2 shards, rank 0 of 1 has 2 left (device cpu, batch 64, fp32)"
    assert lines[1].startswith("[rank 0] shard 0: 16 images in ") and " img/s, eta " in lines[1]
    assert lines[2].startswith("[rank 0] shard 1: 24 images in ") and len(lines) == 3
    recs = [json.loads(x) for x in shard_paths(tmp_path / "a" / "s", 1)[1].read_text().splitlines()]
    assert len(recs) == 8 and recs[3] == {"group": 2, "member": 3, "seed": 0, "c1": 1, "c2": 2,
                                          "lam": round(3 / 7, 6), "guidance": 1.0, "steps": 20,
                                          "generator_hash": want["generator_hash"], "precision": "fp32",
                                          "batch_size": 64, "device": "cpu"}
    assert shard_paths(tmp_path / "a" / "s", 1)[1].read_text().endswith("}\n")
    s = load_store(tmp_path / "a" / "s")
    assert s["images"].shape == (24, 1, 28, 28) and s["c1"].tolist()[16:] == [1] * 8
    # bf16 is recorded (and only then), with its batch size; progress=False prints nothing.
    man = generate_store(tiny, tmp_path / "b", 1, seed=4, steps=3, guidance=2.5, groups_per_shard=1, distributed=None,
                         device="cpu", progress=False, batch_size=5, precision="bf16")
    assert man == {**_manifest(1, 1, seed=4, steps=3, guidance=2.5), "generator_hash": state_hash(tiny),
                   "precision": "bf16"}
    assert capsys.readouterr().out == ""
    rec = json.loads(shard_paths(tmp_path / "b", 0)[1].read_text().splitlines()[0])
    assert (rec["precision"], rec["batch_size"], rec["seed"], rec["steps"], rec["guidance"]) == ("bf16", 5, 4, 3, 2.5)
    assert [c["rows"] for c in fake_heun[-2:]] == [5, 3] and fake_heun[-1]["d"] is not tiny


def test_generate_store_other_ranks_and_errors(tiny, tmp_path, capsys, fake_heun):
    from calibkit.methods.csm.generate import generate_store
    from calibkit.methods.csm.store import MANIFEST, shard_done

    out = tmp_path / "r"
    generate_store(tiny, out, 5, groups_per_shard=1, distributed=(1, 2), device="cpu")
    assert not (out / MANIFEST).exists()  # only rank 0 writes the manifest
    assert [k for k in range(5) if shard_done(out, k)] == [1, 3]
    lines = capsys.readouterr().out.splitlines()
    assert [x.split(":")[0] for x in lines] == ["[rank 1] shard 1", "[rank 1] shard 3"]
    generate_store(tiny, out, 5, groups_per_shard=1, distributed=(0, 2), device="cpu", progress=False)
    assert [k for k in range(5) if shard_done(out, k)] == [0, 1, 2, 3, 4] and (out / MANIFEST).exists()
    fake_heun.clear()
    generate_store(tiny, out, 5, groups_per_shard=1, distributed=None, device="cpu")  # nothing left
    assert fake_heun == [] and "5 shards, rank 0 of 1 has 0 left" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"^store \S*r was generated with other settings \{'steps': \(20, 3\)\}; "
                                         r"use a new --out$"):
        generate_store(tiny, out, 5, steps=3, groups_per_shard=1, distributed=None, device="cpu")
    assert generate_store(tiny, tmp_path / "one", 1, steps=1, groups_per_shard=1, distributed=None, device="cpu",
                          progress=False)["steps"] == 1  # one step and one group per shard are allowed
    for kw in ({"num_groups": 0}, {"num_groups": 1, "groups_per_shard": 0}, {"num_groups": 1, "steps": 0}):
        with pytest.raises(ValueError, match=r"^num_groups, groups_per_shard and steps must be positive$"):
            generate_store(tiny, tmp_path / "x", **kw)
    with pytest.raises(ValueError, match=r"^precision must be one of \('fp32', 'bf16'\), got 'fp8'$"):
        generate_store(tiny, tmp_path / "x", 1, precision="fp8")
    assert not (tmp_path / "x").exists()


def test_generate_store_grows_only_full_shards(tiny, tmp_path, fake_heun):
    from calibkit.methods.csm.generate import generate_store
    from calibkit.methods.csm.store import MANIFEST

    out = tmp_path / "g"
    kw = dict(groups_per_shard=2, distributed=None, device="cpu", progress=False)
    generate_store(tiny, out, 4, **kw)
    man = generate_store(tiny, out, 6, **kw)  # 4 groups fill 2 shards: growing to 6 is allowed
    assert man["num_groups"] == 6 and json.loads((out / MANIFEST).read_text())["num_groups"] == 6
    with pytest.raises(ValueError, match=r"other settings \{'num_groups': \(6, 4\)\}"):
        generate_store(tiny, out, 4, **kw)  # shrinking is not growing
    with pytest.raises(ValueError, match=r"other settings \{'seed': \(0, 1\), 'num_groups': \(6, 8\)\}"):
        generate_store(tiny, out, 8, seed=1, **kw)  # growing with another setting
    generate_store(tiny, tmp_path / "h", 3, **kw)
    with pytest.raises(ValueError, match=r"other settings \{'num_groups': \(3, 5\)\}"):
        generate_store(tiny, tmp_path / "h", 5, **kw)  # shard 1 holds 1 of its 2 groups
    # The same settings again: the manifest is not rewritten.
    stamp = (out / MANIFEST).stat().st_mtime_ns
    generate_store(tiny, out, 6, **kw)
    assert (out / MANIFEST).stat().st_mtime_ns == stamp


def test_companion_default_seed_is_zero():
    src = _groups([(0, 1), (0, 2), (1, 2)], 3)
    labels = torch.tensor([0, 1, 2] * 20)
    assert torch.equal(CSMCompanion(src, 3).draw(labels)[0], CSMCompanion(src, 3, seed=0).draw(labels)[0])


def test_companion_from_a_store(tiny, tmp_path, fake_heun):
    from calibkit.methods.csm.generate import generate_store
    from calibkit.methods.csm.store import load_store, write_annotations

    one = tmp_path / "one"  # a single group: the pair (0, 1) of K = 3, class 2 absent
    generate_store(tiny, one, 1, groups_per_shard=1, distributed=None, device="cpu", progress=False)
    with pytest.raises(ValueError, match=rf"^store {one} has no group for classes \[2\]; generate at least 3 groups"):
        CSMCompanion(one, 3, labels="lam")
    with pytest.raises(ValueError, match=rf"^store {one} has 3 classes, the model 4$"):
        CSMCompanion(one, 4, labels="lam")
    full = tmp_path / "full"
    generate_store(tiny, full, 3, groups_per_shard=3, distributed=None, device="cpu", progress=False)
    store = load_store(full)
    soft = torch.rand(24, 3, generator=torch.Generator().manual_seed(0))
    write_annotations(full, {"soft_labels": soft, "group": store["group"], "member": store["member"]},
                      {"encoder": "test"})
    comp = CSMCompanion(full, 3)
    assert comp.encoder["encoder"] == "test" and torch.equal(comp.soft_labels.reshape(24, 3), soft)
    assert torch.equal(comp.images.reshape(24, 1, 28, 28), store["images"]) and len(comp) == 24
    raw = CSMCompanion(full, 3, labels="lam")
    assert raw.encoder is None and torch.equal(raw.soft_labels[1, 7], torch.eye(3)[0])  # group 1: (0, 2)
    # Annotations of other images (same shape, another group order) are refused.
    write_annotations(full, {"soft_labels": soft, "group": store["group"].flip(0), "member": store["member"]},
                      {"encoder": "test"})
    with pytest.raises(ValueError, match=rf"^annotations of {full} do not match its images; run `calibkit csm "
                                         r"annotate` again$"):
        CSMCompanion(full, 3)


def _gen_mod():
    import importlib

    return importlib.import_module("calibkit.methods.csm.generate")


def test_generate_store_progress_lines_are_timed_and_flushed(tiny, tmp_path, monkeypatch, fake_heun):
    """A fake clock gives exact durations; every progress line is flushed (live logs under torchrun)."""
    gen_mod = _gen_mod()
    ticks = iter([100.0, 104.0, 110.0])
    monkeypatch.setattr(gen_mod, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: next(ticks))}))
    printed = []
    monkeypatch.setattr(gen_mod, "print", lambda *a, **kw: printed.append((a, kw)), raising=False)
    gen_mod.generate_store(tiny, tmp_path / "s", 3, groups_per_shard=2, distributed=None, device="cpu")
    assert printed == [(("2 shards, rank 0 of 1 has 2 left (device cpu, batch 64, fp32)",), {"flush": True}),
                       # eta: 4 s per shard so far x 1 shard left = 0.07 min; then none left
                       (("[rank 0] shard 0: 16 images in 4 s (4.00 img/s, eta 0.1 min)",), {"flush": True}),
                       (("[rank 0] shard 1: 24 images in 10 s (2.40 img/s, eta 0.0 min)",), {"flush": True})]


def test_generate_store_defaults_and_sampler_arguments(tiny, tmp_path, fake_heun):
    gen_mod = _gen_mod()
    man = gen_mod.generate_store(tiny, tmp_path / "s", 17, device="cpu", progress=False)
    assert man["groups_per_shard"] == 16 and man["seed"] == 0 and man["steps"] == 20 and man["guidance"] == 1.0
    from calibkit.methods.csm.store import shard_done

    assert [k for k in range(3) if shard_done(tmp_path / "s", k)] == [0, 1]  # 17 groups: 16 + 1
    fake_heun.clear()
    gen_mod.generate_store(tiny, tmp_path / "t", 1, steps=4, guidance=2.5, groups_per_shard=1, distributed=None,
                           device="cpu", progress=False, batch_size=3)
    assert [(c["rows"], c["steps"], c["guidance"]) for c in fake_heun] == [(3, 4, 2.5), (3, 4, 2.5), (2, 4, 2.5)]


def test_generate_store_under_torchrun_environment(tiny, tmp_path, monkeypatch, fake_heun):
    """WORLD_SIZE > 1 and the default ``distributed="env"``: the process group is joined with gloo,
    this rank's shards are made, then the barrier, and the group made here is destroyed."""
    import torch.distributed as dist

    calls = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend: calls.append(("init", backend)))
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "barrier", lambda: calls.append(("barrier",)))
    monkeypatch.setattr(dist, "destroy_process_group", lambda: calls.append(("destroy",)))
    monkeypatch.setenv("WORLD_SIZE", "2")
    gen_mod = _gen_mod()
    assert gen_mod._dist_env("env") == (1, 2, True)
    calls.clear()
    gen_mod.generate_store(tiny, tmp_path / "s", 5, groups_per_shard=1, device="cpu", progress=False)
    from calibkit.methods.csm.store import shard_done

    assert calls == [("init", "gloo"), ("barrier",), ("destroy",)]
    assert [k for k in range(5) if shard_done(tmp_path / "s", k)] == [1, 3]
    # An explicit (rank, world) never touches the process group.
    calls.clear()
    gen_mod.generate_store(tiny, tmp_path / "t", 5, groups_per_shard=1, device="cpu", progress=False,
                           distributed=(0, 3))
    assert calls == [] and [k for k in range(5) if shard_done(tmp_path / "t", k)] == [0, 3]


def test_generate_store_accepts_a_moved_generator(tiny, tmp_path, fake_heun):
    """The generator's recorded name may change (a copied directory); its weights hash may not."""
    import shutil

    from calibkit.methods.csm.generator import save_generator

    gen_mod = _gen_mod()
    save_generator(tiny, tmp_path / "g1")
    shutil.copytree(tmp_path / "g1", tmp_path / "g2")
    kw = dict(groups_per_shard=1, distributed=None, device="cpu", progress=False)
    gen_mod.generate_store(tmp_path / "g1", tmp_path / "s", 2, **kw)
    man = gen_mod.generate_store(tmp_path / "g2", tmp_path / "s", 2, **kw)
    assert man["generator"] == str(tmp_path / "g2")
    with pytest.raises(ValueError, match="other settings"):
        gen_mod.generate_store(tiny, tmp_path / "s", 2, **kw)  # in memory: another hash


def test_three_channel_groups_share_their_noise(fake_heun):
    from calibkit.methods.csm.generator import CondDenoiser, GeneratorConfig

    torch.manual_seed(0)
    rgb = CondDenoiser(GeneratorConfig(num_classes=2, in_channels=3, **TINY)).eval()
    gen_mod = _gen_mod()
    out = gen_mod.sample_groups(rgb, [0, 1], seed=0, steps=1)
    noise = fake_heun[0]["noise"]
    assert noise.shape == (16, 3, 32, 32) and out["images"].shape == (16, 3, 28, 28)
    assert torch.equal(noise[:8], gen_mod.group_noise(0, 0, (1, 3, 32, 32)).expand(8, -1, -1, -1))


def test_training_images_outside_validation_reads_data_dir_and_val_size_for_every_seed(monkeypatch):
    import calibkit.data as data_pkg

    real, calls = data_pkg.load, []

    def spy(name, **kw):
        calls.append(kw)
        return real(name, **kw)

    monkeypatch.setattr(data_pkg, "load", spy)
    images, _, _, record = training_images_outside_validation("digits", [4, 2], val_size=100, data_dir="/nowhere")
    assert [c["data_dir"] for c in calls] == ["/nowhere"] * 3  # digits ignores it; a folder data set reads it
    assert [c["val_size"] for c in calls] == [100, 0, 100] and calls[0]["seed"] == 2 and calls[2]["seed"] == 4
    assert record["val_size"] == 100 and set(record["val_checksums"]) == {"2", "4"}
    assert record["excluded"] < 200 and len(images) == 1437 - record["excluded"]  # two draws of 100, overlapping


def test_training_images_outside_validation_can_exclude_everything():
    images, labels, _, record = training_images_outside_validation("digits", range(3), val_size=0.95)
    assert record["excluded"] == 1437 and record["train_images"] == 0
    assert images.shape == (0, 1, 28, 28) and images.dtype == torch.uint8 and labels.shape == (0,)
