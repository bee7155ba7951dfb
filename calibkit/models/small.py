"""Small fast models for 28x28 inputs (Fashion-MNIST, digits): a two-layer CNN and an MLP.

Both accept any number of input channels and any image size: the input is first average-pooled
(or repeated) to ``input_size x input_size`` with adaptive pooling, so the flattened size -- and
the parameter count -- is fixed at construction. For 28x28 inputs the pooling is the identity.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from calibkit.errors import UserError


class SmallCNN(nn.Module):
    """conv3x3(32) -> ReLU -> maxpool2 -> conv3x3(64) -> ReLU -> maxpool2 -> FC(256) -> ReLU -> head.

    About 825k parameters for 1x28x28 and 10 classes, almost all in the FC layer; with enough
    capacity to fit a 10k-image training subset, cross-entropy training makes it clearly
    over-confident within minutes on a CPU.

    Args:
        num_classes: K.
        in_channels: C.
        input_size: side S of the (square) input the layers are sized for; other sizes are
            adaptively pooled to the same S/4 x S/4 feature map.
        width: channels of the two conv layers (``width``, ``2 * width``).
        hidden: size D of the penultimate features.
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1, input_size: int = 28, width: int = 32,
                 hidden: int = 256):  # fmt: skip
        super().__init__()
        if input_size < 4:
            raise UserError(f"input_size must be >= 4, got {input_size}")
        self.conv1 = nn.Conv2d(in_channels, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.grid = input_size // 4  # spatial size after two 2x2 max-pools
        self.fc = nn.Linear(2 * width * self.grid * self.grid, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> (N, hidden)."""
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.adaptive_avg_pool2d(x, self.grid)  # identity for input_size inputs
        return F.relu(self.fc(x.flatten(1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> logits (N, K)."""
        return self.head(self.forward_features(x))


class MLP(nn.Module):
    """Flatten -> 512 -> ReLU -> 512 -> ReLU -> head (784-512-512-K, ~670k parameters at 1x28x28).

    Args:
        num_classes: K.
        in_channels: C.
        input_size: side S; inputs of another size are adaptively pooled to S x S first.
        hidden: width D of both hidden layers (the feature size).
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1, input_size: int = 28, hidden: int = 512):
        super().__init__()
        self.input_size = input_size
        self.fc1 = nn.Linear(in_channels * input_size * input_size, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> (N, hidden)."""
        if x.shape[-2:] != (self.input_size, self.input_size):
            x = F.adaptive_avg_pool2d(x, self.input_size)
        return F.relu(self.fc2(F.relu(self.fc1(x.flatten(1)))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> logits (N, K)."""
        return self.head(self.forward_features(x))


def cnn(num_classes: int = 10, in_channels: int = 1, input_size: int = 28) -> SmallCNN:
    """The small CNN: 2 conv layers (32/64) + FC 256."""
    return SmallCNN(num_classes, in_channels, input_size)


def mlp(num_classes: int = 10, in_channels: int = 1, input_size: int = 28) -> MLP:
    """The MLP 784-512-512 with a linear head."""
    return MLP(num_classes, in_channels, input_size)
