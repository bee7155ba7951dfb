"""What pretrained backbones share: the optional extra, the trainable part and the learning rates.

A pretrained model (``efficientnet_lite0``, ``minilm``) is an ``nn.Module`` with calibkit's
contract plus one method, ``backbone_blocks()``: the pretrained modules in input-to-output order
(e.g. the stem, the 16 MBConv blocks and the 1x1 head convolution of EfficientNet-Lite0; the
embeddings and the 6 transformer layers of MiniLM). The ``head`` is new (initialised at random).

**What is trained** (``TrainConfig.finetune``, :func:`set_trainable`):

* ``"all"`` (default): every parameter;
* ``"head"``: the head only, the backbone frozen (a linear probe on the pretrained features);
* ``"last:N"``: the head and the last N backbone blocks.

Frozen parameters get ``requires_grad = False`` and frozen blocks stay in evaluation mode when the
model is put in training mode (:class:`PretrainedMixin`), so their BatchNorm statistics and dropout
do not change the features a frozen backbone computes.

**Learning rates** (:func:`param_groups`): the trainable backbone parameters learn at
``backbone_lr_scale x lr`` (default 0.1, ``TrainConfig.backbone_lr_scale``), the head and any
non-pretrained parameter at ``lr``; each optimiser group records its ``lr_scale``, which the
training loop multiplies into the scheduled learning rate at every step.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

import torch.nn as nn

from calibkit import extras
from calibkit.errors import UserError

DEFAULT_BACKBONE_LR_SCALE = 0.1


def require(module: str, model: str):
    """``import module``, or :class:`calibkit.extras.MissingExtra` (an ``ImportError``) of one line
    naming the package and the extra that installs it (``pip install 'calibkit[pretrained]'``)."""
    extras.require(module, f"model {model!r}")
    return importlib.import_module(module)


def _blocks(model: nn.Module) -> list[nn.Module]:
    """The pretrained blocks of a model that :func:`is_pretrained` accepts, input to output."""
    return list(model.backbone_blocks())  # type: ignore[operator]  # nn.Module does not declare it


def is_pretrained(model) -> bool:
    """Whether ``model`` has a pretrained backbone (a ``backbone_blocks`` method)."""
    return callable(getattr(model, "backbone_blocks", None))


def parse_finetune(part: str) -> int | None:
    """The number of trailing backbone blocks ``part`` trains: None for ``"all"``, 0 for ``"head"``,
    N for ``"last:N"``.

    Raises:
        ValueError: any other text, or N < 1.
    """
    text = str(part)
    if text == "all":
        return None
    if text == "head":
        return 0
    name, colon, count = text.partition(":")
    if name == "last" and colon and count.isdigit() and int(count) >= 1:
        return int(count)
    raise UserError(f"finetune: expected 'all', 'head' or 'last:N' (N >= 1 backbone blocks), got {part!r}")


def set_trainable(model: nn.Module, part: str) -> None:
    """Freeze what ``part`` leaves out (see the module docstring); ``"all"`` unfreezes everything.

    Raises:
        ValueError: ``part`` is not ``"all"`` on a model without a pretrained backbone, or N exceeds
            the number of blocks.
    """
    count = parse_finetune(part)
    if count is None:
        for p in model.parameters():
            p.requires_grad_(True)
        return
    if not is_pretrained(model):
        raise UserError(f"finetune: {part!r} needs a model with a pretrained backbone "
                         f"(efficientnet_lite0, minilm); {type(model).__name__} has none")
    blocks = _blocks(model)
    if count > len(blocks):
        raise UserError(f"finetune: {part!r} asks for more blocks than the backbone's {len(blocks)}")
    for i, block in enumerate(blocks):
        for p in block.parameters():
            p.requires_grad_(i >= len(blocks) - count)
    model.train(model.training)  # frozen blocks switch to evaluation mode now


def backbone_parameter_ids(model: nn.Module) -> set[int]:
    """``id`` of every parameter of the model's pretrained blocks (empty without a backbone)."""
    if not is_pretrained(model):
        return set()
    return {id(p) for block in _blocks(model) for p in block.parameters()}


def param_groups(model: nn.Module, extra=(), backbone_lr_scale: float = DEFAULT_BACKBONE_LR_SCALE) -> list[dict]:
    """Optimiser groups over the trainable parameters of ``model`` and ``extra`` (the loss's own).

    One group ``{"params": ..., "lr_scale": 1.0}`` for the head, the loss's and any other new
    parameter, and, when the model has trainable pretrained parameters, a second one with
    ``"lr_scale": backbone_lr_scale``. Frozen parameters are in no group.
    """
    if not backbone_lr_scale > 0:
        raise UserError(f"backbone_lr_scale: must be > 0, got {backbone_lr_scale!r}")
    pretrained = backbone_parameter_ids(model)
    trainable = [p for p in [*model.parameters(), *extra] if p.requires_grad]
    new = [p for p in trainable if id(p) not in pretrained]
    old = [p for p in trainable if id(p) in pretrained]
    groups = [{"params": new, "lr_scale": 1.0}]
    if old:
        groups.append({"params": old, "lr_scale": float(backbone_lr_scale)})
    return groups


# The mixin is used as ``class Model(PretrainedMixin, nn.Module)``; to the type checker it is a module.
if TYPE_CHECKING:
    _ModuleForTypes = nn.Module
else:
    _ModuleForTypes = object


class PretrainedMixin(_ModuleForTypes):
    """``train(mode)`` that keeps fully frozen backbone blocks in evaluation mode (mixed into an
    ``nn.Module`` that has ``backbone_blocks``)."""

    def train(self, mode: bool = True):
        super().train(mode)
        if mode:
            for block in _blocks(self):
                if not any(p.requires_grad for p in block.parameters()):
                    block.eval()
        return self
