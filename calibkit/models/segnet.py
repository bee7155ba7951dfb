"""Segmentation networks: per-pixel features and a 1x1-convolution head.

Dense contract (the classification contract with spatial axes kept):
``model.forward_features(x)`` maps ``(N, C, H, W)`` to per-pixel features ``(N, D, H, W)`` at
the input resolution, ``model.head`` is ``nn.Conv2d(D, K, 1)`` and
``model(x) == model.head(model.forward_features(x))`` gives logits ``(N, K, H, W)``. The 1x1 head
applied at every pixel is the dense analogue of a linear head on pooled features, which is what
FeDLaS (per-pixel feature norms) and head retraining rely on. ``model.dense`` is ``True``.

* :class:`UNet` (``unet``): a compact U-Net (Ronneberger et al., MICCAI 2015) with three
  resolutions, batch norm, max-pool down and nearest-neighbour up-sampling with skip
  connections. Widths ``w, 2w, 4w`` plus a 4w bottleneck at 1/8 resolution (``w`` = 16: 0.21M
  parameters), small enough to train on a CPU on the 64x64 Fashion-MNIST scenes.
* :class:`DeepLabV3` (``deeplabv3_resnet50``): DeepLabV3 (Chen et al., 2017) on an ImageNet-style
  ResNet-50 (7x7 stride-2 stem, max-pool) whose last two stages are dilated (output stride 8),
  ASPP with rates 12/24/36 and 256 channels, a 3x3 conv + BN + ReLU; the 256-channel features are
  up-sampled bilinearly to the input size and the 1x1 head maps them to logits. Up-sampling
  features then applying the 1x1 head equals applying the head then up-sampling the logits
  (both maps are linear per pixel and the bilinear weights sum to 1), as DeepLab does; the cost is
  memory: 256 x H x W floats per image. About 39.6M parameters. It is the network family of
  the MbLS PASCAL VOC experiments, which used an ImageNet-pretrained encoder; calibkit downloads
  nothing, so it starts from random weights.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .resnet import Bottleneck


def _conv_bn(cin: int, cout: int, k: int = 3, dilation: int = 1) -> nn.Sequential:
    pad = dilation * (k // 2)
    return nn.Sequential(nn.Conv2d(cin, cout, k, padding=pad, dilation=dilation, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


def _double(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(_conv_bn(cin, cout), _conv_bn(cout, cout))


class UNet(nn.Module):
    """Compact U-Net: (conv-BN-ReLU) x 2 per level, 3 max-pools, skip connections, 1x1 head.

    Any input size works (odd sizes are handled by up-sampling to the skip's exact size).

    Args:
        num_classes: K (background included).
        in_channels: C.
        width: channels ``w`` of the first level; levels have ``w, 2w, 4w, 4w`` channels.
    """

    dense = True

    def __init__(self, num_classes: int = 11, in_channels: int = 1, width: int = 16):
        super().__init__()
        w = width
        self.enc1, self.enc2, self.enc3 = _double(in_channels, w), _double(w, 2 * w), _double(2 * w, 4 * w)
        self.bottom = _double(4 * w, 4 * w)
        self.dec3, self.dec2, self.dec1 = _double(8 * w, 2 * w), _double(4 * w, w), _double(2 * w, w)
        self.num_features = w
        self.head = nn.Conv2d(w, num_classes, 1)
        for m in self.modules():
            if isinstance(m, nn.Conv2d) and m is not self.head:
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    @staticmethod
    def _up(x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return torch.cat([F.interpolate(x, size=skip.shape[-2:], mode="nearest"), skip], dim=1)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> per-pixel features (N, w, H, W)."""
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        e3 = self.enc3(F.max_pool2d(e2, 2))
        b = self.bottom(F.max_pool2d(e3, 2))
        d3 = self.dec3(self._up(b, e3))
        d2 = self.dec2(self._up(d3, e2))
        return self.dec1(self._up(d2, e1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> logits (N, K, H, W)."""
        return self.head(self.forward_features(x))


class _DilatedBottleneck(Bottleneck):
    """The ResNet bottleneck with a dilated 3x3 conv (stride 1 where dilation replaces it)."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1, dilation: int = 1):
        super().__init__(in_planes, planes, stride)
        if dilation > 1:
            self.conv2 = nn.Conv2d(planes, planes, 3, stride, padding=dilation, dilation=dilation, bias=False)


class _ASPP(nn.Module):
    """Atrous spatial pyramid pooling: 1x1, three dilated 3x3 and an image-pooling branch, projected."""

    def __init__(self, cin: int, cout: int, rates=(12, 24, 36)):
        super().__init__()
        self.branches = nn.ModuleList([_conv_bn(cin, cout, 1)] + [_conv_bn(cin, cout, 3, r) for r in rates])
        self.pool = _conv_bn(cin, cout, 1)
        self.project = nn.Sequential(_conv_bn(cout * (len(rates) + 2), cout, 1), nn.Dropout(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self.pool(F.adaptive_avg_pool2d(x, 1)).expand(-1, -1, *x.shape[-2:])
        return self.project(torch.cat([b(x) for b in self.branches] + [pooled], dim=1))


class DeepLabV3(nn.Module):
    """DeepLabV3 with a dilated ResNet-50 encoder (output stride 8); see the module docstring.

    Args:
        num_classes: K (21 for PASCAL VOC: background + 20 objects).
        in_channels: C.
        channels: D, the ASPP / feature width (256).
    """

    dense = True

    def __init__(self, num_classes: int = 21, in_channels: int = 3, channels: int = 256):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        layers, in_planes = [], 64
        # (blocks, planes, stride, dilation): stages 3 and 4 keep stride 8 and dilate instead
        for n, planes, stride, dilation in [(3, 64, 1, 1), (4, 128, 2, 1), (6, 256, 1, 2), (3, 512, 1, 4)]:
            for j in range(n):
                layers.append(_DilatedBottleneck(in_planes, planes, stride if j == 0 else 1, dilation))
                in_planes = planes * Bottleneck.expansion
        self.encoder = nn.Sequential(*layers)
        self.aspp = _ASPP(in_planes, channels)
        self.refine = _conv_bn(channels, channels)
        self.num_features = channels
        self.head = nn.Conv2d(channels, num_classes, 1)
        for m in self.modules():
            if isinstance(m, nn.Conv2d) and m is not self.head:
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> features (N, 256, H, W), bilinearly up-sampled from stride 8."""
        f = self.refine(self.aspp(self.encoder(self.stem(x))))
        return F.interpolate(f, size=x.shape[-2:], mode="bilinear", align_corners=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> logits (N, K, H, W)."""
        return self.head(self.forward_features(x))


def unet(num_classes: int = 11, in_channels: int = 1, width: int = 16) -> UNet:
    """The compact U-Net (widths 16/32/64/64, 0.21M parameters at 1 input channel)."""
    return UNet(num_classes, in_channels, width)


def deeplabv3_resnet50(num_classes: int = 21, in_channels: int = 3) -> DeepLabV3:
    """DeepLabV3, dilated ResNet-50 encoder (output stride 8), ASPP 12/24/36, 256 channels."""
    return DeepLabV3(num_classes, in_channels)
