"""The learning rate as a pure function of the (fractional) epoch, so a resumed run needs no state."""

from __future__ import annotations

import math

from calibkit.config import TrainConfig


def learning_rate(cfg: TrainConfig, t: float) -> float:
    """Learning rate at fractional epoch ``t`` in ``[0, epochs)``.

    - multistep: ``lr * gamma ** (number of milestones <= floor(t))`` (steps at epoch boundaries);
    - cosine: ``lr * (1 + cos(pi t / epochs)) / 2``;
    - onecycle: linear warm-up from ``lr / 25`` to ``lr`` over the first 25% of training, then
      cosine decay to 0.
    """
    if cfg.schedule == "multistep":
        return cfg.lr * cfg.gamma ** sum(int(t) >= m for m in cfg.resolved_milestones())
    frac = t / cfg.epochs
    if cfg.schedule == "cosine":
        return cfg.lr * 0.5 * (1 + math.cos(math.pi * frac))
    warm = 0.25
    if frac < warm:
        return cfg.lr * (0.04 + 0.96 * frac / warm)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * (frac - warm) / (1 - warm)))
