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

from calibkit.methods.csm.generator import class_vector, generator_hash, load_generator, to_uint8
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


def sample_groups(model, groups, seed: int, steps: int = 20, guidance: float = 1.0) -> dict:
    """Sample whole groups with ``model`` in one batch; returns the conditions plus ``images`` uint8."""
    cfg = model.config
    cond = group_conditions(groups, cfg.num_classes)
    shape = (1, cfg.in_channels, cfg.image_size, cfg.image_size)
    noise = torch.cat([group_noise(seed, g, shape).expand(GROUP_SIZE, -1, -1, -1) for g in groups])
    x = heun_sample(model, noise, cond["y"], steps=steps, guidance=guidance)
    cond["images"] = to_uint8(x, cfg)
    return cond


def _dist_env(distributed) -> tuple[int, int, bool]:
    """(rank, world, initialised_here) from an explicit (rank, world) or torchrun's environment."""
    if isinstance(distributed, tuple):
        return int(distributed[0]), int(distributed[1]), False
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if distributed != "env" or world == 1:
        return 0, 1, False
    import torch.distributed as dist

    init = not dist.is_initialized()
    if init:
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), init


def generate_store(generator_dir, store_dir, num_groups: int, seed: int = 0, steps: int = 20,
                   guidance: float = 1.0, groups_per_shard: int = 16, distributed="env",
                   progress: bool = True) -> dict:
    """Generate ``num_groups`` groups into ``store_dir`` (resuming if it already holds shards).

    Args:
        generator_dir: directory written by ``calibkit csm train-generator``.
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

    Returns:
        The store manifest.
    """
    if num_groups < 1 or groups_per_shard < 1 or steps < 1:
        raise ValueError("num_groups, groups_per_shard and steps must be positive")
    rank, world, init_here = _dist_env(distributed)
    store_dir = Path(store_dir)
    store_dir.mkdir(parents=True, exist_ok=True)
    model = load_generator(generator_dir)
    cfg = model.config
    manifest = {
        "format": STORE_FORMAT, "version": 1, "generator": str(generator_dir),
        "generator_hash": generator_hash(generator_dir), "num_classes": cfg.num_classes,
        "image_shape": [cfg.in_channels, cfg.data_size, cfg.data_size], "seed": int(seed),
        "steps": int(steps), "guidance": float(guidance), "sampler": "edm-heun sigma 0.002..80 rho 7",
        "group_size": GROUP_SIZE, "groups_per_shard": int(groups_per_shard), "num_groups": int(num_groups),
        "pairs": "all unordered (c1 < c2) in lexicographic order, cycled; lam = linspace(0, 1, 8)",
    }
    path = store_dir / MANIFEST
    if path.exists():
        old = json.loads(path.read_text())
        diff = {k: (old.get(k), v) for k, v in manifest.items() if k != "generator" and old.get(k) != v}
        # Growing a store is allowed when its old shards are all full: they stay valid as they are.
        grow = set(diff) == {"num_groups"} and num_groups > old["num_groups"] \
            and old["num_groups"] % groups_per_shard == 0
        if diff and not grow:
            raise ValueError(f"store {store_dir} was generated with other settings {diff}; use a new --out")
    if rank == 0 and (not path.exists() or json.loads(path.read_text()) != manifest):
        atomic_write(path, json.dumps(manifest, indent=2).encode())

    todo = [k for k in range(rank, num_shards(manifest), world) if not shard_done(store_dir, k)]
    if progress and rank == 0:
        print(f"{num_shards(manifest)} shards, rank 0 of {world} has {len(todo)} left", flush=True)
    n_img, t0 = 0, time.perf_counter()
    for k in todo:
        groups = range(k * groups_per_shard, min((k + 1) * groups_per_shard, num_groups))
        out = sample_groups(model, groups, seed, steps, guidance)
        from safetensors.torch import save

        img_path, idx_path = shard_paths(store_dir, k)
        atomic_write(img_path, save({key: out[key].contiguous() for key in
                                     ("images", "group", "member", "c1", "c2", "lam")}))
        records = [json.dumps({"group": int(out["group"][i]), "member": int(out["member"][i]), "seed": int(seed),
                               "c1": int(out["c1"][i]), "c2": int(out["c2"][i]),
                               "lam": round(float(out["lam"][i]), 6), "guidance": float(guidance),
                               "steps": int(steps), "generator_hash": manifest["generator_hash"]})
                   for i in range(len(out["group"]))]
        atomic_write(idx_path, ("\n".join(records) + "\n").encode())  # index last: marks the shard done
        n_img += len(records)
        if progress:
            dt = time.perf_counter() - t0
            print(f"[rank {rank}] shard {k}: {n_img} images in {dt:.0f} s ({n_img / dt:.2f} img/s)", flush=True)
    if world > 1 and distributed == "env":
        import torch.distributed as dist

        dist.barrier()
        if init_here:
            dist.destroy_process_group()
    return manifest
