"""Conformance tests over every MODELS key, plus architecture facts (parameter counts, sizes)."""

import os
import re

import pytest
import torch

from calibkit.models import DENSE_MODELS, MODELS, PRETRAINED_MODELS, build, input_kind, num_parameters
from tests.conftest import ROOT

from .pretrained_skip import NEEDS

SMALL = {"cnn", "mlp"}
DENSE = DENSE_MODELS
# the big networks run on a batch of 2 to keep the suite fast; BN still sees > 1 value per channel
BATCH = {name: (2 if name in {"wrn26_10", "wrn28_10", "densenet121", "resnet101", "resnet50",
                              "deeplabv3_resnet50"} else 4) for name in MODELS}


TEXT = {name for name in MODELS if input_kind(MODELS[name]) == "tokens"}
VOCAB = 50  # in_channels of a text model is its vocabulary size
OWN_VOCAB = {"minilm": 30522}  # pretrained text models read their own tokenizer's ids
# every model, the pretrained ones skipped (with the reason) when calibkit[pretrained] is missing
ALL = [pytest.param(name, marks=NEEDS[name]) if name in PRETRAINED_MODELS else name for name in sorted(MODELS)]


def _documented_models() -> list[str]:
    """The names in the first column of docs/models.md's tables of models (headed ``| name |``), in
    order; ``resnet8/20/32`` stands for ``resnet8``, ``resnet20``, ``resnet32``."""
    with open(os.path.join(ROOT, "docs", "models.md")) as f:
        tables = re.split(r"\n(?=\| name \|)", f.read())[1:]
    names = []
    for table in tables:
        for first in re.findall(r"^\| `([^`]+)` \|", table.split("\n\n", 1)[0], flags=re.M):
            head, *rest = first.split("/")
            stem = re.match(r"[a-z_]*", head).group()
            names += [head, *(stem + r for r in rest)]
    return names


def test_every_registered_model_is_documented():
    documented = _documented_models()
    assert sorted(documented) == sorted(MODELS) and len(documented) == len(set(documented))


def _input(name, channels, gen, size=None):
    if name in TEXT:  # token ids with <pad> (0) at the end of the shorter rows
        x = torch.randint(1, channels, (BATCH[name], 40), generator=gen)
        x[1, 25:] = 0
        return x
    size = size or (28 if name in SMALL else 32)
    return torch.randn(BATCH[name], channels, size, size, generator=gen)


@pytest.mark.parametrize("name", ALL)
def test_contract_forward_backward(name, gen):
    torch.manual_seed(0)
    k, c = 7, (OWN_VOCAB.get(name, VOCAB) if name in TEXT else 1 if name in SMALL else 3)
    model = MODELS[name](num_classes=k, in_channels=c)
    assert getattr(model, "dense", False) == (name in DENSE)
    x = _input(name, c, gen)
    n, size = x.shape[0], x.shape[-2:]
    if name in DENSE:  # per-pixel features (N, D, H, W) and a 1x1-conv head at the input resolution
        head = model.head
        assert isinstance(head, torch.nn.Conv2d) and head.kernel_size == (1, 1) and head.out_channels == k
        feat_shape, logit_shape = (n, head.in_channels, *size), (n, k, *size)
    else:
        assert isinstance(model.head, torch.nn.Linear) and model.head.out_features == k
        feat_shape, logit_shape = (n, model.head.in_features), (n, k)
    model.train()
    feats = model.forward_features(x)
    assert feats.shape == feat_shape
    logits = model(x)
    assert logits.shape == logit_shape and torch.isfinite(logits).all()
    logits.logsumexp(1).sum().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads), "every parameter receives a gradient"
    assert model.head.weight.grad.abs().sum() > 0
    first = next(model.parameters())
    assert first.grad.abs().sum() > 0, "the gradient reaches the first layer"
    if name in TEXT:  # only the embeddings of tokens in the batch get a gradient; <pad>'s stays zero
        used = torch.zeros(c, dtype=torch.bool)
        used[x.unique()] = True
        assert (first.grad[used & (torch.arange(c) > 0)].abs().sum(1) > 0).all()
        assert first.grad[~used].abs().sum() == 0 and first.grad[0].abs().sum() == 0
    # forward == head(forward_features), checked in eval mode where BN is deterministic
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x), model.head(model.forward_features(x)))


@pytest.mark.parametrize("name", ["cnn", "mlp", "resnet8", "unet"])
@pytest.mark.parametrize("channels,size", [(1, 28), (3, 32), (3, 20)])
def test_any_channels_and_size(name, channels, size, gen):
    model = build(name, num_classes=10, in_channels=channels).eval()
    x = torch.randn(3, channels, size, size, generator=gen)
    with torch.no_grad():
        if name in DENSE:
            assert model(x).shape == (3, 10, size, size)
            assert model.forward_features(x).shape == (3, model.head.in_channels, size, size)
        else:
            assert model(x).shape == (3, 10)
            assert model.forward_features(x).shape == (3, model.head.in_features)


@pytest.mark.parametrize(
    "name,low,high",
    [
        ("resnet20", 0.26e6, 0.28e6),  # He et al.: 0.27M
        ("resnet32", 0.45e6, 0.47e6),  # 0.46M
        ("resnet56", 0.84e6, 0.86e6),  # 0.85M
        ("resnet110", 1.7e6, 1.75e6),  # 1.7M
        ("resnet50", 23.4e6, 23.6e6),  # ImageNet ResNet-50 without the 1000-way FC and 7x7 stem
        ("wrn28_10", 36.4e6, 36.6e6),  # Zagoruyko & Komodakis: 36.5M
        ("densenet121", 6.9e6, 7.0e6),
        ("cnn", 0.82e6, 0.83e6),  # 2 conv (32/64) + FC 256 at 1x28x28
        ("mlp", 0.66e6, 0.68e6),  # 784-512-512-10
        # U-Net 16/32/64/64 on 1 channel, bias-free 3x3 convs + BN (2 per channel), 1x1 head (K = 10):
        # enc 2512 + 13952 + 55552, bottom 73984, dec 46208 + 11584 + 6976, head 170 = 210,938
        ("unet", 210938, 210938),
        # DeepLabV3-ResNet-50 without an auxiliary head: 23.5M encoder + 16.1M ASPP/refine + head
        ("deeplabv3_resnet50", 39.5e6, 39.8e6),
    ],
)
def test_parameter_counts(name, low, high):
    c = 1 if name in SMALL or name == "unet" else 3
    assert low <= num_parameters(MODELS[name](num_classes=10, in_channels=c)) <= high


def test_feature_sizes():
    expect = {"resnet20": 64, "resnet110": 64, "resnet50": 2048, "wrn26_10": 640, "wrn28_10": 640,
              "densenet121": 1024, "cnn": 256, "mlp": 512}  # fmt: skip
    for name, d in expect.items():
        assert MODELS[name](num_classes=10, in_channels=3).head.in_features == d


def test_resnet_depths():
    # depth = 6n + 2 counts the stem, 2 convs per basic block and the head
    for name, n in [("resnet8", 1), ("resnet20", 3), ("resnet32", 5), ("resnet56", 9), ("resnet110", 18)]:
        model = MODELS[name](num_classes=10, in_channels=3)
        convs = sum(isinstance(m, torch.nn.Conv2d) for m in model.modules())
        assert convs + 1 == 6 * n + 2


def test_option_a_shortcut_is_parameter_free_zero_padding():
    from calibkit.models.resnet import BasicBlock

    block = BasicBlock(16, 32, stride=2)
    x = torch.arange(2 * 16 * 4 * 4, dtype=torch.float32).reshape(2, 16, 4, 4)
    s = block.shortcut(x)
    assert s.shape == (2, 32, 2, 2)
    torch.testing.assert_close(s[:, 8:24], x[:, :, ::2, ::2])
    assert s[:, :8].abs().sum() == 0 and s[:, 24:].abs().sum() == 0


def test_unknown_model_lists_names():
    with pytest.raises(ValueError, match="resnet20"):
        build("resnet19", num_classes=10, in_channels=3)
