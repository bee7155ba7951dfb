"""CSM reannotation (calibkit.methods.csm.annotate) at its edges: the class count, the range
checks, the encoder checks and identity, and the CLIP encoder's preprocessing settings."""

import functools
import hashlib
import json
import math

import pytest
import torch

from calibkit.methods.csm.annotate import annotate, encoder_identity


def pixels(images):
    """A transparent encoder: the image's pixels as features."""
    return images.float().flatten(1)


def _data(k=3):
    # one training image per class, pixel value 40 * class; generated images in between
    train = torch.stack([torch.full((1, 2, 2), 40 * c, dtype=torch.uint8) for c in range(k)])
    labels = torch.arange(k)
    gen = torch.tensor([10, 30, 60], dtype=torch.uint8)[:, None, None, None].expand(3, 1, 2, 2).contiguous()
    return train, labels, gen, torch.tensor([1, 1, 2]), torch.tensor([0, 0, 1])


def test_annotate_by_hand_with_the_default_sharpness():
    train, labels, gen, c1, c2 = _data()
    out = annotate(gen, c1, c2, pixels, train, labels)
    lam_hat = torch.tensor([10 / 40, 30 / 40, (60 - 40) / 40])  # projection on the prototype segment
    torch.testing.assert_close(out["lam_hat"], lam_hat)
    torch.testing.assert_close(out["lam_annot"], torch.sigmoid(4.0 * (lam_hat - 0.5)))  # s = 4 by default
    assert out["soft_labels"].shape == (3, 3) and out["prototypes"].shape == (3, 4)


def test_annotate_class_count_comes_from_labels_and_pairs():
    train, labels, gen, c1, c2 = _data(k=4)  # class 3 only among the training labels
    assert annotate(gen, c1, c2, pixels, train, labels)["soft_labels"].shape == (3, 4)
    train, labels, gen, c1, c2 = _data(k=3)
    for a, b in ((c1, torch.tensor([0, 3, 1])), (torch.tensor([1, 3, 2]), c2)):  # class 3 only in a pair
        with pytest.raises(ValueError, match=r"no training image for classes \[3\]"):
            annotate(gen, a, b, pixels, train, labels)


def test_annotate_range_and_shape_checks():
    train, labels, gen, c1, c2 = _data()
    rng = r"^labels and class pairs must lie in \[0, 2\)$"
    with pytest.raises(ValueError, match=rng):  # the pairs stay inside, only a label reaches k
        annotate(gen, torch.tensor([1, 1, 0]), torch.tensor([0, 0, 1]), pixels, train, labels, num_classes=2)
    with pytest.raises(ValueError, match=r"^labels and class pairs must lie in \[0, 3\)$"):
        annotate(gen, torch.tensor([1, 3, 0]), torch.tensor([0, 0, 1]), pixels, train, labels, num_classes=3)
    with pytest.raises(ValueError, match=r"^generated images must be uint8, got torch.float32$"):
        annotate(gen.float(), c1, c2, pixels, train, labels)
    with pytest.raises(ValueError, match=r"^c1 and c2 must have shape \(3,\), got \(3,\) and \(2,\)$"):
        annotate(gen, c1, c2[:2], pixels, train, labels)
    with pytest.raises(ValueError, match=r"^c1 and c2 must have shape \(3,\), got \(2,\) and \(3,\)$"):
        annotate(gen, c1[:2], c2, pixels, train, labels)


def test_annotate_checks_what_the_encoder_returns():
    train, labels, gen, c1, c2 = _data()
    msg = r"^the encoder must map the 3 {} images to features \(N, D\); got {}$"
    with pytest.raises(ValueError, match=msg.format("training", r"\(3, 4, 1\)")):
        annotate(gen, c1, c2, lambda im: pixels(im)[..., None], train, labels)
    with pytest.raises(ValueError, match=msg.format("training", "list")):
        annotate(gen, c1, c2, lambda im: pixels(im).tolist(), train, labels)
    with pytest.raises(ValueError, match=msg.format("training", r"\(2, 4\)")):
        annotate(gen, c1, c2, lambda im: pixels(im)[:2], train, labels)

    def nan_on_generated(im):
        f = pixels(im)
        return f * math.nan if im[0, 0, 0, 0] == 10 else f

    with pytest.raises(ValueError, match=r"^the encoder returned NaN or infinite features for the generated images$"):
        annotate(gen, c1, c2, nan_on_generated, train, labels)
    with pytest.raises(ValueError, match=r"^the encoder returned NaN or infinite features for the training images$"):
        annotate(gen, c1, c2, lambda im: pixels(im) * math.inf, train, labels)


class _Enc:
    def __call__(self, images):
        return pixels(images)


class _NoModule(_Enc):
    def __getattribute__(self, name):
        if name == "__module__":
            raise AttributeError(name)
        return object.__getattribute__(self, name)


def test_encoder_identity():
    assert encoder_identity(pixels) == {"encoder": "callable", "name": f"{__name__}.pixels"}
    assert encoder_identity(_Enc()) == {"encoder": "callable", "name": f"{__name__}._Enc"}  # the class's name
    assert encoder_identity(_NoModule()) == {"encoder": "callable", "name": "?._NoModule"}
    p = functools.partial(pixels)
    assert encoder_identity(p) == {"encoder": "callable", "name": "functools.partial"}
    enc = _Enc()
    enc.identity = {"encoder": "mine", "v": 1}
    ident = encoder_identity(enc)
    assert ident == {"encoder": "mine", "v": 1} and ident is not enc.identity  # a copy


def test_clip_encoder_reads_its_normalisation_and_records_it(tmp_path):
    transformers = pytest.importorskip("transformers")
    from calibkit.methods.csm.annotate import CLIP_MEAN, CLIP_STD, ClipEncoder

    cfg = transformers.CLIPConfig(
        text_config=dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=16),
        vision_config=dict(image_size=8, patch_size=4, hidden_size=16, intermediate_size=32,
                           num_hidden_layers=1, num_attention_heads=2),
        projection_dim=6)
    torch.manual_seed(0)
    transformers.CLIPModel(cfg).eval().save_pretrained(tmp_path)
    plain = ClipEncoder(tmp_path)
    assert plain.batch_size == 64 and plain.size == 8
    assert {k: plain.identity[k] for k in ("encoder", "clip_dir", "image_size", "mean", "std")} == \
        {"encoder": "clip", "clip_dir": str(tmp_path), "image_size": 8, "mean": list(CLIP_MEAN), "std": list(CLIP_STD)}
    weights = sorted(tmp_path.glob("*.safetensors"))
    assert len(weights) == 1  # the hash covers the weight files
    assert plain.identity["weights_sha256"] == hashlib.sha256(weights[0].read_bytes()).hexdigest()[:16]
    assert isinstance(plain.device, torch.device) and plain.device == torch.device("cpu")
    dev = torch.device("cpu")
    assert ClipEncoder(tmp_path, device=dev).device is dev
    # a downsampled stripe pattern keeps its mean brightness (antialiased resizing, as the CLIP processor)
    stripes = torch.zeros(1, 3, 24, 24, dtype=torch.uint8)
    stripes[..., ::3] = 255
    raw = plain.preprocess(stripes) * plain.std + plain.mean
    assert raw.mean().item() == pytest.approx(1 / 3, abs=0.03)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"do_resize": True}))  # no mean/std: CLIP's
    assert ClipEncoder(tmp_path).identity["mean"] == list(CLIP_MEAN)
    assert ClipEncoder(tmp_path).identity["std"] == list(CLIP_STD)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"image_mean": [0.5, 0.25, 0.0],
                                                                   "image_std": [0.5, 0.25, 2.0]}))
    enc = ClipEncoder(tmp_path)
    assert enc.identity["mean"] == [0.5, 0.25, 0.0] and enc.identity["std"] == [0.5, 0.25, 2.0]
    assert enc.identity["weights_sha256"] == plain.identity["weights_sha256"]  # the same weights
    (tmp_path / "extra.bin").write_bytes(b"more weights")  # .bin weight files count too
    assert ClipEncoder(tmp_path).identity["weights_sha256"] != plain.identity["weights_sha256"]
    # constant grey images: resizing keeps the value, then (v / 255 - mean) / std per channel
    grey = torch.full((2, 1, 5, 5), 51, dtype=torch.uint8)
    px = enc.preprocess(grey)
    assert px.shape == (2, 3, 8, 8)
    want = (torch.tensor([0.2, 0.2, 0.2]) - torch.tensor([0.5, 0.25, 0.0])) / torch.tensor([0.5, 0.25, 2.0])
    torch.testing.assert_close(px[0, :, 3, 3], want)
    rgb = torch.zeros(1, 3, 8, 8, dtype=torch.uint8)
    rgb[:, 0] = 255  # a red image stays red: three channels are not mixed
    torch.testing.assert_close(enc.preprocess(rgb)[0, :, 0, 0],
                               (torch.tensor([1.0, 0, 0]) - torch.tensor([0.5, 0.25, 0.0]))
                               / torch.tensor([0.5, 0.25, 2.0]))
    # bicubic overshoot at a sharp edge is clamped to [0, 1] before normalising
    edge = torch.zeros(1, 1, 3, 3, dtype=torch.uint8)
    edge[..., 1:] = 255
    raw = enc.preprocess(edge) * enc.std + enc.mean
    assert raw.min() >= -1e-6 and raw.max() <= 1 + 1e-6
    assert raw.min() < 1e-6 and raw.max() > 1 - 1e-6


def test_reannotate_with_a_second_prototype_away_from_the_origin():
    from calibkit.methods.csm.annotate import reannotate

    protos = torch.tensor([[1.0, 1.0], [3.0, 1.0], [1.0, 2.0]])
    f = torch.tensor([[2.5, 7.0], [1.0, 1.5]])
    c1, c2 = torch.tensor([1, 2]), torch.tensor([0, 0])
    out = reannotate(f, c1, c2, protos)  # sharpness 4 by default
    # lam_hat = <f - p_c2, p_c1 - p_c2> / ||p_c1 - p_c2||^2 = 3/4 and 0.5/1 (the segment has length 1)
    lam_hat = torch.tensor([0.75, 0.5])
    torch.testing.assert_close(out["lam_hat"], lam_hat)
    torch.testing.assert_close(out["lam_annot"], torch.sigmoid(4 * (lam_hat - 0.5)))
    torch.testing.assert_close(out["soft_labels"], torch.tensor([[1 - float(out["lam_annot"][0]),
                                                                  float(out["lam_annot"][0]), 0.0], [0.5, 0.0, 0.5]]))


def test_reannotate_errors():
    from calibkit.methods.csm.annotate import reannotate

    p = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    c1, c2 = torch.tensor([1]), torch.tensor([0])
    msg = r"^features \(N, D\) and prototypes \(K, D\) disagree: {} vs {}$"
    with pytest.raises(ValueError, match=msg.format(r"\(1, 3\)", r"\(2, 2\)")):
        reannotate(torch.zeros(1, 3), c1, c2, p)
    with pytest.raises(ValueError, match=msg.format(r"\(1, 2, 1\)", r"\(2, 2\)")):
        reannotate(torch.zeros(1, 2, 1), c1, c2, p)
    with pytest.raises(ValueError, match=msg.format(r"\(1, 2\)", r"\(2, 2, 1\)")):
        reannotate(torch.zeros(1, 2), c1, c2, p[..., None])
    with pytest.raises(ValueError, match=r"^c1 and c2 must differ for every image$"):
        reannotate(torch.zeros(1, 2), c1, c1, p)
    with pytest.raises(ValueError, match=r"^two class prototypes coincide; the projection is undefined$"):
        reannotate(torch.zeros(1, 2), c1, c2, torch.zeros(2, 2))


def _store(path, num_groups=6, k=4):
    from safetensors.torch import save

    from calibkit.methods.csm.generate import group_conditions
    from calibkit.methods.csm.store import MANIFEST, STORE_FORMAT, atomic_write, shard_paths

    path.mkdir(parents=True)
    cond = group_conditions(range(num_groups), k)
    n = num_groups * 8
    images = torch.randint(0, 256, (n, 1, 3, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    manifest = {"format": STORE_FORMAT, "num_classes": k, "num_groups": num_groups, "group_size": 8,
                "groups_per_shard": num_groups, "generator_hash": "h0"}
    atomic_write(path / MANIFEST, json.dumps(manifest).encode())
    img, idx = shard_paths(path, 0)
    atomic_write(img, save({"images": images, **{key: cond[key] for key in ("group", "member", "c1", "c2", "lam")}}))
    idx.write_text("{}\n")
    return cond


def test_annotate_store_writes_what_it_returns(tmp_path):
    pytest.importorskip("safetensors")
    from calibkit.methods.csm.annotate import annotate_store
    from calibkit.methods.csm.store import load_annotations

    cond = _store(tmp_path / "s")
    train = torch.randint(0, 256, (20, 1, 3, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    labels = torch.arange(20) % 4
    out = annotate_store(tmp_path / "s", pixels, train, labels, sharpness=2.0, extra_meta={"note": 1})
    assert torch.equal(out["group"], cond["group"]) and torch.equal(out["member"], cond["member"])
    assert out["meta"] == {"encoder": "callable", "name": f"{__name__}.pixels", "sharpness": 2.0,
                           "prototype_images": 20, "generator_hash": "h0", "note": 1}
    tensors, meta = load_annotations(tmp_path / "s")
    assert meta == out["meta"]
    for key in ("soft_labels", "group", "member", "lam_hat"):
        assert torch.equal(tensors[key], out[key])
    with pytest.raises(ValueError, match=r"^train_labels go up to 4 but the store has 4 classes$"):
        annotate_store(tmp_path / "s", pixels, train, torch.where(labels == 3, 4, labels))


def test_classifier_encoder_identity_features_and_training_split(tmp_path):
    import hashlib

    from calibkit.data import load
    from calibkit.methods.csm.annotate import ClassifierEncoder
    from calibkit.train import load_config, train

    run = tmp_path / "ce"
    train(load_config(data="digits", model="mlp", epochs=1, num_threads=1, device="cpu", seed=3, val_size=100,
                      train_subset=300), run, progress=False, verbose=False)
    enc = ClassifierEncoder(run)
    sha = hashlib.sha256((run / "model.safetensors").read_bytes()).hexdigest()[:16]
    assert enc.identity == {"encoder": "classifier", "run": str(run), "model": "mlp", "weights_sha256": sha}
    assert enc.batch_size == 512 and enc.run_dir == str(run) and enc.device == torch.device("cpu")
    dev = torch.device("cpu")
    assert ClassifierEncoder(run, device=dev).device is dev
    images, labels = enc.training_split()
    want = load("digits", seed=3, val_size=100, train_subset=300).train  # the split this run trained on
    assert len(images) == 300 and torch.equal(images, want.images) and torch.equal(labels, want.labels)
    small = ClassifierEncoder(run, batch_size=7)
    f = enc(images[:20])
    assert f.shape[0] == 20 and torch.allclose(small(images[:20]), f, atol=1e-6)
