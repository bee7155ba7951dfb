"""How a training run is built from a :class:`TrainConfig`.

:func:`build_run` loads the data and builds the model, the loss, the input pipeline, the method's
step, the optimizer and the evaluator, seeded so that every DDP rank builds the same ones, and
restores a checkpoint's state when the run resumes. The result is a
:class:`~calibkit.train.state.Run`, which the epoch loop (:mod:`calibkit.train.loop`) carries from
epoch to epoch.

The evaluator is chosen here, once: a segmentation run (its input pipeline is
:class:`~calibkit.data.inputs.SegmentationInputs`) is measured per pixel and streamed
(:class:`calibkit.train.dense.DenseEvaluator`), every other run on its logits
(:class:`calibkit.train.evaluate.ClassificationEvaluator`). Nothing after the build asks which
kind of run it is.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn as nn

import calibkit.data  # calibkit.data.load read at each call, so a replaced loader is the one used
from calibkit import distributed as D
from calibkit import losses, rundir
from calibkit.config import TrainConfig
from calibkit.data.inputs import SegmentationInputs, inputs_for
from calibkit.errors import UserError
from calibkit.models import DENSE_MODELS, MODELS, input_kind, resolve
from calibkit.train.dense import DenseEvaluator
from calibkit.train.evaluate import ClassificationEvaluator
from calibkit.train.keep import Keeper
from calibkit.train.optim import build_optimizer
from calibkit.train.state import Evaluator, Log, Run
from calibkit.train.steps import build_step

if TYPE_CHECKING:
    from calibkit.data.bundle import DataBundle
    from calibkit.data.inputs import FeatureInputs, ImageInputs, TokenInputs

class WithFeatures(nn.Module):
    """``x -> (logits, features)`` in one ``forward``, so DDP sees (and synchronises) the call."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        features = self.model.forward_features(x)
        return self.model.head(features), features


def reseed_globals(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def check_modality(cfg: TrainConfig, modality: str, kind: str) -> None:
    """Refuse a model that cannot read the data, and input-mixing methods on token ids."""
    if (kind == "tokens") != (modality == "text"):
        takes = "token ids (text)" if kind == "tokens" else "images"
        raise UserError(f"model: {cfg.model} takes {takes}, but data set {cfg.data} is {modality}; "
                         f"choose a {'text' if modality == 'text' else 'image'} model")
    if modality == "text" and cfg.method != "standard":
        raise UserError(f"method: {cfg.method} mixes or generates input images; text data (token ids) "
                         "trains with method standard only")


def _check_dense(cfg: TrainConfig, model: nn.Module, modality: str) -> None:
    """A dense (segmentation) model for segmentation data, a classifier for every other data set."""
    if bool(getattr(model, "dense", False)) != (modality == "segmentation"):
        kind = "segmentation data needs a dense model" if modality == "segmentation" else \
            f"{modality} data needs a classifier, not a dense model"
        raise UserError(f"model: {cfg.model!r} does not fit data {cfg.data!r}: {kind} "
                         f"(dense models: {', '.join(sorted(DENSE_MODELS))})")


def _load_data(cfg: TrainConfig, dd: D.Dist) -> DataBundle:
    """The config's data set and split, refused when it cannot train (no validation, too few images)."""
    bundle = calibkit.data.load(cfg.data, data_dir=cfg.data_dir, seed=cfg.seed, val_size=cfg.val_size,
                                train_subset=cfg.train_subset)
    if len(bundle.val) == 0:
        raise UserError("val_size: the validation split is empty; model selection needs one")
    if (-(-len(bundle.train) // dd.world)) // (cfg.batch_size // dd.world) == 0:
        raise UserError(f"batch_size {cfg.batch_size} exceeds the {len(bundle.train)} training images")
    return bundle


def _resolve(cfg: TrainConfig) -> Callable[..., nn.Module]:
    """The builder of ``cfg.model`` (a name of ``MODELS`` or ``module:function``)."""
    try:
        return resolve(cfg.model)
    except ValueError as exc:
        raise UserError(f"model: {exc}") from None


def _build_model(cfg: TrainConfig, builder: Callable[..., nn.Module], bundle: DataBundle,
                 device: torch.device) -> nn.Module:
    """The config's model for the data's classes and channels, checked against the data's modality."""
    if cfg.model in MODELS:  # known before building (an image model on a vocabulary would be huge)
        check_modality(cfg, bundle.modality, input_kind(builder))
    model = builder(num_classes=bundle.num_classes, in_channels=bundle.in_channels).to(device)
    check_modality(cfg, bundle.modality, input_kind(model))
    if cfg.channels_last:  # conv outputs follow the weights' layout; inputs need no conversion
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # absent from the stubs
    _check_dense(cfg, model, bundle.modality)
    return model


def _wrap(cfg: TrainConfig, dd: D.Dist, model: nn.Module) -> nn.Module:
    """The model returning its features too, in DDP and compiled as configured."""
    dev = dd.device
    net: nn.Module = WithFeatures(model)
    if dd.enabled:
        net = nn.parallel.DistributedDataParallel(net, device_ids=[dev.index] if dev.type == "cuda" else None)
    if cfg.compile:
        net = torch.compile(net)  # type: ignore[assignment]  # returns an nn.Module for a module; typed as a callable
    return net


def _evaluator_for(inputs: ImageInputs | TokenInputs | FeatureInputs) -> Evaluator:
    """Per pixel for a segmentation pipeline, on whole logits for every other."""
    return DenseEvaluator(inputs) if isinstance(inputs, SegmentationInputs) else ClassificationEvaluator()


def build_run(cfg: TrainConfig, dd: D.Dist, resume: dict | None, out: Path, log: Log) -> Run:
    """Data, model, loss, optimizer, step and evaluator: seeded, so every rank builds the same ones.

    With ``resume`` (a checkpoint read from ``out``), the run continues from its state.
    """
    builder = _resolve(cfg)
    reseed_globals(cfg.seed)
    bundle = _load_data(cfg, dd)
    dev = dd.device
    model = _build_model(cfg, builder, bundle, dev)
    loss_fn = losses.build(cfg.loss, num_classes=bundle.num_classes).to(dev)
    inputs = inputs_for(bundle, cfg.augment)
    step = build_step(cfg, loss_fn, bundle.num_classes, inputs, cfg.seed)
    # The loss's own parameters (FeDLaS's gate) share the optimizer, lr, wd and schedule; a pretrained
    # backbone trains as cfg.finetune says, at cfg.backbone_lr_scale x lr (calibkit.train.optim).
    optimizer = build_optimizer(cfg, model, loss_fn)
    run = Run(cfg=cfg, dd=dd, bundle=bundle, inputs=inputs, model=model, net=_wrap(cfg, dd, model),
              loss_fn=loss_fn, optimizer=optimizer, step=step, keeper=Keeper(cfg.keep),
              evaluator=_evaluator_for(inputs), train_x=bundle.train.images.to(dev),
              train_y=bundle.train.labels.to(dev), train_y_cpu=bundle.train.labels,
              loss_params=list(loss_fn.parameters()))
    if resume is not None:
        _resume(run, resume, out, log)
    return run


def _resume(run: Run, checkpoint: dict, out: Path, log: Log) -> None:
    """Load a checkpoint's weights, optimizer, loss and policy states and its bookkeeping into ``run``."""
    cfg = run.cfg
    try:
        run.model.load_state_dict(checkpoint["model"])
        run.optimizer.load_state_dict(checkpoint["optimizer"])
        run.loss_fn.load_state_dict(checkpoint["loss"])
    except (KeyError, RuntimeError, ValueError) as exc:
        raise UserError(f"{out / rundir.CHECKPOINT}: does not match this config ({exc})") from exc
    # Checkpoints written before the policy was recorded kept the best validation accuracy.
    legacy = {"score": checkpoint.get("best_val_acc"), "epoch": checkpoint.get("best_epoch")}
    run.keeper = Keeper(cfg.keep, checkpoint.get("keep") or legacy)
    run.start_epoch, run.history, run.elapsed = checkpoint["epoch"], checkpoint["history"], checkpoint["elapsed_s"]
    run.kept = rundir.read_tensors(out / rundir.MODEL)
    log(f"{out}: resuming after epoch {run.start_epoch}/{cfg.epochs} (kept: epoch {run.keeper.epoch}, "
        f"policy {cfg.keep})")
