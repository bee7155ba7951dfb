"""CSM store: sharded and resumed generation, the companion's sampling rule, the CLIP encoder."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")

from calibkit.methods.csm.annotate import ClipEncoder, annotate_store  # noqa: E402
from calibkit.methods.csm.dataset import CSMCompanion  # noqa: E402
from calibkit.methods.csm.generate import generate_store  # noqa: E402
from calibkit.methods.csm.generator import CondDenoiser, GeneratorConfig, save_generator  # noqa: E402
from calibkit.methods.csm.store import load_annotations, load_store, shard_paths, write_annotations  # noqa: E402

TINY = dict(block_out_channels=(8, 16, 16), norm_num_groups=4, attention_head_dim=4)
ARGS = dict(num_groups=3, seed=7, steps=2, guidance=2.0, groups_per_shard=1, progress=False)


# Tiny networks run on one torch thread (see conftest.one_thread).
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def gen_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("gen")
    torch.manual_seed(0)
    save_generator(CondDenoiser(GeneratorConfig(**TINY)), d)
    return d


@pytest.fixture(scope="module")
def single(gen_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    generate_store(gen_dir, out, distributed=None, **ARGS)
    return out


def _files(d: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.name.startswith(("shard-", "store"))}


def test_store_content_and_index(single):
    s = load_store(single)
    assert s["images"].shape == (24, 1, 28, 28) and s["images"].dtype == torch.uint8
    assert s["group"].tolist() == [g for g in range(3) for _ in range(8)]
    recs = [json.loads(line) for k in range(3) for line in shard_paths(single, k)[1].read_text().splitlines()]
    assert len(recs) == 24 and recs[9] == {**recs[9], "group": 1, "member": 1, "c1": 0, "c2": 2, "seed": 7,
                                           "guidance": 2.0}
    assert recs[9]["lam"] == pytest.approx(1 / 7) and len(recs[0]["generator_hash"]) == 16


def test_simulated_ranks_equal_single_process(gen_dir, single, tmp_path):
    for rank in range(2):  # the same code path torchrun takes, one rank after the other
        generate_store(gen_dir, tmp_path, distributed=(rank, 2), **ARGS)
    assert _files(tmp_path) == _files(single)


def test_resume_redoes_only_missing_shards(gen_dir, single, tmp_path):
    generate_store(gen_dir, tmp_path, distributed=None, **ARGS)
    # Interrupt: shard 1 lost its index (killed between the two writes), shard 2 never started.
    shard_paths(tmp_path, 1)[1].unlink()
    for p in shard_paths(tmp_path, 2):
        p.unlink()
    with pytest.raises(ValueError, match="incomplete"):
        load_store(tmp_path)
    before = os.stat(shard_paths(tmp_path, 0)[0]).st_mtime_ns
    generate_store(gen_dir, tmp_path, distributed=None, **ARGS)
    assert os.stat(shard_paths(tmp_path, 0)[0]).st_mtime_ns == before  # done shards are not redone
    assert _files(tmp_path) == _files(single)
    with pytest.raises(ValueError, match="other settings"):
        generate_store(gen_dir, tmp_path, distributed=None, **{**ARGS, "seed": 8})


def test_growing_a_store_equals_generating_it_at_once(gen_dir, single, tmp_path):
    generate_store(gen_dir, tmp_path, distributed=None, **{**ARGS, "num_groups": 2})
    generate_store(gen_dir, tmp_path, distributed=None, **ARGS)
    assert _files(tmp_path) == _files(single)
    partial = {**ARGS, "num_groups": 1, "groups_per_shard": 2}  # shard 0 holds 1 of its 2 groups
    generate_store(gen_dir, tmp_path / "p", distributed=None, **partial)
    with pytest.raises(ValueError, match="other settings"):
        generate_store(gen_dir, tmp_path / "p", distributed=None, **{**partial, "num_groups": 2})


@pytest.mark.slow
def test_torchrun_two_processes_equal_single(gen_dir, single, tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517",
           "-m", "calibkit", "csm", "generate", "--generator", str(gen_dir), "--groups", "3", "--seed", "7",
           "--steps", "2", "--guidance", "2", "--groups-per-shard", "1", "--out", str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    files = _files(tmp_path)
    ref = _files(single)
    assert {k for k in files if k != "store.json"} == {k for k in ref if k != "store.json"}
    assert all(files[k] == ref[k] for k in ref if k != "store.json")


def _fake_store(tmp_path, num_groups=12, k=4):
    """A store whose pixel values encode (group, member) and whose labels are known."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save

    from calibkit.methods.csm.generate import group_conditions
    from calibkit.methods.csm.store import MANIFEST, STORE_FORMAT, atomic_write

    cond = group_conditions(range(num_groups), k)
    n = num_groups * 8
    images = (cond["group"] * 8 + cond["member"]).to(torch.uint8).view(n, 1, 1, 1).expand(n, 1, 3, 3).contiguous()
    manifest = {"format": STORE_FORMAT, "num_classes": k, "num_groups": num_groups, "group_size": 8,
                "groups_per_shard": num_groups, "generator_hash": "test"}
    atomic_write(tmp_path / MANIFEST, json.dumps(manifest).encode())
    img, idx = shard_paths(tmp_path, 0)
    atomic_write(img, save({"images": images, **{key: cond[key] for key in ("group", "member", "c1", "c2", "lam")}}))
    idx.write_text("{}\n")
    soft = torch.rand(n, k)  # arbitrary labels: the companion must return them unchanged
    write_annotations(tmp_path, {"soft_labels": soft, "group": cond["group"], "member": cond["member"]},
                      {"encoder": "test"})
    return cond, soft


def test_companion_sampling_rule(tmp_path):
    cond, soft = _fake_store(tmp_path)
    comp = CSMCompanion(tmp_path, 4, seed=0)
    labels = torch.tensor([0, 1, 2, 3] * 250)
    images, labs = comp.draw(labels, torch.Generator().manual_seed(1))
    assert images.shape == (2000, 1, 3, 3) and labs.shape == (2000, 4)
    code = images[:, 0, 0, 0].long()
    g, m = code // 8, code % 8
    b = len(labels)
    # Endpoint: a group containing y, the member with y's pure condition (lam=1 <-> c1, lam=0 <-> c2).
    c1, c2 = cond["c1"][g * 8], cond["c2"][g * 8]
    assert ((c1[:b] == labels) | (c2[:b] == labels)).all()
    assert torch.equal(m[:b], torch.where(c1[:b] == labels, 7, 0))
    # Interior member from the same group, never an endpoint; every interior member gets drawn.
    assert torch.equal(g[b:], g[:b]) and ((m[b:] >= 1) & (m[b:] <= 6)).all()
    assert set(m[b:].tolist()) == set(range(1, 7))
    # Every group containing y is reachable (12 groups = pairs cycled twice, 6 per class).
    assert set(g[:b][labels == 0].tolist()) == {i for i in range(12) if 0 in (int(cond["c1"][i * 8]),
                                                                         int(cond["c2"][i * 8]))}
    assert torch.equal(labs, soft[code])
    raw = CSMCompanion(tmp_path, 4, labels="lam")
    # Group 3 is the pair (1, 2): lam = 1 is pure class 1, lam = 0 pure class 2.
    assert raw.encoder is None and torch.equal(raw.soft_labels[3, 7], torch.eye(4)[1])
    assert torch.equal(raw.soft_labels[3, 0], torch.eye(4)[2])
    with pytest.raises(ValueError, match="4 classes"):
        CSMCompanion(tmp_path, 5)


def test_clip_encoder_on_tiny_random_model(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.CLIPConfig(
        text_config=dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=16),
        vision_config=dict(image_size=32, patch_size=8, hidden_size=16, intermediate_size=32,
                           num_hidden_layers=1, num_attention_heads=2),
        projection_dim=12)
    torch.manual_seed(0)
    model = transformers.CLIPModel(cfg).eval()
    model.save_pretrained(tmp_path / "clip")
    enc = ClipEncoder(tmp_path / "clip")
    imgs = torch.randint(0, 256, (5, 1, 28, 28), dtype=torch.uint8)
    feats = enc(imgs)
    assert feats.shape == (5, 12) and enc.identity["encoder"] == "clip"
    px = enc.preprocess(imgs)
    gray = px * enc.std + enc.mean  # undo the normalisation: the three channels hold the same grey
    assert px.shape == (5, 3, 32, 32) and torch.allclose(gray[:, 0], gray[:, 2], atol=1e-6)
    with torch.no_grad():
        ref = model.get_image_features(pixel_values=px)
    ref = ref if isinstance(ref, torch.Tensor) else ref.pooler_output
    assert torch.allclose(feats, ref, atol=1e-5)
    # Through the store API: annotations carry the encoder identity.
    cond, _ = _fake_store(tmp_path / "store")
    imgs_train = torch.randint(0, 256, (40, 1, 3, 3), dtype=torch.uint8)
    out = annotate_store(tmp_path / "store", enc, imgs_train, torch.arange(40) % 4)
    tensors, meta = load_annotations(tmp_path / "store")
    assert meta["encoder"] == "clip" and meta["sharpness"] == 4.0
    assert torch.equal(tensors["soft_labels"], out["soft_labels"])
    # lam' = sigmoid(s (lam_hat - 1/2)) with the recorded sharpness, and the soft label puts lam' on c1.
    lam = torch.sigmoid(meta["sharpness"] * (tensors["lam_hat"].double() - 0.5))
    torch.testing.assert_close(tensors["lam_annot"].double(), lam, rtol=0, atol=1e-6)
    rows = torch.arange(len(lam))
    torch.testing.assert_close(tensors["soft_labels"][rows, cond["c1"]].double(), lam, rtol=0, atol=1e-6)
    with pytest.raises(FileNotFoundError, match="config.json"):
        ClipEncoder(tmp_path)


def test_companion_per_real_repeats_independent_pairs(tmp_path):
    _fake_store(tmp_path)
    comp = CSMCompanion(tmp_path, 4, seed=0)
    labels = torch.tensor([0, 1, 2, 3] * 50)
    b = len(labels)
    two = comp.draw(labels, torch.Generator().manual_seed(3))
    four = comp.draw(labels, torch.Generator().manual_seed(3), per_real=4)
    assert four[0].shape[0] == 4 * b
    # The first pair is exactly the per_real=2 draw (same stream); the second is another pair drawn after it.
    assert torch.equal(four[0][:2 * b], two[0]) and torch.equal(four[1][:2 * b], two[1])
    code = four[0][:, 0, 0, 0].long()
    g, m = code // 8, code % 8
    assert torch.equal(g[3 * b:], g[2 * b:3 * b]) and ((m[3 * b:] >= 1) & (m[3 * b:] <= 6)).all()
    assert not torch.equal(g[2 * b:3 * b], g[:b])  # an independent group choice
    with pytest.raises(ValueError, match="even"):
        comp.draw(labels, per_real=3)


def test_csm_step_weights_the_generated_term(tmp_path):
    from calibkit import functional as F_
    from calibkit.train.steps import CSM, EpochGenerators

    _fake_store(tmp_path)
    comp = CSMCompanion(tmp_path, 4, seed=0)
    comp.soft_labels = comp.soft_labels / comp.soft_labels.sum(-1, keepdim=True)  # probability rows

    class Inputs:
        def train_batch(self, x, y, gen):
            return x.float().flatten(1), y

    torch.manual_seed(0)
    lin = torch.nn.Linear(9, 4)
    net = lambda x: (lin(x), x)  # noqa: E731
    x, y = torch.randn(6, 9), torch.tensor([0, 1, 2, 3, 0, 1])
    losses = {}
    for w, per, kind in ((1.0, 2, "l2"), (2.5, 2, "l2"), (1.0, 4, "l2"), (2.0, 2, "ce")):
        step = CSM(lambda logits, t, f: torch.nn.functional.cross_entropy(logits, t), comp, Inputs(),
                   csm_weight=w, csm_per_real=per, csm_loss=kind)
        gens = EpochGenerators(aug=torch.Generator(), draw=torch.Generator().manual_seed(5))
        losses[w, per, kind] = step(net, x, y, y, gens)[0]
    ce = torch.nn.functional.cross_entropy(lin(x), y)
    gx, gs = comp.draw(y, torch.Generator().manual_seed(5))
    l2 = F_.soft_l2(lin(gx.float().flatten(1)), gs)
    torch.testing.assert_close(losses[1.0, 2, "l2"], ce + l2)
    torch.testing.assert_close(losses[2.5, 2, "l2"], ce + 2.5 * l2)
    gx4, gs4 = comp.draw(y, torch.Generator().manual_seed(5), per_real=4)
    torch.testing.assert_close(losses[1.0, 4, "l2"], ce + F_.soft_l2(lin(gx4.float().flatten(1)), gs4))
    soft_ce = -(gs * lin(gx.float().flatten(1)).log_softmax(1)).sum(1).mean()  # by hand
    torch.testing.assert_close(losses[2.0, 2, "ce"], ce + 2.0 * soft_ce)


def test_subset_store_equals_a_smaller_generation(gen_dir, single, tmp_path):
    from calibkit.methods.csm.store import subset_store

    man = subset_store(single, tmp_path / "sub", 2)
    small = tmp_path / "small"
    generate_store(gen_dir, small, distributed=None, **{**ARGS, "num_groups": 2})
    a, b = load_store(tmp_path / "sub"), load_store(small)
    for k in ("images", "group", "member", "c1", "c2", "lam"):
        assert torch.equal(a[k], b[k]), k
    assert man["num_groups"] == 2 and man["subset_of"]["num_groups"] == 3
    idx = shard_paths(tmp_path / "sub", 0)[1].read_text().splitlines()
    assert idx == [line for k in range(2) for line in shard_paths(small, k)[1].read_text().splitlines()]
    with pytest.raises(ValueError, match="num_groups"):
        subset_store(single, tmp_path / "x", 4)


@pytest.mark.parametrize("w,per", [(1.0, 2), (2.5, 2), (1.0, 4), (4.0, 6)])
def test_csm_step_loss_and_gradient_by_hand(tmp_path, w, per):
    """csm_weight and csm_per_real against a hand computation of L = CE(real) + w * soft_l2(gen).

    The network outputs zero logits (p = 1/4 on each of K = 4 classes) and every generated image
    carries the soft label y = (3/4, 1/4, 0, 0), so the value does not depend on which images
    the companion draws:
      CE(real) = ln 4;  soft_l2 = (1/4 - 3/4)^2 + (1/4 - 1/4)^2 + 2 (1/4)^2 = 3/8.
    Gradient with respect to the output bias b (logits z = b): the real term gives
    mean_i (p - onehot(y_i)); for the L2 term d/dz sum_k (p_k - y_k)^2 = 2 (diag(p) - p p^T)(p - y)
    = (2/K)(p - y) since sum_k p_k (p_k - y_k) = 1/K - 1/K = 0, i.e. (-1/4, 0, 1/8, 1/8) for every
    generated image and hence for their mean. The network sees B real + per_real * B generated rows.
    """
    from calibkit.train.steps import CSM, EpochGenerators

    _fake_store(tmp_path)
    comp = CSMCompanion(tmp_path, 4, seed=0)
    comp.soft_labels = torch.tensor([0.75, 0.25, 0.0, 0.0]).expand_as(comp.soft_labels).clone()

    class Inputs:
        def train_batch(self, x, y, gen):
            return x.float().flatten(1), y

    lin = torch.nn.Linear(9, 4)
    torch.nn.init.zeros_(lin.weight)
    torch.nn.init.zeros_(lin.bias)
    rows = []

    def net(x):
        rows.append(len(x))
        return lin(x), x

    x, y = torch.randn(6, 9), torch.tensor([0, 1, 2, 3, 0, 1])
    step = CSM(lambda logits, t, f: torch.nn.functional.cross_entropy(logits, t), comp, Inputs(),
               csm_weight=w, csm_per_real=per)
    gens = EpochGenerators(aug=torch.Generator(), draw=torch.Generator().manual_seed(5))
    loss = step(net, x, y, y, gens)[0]
    assert rows == [6 + per * 6]
    assert abs(loss.item() - (math.log(4) + w * 3 / 8)) < 1e-6
    loss.backward()
    real_grad = torch.full((4,), 0.25) - torch.tensor([2, 2, 1, 1]) / 6  # p - mean onehot(y)
    expected = real_grad + w * torch.tensor([-0.25, 0.0, 0.125, 0.125])
    torch.testing.assert_close(lin.bias.grad, expected)


def test_shipped_fashion_mnist_set_fits_the_default_preset():
    """The packaged set: as many images as the default preset's real training images, made by the
    packaged generator (same weights hash), which never saw the validation images of the preset's
    seeds; its shard holds exactly the groups the manifest declares, each of 8 members."""
    from calibkit.bench.grid import PRESETS
    from calibkit.bench.twostage import SHIPPED_STORES
    from calibkit.methods.csm.generator import generator_hash
    from calibkit.methods.csm.store import load_store, read_manifest

    store = SHIPPED_STORES["fmnist"]
    gen = store.parent / "fmnist"
    man, preset = read_manifest(store), PRESETS["default"]
    assert man["num_groups"] * man["group_size"] >= preset.train["train_subset"]
    assert man["generator_hash"] == generator_hash(gen)
    split = json.loads((gen / "generator.json").read_text())["split"]
    assert set(preset.seeds) <= set(split["excluded_val_seeds"]) and split["val_size"] == preset.train["val_size"]
    data = load_store(store)
    n = man["num_groups"] * 8
    assert data["images"].shape == (n, 1, 28, 28) and data["images"].dtype == torch.uint8
    assert torch.equal(data["group"], torch.arange(n) // 8) and torch.equal(data["member"], torch.arange(n) % 8)
