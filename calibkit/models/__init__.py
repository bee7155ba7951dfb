"""Classifiers that expose their penultimate features.

Every entry of ``MODELS`` builds with ``MODELS[name](num_classes=K, in_channels=C)`` and obeys one
contract: ``model.forward_features(x)`` returns (N, D), ``model.head`` is ``nn.Linear(D, K)`` and
``model(x) == model.head(model.forward_features(x))`` -- FeDLaS reads the features, MaC-Cal
retrains the head. Models that take int64 token ids ``(N, L)`` instead of images have
``input_kind = "tokens"`` (:func:`input_kind`); for them ``in_channels`` is the vocabulary size.
Models with a pretrained backbone (:data:`PRETRAINED_MODELS`, installed with
``pip install calibkit[pretrained]``) also have ``backbone_blocks()`` (:mod:`calibkit.models.pretrained`).
Segmentation models (``model.dense`` is True) keep the spatial axes: features (N, D, H, W),
``head`` an ``nn.Conv2d(D, K, 1)``, logits (N, K, H, W).

    >>> import torch
    >>> m = MODELS["resnet20"](num_classes=10, in_channels=3)
    >>> m.forward_features(torch.zeros(2, 3, 32, 32)).shape, m.head.in_features
    (torch.Size([2, 64]), 64)
"""

from __future__ import annotations

import difflib

from calibkit.errors import UserError

from .custom import import_factory
from .densenet import densenet121
from .efficientnet_lite import efficientnet_lite0
from .minilm import minilm
from .resnet import resnet8, resnet20, resnet32, resnet50, resnet56, resnet101, resnet110
from .segnet import deeplabv3_resnet50, unet
from .small import cnn, mlp
from .text import gpool_cnn, gpool_cnn_small
from .wideresnet import wrn26_10, wrn28_10

MODELS = {
    # small models for 28x28 data (any channels / size via adaptive pooling)
    "cnn": cnn,
    "mlp": mlp,
    # CIFAR-style ResNets (3x3 stem, no max-pool)
    "resnet8": resnet8,
    "resnet20": resnet20,
    "resnet32": resnet32,
    "resnet56": resnet56,
    "resnet110": resnet110,
    "resnet50": resnet50,
    "resnet101": resnet101,
    # wide and dense networks
    "wrn26_10": wrn26_10,
    "wrn28_10": wrn28_10,
    "densenet121": densenet121,
    # text: token ids (N, L); in_channels = vocabulary size
    "gpool_cnn": gpool_cnn,
    "gpool_cnn_small": gpool_cnn_small,
    # pretrained backbones, new linear head (calibkit[pretrained]; see pretrained.py)
    "efficientnet_lite0": efficientnet_lite0,
    "minilm": minilm,
    # semantic segmentation (dense: features (N, D, H, W), 1x1-conv head; see segnet.py)
    "unet": unet,
    "deeplabv3_resnet50": deeplabv3_resnet50,
}

# Names of the models with a pretrained backbone (``backbone_blocks()``; TrainConfig.finetune).
PRETRAINED_MODELS = frozenset({"efficientnet_lite0", "minilm"})

# Names of the dense (segmentation) models; each has ``model.dense == True``.
DENSE_MODELS = frozenset({"unet", "deeplabv3_resnet50"})


def resolve(name: str):
    """The builder of model ``name``: ``MODELS[name]``, or the user's ``factory`` for
    ``"package.module:factory"`` / ``"file.py:factory"`` (:mod:`calibkit.models.custom`).

    Raises:
        ValueError: an unknown name, or a factory that cannot be imported.
    """
    if name in MODELS:
        return MODELS[name]
    if ":" in str(name):
        return import_factory(name)

    close = difflib.get_close_matches(str(name), list(MODELS), n=1, cutoff=0.5)
    hint = f" (nearest valid name: {close[0]})" if close else ""
    raise UserError(f"unknown model {name!r}{hint}; choose one of {', '.join(MODELS)}, or give your own as "
                     "'package.module:factory'")


def build(name: str, num_classes: int, in_channels: int, **kwargs):
    """``resolve(name)(num_classes=..., in_channels=..., **kwargs)`` with a clear error for unknown names."""
    return resolve(name)(num_classes=num_classes, in_channels=in_channels, **kwargs)


def input_kind(model) -> str:
    """``"tokens"`` for models over int64 token ids (N, L), ``"image"`` for the others (a model or
    a ``MODELS`` builder)."""
    return getattr(model, "input_kind", "image")


def num_parameters(model) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


__all__ = ["DENSE_MODELS", "MODELS", "PRETRAINED_MODELS", "build", "input_kind", "num_parameters", "resolve"]
