"""The optimiser of a run: which parameters it trains and at what share of the learning rate.

:func:`build_optimizer` freezes what ``cfg.finetune`` leaves out of a pretrained model
(:func:`calibkit.models.pretrained.set_trainable`) and builds SGD or Adam over the param groups of
:func:`calibkit.models.pretrained.param_groups`: the head, the other new parameters and the loss's
own parameters (FeDLaS's gate) at the scheduled learning rate, the trainable pretrained backbone
at ``cfg.backbone_lr_scale`` times it. Every group carries its ``lr_scale``; :func:`set_lr` writes
``lr * lr_scale`` into each group at every step. A model without a pretrained backbone has a single
group of scale 1, the optimiser calibkit always built.
"""

from __future__ import annotations

import torch

from calibkit.errors import UserError
from calibkit.models.pretrained import param_groups, set_trainable


def build_optimizer(cfg, model: torch.nn.Module, loss_fn: torch.nn.Module) -> torch.optim.Optimizer:
    """SGD (momentum, weight decay) or Adam over ``model`` and ``loss_fn`` as ``cfg`` says."""
    try:
        set_trainable(model, cfg.finetune)
    except ValueError as exc:
        raise UserError(f"{exc} (model {cfg.model!r})") from None
    groups = param_groups(model, list(loss_fn.parameters()), cfg.backbone_lr_scale)
    for group in groups:
        group["lr"] = cfg.lr * group["lr_scale"]
    if cfg.optimizer == "adam":
        return torch.optim.Adam(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Each group's learning rate: ``lr`` times its ``lr_scale`` (1 when it has none)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
