"""DenseNet-121, CIFAR variant (Huang et al., CVPR 2017): DenseNet-BC with a 3x3 stem.

Growth rate 32, dense blocks of 6-12-24-16 bottleneck layers (BN-ReLU-conv1x1(4k)-BN-ReLU-
conv3x3(k), output concatenated to the input), transitions BN-ReLU-conv1x1 with compression 0.5
and 2x2 average pooling. For 32x32 inputs the ImageNet stem (7x7 stride 2 + max-pool) is replaced
by one 3x3 stride-1 conv with 2k = 64 channels. Feature size D = 1024; ~7.0M parameters.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class DenseLayer(nn.Module):
    """BN-ReLU-conv1x1(4k)-BN-ReLU-conv3x3(k); returns the input with k new channels appended."""

    def __init__(self, in_planes: int, growth: int):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, 4 * growth, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(4 * growth)
        self.conv2 = nn.Conv2d(4 * growth, growth, 3, 1, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(F.relu(self.bn1(x)))
        out = self.conv2(F.relu(self.bn2(out)))
        return torch.cat([x, out], dim=1)


class Transition(nn.Module):
    """BN-ReLU-conv1x1 (compression) then 2x2 average pooling."""

    def __init__(self, in_planes: int, out_planes: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(in_planes)
        self.conv = nn.Conv2d(in_planes, out_planes, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(self.conv(F.relu(self.bn(x))), 2)


class DenseNet(nn.Module):
    """DenseNet-BC for small images.

    Args:
        blocks: layers per dense block.
        growth: growth rate k.
        reduction: channel compression of each transition.
        num_classes: K.
        in_channels: C.
    """

    def __init__(self, blocks=(6, 12, 24, 16), growth: int = 32, reduction: float = 0.5, num_classes: int = 10,
                 in_channels: int = 3):  # fmt: skip
        super().__init__()
        planes = 2 * growth
        self.conv1 = nn.Conv2d(in_channels, planes, 3, 1, 1, bias=False)
        stages: list[nn.Module] = []
        for i, n in enumerate(blocks):
            for _ in range(n):
                stages.append(DenseLayer(planes, growth))
                planes += growth
            if i < len(blocks) - 1:
                out = int(planes * reduction)
                stages.append(Transition(planes, out))
                planes = out
        self.features = nn.Sequential(*stages)
        self.bn = nn.BatchNorm2d(planes)
        self.num_features = planes
        self.head = nn.Linear(planes, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> pooled features (N, D)."""
        x = self.features(self.conv1(x))
        return F.adaptive_avg_pool2d(F.relu(self.bn(x)), 1).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> logits (N, K)."""
        return self.head(self.forward_features(x))


def densenet121(num_classes: int = 10, in_channels: int = 3) -> DenseNet:
    """DenseNet-121 (CIFAR variant, growth 32, D = 1024)."""
    return DenseNet((6, 12, 24, 16), 32, 0.5, num_classes, in_channels)
