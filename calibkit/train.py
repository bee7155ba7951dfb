"""The trainer: one readable loop from a :class:`TrainConfig` to a finished run directory.

``train(cfg, out_dir)`` loads the data, builds the model and the loss, and runs SGD with momentum
and weight decay under a multistep, cosine or one-cycle schedule, with gradient clipping (global
norm on the model's parameters), optional bfloat16 autocast, batched augmentation of uint8 images,
and one of four methods:

- ``standard``: the configured loss on the augmented batch;
- ``mixup``: soft-label cross-entropy on the Mixup batch (the configured loss must be ``ce``);
- ``regmixup``: the configured loss on the clean batch + soft cross-entropy on its Mixup copy,
  one concatenated forward, weight 1;
- ``csm``: the configured loss on the real batch + ``soft_l2`` on 2 generated images per real one
  (CSM's companion set), same augmentation, one concatenated forward, weight 1.

The best-validation-accuracy weights are kept; at the end their validation and test logits are
saved for post-hoc calibration. The run directory format is described in ``docs/design.md``.

Reproducibility and resume: every random stream (data order, augmentation, mixing, CSM draws,
the global torch/numpy/python RNGs) is reseeded at the start of each epoch from
``(seed, epoch, rank)``, and the learning rate is a pure function of the (fractional) epoch.
A checkpoint therefore needs only the model, optimizer and loss states and the bookkeeping, and
a run resumed from any epoch ends with exactly the weights of an uninterrupted one, also under DDP.
"""

from __future__ import annotations

import functools
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from tqdm import tqdm

from calibkit import distributed as D
from calibkit import rundir
from calibkit.config import METHODS, SCHEDULES, TrainConfig, load_config
from calibkit.rundir import load_logits, load_run, predict_logits

__all__ = ["TrainConfig", "load_config", "train", "learning_rate", "load_run", "load_logits",
           "predict_logits", "METHODS", "SCHEDULES"]


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


@torch.no_grad()
def _sharded_logits(model, split, mean, std, dd: D.Dist, batch_size: int) -> torch.Tensor:
    """Logits of a whole split; under DDP each rank computes a chunk and all ranks get every row."""
    idx, _ = D.eval_shard(len(split), dd)
    logits = predict_logits(model, split.images[idx], (mean, std), batch_size, dd.device)
    return D.gather_rows(logits.to(dd.device), len(split), dd).cpu()


def _prepare_run_dir(out: Path, cfg: TrainConfig) -> tuple[str, dict | None]:
    """Decide from what is on disk: ``("fresh", None)``, ``("resume", checkpoint)`` or ``("done", info)``.

    Refuses (``ValueError``) to touch a non-empty directory that is not a run, or a run made with a
    different config, so that results already written are never overwritten.
    """
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return "fresh", None
    if not out.is_dir():
        raise ValueError(f"out: {out} exists and is not a directory")
    if not (out / rundir.CONFIG).is_file():
        raise ValueError(f"out: {out} is not empty and holds no calibkit run; choose another directory")
    info = rundir.read_json(out / rundir.CONFIG)
    old = TrainConfig.from_dict(info.get("config", {}))
    diff = cfg.differences(old)
    if diff:
        raise ValueError(f"out: {out} holds a run with a different config (differs in: {', '.join(diff)}); "
                         "choose another directory")
    if info.get("status") == "done" and (out / rundir.LOGITS).is_file():
        return "done", info
    if (out / rundir.CHECKPOINT).is_file():
        return "resume", rundir.read_checkpoint(out / rundir.CHECKPOINT)
    return "fresh", None  # killed before the first epoch ended: nothing worth keeping yet


def _summary(info: dict) -> dict:
    keys = ("status", "epochs_done", "best_epoch", "best_val_acc", "test_acc", "test_ece", "wall_time_s")
    return {k: info.get(k) for k in keys}


def train(cfg: TrainConfig, out_dir, progress: bool = True, verbose: bool = True,
          stop_after_epoch: int | None = None) -> dict:
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

    Returns:
        A summary: status, epochs_done, best_epoch, best_val_acc, test_acc, test_ece, wall_time_s.
    """
    cfg.validate()
    out = Path(out_dir)
    dd = D.setup(cfg.device)
    # Flushed at once: under torchrun or a pipe, stdout is block-buffered and lines would lag by epochs.
    log = functools.partial(print, flush=True) if (verbose and dd.is_main) else (lambda *a, **k: None)
    try:
        # Everything heavy is imported here so that `import calibkit.train` stays cheap.
        from calibkit.data import augment, load, mixup, normalize, regmixup
        from calibkit.functional import ece, soft_cross_entropy, soft_l2
        from calibkit.losses import build
        from calibkit.models import MODELS

        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        if cfg.amp and dd.device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ValueError("amp: this GPU has no bfloat16 support; train without --amp")
        if cfg.model not in MODELS:
            raise ValueError(f"model: unknown model {cfg.model!r}; valid: {', '.join(MODELS)}")
        if cfg.batch_size % dd.world:
            raise ValueError(f"batch_size {cfg.batch_size} is the global batch; it must divide by the "
                             f"{dd.world} processes")

        # --- 1. What is on disk already: start, resume, or report a finished run. -----------------
        state, found = _prepare_run_dir(out, cfg)
        D.barrier(dd)  # every rank has read the directory before rank 0 writes into it
        if state == "done":
            log(f"{out}: run already finished ({found.get('epochs_done')} epochs); nothing to do")
            return _summary(found)

        # --- 2. Data, model, loss, optimizer: seeded, so every rank builds the same ones. ---------
        _reseed_globals(cfg.seed)
        bundle = load(cfg.data, data_dir=cfg.data_dir, seed=cfg.seed, val_size=cfg.val_size,
                      train_subset=cfg.train_subset)
        if len(bundle.val) == 0:
            raise ValueError("val_size: the validation split is empty; model selection needs one")
        K, dev, mean, std = bundle.num_classes, dd.device, bundle.mean, bundle.std
        model = MODELS[cfg.model](num_classes=K, in_channels=bundle.in_channels).to(dev)
        loss_fn = build(cfg.loss, num_classes=K).to(dev)
        needs_features = bool(getattr(loss_fn, "needs_features", False))
        if cfg.method == "mixup" and cfg.loss.split(":")[0].strip().lower() != "ce":
            raise ValueError(f"method mixup trains with soft-label cross-entropy; loss must be 'ce', got {cfg.loss!r}")
        mix_alpha = cfg.mix_alpha or (0.2 if cfg.method == "mixup" else 10.0 if K >= 100 else 20.0)
        companion = None
        if cfg.method == "csm":
            from calibkit.methods.csm.dataset import CSMCompanion

            companion = CSMCompanion(cfg.csm_data, K, cfg.seed)
        # The loss's own parameters (FeDLaS's gate) share the optimizer, lr, wd and schedule.
        loss_params = list(loss_fn.parameters())
        optimizer = torch.optim.SGD(list(model.parameters()) + loss_params, lr=cfg.lr,
                                    momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        net = _WithFeatures(model)
        if dd.enabled:
            net = nn.parallel.DistributedDataParallel(net, device_ids=[dev.index] if dev.type == "cuda" else None)
        amp_dtype = torch.bfloat16  # no loss scaling needed, on CPU and on recent GPUs

        start_epoch, best_acc, best_epoch, history, elapsed, best_state = 0, -1.0, 0, [], 0.0, None
        if state == "resume":
            try:
                model.load_state_dict(found["model"])
                optimizer.load_state_dict(found["optimizer"])
                loss_fn.load_state_dict(found["loss"])
            except (KeyError, RuntimeError, ValueError) as exc:
                raise ValueError(f"{out / rundir.CHECKPOINT}: does not match this config ({exc})") from exc
            start_epoch, best_acc, best_epoch = found["epoch"], found["best_val_acc"], found["best_epoch"]
            history, elapsed = found["history"], found["elapsed_s"]
            best_state = rundir.read_tensors(out / rundir.MODEL)
            log(f"{out}: resuming after epoch {start_epoch}/{cfg.epochs} (best val acc {best_acc:.2%} at epoch {best_epoch})")
        info = {"config": cfg.to_dict(), "status": "running", "num_classes": K,
                "in_channels": bundle.in_channels, "mean": list(map(float, mean)), "std": list(map(float, std)),
                "class_names": list(bundle.class_names), "split": bundle.split,
                "world_size": dd.world, "device": str(dev), **rundir.environment()}
        if dd.is_main:
            out.mkdir(parents=True, exist_ok=True)
            rundir.write_json(out / rundir.CONFIG, info)

        train_x, train_y = bundle.train.images.to(dev), bundle.train.labels.to(dev)
        crop_pad, hflip = (bundle.crop_pad, bundle.hflip) if cfg.augment else (0, False)
        b = cfg.batch_size // dd.world  # per-process batch; the global batch is cfg.batch_size
        steps = (-(-len(train_y) // dd.world)) // b  # full batches only (drop_last), equal on every rank
        if steps == 0:
            raise ValueError(f"batch_size {cfg.batch_size} exceeds the {len(train_y)} training images")

        # --- 3. The epochs. -------------------------------------------------------------------------
        for epoch in range(start_epoch, cfg.epochs):
            t0 = time.time()
            _reseed_globals(cfg.seed * 100_003 + epoch * 101 + dd.rank)
            order = D.train_shard(len(train_y), _epoch_rng(cfg.seed, epoch, 0, 0), dd).to(dev)
            aug_gen = _epoch_rng(cfg.seed, epoch, dd.rank, 1, dev)
            draw_gen = _epoch_rng(cfg.seed, epoch, dd.rank, 2)
            net.train()
            loss_fn.train()
            loss_sum = correct = seen = 0.0
            bar = tqdm(range(steps), desc=f"epoch {epoch + 1}/{cfg.epochs}", leave=False, dynamic_ncols=True,
                       disable=not (progress and dd.is_main and sys.stderr.isatty()))
            for step in bar:
                idx = order[step * b:(step + 1) * b]
                x = normalize(augment(train_x[idx], crop_pad, hflip, aug_gen), mean, std)
                y = train_y[idx]
                lr = learning_rate(cfg, epoch + step / steps)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                with torch.autocast(dev.type, dtype=amp_dtype, enabled=cfg.amp):
                    if cfg.method == "standard":
                        logits, feats = net(x)
                        loss = loss_fn(logits, y, feats if needs_features else None)
                        target = y
                    elif cfg.method == "mixup":
                        x_mix, soft = mixup(x, y, K, mix_alpha, aug_gen)
                        logits, _ = net(x_mix)
                        loss = soft_cross_entropy(logits, soft)
                        target = soft.argmax(1)
                    elif cfg.method == "regmixup":
                        x_cat, soft = regmixup(x, y, K, mix_alpha, aug_gen)
                        all_logits, feats = net(x_cat)
                        logits = all_logits[:b]
                        loss = (loss_fn(logits, y, feats[:b] if needs_features else None)
                                + soft_cross_entropy(all_logits[b:], soft[b:]))
                        target = y
                    else:  # csm: two generated images per real one, augmented like the real ones
                        gen_x, gen_soft = companion.draw(y.cpu(), draw_gen)
                        gen_x = normalize(augment(gen_x.to(dev), crop_pad, hflip, aug_gen), mean, std)
                        all_logits, feats = net(torch.cat([x, gen_x]))
                        logits = all_logits[:b]
                        loss = (loss_fn(logits, y, feats[:b] if needs_features else None)
                                + soft_l2(all_logits[b:], gen_soft.to(dev)))
                        target = y
                if not torch.isfinite(loss):
                    raise RuntimeError(f"loss is {loss.item()} at epoch {epoch + 1}, step {step + 1}; "
                                       f"lower the learning rate (lr {lr:.4g})")
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                D.average_grads(loss_params, dd)  # DDP averages the model's gradients, not the loss's
                if cfg.grad_clip > 0:
                    nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                optimizer.step()
                loss_sum += loss.item() * len(y)
                correct += (logits.argmax(1) == target).sum().item()
                seen += len(y)
                bar.set_postfix(loss=f"{loss_sum / seen:.4f}", acc=f"{correct / seen:.2%}", lr=f"{lr:.3g}")
            bar.close()
            loss_sum, correct, seen = D.all_reduce_sum([loss_sum, correct, seen], dd)

            # Validation: model selection, history, and AdaFocal's per-epoch update (same on every rank).
            model.eval()
            loss_fn.eval()
            val_logits = _sharded_logits(model, bundle.val, mean, std, dd, cfg.eval_batch_size)
            val_labels = bundle.val.labels
            val_acc = (val_logits.argmax(1) == val_labels).double().mean().item()
            val_nll = nn.functional.cross_entropy(val_logits.double(), val_labels).item()
            val_ece = float(ece(val_logits.softmax(1), val_labels, n_bins=15))
            if hasattr(loss_fn, "update"):
                loss_fn.update(val_logits.to(dev), val_labels.to(dev))
            elapsed += time.time() - t0
            history.append({"epoch": epoch + 1, "lr": lr, "train_loss": loss_sum / seen, "train_acc": correct / seen,
                            "val_loss": val_nll, "val_acc": val_acc, "val_ece": val_ece,
                            "time_s": time.time() - t0})
            improved = val_acc > best_acc
            if improved:
                best_acc, best_epoch = val_acc, epoch + 1
                best_state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
            if dd.is_main:  # best weights first, then the checkpoint that refers to them
                if improved:
                    rundir.write_tensors(out / rundir.MODEL, best_state)
                rundir.write_checkpoint(out / rundir.CHECKPOINT, {
                    "epoch": epoch + 1, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "loss": loss_fn.state_dict(), "best_val_acc": best_acc, "best_epoch": best_epoch,
                    "history": history, "elapsed_s": elapsed, "config": cfg.to_dict()})
                rundir.write_json(out / rundir.HISTORY, history)
            log(f"epoch {epoch + 1:>3}/{cfg.epochs}  loss {loss_sum / seen:.4f}  train acc {correct / seen:6.2%}  "
                f"val acc {val_acc:6.2%}  val ECE {100 * val_ece:5.2f}  lr {lr:.4g}  "
                f"{time.time() - t0:5.1f}s{'  *best' if improved else ''}")
            if stop_after_epoch is not None and epoch + 1 >= stop_after_epoch and epoch + 1 < cfg.epochs:
                info.update(epochs_done=epoch + 1, best_epoch=best_epoch, best_val_acc=best_acc, wall_time_s=elapsed)
                return _summary(info)

        # --- 4. The selected weights: their validation and test logits, for post-hoc calibration. -
        model.load_state_dict(best_state)
        model.eval()
        val_logits = _sharded_logits(model, bundle.val, mean, std, dd, cfg.eval_batch_size)
        test_logits = _sharded_logits(model, bundle.test, mean, std, dd, cfg.eval_batch_size)
        test_acc = (test_logits.argmax(1) == bundle.test.labels).double().mean().item() if len(bundle.test) else None
        test_ece = float(ece(test_logits.softmax(1), bundle.test.labels, n_bins=15)) if len(bundle.test) else None
        info.update(status="done", epochs_done=cfg.epochs, best_epoch=best_epoch, best_val_acc=best_acc,
                    test_acc=test_acc, test_ece=test_ece, wall_time_s=elapsed)
        if dd.is_main:
            rundir.write_tensors(out / rundir.LOGITS, {"val_logits": val_logits, "val_labels": bundle.val.labels,
                                                      "test_logits": test_logits, "test_labels": bundle.test.labels})
            rundir.write_json(out / rundir.CONFIG, info)
        log(f"done: best val acc {best_acc:.2%} (epoch {best_epoch}), test acc {test_acc:.2%}, "
            f"test ECE {100 * test_ece:.2f}, {elapsed:.0f}s -> {out}")
        return _summary(info)
    finally:
        D.teardown(dd)
