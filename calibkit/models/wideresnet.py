"""Wide ResNets for 32x32 inputs: WRN-28-10 and WRN-26-10 (widths 160/320/640, D = 640).

The two names follow two counting conventions of the literature, and calibkit keeps both:

* ``wrn28_10`` -- Zagoruyko & Komodakis (BMVC 2016): pre-activation wide blocks
  (BN-ReLU-conv3x3-BN-ReLU-conv3x3), depth = 6n + 4 with n = 4 blocks per stage, 1x1-conv
  shortcuts where the shape changes, a final BN-ReLU before pooling; optional dropout between
  the two convs (0 by default).
* ``wrn26_10`` -- the network the calibration papers after Mukhoti et al. (NeurIPS 2020) train
  under this name: post-activation basic blocks (conv-BN-ReLU-conv-BN, add, ReLU) with 1x1-conv
  + BN projection shortcuts, depth = 6n + 2 with n = 4 blocks per stage.

So both have 3 x 4 blocks and ~36.5M parameters; they differ in where BN/ReLU sit.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class PreActBlock(nn.Module):
    """BN-ReLU-conv3x3(stride) [-dropout] -BN-ReLU-conv3x3 plus a (projected) shortcut."""

    def __init__(self, in_planes: int, planes: int, stride: int, dropout: float = 0.0):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.dropout = dropout
        self.proj = None
        if stride != 1 or in_planes != planes:
            self.proj = nn.Conv2d(in_planes, planes, 1, stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = F.relu(self.bn1(x))
        out = self.conv1(act)
        out = F.relu(self.bn2(out))
        if self.dropout > 0:
            out = F.dropout(out, self.dropout, self.training)
        out = self.conv2(out)
        # when projecting, the shortcut reads the pre-activated input (as in the reference design)
        return out + (x if self.proj is None else self.proj(act))


class PostActBlock(nn.Module):
    """conv3x3(stride)-BN-ReLU-conv3x3-BN, add the (conv1x1+BN projected) shortcut, ReLU."""

    def __init__(self, in_planes: int, planes: int, stride: int, dropout: float = 0.0):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.dropout = dropout
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        if self.dropout > 0:
            out = F.dropout(out, self.dropout, self.training)
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class WideResNet(nn.Module):
    """Stem conv3x3(16) -> 3 stages of ``n`` blocks (16k, 32k, 64k channels) -> pool -> ``head``.

    Args:
        n: blocks per stage.
        widen: width factor k.
        preact: pre-activation blocks (WRN-28-10) or post-activation blocks (WRN-26-10).
        num_classes: K.
        in_channels: C.
        dropout: dropout probability inside each block.
    """

    def __init__(self, n: int, widen: int, preact: bool, num_classes: int = 10, in_channels: int = 3,
                 dropout: float = 0.0):  # fmt: skip
        super().__init__()
        widths = [16 * widen, 32 * widen, 64 * widen]
        block = PreActBlock if preact else PostActBlock
        self.conv1 = nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)
        # post-activation nets normalise the stem output; pre-activation blocks do it themselves
        self.bn1 = None if preact else nn.BatchNorm2d(16)
        layers, in_planes = [], 16
        for i, planes in enumerate(widths):
            for j in range(n):
                layers.append(block(in_planes, planes, 2 if (i > 0 and j == 0) else 1, dropout))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        self.bn_final = nn.BatchNorm2d(in_planes) if preact else None
        self.num_features = in_planes
        self.head = nn.Linear(in_planes, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> pooled features (N, 64 * widen)."""
        x = self.conv1(x)
        if self.bn1 is not None:
            x = F.relu(self.bn1(x))
        x = self.layers(x)
        if self.bn_final is not None:
            x = F.relu(self.bn_final(x))
        return F.adaptive_avg_pool2d(x, 1).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> logits (N, K)."""
        return self.head(self.forward_features(x))


def wrn28_10(num_classes: int = 10, in_channels: int = 3, dropout: float = 0.0) -> WideResNet:
    """WRN-28-10 (pre-activation, depth 6n+4, n = 4)."""
    return WideResNet((28 - 4) // 6, 10, True, num_classes, in_channels, dropout)


def wrn26_10(num_classes: int = 10, in_channels: int = 3, dropout: float = 0.0) -> WideResNet:
    """WRN-26-10 (post-activation, depth 6n+2, n = 4)."""
    return WideResNet((26 - 2) // 6, 10, False, num_classes, in_channels, dropout)
