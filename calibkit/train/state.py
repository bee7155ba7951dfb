"""A training run's state between epochs, and the interface of the evaluator that measures it.

:class:`Run` is built by :func:`calibkit.train.run.build_run` and carried by the epoch loop
(:mod:`calibkit.train.loop`); its evaluator (:class:`Evaluator`) is a
:class:`calibkit.train.evaluate.ClassificationEvaluator` or, for segmentation, a
:class:`calibkit.train.dense.DenseEvaluator`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn as nn

from calibkit import distributed as D
from calibkit.config import TrainConfig
from calibkit.train.keep import Keeper
from calibkit.train.steps import Standard

if TYPE_CHECKING:
    from calibkit.data.bundle import DataBundle
    from calibkit.data.inputs import FeatureInputs, ImageInputs, TokenInputs

Log = Callable[[str], object]


def _as_is(config: dict) -> dict:
    return config


def _never(out: Path) -> bool:
    return False


@dataclass(frozen=True)
class Placement:
    """What the directory a run sits in asks of the training loop (the default: nothing).

    ``record`` turns ``TrainConfig.to_dict()`` into the form ``config.json`` records, ``recorded``
    turns a recorded config back into that form (a run compares the two when it resumes), and
    ``fresh(out)`` says whether ``out``, not empty and without ``config.json``, holds nothing of a
    run, so the run may start in it. A bench's runs get :func:`calibkit.bench.paths.placement`.
    """

    record: Callable[[dict], dict] = _as_is
    recorded: Callable[[dict], dict] = _as_is
    fresh: Callable[[Path], bool] = _never


class Evaluator(Protocol):
    """How a run is measured: after every epoch, and once with the kept weights at the end."""

    def validate(self, run: Run) -> dict:
        """The epoch's validation record (at least ``val_loss``, ``val_acc``, ``val_ece``)."""
        ...

    def finish(self, run: Run, out: Path, info: dict, log: Log) -> dict:
        """Evaluate the kept weights, write the logits and the final run record; the summary."""
        ...


@dataclass(kw_only=True)
class Run:
    """Everything one training run holds between epochs."""

    cfg: TrainConfig
    dd: D.Dist
    bundle: DataBundle
    inputs: ImageInputs | TokenInputs | FeatureInputs  # the bundle's pipeline (SegmentationInputs is an ImageInputs)
    model: nn.Module
    net: nn.Module  # model wrapped to return features too, then in DDP and torch.compile as configured
    loss_fn: nn.Module
    optimizer: torch.optim.Optimizer
    step: Standard  # Standard, Mixup, RegMixup or CSM (calibkit.train.steps)
    keeper: Keeper
    evaluator: Evaluator  # classification or per-pixel (segmentation), chosen by build_run
    train_x: torch.Tensor  # the training inputs, on the device
    train_y: torch.Tensor  # their targets, on the device
    train_y_cpu: torch.Tensor  # the same targets on the CPU, for host-side draws
    loss_params: list[nn.Parameter]  # the loss's own parameters (averaged by hand under DDP)
    history: list[dict[str, Any]] = field(default_factory=list)
    elapsed: float = 0.0
    start_epoch: int = 0
    kept: dict[str, torch.Tensor] | None = None  # the kept weights (on the CPU)
    kept_unsaved: bool = False  # kept since the last checkpoint: written with the next one
    val_logits: torch.Tensor | None = None  # the last validation pass's logits (classification)
    kept_val_logits: torch.Tensor | None = None  # the kept weights' (None after a resume)

    @property
    def kept_record(self) -> dict:
        return self.history[self.keeper.epoch - 1] if self.keeper.epoch else {}
