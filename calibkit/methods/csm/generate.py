"""Semantic mixing: generate CSM groups into a store (deterministic, shardable, resumable).

A *group* is 8 images sampled from one initial noise while the class condition moves from
``onehot(c2)`` (lam = 0) to ``onehot(c1)`` (lam = 1) with ``lam = linspace(0, 1, 8)``
(CSM, ICML 2025, Sec. 3). Group ``g`` uses the pair ``pairs[g % P]`` of the P = K (K - 1) / 2
unordered pairs (c1 < c2) in lexicographic order, and its noise is drawn from a generator seeded by
``SeedSequence([seed, g])``, so any group can be reproduced alone and the output does not depend on
how the work is split.

Work is split by shards (blocks of ``groups_per_shard`` consecutive groups): under ``torchrun``
rank r of W produces shards r, r + W, ...; each shard is sampled as one batch, so its bytes are
identical whatever W is. See :mod:`calibkit.methods.csm.store` for the format.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import save

import calibkit.distributed
from calibkit.errors import UserError
from calibkit.methods.csm.generator import class_vector, generator_hash, load_generator, state_hash, to_uint8
from calibkit.methods.csm.sampler import heun_sample
from calibkit.methods.csm.store import (
    MANIFEST,
    STORE_FORMAT,
    atomic_write,
    num_shards,
    shard_done,
    shard_paths,
)

GROUP_SIZE = 8


def class_pairs(num_classes: int) -> list[tuple[int, int]]:
    """All unordered pairs (c1, c2), c1 < c2, in lexicographic order."""
    return [(a, b) for a in range(num_classes) for b in range(a + 1, num_classes)]


def group_noise(seed: int, group: int, shape: tuple) -> torch.Tensor:
    """Standard normal initial noise of ``group`` (float32, ``shape``), independent of other groups."""
    state = np.random.SeedSequence([int(seed), int(group)]).generate_state(1, dtype=np.uint64)[0]
    g = torch.Generator().manual_seed(int(state) & 0x7FFF_FFFF_FFFF_FFFF)
    return torch.randn(shape, generator=g)


def group_conditions(groups, num_classes: int) -> dict:
    """Per-image ``c1``, ``c2``, ``lam``, ``group``, ``member`` and class vector ``y`` of ``groups``."""
    pairs = class_pairs(num_classes)
    groups = torch.as_tensor(list(groups), dtype=torch.long)
    lam = torch.linspace(0, 1, GROUP_SIZE)
    g = groups.repeat_interleave(GROUP_SIZE)
    pair = torch.tensor([pairs[int(i) % len(pairs)] for i in groups], dtype=torch.long).reshape(-1, 2)
    c1 = pair[:, 0].repeat_interleave(GROUP_SIZE)
    c2 = pair[:, 1].repeat_interleave(GROUP_SIZE)
    lam_all = lam.repeat(len(groups))
    member = torch.arange(GROUP_SIZE).repeat(len(groups))
    return {"group": g, "member": member, "c1": c1, "c2": c2, "lam": lam_all,
            "y": class_vector(c1, c2, lam_all, num_classes)}


PRECISIONS = ("fp32", "bf16")


def autocast_denoiser(model, precision: str = "fp32"):
    """``model`` wrapped so its network runs under ``precision`` (``"bf16"``: bfloat16 autocast).

    Only the network's matrix products and convolutions run in bfloat16; the sampler's state, the
    EDM preconditioning and the returned denoised image stay float32.
    """
    if precision not in PRECISIONS:
        raise UserError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "fp32":
        return model
    dev_type = next(model.parameters()).device.type

    def d(x, sigma, y):
        with torch.autocast(dev_type, dtype=torch.bfloat16):
            return model(x, sigma, y).float()

    return d


def default_batch_size(device) -> int:
    """Images per sampler batch: 64 on the CPU (fastest measured, ``benchmarks/csm_speed.py``),
    4096 on a GPU (fills it with a 1M-parameter 28x28 UNet)."""
    return 4096 if torch.device(device).type == "cuda" else 64


def sample_groups(model, groups, seed: int, steps: int = 20, guidance: float = 1.0,
                  batch_size: int | None = None, precision: str = "fp32", members=None) -> dict:
    """Sample whole groups with ``model`` (on the model's device); conditions plus ``images`` uint8.

    Args:
        model: a :class:`~calibkit.methods.csm.generator.CondDenoiser` (any device).
        groups: group indices; group ``g`` uses pair ``g % P`` and the noise of ``(seed, g)``.
        seed, steps, guidance: see :func:`generate_store`.
        batch_size: images per sampler batch (default :func:`default_batch_size`); the images
            are split into consecutive chunks, so the result depends on it only through floating-
            point rounding.
        precision: ``"fp32"`` or ``"bf16"`` (bfloat16 autocast of the network).
        members: positions in the group to sample (default all 8; e.g. ``[0, 7]`` for the pure
            endpoints only, as the quality benchmarks do).

    Returns:
        dict of CPU tensors: ``group``, ``member``, ``c1``, ``c2``, ``lam``, ``y`` and ``images``
        uint8 (N, C, data_size, data_size).
    """
    cfg = model.config
    device = next(model.parameters()).device
    groups = list(groups)
    cond = group_conditions(groups, cfg.num_classes)
    shape = (1, cfg.in_channels, cfg.image_size, cfg.image_size)
    noise = torch.cat([group_noise(seed, g, shape).expand(GROUP_SIZE, -1, -1, -1) for g in groups])
    if members is not None:
        keep = torch.isin(cond["member"], torch.as_tensor(list(members)))
        cond = {k: v[keep] for k, v in cond.items()}
        noise = noise[keep]
    bs = batch_size or default_batch_size(device)
    if bs < 1:
        raise UserError(f"batch_size must be positive, got {bs}")
    d = autocast_denoiser(model, precision)
    out = []
    with torch.inference_mode():
        for i in range(0, len(noise), bs):
            x = heun_sample(d, noise[i:i + bs].to(device), cond["y"][i:i + bs].to(device), steps=steps,
                            guidance=guidance)
            out.append(to_uint8(x, cfg).cpu())
    cond["images"] = torch.cat(out)
    return cond


def generate(model, num_groups: int, seed: int = 0, steps: int = 20, guidance: float = 1.0,
             batch_size: int | None = None, precision: str = "fp32") -> dict:
    """Generate groups 0 to num_groups - 1 in memory: the same images :func:`generate_store` writes.

    Args:
        model: a :class:`~calibkit.methods.csm.generator.CondDenoiser` (e.g. returned by
            :func:`~calibkit.methods.csm.train_generator.train_generator`), on any device.
        num_groups, seed, steps, guidance, batch_size, precision: as :func:`generate_store`.
            With the same batch size as the store's shards are sampled in, the bytes are equal.

    Returns:
        dict of CPU tensors in group order: ``images`` uint8 (8 G, C, H, W), ``group``,
        ``member``, ``c1``, ``c2`` int64 and ``lam`` float32 (8 G,), ``y`` (8 G, K).
    """
    if num_groups < 1 or steps < 1:
        raise UserError("num_groups and steps must be positive")
    return sample_groups(model.eval(), range(num_groups), seed, steps, guidance, batch_size=batch_size,
                         precision=precision)


def _dist_env(distributed) -> tuple[int, int, bool]:
    """(rank, world, initialised_here) from an explicit (rank, world) or torchrun's environment."""
    if isinstance(distributed, tuple):
        return int(distributed[0]), int(distributed[1]), False
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if distributed != "env" or world == 1:
        return 0, 1, False

    init = not dist.is_initialized()
    if init:
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), init


def _resolve_generator(generator, device):
    """(model on ``device``, recorded name, weights hash) from a directory or a ``CondDenoiser``."""
    dev = device if isinstance(device, torch.device) else calibkit.distributed.resolve_device(device or "auto",
                                                                          int(os.environ.get("LOCAL_RANK", "0")))
    if isinstance(generator, (str, os.PathLike)):
        return load_generator(generator).to(dev), str(generator), generator_hash(generator)
    return generator.eval().to(dev), "in-memory", state_hash(generator)


def _manifest(cfg, gen_name: str, gen_hash: str, num_groups: int, seed: int, steps: int, guidance: float,
              groups_per_shard: int, precision: str) -> dict:
    """The store's manifest: its identity (every setting that changes an image) and its layout."""
    manifest = {
        "format": STORE_FORMAT, "version": 1, "generator": gen_name,
        "generator_hash": gen_hash, "num_classes": cfg.num_classes,
        "image_shape": [cfg.in_channels, cfg.data_size, cfg.data_size], "seed": int(seed),
        "steps": int(steps), "guidance": float(guidance), "sampler": "edm-heun sigma 0.002..80 rho 7",
        "group_size": GROUP_SIZE, "groups_per_shard": int(groups_per_shard), "num_groups": int(num_groups),
        "pairs": "all unordered (c1 < c2) in lexicographic order, cycled; lam = linspace(0, 1, 8)",
    }
    if precision != "fp32":  # stores written before the option existed are float32 and lack the key
        manifest["precision"] = precision
    return manifest


def _write_manifest(store_dir: Path, manifest: dict, rank: int) -> None:
    """Refuse a store written with other settings (growing one whose shards are all full is
    allowed: they stay valid as they are); rank 0 then writes the manifest if it changed."""
    path = store_dir / MANIFEST
    if path.exists():
        old = json.loads(path.read_text())
        diff = {k: (old.get(k), v) for k, v in {**old, **manifest}.items()
                if k != "generator" and old.get(k) != manifest.get(k)}
        grow = set(diff) == {"num_groups"} and manifest["num_groups"] > old["num_groups"] \
            and old["num_groups"] % manifest["groups_per_shard"] == 0
        if diff and not grow:
            raise UserError(f"store {store_dir} was generated with other settings {diff}; use a new --out")
    if rank == 0 and (not path.exists() or json.loads(path.read_text()) != manifest):
        atomic_write(path, json.dumps(manifest, indent=2).encode())


def _write_shard(store_dir: Path, k: int, out: dict, manifest: dict, batch_size: int, device_type: str) -> int:
    """Shard ``k``'s images, then its index (written last: it marks the shard done). Returns the
    number of images written."""
    img_path, idx_path = shard_paths(store_dir, k)
    atomic_write(img_path, save({key: out[key].contiguous() for key in
                                 ("images", "group", "member", "c1", "c2", "lam")}))
    m = manifest
    records = [json.dumps({"group": int(out["group"][i]), "member": int(out["member"][i]), "seed": m["seed"],
                           "c1": int(out["c1"][i]), "c2": int(out["c2"][i]),
                           "lam": round(float(out["lam"][i]), 6), "guidance": m["guidance"],
                           "steps": m["steps"], "generator_hash": m["generator_hash"],
                           "precision": m.get("precision", "fp32"), "batch_size": batch_size, "device": device_type})
               for i in range(len(out["group"]))]
    atomic_write(idx_path, ("\n".join(records) + "\n").encode())
    return len(records)


def generate_store(generator, store_dir, num_groups: int, seed: int = 0, steps: int = 20,
                   guidance: float = 1.0, groups_per_shard: int = 16, distributed="env",
                   progress: bool = True, device="auto", batch_size: int | None = None,
                   precision: str = "fp32") -> dict:
    """Generate ``num_groups`` groups into ``store_dir`` (resuming if it already holds shards).

    Args:
        generator: directory written by ``calibkit csm train-generator`` (or
            :func:`~calibkit.methods.csm.train_generator.train_generator`), or a
            :class:`~calibkit.methods.csm.generator.CondDenoiser` in memory.
        store_dir: output store (created).
        num_groups: number of groups (8 images each). An existing store whose groups fill whole
            shards can be grown by asking for more groups with otherwise identical settings.
        seed: base seed of the initial noises.
        steps: Heun sampler steps (2 steps - 1 network calls per image, twice that with guidance).
        guidance: classifier-free guidance weight (1 = none), recorded in the store.
        groups_per_shard: groups per shard file (the unit of work and of resuming).
        distributed: ``"env"`` (torchrun's RANK/WORLD_SIZE, gloo barrier at the end), ``None``
            (single process) or an explicit ``(rank, world_size)``.
        progress: print one line per shard.
        device: ``"auto"`` (``cuda:LOCAL_RANK`` when CUDA is available, else the CPU), ``"cpu"``,
            ``"cuda"``, ``"cuda:N"`` or a ``torch.device``.
        batch_size: images per sampler batch (default: 64 on the CPU, 4096 on a GPU); recorded
            per image in the index. It changes results only through floating-point rounding, so a
            store may be grown with another batch size or on another device.
        precision: ``"fp32"`` or ``"bf16"`` (bfloat16 autocast of the network); recorded in the
            store and part of its identity.

    Returns:
        The store manifest.
    """
    if num_groups < 1 or groups_per_shard < 1 or steps < 1:
        raise UserError("num_groups, groups_per_shard and steps must be positive")
    if precision not in PRECISIONS:
        raise UserError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    rank, world, init_here = _dist_env(distributed)
    model, gen_name, gen_hash = _resolve_generator(generator, device)  # before anything is written
    store_dir = Path(store_dir)
    store_dir.mkdir(parents=True, exist_ok=True)
    dev = next(model.parameters()).device
    bs = batch_size or default_batch_size(dev)
    manifest = _manifest(model.config, gen_name, gen_hash, num_groups, seed, steps, guidance,
                         groups_per_shard, precision)
    _write_manifest(store_dir, manifest, rank)

    todo = [k for k in range(rank, num_shards(manifest), world) if not shard_done(store_dir, k)]
    if progress and rank == 0:
        print(f"{num_shards(manifest)} shards, rank 0 of {world} has {len(todo)} left "
              f"(device {dev}, batch {bs}, {precision})", flush=True)
    n_img, t0 = 0, time.perf_counter()
    for done_shards, k in enumerate(todo, start=1):
        groups = range(k * groups_per_shard, min((k + 1) * groups_per_shard, num_groups))
        out = sample_groups(model, groups, seed, steps, guidance, batch_size=bs, precision=precision)
        n_img += _write_shard(store_dir, k, out, manifest, bs, dev.type)
        if progress:
            dt = time.perf_counter() - t0
            eta = dt / done_shards * (len(todo) - done_shards) / 60
            print(f"[rank {rank}] shard {k}: {n_img} images in {dt:.0f} s ({n_img / dt:.2f} img/s, "
                  f"eta {eta:.1f} min)", flush=True)
    if world > 1 and distributed == "env":
        dist.barrier()
        if init_here:
            dist.destroy_process_group()
    return manifest
