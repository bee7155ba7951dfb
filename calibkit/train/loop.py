"""The training loop: from a :class:`TrainConfig` to a finished run directory.

``train(cfg, out_dir)`` loads the data, builds the model and the loss, and runs SGD with momentum (or Adam)
and weight decay under a multistep, cosine or one-cycle schedule, with gradient clipping (global
norm on the model's parameters), optional bfloat16 autocast and optional ``torch.compile``. How a
batch becomes model inputs is the modality's input pipeline (:mod:`calibkit.data.inputs`); how it
becomes a loss is the method's step (:mod:`calibkit.train.steps`); which epoch's weights are kept
is the checkpoint policy ``cfg.keep`` (:mod:`calibkit.train.keep`). At the end the kept weights'
validation and test logits are saved for post-hoc calibration (run directory: ``docs/design.md``).

This module is the epoch loop; the run it carries is built by :func:`calibkit.train.run.build_run`
(a typed :class:`calibkit.train.state.Run`), and measured by the evaluator chosen there
(:mod:`calibkit.train.evaluate`, or :mod:`calibkit.train.dense` for segmentation).

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
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from tqdm import tqdm

from calibkit import _validation, rundir
from calibkit import distributed as D
from calibkit.config import TrainConfig
from calibkit.errors import UserError, UserRuntimeError
from calibkit.train import preempt
from calibkit.train.evaluate import summary
from calibkit.train.optim import set_lr
from calibkit.train.run import build_run, reseed_globals
from calibkit.train.schedule import learning_rate
from calibkit.train.state import Log, Placement, Run
from calibkit.train.steps import EpochGenerators, EpochSums


def _epoch_rng(seed: int, epoch: int, rank: int, stream: int, device="cpu") -> torch.Generator:
    """An independent generator for one (seed, epoch, rank, stream): resumable without saved state."""
    state = np.random.SeedSequence([seed, epoch, rank, stream]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator(device=device).manual_seed(int(state) & (2**63 - 1))


def _prepare_run_dir(out: Path, cfg: TrainConfig, main: bool = True,
                     place: Placement | None = None) -> tuple[str, dict | None]:
    """Decide from what is on disk: ``("fresh", None)``, ``("resume", checkpoint)`` or ``("done", info)``.

    Refuses (``ValueError``) to touch a non-empty directory that is not a run, or a run made with a
    different config that has completed an epoch, so that results already written are never
    overwritten. A run of another config that ended before its first epoch (no ``history.json``,
    checkpoint or weights: e.g. a learning rate that diverged at once) holds nothing worth keeping
    and starts again with the new config (it says so). A directory the placement calls ``fresh``
    (a bench's: one holding only the record of a scheduler's attempt that ended before training
    wrote anything, :func:`calibkit.bench.paths.only_records`) starts fresh. The configs are
    compared in the form the placement records (a bench's: paths inside the bench directory
    relative to it, :func:`calibkit.bench.paths.rooted`), so a moved bench directory resumes its runs.
    """
    place = place or Placement()
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return "fresh", None
    if not out.is_dir():
        raise UserError(f"out: {out} exists and is not a directory")
    if not (out / rundir.CONFIG).is_file():
        if place.fresh(out):
            if main:
                print(f"{out}: holds only the record of an attempt that ended before training started; "
                      "starting the run", file=sys.stderr, flush=True)
            return "fresh", None
        raise UserError(f"out: {out} is not empty and holds no calibkit run; choose another directory")
    info = rundir.read_json(out / rundir.CONFIG)
    old = TrainConfig.from_dict(place.recorded(TrainConfig.from_dict(info.get("config", {})).to_dict()))
    cfg = TrainConfig.from_dict(place.record(cfg.to_dict()))
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


def _train_epoch(run: Run, epoch: int, progress: bool) -> dict:
    cfg, dd, dev = run.cfg, run.dd, run.dd.device
    train = run.bundle.train
    b = cfg.batch_size // dd.world  # per-process batch; the global batch is cfg.batch_size
    steps = (-(-len(train) // dd.world)) // b  # full batches only (drop_last), equal on every rank
    reseed_globals(cfg.seed * 100_003 + epoch * 101 + dd.rank)
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


def _end_epoch(run: Run, out: Path, epoch: int, record: dict, force: bool = False) -> bool:
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
        run.kept_val_logits = run.val_logits  # the same weights' logits: finish needs no new pass
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


def train(cfg: TrainConfig, out_dir, progress: bool = True, verbose: bool = True,
          stop_after_epoch: int | None = None, place: Placement | None = None) -> dict:
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
        place: what the directory the run sits in asks of it (:class:`calibkit.train.state.Placement`;
            None: nothing): a bench's runs (:func:`calibkit.bench.paths.placement`) record the
            config's paths inside the bench directory relative to it, so the directory can be moved
            or copied and its runs still resume, and start in a run directory holding only the
            records of their scheduler's earlier attempts (without it, such a directory is refused
            as any directory that holds no run).

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
        _check_process(cfg, dd)
        state, found = _prepare_run_dir(out, cfg, dd.is_main, place)
        D.barrier(dd)  # every rank has read the directory before rank 0 writes into it
        if state == "done":
            assert found is not None  # "done" comes with the run's config.json
            log(f"{out}: run already finished ({found.get('epochs_done')} epochs); nothing to do")
            return summary(found)
        if state == "resume" and dd.is_main and found is not None:  # always said: a resumed run is worth knowing about
            print(f"{out}: resuming after epoch {found['epoch']} ({rundir.CHECKPOINT})", flush=True)
        run = build_run(cfg, dd, found if state == "resume" else None, out, log)
        info = _start_record(run, out, place or Placement())
        return _epochs(run, out, info, log, progress, stop_after_epoch)
    finally:
        del run  # the DDP wrapper goes before the process group (D.teardown)
        D.teardown(dd)


def _check_process(cfg: TrainConfig, dd: D.Dist) -> None:
    """Set the thread count; refuse bfloat16 on a GPU without it and a batch the processes cannot share."""
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    if cfg.amp and dd.device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UserError("amp: this GPU has no bfloat16 support; train without --amp")
    if cfg.batch_size % dd.world:
        raise UserError(f"batch_size {cfg.batch_size} is the global batch; it must divide by the "
                         f"{dd.world} processes")


def _start_record(run: Run, out: Path, place: Placement) -> dict:
    """The run record of a started run (``config.json``, status running), written with the vocabulary."""
    cfg, dd, bundle = run.cfg, run.dd, run.bundle
    record = place.record(cfg.to_dict())
    info = {"config": record, "status": "running", "num_classes": bundle.num_classes,
            "in_channels": bundle.in_channels, "mean": list(map(float, bundle.mean)),
            "std": list(map(float, bundle.std)), "class_names": list(bundle.class_names),
            "split": bundle.split, "modality": bundle.modality, "world_size": dd.world, "device": str(dd.device),
            **rundir.environment()}
    if dd.is_main:
        out.mkdir(parents=True, exist_ok=True)
        rundir.write_json(out / rundir.CONFIG, info)
        if bundle.vocab is not None:  # what turns text into this run's token ids
            rundir.write_json(out / rundir.VOCAB, bundle.vocab.to_dict())
    return info


def _epochs(run: Run, out: Path, info: dict, log: Log, progress: bool, stop_after_epoch: int | None) -> dict:
    """The epochs left to train, then the kept weights' evaluation; the summary.

    Ends early (the summary so far, status running) after ``stop_after_epoch``, and raises
    :class:`calibkit.train.preempt.Preempted` after an epoch during which a stop was requested.
    """
    cfg, dd = run.cfg, run.dd
    for epoch in range(run.start_epoch, cfg.epochs):
        t0 = time.time()
        record = {"epoch": epoch + 1, **_train_epoch(run, epoch, progress), **run.evaluator.validate(run)}
        record["time_s"] = time.time() - t0  # one reading: the run's wall time is the sum of its epochs'
        run.elapsed += record["time_s"]
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
            return summary(info)
    return run.evaluator.finish(run, out, info, log)
