"""CIFAR-style ResNets: 3x3 stem, no max-pool, global average pooling, a linear head.

* ResNet-8/20/32/56/110 (He et al., CVPR 2016, section 4.2): three stages of ``n`` basic blocks
  with 16/32/64 channels, depth 6n+2. Shortcuts that change shape are "option A": stride-2
  subsampling and zero-padded channels, parameter-free, as in the paper -- this is what gives
  ResNet-20 its 0.27M and ResNet-110 its 1.7M parameters. Feature size D = 64.
* ResNet-50/101: the ImageNet bottleneck design (stages of 3-4-6-3 / 3-4-23-3 blocks, widths
  64..512, expansion 4, 1x1-conv projection shortcuts) with a 3x3 stride-1 stem and no max-pool,
  the variant used for CIFAR and Tiny-ImageNet in the calibration literature. D = 2048.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    """Two 3x3 convs with BN; parameter-free (option A) shortcut when the shape changes."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.stride = stride
        self.pad = planes - in_planes

    def shortcut(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride > 1:
            x = x[:, :, :: self.stride, :: self.stride]
        if self.pad > 0:  # new channels start at zero (split evenly front and back)
            x = F.pad(x, (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3 (carries the stride) -> 1x1 expand (x4), projection shortcut when needed."""

    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        out_planes = planes * self.expansion
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out_planes, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_planes)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != out_planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, out_planes, 1, stride, bias=False), nn.BatchNorm2d(out_planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """Stem conv3x3 -> stages -> global average pool -> ``head``.

    Args:
        block: ``BasicBlock`` or ``Bottleneck``.
        blocks: number of blocks per stage.
        widths: ``planes`` of each stage (the first stage has stride 1, the others stride 2).
        num_classes: K.
        in_channels: C.
        stem: channels of the stem conv.
    """

    def __init__(self, block, blocks, widths, num_classes: int = 10, in_channels: int = 3, stem: int = 16):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, stem, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(stem)
        layers, in_planes = [], stem
        for i, (n, planes) in enumerate(zip(blocks, widths)):
            for j in range(n):
                stride = 2 if (i > 0 and j == 0) else 1
                layers.append(block(in_planes, planes, stride))
                in_planes = planes * getattr(block, "expansion", 1)
        self.layers = nn.Sequential(*layers)
        self.num_features = in_planes
        self.head = nn.Linear(in_planes, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> pooled features (N, D)."""
        x = F.relu(self.bn1(self.conv1(x)))
        return F.adaptive_avg_pool2d(self.layers(x), 1).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> logits (N, K)."""
        return self.head(self.forward_features(x))


def _cifar(n: int):
    def build(num_classes: int = 10, in_channels: int = 3) -> ResNet:
        return ResNet(BasicBlock, [n, n, n], [16, 32, 64], num_classes, in_channels, stem=16)

    build.__doc__ = f"ResNet-{6 * n + 2} (CIFAR, basic blocks, 16/32/64 channels, D = 64)."
    return build


resnet8 = _cifar(1)
resnet20 = _cifar(3)
resnet32 = _cifar(5)
resnet56 = _cifar(9)
resnet110 = _cifar(18)


def resnet50(num_classes: int = 10, in_channels: int = 3) -> ResNet:
    """ResNet-50 with a 3x3 stem and no max-pool (bottleneck 3-4-6-3, D = 2048)."""
    return ResNet(Bottleneck, [3, 4, 6, 3], [64, 128, 256, 512], num_classes, in_channels, stem=64)


def resnet101(num_classes: int = 10, in_channels: int = 3) -> ResNet:
    """ResNet-101 with a 3x3 stem and no max-pool (bottleneck 3-4-23-3, D = 2048)."""
    return ResNet(Bottleneck, [3, 4, 23, 3], [64, 128, 256, 512], num_classes, in_channels, stem=64)
