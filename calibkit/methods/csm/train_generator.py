"""Training loop of the CSM generator: EDM loss, Adam, EMA, class dropout, resumable checkpoints.

One readable function, :func:`train_generator`. The learning rate is constant after a short
warm-up, so the trajectory does not depend on the total step budget: a run of N steps is exactly
the first N steps of a longer run, and ``--steps`` can be raised later to continue training.
Every ``checkpoint_every`` steps the full state (weights, EMA, Adam, random-generator state, step,
accumulated wall time) is written atomically to ``train_state.pt`` and the EMA weights to
``generator.safetensors``, so the output directory is always a loadable generator.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import time
from pathlib import Path

import torch

from calibkit.errors import UserError
from calibkit.methods.csm.generator import (
    CondDenoiser,
    GeneratorConfig,
    edm_loss,
    save_generator,
    to_model_space,
)
from calibkit.methods.csm.inputs import as_image_tensors

STATE_NAME = "train_state.pt"
LOG_NAME = "train_log.jsonl"


@dataclasses.dataclass
class GeneratorTrainConfig:
    """Optimisation settings (recorded in ``generator.json`` and checked on resume)."""

    steps: int = 2000
    batch_size: int = 64
    seed: int = 0
    lr: float = 1e-3
    warmup_steps: int = 100
    ema_decay: float = 0.999
    p_uncond: float = 0.1  # fraction of samples trained with the zero class vector (guidance)
    grad_clip: float = 1.0


def _ema_decay(step: int, decay: float) -> float:
    # Short warm-up of the EMA so early checkpoints are not dominated by the random init.
    return min(decay, (1 + step) / (10 + step))


def _resume(state_path: Path, fingerprint: dict, model, ema, opt, gen: torch.Generator, device) -> tuple[int, float]:
    """Load the training state saved at ``state_path`` into the networks, the optimiser and the
    generator; refuse a state written with other settings. Returns ``(step, elapsed seconds)``."""
    state = torch.load(state_path, weights_only=True, map_location=device)
    saved = json.loads(state["fingerprint"])
    if saved != json.loads(json.dumps(fingerprint)):
        raise UserError(f"{state_path} was written with different settings: {saved}; "
                         "use a new --out directory or the same settings")
    model.load_state_dict(state["model"])
    ema.load_state_dict(state["ema"])
    opt.load_state_dict(state["opt"])
    gen.set_state(state["rng"].cpu())
    return int(state["step"]), float(state["elapsed"])


def _train_step(model, ema, opt, x_all: torch.Tensor, onehot: torch.Tensor, gen: torch.Generator,
                train_cfg: GeneratorTrainConfig, step: int) -> float:
    """One optimisation step on a random batch (the draws in a fixed order from ``gen``: batch,
    class dropout, then the EDM noise), then the EMA update. ``onehot``: ``(N, K)`` class vectors
    of the training images. Returns the batch's loss."""
    idx = torch.randint(x_all.shape[0], (train_cfg.batch_size,), generator=gen).to(x_all.device)
    y = onehot[idx]
    drop = (torch.rand(train_cfg.batch_size, generator=gen) < train_cfg.p_uncond).to(x_all.device)
    y[drop] = 0.0  # the zero vector is the unconditional input of classifier-free guidance
    for g in opt.param_groups:
        g["lr"] = train_cfg.lr * min(1.0, (step + 1) / max(1, train_cfg.warmup_steps))
    loss = edm_loss(model, x_all[idx], y, gen)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip)
    opt.step()
    d = _ema_decay(step, train_cfg.ema_decay)
    with torch.no_grad():
        for pe, pm in zip(ema.parameters(), model.parameters()):
            pe.lerp_(pm, 1 - d)
    return loss.item()


def train_generator(images, labels, out_dir, train_cfg: GeneratorTrainConfig,
                    gen_cfg: GeneratorConfig | None = None, checkpoint_every: int = 100,
                    extra_meta: dict | None = None, progress: bool = True, device="cpu") -> CondDenoiser:
    """Train (or resume) a class-conditional EDM generator and return its EMA copy.

    Args:
        images: training images (N, C, H, W), H = W = ``gen_cfg.data_size``, uint8 or float in
            [0, 1]; or a Dataset of ``(image, label)`` pairs (see
            :func:`~calibkit.methods.csm.inputs.as_image_tensors`).
        labels: integer class labels (N,); None when ``images`` is a Dataset.
        out_dir: output directory (created; resumed from ``train_state.pt`` if present).
        train_cfg: optimisation settings; ``train_cfg.steps`` is the total step count.
        gen_cfg: architecture; defaults to ``GeneratorConfig(num_classes=max(labels)+1, ...)``.
        checkpoint_every: steps between atomic checkpoints.
        extra_meta: recorded in ``generator.json`` (e.g. the command line, the data set name).
        progress: print one line every ``checkpoint_every`` steps.
        device: where the network and the data live (``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a
            ``torch.device``). The random draws (batches, noise, sigma, class dropout) come from
            one CPU generator whatever the device, so a run can resume on another device.

    Returns:
        The EMA network (on ``device``, eval mode).
    """
    images, labels = as_image_tensors(images, labels)
    if train_cfg.steps < 1 or train_cfg.batch_size < 1:
        raise UserError("steps and batch_size must be positive")
    if gen_cfg is None:
        gen_cfg = GeneratorConfig(num_classes=int(labels.max()) + 1, in_channels=images.shape[1],
                                  data_size=images.shape[2])
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    device = torch.device(device)
    torch.manual_seed(train_cfg.seed)  # weight initialisation (on the CPU, then moved)
    model = CondDenoiser(gen_cfg).to(device)
    ema = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.Adam(model.parameters(), lr=train_cfg.lr)
    gen = torch.Generator().manual_seed(train_cfg.seed)  # batches, noise, sigma, class dropout
    step, elapsed = 0, 0.0
    fingerprint = {"gen": dataclasses.asdict(gen_cfg), "train": {k: v for k, v in
                   dataclasses.asdict(train_cfg).items() if k != "steps"}}

    state_path = out_dir / STATE_NAME
    if state_path.exists():
        step, elapsed = _resume(state_path, fingerprint, model, ema, opt, gen, device)
        if progress:
            print(f"resuming from step {step} ({elapsed:.0f} s so far)", flush=True)

    x_all = to_model_space(images, gen_cfg).to(device)  # (N, C, S, S) float, padded once
    labels = labels.to(device)
    onehot = torch.eye(gen_cfg.num_classes, device=device)[labels]  # (N, K), indexed per batch
    n_params = sum(p.numel() for p in model.parameters())

    def checkpoint():
        tmp = state_path.with_name(f".{STATE_NAME}.tmp")
        torch.save({"model": model.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(),
                    "rng": gen.get_state(), "step": step, "elapsed": elapsed,
                    "fingerprint": json.dumps(fingerprint)}, tmp)
        os.replace(tmp, state_path)
        meta = {"train": {**dataclasses.asdict(train_cfg), "steps_done": step},
                "wall_seconds": round(elapsed, 1), "parameters": n_params,
                "threads": torch.get_num_threads(), "device": str(device), **(extra_meta or {})}
        save_generator(ema, out_dir, extra=meta)

    model.train()
    t_last, loss_sum, n_sum = time.perf_counter(), 0.0, 0
    while step < train_cfg.steps:
        loss = _train_step(model, ema, opt, x_all, onehot, gen, train_cfg, step)
        step += 1
        loss_sum, n_sum = loss_sum + loss, n_sum + 1
        now = time.perf_counter()
        elapsed += now - t_last
        t_last = now
        if step % checkpoint_every == 0 or step == train_cfg.steps:
            checkpoint()
            rec = {"step": step, "loss": round(loss_sum / n_sum, 5), "elapsed_s": round(elapsed, 1)}
            with open(out_dir / LOG_NAME, "a") as f:
                f.write(json.dumps(rec) + "\n")
            if progress:
                rate = elapsed / step
                print(f"step {step}/{train_cfg.steps} loss {rec['loss']:.4f} "
                      f"{rate:.2f} s/step eta {(train_cfg.steps - step) * rate / 60:.1f} min", flush=True)
            loss_sum, n_sum = 0.0, 0
            t_last = time.perf_counter()  # checkpoint I/O is not training time
    return ema.eval()
