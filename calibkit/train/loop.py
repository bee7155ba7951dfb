"""The training loop: from a :class:`TrainConfig` to a finished run directory.

``train(cfg, out_dir)`` loads the data, builds the model and the loss, and runs SGD with momentum (or Adam)
and weight decay under a multistep, cosine or one-cycle schedule, with gradient clipping (global
norm on the model's parameters), optional bfloat16 autocast and optional ``torch.compile``. How a
batch becomes model inputs is the modality's input pipeline (:mod:`calibkit.data.inputs`); how it
becomes a loss is the method's step (:mod:`calibkit.train.steps`); which epoch's weights are kept
is the checkpoint policy ``cfg.keep`` (:mod:`calibkit.train.keep`). At the end the kept weights'
validation and test logits are saved for post-hoc calibration (run directory: ``docs/design.md``).

No host synchronisation per step: the loss sum, the correct count and the first non-finite loss
are accumulated on the device and read once per epoch; the losses' input checks that read tensor
values run on the first batch of every epoch and are skipped for the others
(:func:`calibkit._validation.trusted_inputs`). A non-finite loss still stops training with an
error naming its epoch and step (after that epoch; no checkpoint of it is written).

Reproducibility and resume: every random stream (data order, augmentation, mixing, CSM draws,
the global torch/numpy/python RNGs) is reseeded at the start of each epoch from
``(seed, epoch, rank)``, and the learning rate is a pure function of the (fractional) epoch.
A checkpoint therefore needs only the model, optimizer and loss states and the bookkeeping, and
a run resumed from any epoch ends with exactly the weights of an uninterrupted one, also under DDP.
"""

from __future__ import annotations

import contextlib
import functools
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn as nn
from tqdm import tqdm

from calibkit import _validation, rundir
from calibkit import distributed as D
from calibkit.config import TrainConfig
from calibkit.errors import UserError, UserRuntimeError
from calibkit.train import preempt
from calibkit.train.keep import Keeper
from calibkit.train.optim import build_optimizer, set_lr
from calibkit.train.schedule import learning_rate
from calibkit.train.steps import EpochGenerators, EpochSums, Standard, build_step

if TYPE_CHECKING:
    from calibkit.data.bundle import DataBundle
    from calibkit.data.inputs import FeatureInputs, ImageInputs, TokenInputs


class _WithFeatures(nn.Module):
    """``x -> (logits, features)`` in one ``forward``, so DDP sees (and synchronises) the call."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        features = self.model.forward_features(x)
        return self.model.head(features), features


def _epoch_rng(seed: int, epoch: int, rank: int, stream: int, device="cpu") -> torch.Generator:
    """An independent generator for one (seed, epoch, rank, stream): resumable without saved state."""
    state = np.random.SeedSequence([seed, epoch, rank, stream]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator(device=device).manual_seed(int(state) & (2**63 - 1))


def _reseed_globals(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _prepare_run_dir(out: Path, cfg: TrainConfig, main: bool = True, root=None) -> tuple[str, dict | None]:
    """Decide from what is on disk: ``("fresh", None)``, ``("resume", checkpoint)`` or ``("done", info)``.

    Refuses (``ValueError``) to touch a non-empty directory that is not a run, or a run made with a
    different config that has completed an epoch, so that results already written are never
    overwritten. A run of another config that ended before its first epoch (no ``history.json``,
    checkpoint or weights: e.g. a learning rate that diverged at once) holds nothing worth keeping
    and starts again with the new config (it says so). A directory holding only the record of a
    scheduler's attempt that ended before training wrote anything (:func:`calibkit.rundir.only_records`)
    is calibkit's and starts fresh. With ``root`` (the bench directory), the configs' paths are
    compared in the form recorded under it (:func:`calibkit.rundir.rooted`), so a moved bench
    directory resumes its runs.
    """
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return "fresh", None
    if not out.is_dir():
        raise UserError(f"out: {out} exists and is not a directory")
    if not (out / rundir.CONFIG).is_file():
        if rundir.only_records(out):
            if main:
                print(f"{out}: holds only the record of an attempt that ended before training started; "
                      "starting the run", file=sys.stderr, flush=True)
            return "fresh", None
        raise UserError(f"out: {out} is not empty and holds no calibkit run; choose another directory")
    info = rundir.read_json(out / rundir.CONFIG)
    old = TrainConfig.from_dict(info.get("config", {}))
    if root is not None:
        old = TrainConfig.from_dict(rundir.rooted_config(old.to_dict(), root, recorded=True))
        cfg = TrainConfig.from_dict(rundir.rooted_config(cfg.to_dict(), root))
    diff = cfg.differences(old)
    if diff and not any((out / name).exists() for name in (rundir.HISTORY, rundir.CHECKPOINT, rundir.MODEL)):
        if main:  # one line, from one rank
            print(f"{out}: the run there (config differs in: {', '.join(diff)}) ended before completing an epoch; "
                  "starting it again with this config", file=sys.stderr, flush=True)
        return "fresh", None
    if diff:
        raise UserError(f"out: {out} holds a run with a different config (differs in: {', '.join(diff)}) that "
                         "has completed at least one epoch; choose another directory (a run that has not "
                         "completed an epoch may be restarted with a new config)")
    if info.get("status") == "done" and (out / rundir.LOGITS).is_file():
        return "done", info
    if (out / rundir.CHECKPOINT).is_file():
        return "resume", rundir.read_checkpoint(out / rundir.CHECKPOINT)
    return "fresh", None  # killed before the first epoch ended: nothing worth keeping yet


def _summary(info: dict) -> dict:
    keys = ("status", "epochs_done", "best_epoch", "best_val_acc", "test_acc", "test_ece", "wall_time_s")
    return {k: info.get(k) for k in keys}


@dataclass
class _Run:
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
    train_x: torch.Tensor  # the training inputs, on the device
    train_y: torch.Tensor  # their targets, on the device
    train_y_cpu: torch.Tensor  # the same targets on the CPU, for host-side draws
    loss_params: list  # the loss's own parameters (averaged by hand under DDP)
    history: list = field(default_factory=list)
    elapsed: float = 0.0
    start_epoch: int = 0
    kept: dict | None = None  # the kept weights (on the CPU)
    kept_unsaved: bool = False  # kept since the last checkpoint: written with the next one
    val_logits: torch.Tensor | None = None  # the last validation pass's logits
    kept_val_logits: torch.Tensor | None = None  # the kept weights' (None after a resume)

    @property
    def kept_record(self) -> dict:
        return self.history[self.keeper.epoch - 1] if self.keeper.epoch else {}


def _check_modality(cfg: TrainConfig, modality: str, kind: str) -> None:
    """Refuse a model that cannot read the data, and input-mixing methods on token ids."""
    if (kind == "tokens") != (modality == "text"):
        takes = "token ids (text)" if kind == "tokens" else "images"
        raise UserError(f"model: {cfg.model} takes {takes}, but data set {cfg.data} is {modality}; "
                         f"choose a {'text' if modality == 'text' else 'image'} model")
    if modality == "text" and cfg.method != "standard":
        raise UserError(f"method: {cfg.method} mixes or generates input images; text data (token ids) "
                         "trains with method standard only")


def _build(cfg: TrainConfig, dd: D.Dist, resume: dict | None, out: Path, log) -> _Run:
    """Data, model, loss, optimizer and step: seeded, so every rank builds the same ones."""
    from calibkit import losses
    from calibkit.data import load
    from calibkit.data.inputs import inputs_for
    from calibkit.models import MODELS, input_kind, resolve

    try:
        builder = resolve(cfg.model)
    except ValueError as exc:
        raise UserError(f"model: {exc}") from None
    _reseed_globals(cfg.seed)
    bundle = load(cfg.data, data_dir=cfg.data_dir, seed=cfg.seed, val_size=cfg.val_size,
                  train_subset=cfg.train_subset)
    if len(bundle.val) == 0:
        raise UserError("val_size: the validation split is empty; model selection needs one")
    if (-(-len(bundle.train) // dd.world)) // (cfg.batch_size // dd.world) == 0:
        raise UserError(f"batch_size {cfg.batch_size} exceeds the {len(bundle.train)} training images")
    K, dev = bundle.num_classes, dd.device
    if cfg.model in MODELS:  # known before building (an image model on a vocabulary would be huge)
        _check_modality(cfg, bundle.modality, input_kind(builder))
    model = builder(num_classes=K, in_channels=bundle.in_channels).to(dev)
    _check_modality(cfg, bundle.modality, input_kind(model))
    if cfg.channels_last:  # conv outputs follow the weights' layout; inputs need no conversion
        model = model.to(memory_format=torch.channels_last)
    if bool(getattr(model, "dense", False)) != (bundle.modality == "segmentation"):
        from calibkit.models import DENSE_MODELS

        kind = "segmentation data needs a dense model" if bundle.modality == "segmentation" else \
            f"{bundle.modality} data needs a classifier, not a dense model"
        raise UserError(f"model: {cfg.model!r} does not fit data {cfg.data!r}: {kind} "
                         f"(dense models: {', '.join(sorted(DENSE_MODELS))})")
    loss_fn = losses.build(cfg.loss, num_classes=K).to(dev)
    inputs = inputs_for(bundle, cfg.augment)
    step = build_step(cfg, loss_fn, K, inputs, cfg.seed)
    # The loss's own parameters (FeDLaS's gate) share the optimizer, lr, wd and schedule; a pretrained
    # backbone trains as cfg.finetune says, at cfg.backbone_lr_scale x lr (calibkit.train.optim).
    optimizer = build_optimizer(cfg, model, loss_fn)
    net: nn.Module = _WithFeatures(model)
    if dd.enabled:
        net = nn.parallel.DistributedDataParallel(net, device_ids=[dev.index] if dev.type == "cuda" else None)
    if cfg.compile:
        net = torch.compile(net)  # type: ignore[assignment]  # returns an nn.Module for a module; typed as a callable
    run = _Run(cfg, dd, bundle, inputs, model, net, loss_fn, optimizer, step, Keeper(cfg.keep),
               train_x=bundle.train.images.to(dev), train_y=bundle.train.labels.to(dev),
               train_y_cpu=bundle.train.labels, loss_params=list(loss_fn.parameters()))
    if resume is not None:
        try:
            model.load_state_dict(resume["model"])
            optimizer.load_state_dict(resume["optimizer"])
            loss_fn.load_state_dict(resume["loss"])
        except (KeyError, RuntimeError, ValueError) as exc:
            raise UserError(f"{out / rundir.CHECKPOINT}: does not match this config ({exc})") from exc
        # Checkpoints written before the policy was recorded kept the best validation accuracy.
        legacy = {"score": resume.get("best_val_acc"), "epoch": resume.get("best_epoch")}
        run.keeper = Keeper(cfg.keep, resume.get("keep") or legacy)
        run.start_epoch, run.history, run.elapsed = resume["epoch"], resume["history"], resume["elapsed_s"]
        run.kept = rundir.read_tensors(out / rundir.MODEL)
        log(f"{out}: resuming after epoch {run.start_epoch}/{cfg.epochs} (kept: epoch {run.keeper.epoch}, "
            f"policy {cfg.keep})")
    return run


def _train_epoch(run: _Run, epoch: int, progress: bool) -> dict:
    cfg, dd, dev = run.cfg, run.dd, run.dd.device
    train = run.bundle.train
    b = cfg.batch_size // dd.world  # per-process batch; the global batch is cfg.batch_size
    steps = (-(-len(train) // dd.world)) // b  # full batches only (drop_last), equal on every rank
    _reseed_globals(cfg.seed * 100_003 + epoch * 101 + dd.rank)
    order = D.train_shard(len(train), _epoch_rng(cfg.seed, epoch, 0, 0), dd)
    order_dev = order.to(dev)
    gens = EpochGenerators(aug=_epoch_rng(cfg.seed, epoch, dd.rank, 1, dev),
                           draw=_epoch_rng(cfg.seed, epoch, dd.rank, 2))
    run.net.train()
    run.loss_fn.train()
    sums = EpochSums(steps, dev)
    y_cpu = run.train_y_cpu[order]  # host-side targets in this epoch's order (CSM's draws)
    # autocast only when asked: entering even a disabled context costs host time every step
    amp = functools.partial(torch.autocast, dev.type, dtype=torch.bfloat16) if cfg.amp else contextlib.nullcontext
    bar = tqdm(range(steps), desc=f"epoch {epoch + 1}/{cfg.epochs}", leave=False, dynamic_ncols=True,
               disable=not (progress and dd.is_main and sys.stderr.isatty()))
    for step in bar:
        idx = order_dev[step * b:(step + 1) * b]
        x, y = run.inputs.train_batch(run.train_x[idx], run.train_y[idx], gens.aug)
        lr = learning_rate(cfg, epoch + step / steps)
        set_lr(run.optimizer, lr)
        # The losses check their inputs' values on the first batch of the epoch only.
        checks = _validation.trusted_inputs() if step else contextlib.nullcontext()
        with amp(), checks:
            loss, logits, target = run.step(run.net, x, y, y_cpu[step * b:(step + 1) * b], gens)
        sums.add(step, loss, logits, target)
        run.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        D.average_grads(run.loss_params, dd)  # DDP averages the model's gradients, not the loss's
        if cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(run.model.parameters(), cfg.grad_clip)
        run.optimizer.step()
        if not bar.disable and step % 20 == 0:  # reading the sums is a host sync: only for the bar
            loss_sum, correct, seen, _, _ = sums.read()
            bar.set_postfix(loss=f"{loss_sum / seen:.4f}", acc=f"{correct / seen:.2%}")
    bar.close()
    loss_sum, correct, seen, first_bad, bad_value = sums.read()
    loss_sum, correct, seen, bad = D.all_reduce_sum([loss_sum, correct, seen, float(first_bad >= 0)], dd)
    if bad:
        where = f"step {first_bad + 1}" if first_bad >= 0 else "a step of another process"
        raise UserRuntimeError(f"loss is {bad_value if first_bad >= 0 else 'not finite'} at epoch {epoch + 1}, "
                               f"{where}; lower the learning rate "
                               f"(lr {learning_rate(cfg, epoch + max(first_bad, 0) / steps):.4g})")
    return {"lr": lr, "train_loss": loss_sum / seen, "train_acc": correct / seen}


@torch.no_grad()
def _logits(run: _Run, split) -> torch.Tensor:
    """Logits of a whole split; under DDP each rank computes a chunk and all ranks get every row."""
    idx, _ = D.eval_shard(len(split), run.dd)
    images = split.images[idx] if run.dd.enabled else split.images  # one process: every row in order, no copy
    logits = rundir.predict_logits(run.model, images, run.inputs, run.cfg.eval_batch_size, run.dd.device)
    return D.gather_rows(logits.to(run.dd.device), len(split), run.dd).cpu()


def _validate(run: _Run) -> dict:
    """Validation accuracy, NLL and ECE (15 bins); AdaFocal's per-epoch update (same on every rank)."""
    from calibkit.functional import ece

    if getattr(run.inputs, "dense", False):  # per pixel, streamed: calibkit.train.dense
        from calibkit.train.dense import validate_dense

        return validate_dense(run)

    run.model.eval()
    run.loss_fn.eval()
    logits, labels = _logits(run, run.bundle.val), run.bundle.val.labels
    run.val_logits = logits
    update = getattr(run.loss_fn, "update", None)  # AdaFocal's per-epoch update of its gammas
    if update is not None:
        update(logits.to(run.dd.device), labels.to(run.dd.device))
    return {"val_loss": nn.functional.cross_entropy(logits.double(), labels).item(),
            "val_acc": (logits.argmax(1) == labels).double().mean().item(),
            "val_ece": float(ece(logits.softmax(1), labels, n_bins=15))}


def _end_epoch(run: _Run, out: Path, epoch: int, record: dict, force: bool = False) -> bool:
    """Record the epoch, offer its weights to the checkpoint policy, write the checkpoint.

    The checkpoint and the kept weights are written together, every ``cfg.checkpoint_every``
    epochs, after the last one and when ``force`` (a stop was requested); in between the kept
    weights wait in memory, so the two files always belong to the same epoch. ``history.json`` is
    written every epoch.
    """
    run.history.append(record)
    kept = run.keeper.offer(epoch + 1, record)
    if kept:
        run.kept = {k: v.detach().cpu().clone() for k, v in run.model.state_dict().items()}
        run.kept_unsaved = True
        run.kept_val_logits = run.val_logits  # the same weights' logits: _finish needs no new pass
    due = force or (epoch + 1) % run.cfg.checkpoint_every == 0 or epoch + 1 == run.cfg.epochs
    if run.dd.is_main and due:  # kept weights first, then the checkpoint that refers to them
        if run.kept_unsaved:
            assert run.kept is not None  # kept_unsaved: weights were kept this run
            rundir.write_tensors(out / rundir.MODEL, run.kept)
        rundir.write_checkpoint(out / rundir.CHECKPOINT, {
            "epoch": epoch + 1, "model": run.model.state_dict(), "optimizer": run.optimizer.state_dict(),
            "loss": run.loss_fn.state_dict(), "keep": run.keeper.state_dict(),
            "best_val_acc": run.kept_record.get("val_acc"), "best_epoch": run.keeper.epoch,
            "history": run.history, "elapsed_s": run.elapsed, "config": run.cfg.to_dict()})
    if run.dd.is_main:  # every epoch: what a user watching the run reads
        rundir.write_json(out / rundir.HISTORY, run.history)
    if due:
        run.kept_unsaved = False
    return kept


def _finish(run: _Run, out: Path, info: dict, log) -> dict:
    """The kept weights' validation and test logits, for post-hoc calibration; status done."""
    from calibkit.functional import ece

    if getattr(run.inputs, "dense", False):  # pixel samples and streamed test metrics instead
        from calibkit.train.dense import finish_dense

        return finish_dense(run, out, info, log, _summary)

    assert run.kept is not None  # every finished run has kept an epoch's weights
    run.model.load_state_dict(run.kept)
    run.model.eval()
    test = run.bundle.test
    # The kept epoch's validation pass computed the kept weights' logits, in the same batches;
    # a run resumed after that epoch computes them again.
    val_logits = run.kept_val_logits if run.kept_val_logits is not None else _logits(run, run.bundle.val)
    test_logits = _logits(run, test)
    test_acc = (test_logits.argmax(1) == test.labels).double().mean().item() if len(test) else None
    test_ece = float(ece(test_logits.softmax(1), test.labels, n_bins=15)) if len(test) else None
    info.update(status="done", epochs_done=run.cfg.epochs, best_epoch=run.keeper.epoch,
                best_val_acc=run.kept_record.get("val_acc"), test_acc=test_acc, test_ece=test_ece,
                wall_time_s=run.elapsed)
    if run.dd.is_main:
        rundir.write_tensors(out / rundir.LOGITS, {"val_logits": val_logits, "val_labels": run.bundle.val.labels,
                                                  "test_logits": test_logits, "test_labels": test.labels})
        rundir.write_json(out / rundir.CONFIG, info)
    tested = (f"test acc {test_acc:.2%}, test ECE {100 * test_ece:.2f}"
              if test_acc is not None and test_ece is not None else "test acc n/a, test ECE n/a")
    log(f"done: kept epoch {run.keeper.epoch} ({run.cfg.keep}; val acc {info['best_val_acc']:.2%}), "
        f"{tested}, {run.elapsed:.0f}s -> {out}")
    return _summary(info)


def train(cfg: TrainConfig, out_dir, progress: bool = True, verbose: bool = True,
          stop_after_epoch: int | None = None, root=None) -> dict:
    """Train ``cfg`` into ``out_dir`` (resuming it if it holds an unfinished run of the same config).

    Under ``torchrun`` every process calls this; the data are sharded, metrics and logits are
    gathered, and only rank 0 writes files or prints.

    Args:
        cfg: the training configuration.
        out_dir: the run directory (created; see ``docs/design.md`` for its files).
        progress: show a tqdm bar per epoch (only on a terminal, only on rank 0).
        verbose: print one summary line per epoch.
        stop_after_epoch: end this call after that epoch (1-based), leaving a resumable run with
            status ``"running"`` -- what a killed run looks like; the next call continues it.
        root: the bench directory the run belongs to (None: none): ``config.json`` records the
            config's paths inside it relative to it (:func:`calibkit.rundir.rooted`), so the
            directory can be moved or copied and its runs still resume.

    Returns:
        A summary: status, epochs_done, best_epoch (the kept epoch), best_val_acc (its validation
        accuracy), test_acc, test_ece, wall_time_s.
    """
    cfg.validate()
    out = Path(out_dir)
    dd = D.setup(cfg.device)
    # Flushed at once: under torchrun or a pipe, stdout is block-buffered and lines would lag by epochs.
    log = functools.partial(print, flush=True) if (verbose and dd.is_main) else (lambda *a, **k: None)
    run = None
    try:
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        if cfg.amp and dd.device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise UserError("amp: this GPU has no bfloat16 support; train without --amp")
        if cfg.batch_size % dd.world:
            raise UserError(f"batch_size {cfg.batch_size} is the global batch; it must divide by the "
                             f"{dd.world} processes")
        state, found = _prepare_run_dir(out, cfg, dd.is_main, root)
        D.barrier(dd)  # every rank has read the directory before rank 0 writes into it
        if state == "done":
            assert found is not None  # "done" comes with the run's config.json
            log(f"{out}: run already finished ({found.get('epochs_done')} epochs); nothing to do")
            return _summary(found)
        if state == "resume" and dd.is_main and found is not None:  # always said: a resumed run is worth knowing about
            print(f"{out}: resuming after epoch {found['epoch']} ({rundir.CHECKPOINT})", flush=True)
        run = _build(cfg, dd, found if state == "resume" else None, out, log)
        bundle, dev = run.bundle, dd.device
        record = cfg.to_dict() if root is None else rundir.rooted_config(cfg.to_dict(), root)
        info = {"config": record, "status": "running", "num_classes": bundle.num_classes,
                "in_channels": bundle.in_channels, "mean": list(map(float, bundle.mean)),
                "std": list(map(float, bundle.std)), "class_names": list(bundle.class_names),
                "split": bundle.split, "modality": bundle.modality, "world_size": dd.world, "device": str(dev),
                **rundir.environment()}
        if dd.is_main:
            out.mkdir(parents=True, exist_ok=True)
            rundir.write_json(out / rundir.CONFIG, info)
            if bundle.vocab is not None:  # what turns text into this run's token ids
                rundir.write_json(out / rundir.VOCAB, bundle.vocab.to_dict())

        for epoch in range(run.start_epoch, cfg.epochs):
            t0 = time.time()
            record = {"epoch": epoch + 1, **_train_epoch(run, epoch, progress), **_validate(run)}
            run.elapsed += time.time() - t0
            record["time_s"] = time.time() - t0
            stop = preempt.agreed(dd) and epoch + 1 < cfg.epochs
            kept = _end_epoch(run, out, epoch, record, force=stop)
            log(f"epoch {epoch + 1:>3}/{cfg.epochs}  loss {record['train_loss']:.4f}  train acc "
                f"{record['train_acc']:6.2%}  val acc {record['val_acc']:6.2%}  "
                f"val ECE {100 * record['val_ece']:5.2f}  lr {record['lr']:.4g}  "
                f"{record['time_s']:5.1f}s{'  *kept' if kept else ''}")
            if stop:  # the checkpoint of this epoch is written: a later call resumes after it
                D.barrier(dd)
                log(f"stopped on request after epoch {epoch + 1}; the run resumes from {out / rundir.CHECKPOINT}")
                raise preempt.Preempted(epoch + 1, out)
            if stop_after_epoch is not None and epoch + 1 >= stop_after_epoch and epoch + 1 < cfg.epochs:
                info.update(epochs_done=epoch + 1, best_epoch=run.keeper.epoch,
                            best_val_acc=run.kept_record.get("val_acc"), wall_time_s=run.elapsed)
                return _summary(info)
        return _finish(run, out, info, log)
    finally:
        del run  # the DDP wrapper goes before the process group (D.teardown)
        D.teardown(dd)
