"""Text classifiers over token ids: the global-pooling CNN of the MbLS text experiment.

Input: int64 token ids ``(N, L)`` from :class:`calibkit.data.tokenizer.Vocabulary` (0 = padding).
For token inputs the models' ``in_channels`` argument is the **vocabulary size** V -- a token is a
one-hot vector over V channels, and the embedding layer is the linear map applied to it -- so
every model still builds with ``MODELS[name](num_classes=K, in_channels=V)``, and a run records V
as its ``in_channels``.

The network (Lin et al.'s global pooling, as trained on 20 Newsgroups by Mukhoti et al. 2020 and
Liu et al. 2022, MbLS Table 6)::

    embedding (V x E) -> conv1d(E->C, k5) -> ReLU -> maxpool(k5, s1)
                      -> conv1d(C->C, k5) -> ReLU -> maxpool(k5, s1)
                      -> conv1d(C->C, k5) -> ReLU -> max over time
                      -> linear(C->D) -> ReLU  = features (N, D) -> head linear(D->K)

with E = 100, C = D = 128 in the published experiment, whose embedding is frozen 100-d GloVe.
No pretrained word vectors can be downloaded here, so calibkit **learns the embedding** from
scratch with the rest of the network (initialised N(0, 1), the ``<pad>`` row fixed at zero). Inputs
shorter than the 21 positions the layers consume are padded with ``<pad>`` at the end.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from calibkit.errors import UserError


class GlobalPoolingCNN(nn.Module):
    """Embedding + three 1-D convolutions + global max pooling + one hidden layer + linear head.

    Args:
        num_classes: K.
        in_channels: the vocabulary size V (see the module docstring).
        embed_dim: E, the width of the learned word embedding.
        channels: C, the filters of each convolution.
        hidden: D, the size of the penultimate features (the head's input).
        kernel: the width of the convolutions and of the two max-pools.

    Attributes:
        input_kind: ``"tokens"`` -- the model takes int64 token ids (N, L), not images.
    """

    input_kind = "tokens"

    def __init__(self, num_classes: int = 20, in_channels: int = 20000, embed_dim: int = 100,
                 channels: int = 128, hidden: int = 128, kernel: int = 5):  # fmt: skip
        super().__init__()
        if in_channels < 2:
            raise UserError(f"in_channels is the vocabulary size for text models (>= 2), got {in_channels}")
        self.kernel = kernel
        self.min_length = 5 * (kernel - 1) + 1
        self.embedding = nn.Embedding(in_channels, embed_dim, padding_idx=0)
        self.conv1 = nn.Conv1d(embed_dim, channels, kernel)
        self.conv2 = nn.Conv1d(channels, channels, kernel)
        self.conv3 = nn.Conv1d(channels, channels, kernel)
        self.fc = nn.Linear(channels, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """int64 token ids (N, L) -> features (N, D)."""
        if x.dtype != torch.int64 or x.dim() != 2:
            raise UserError(f"expected int64 token ids (N, L), got {x.dtype} {tuple(x.shape)}")
        if x.shape[1] < self.min_length:
            x = F.pad(x, (0, self.min_length - x.shape[1]))  # <pad> = 0 at the end
        h = self.embedding(x).transpose(1, 2)  # (N, E, L)
        h = F.max_pool1d(F.relu(self.conv1(h)), self.kernel, stride=1)
        h = F.max_pool1d(F.relu(self.conv2(h)), self.kernel, stride=1)
        h = F.relu(self.conv3(h)).amax(dim=2)  # global max pooling over time
        return F.relu(self.fc(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """int64 token ids (N, L) -> logits (N, K)."""
        return self.head(self.forward_features(x))


def gpool_cnn(num_classes: int = 20, in_channels: int = 20000) -> GlobalPoolingCNN:
    """The published sizes: embedding 100, 128 filters, 128 features (~2.2M parameters at V = 20k)."""
    return GlobalPoolingCNN(num_classes, in_channels, embed_dim=100, channels=128, hidden=128)


def gpool_cnn_small(num_classes: int = 20, in_channels: int = 20000) -> GlobalPoolingCNN:
    """Half width for CPU benches: embedding 64, 64 filters, 64 features (same layers)."""
    return GlobalPoolingCNN(num_classes, in_channels, embed_dim=64, channels=64, hidden=64)


# known before building (calibkit.models.input_kind)
gpool_cnn.input_kind = gpool_cnn_small.input_kind = "tokens"  # type: ignore[attr-defined]
