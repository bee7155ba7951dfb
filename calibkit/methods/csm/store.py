"""On-disk format of a CSM store: generated mixing groups, their index and their annotations.

A store is a directory::

    store.json                  generation settings (generator hash, seed, steps, guidance, counts)
    shard-00000.safetensors     images uint8 (n, C, H, W) + group, member, c1, c2 (int64), lam (float32)
    shard-00000.jsonl           index: one JSON record per image (group, member, seed, c1, c2, lam,
                                guidance, steps, generator_hash)
    ...
    annotations.safetensors     written by ``calibkit csm annotate``: soft_labels (N, K), lam_hat,
                                lam_annot (N,), group, member (N,) in store order
    annotations.json            the encoder identity and the annotation settings

Shard k holds the groups ``[k S, (k + 1) S)`` (S = groups per shard), 8 images per group in the
order lam = 0, 1/7, ..., 1. A shard is written atomically and its index file after it, so a
shard counts as done only when its ``.jsonl`` exists: an interrupted generation redoes at most
the shards in flight, never duplicates or loses a group. The layout does not depend on how many
processes produced it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save

from calibkit.errors import UserError

STORE_FORMAT = "calibkit-csm-store"
MANIFEST = "store.json"
ANNOT_TENSORS = "annotations.safetensors"
ANNOT_META = "annotations.json"


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory and ``os.replace``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def shard_paths(store_dir, k: int) -> tuple[Path, Path]:
    """(images file, index file) of shard ``k``."""
    store_dir = Path(store_dir)
    return store_dir / f"shard-{k:05d}.safetensors", store_dir / f"shard-{k:05d}.jsonl"


def read_manifest(store_dir) -> dict:
    """The ``store.json`` of a store; raises ``FileNotFoundError`` naming the directory otherwise."""
    path = Path(store_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{store_dir} is not a CSM store (no {MANIFEST}); run `calibkit csm generate`")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != STORE_FORMAT:
        raise UserError(f"{path} is not a {STORE_FORMAT} manifest")
    return manifest


def num_shards(manifest: dict) -> int:
    return -(-manifest["num_groups"] // manifest["groups_per_shard"])


def shard_done(store_dir, k: int) -> bool:
    images, index = shard_paths(store_dir, k)
    return images.is_file() and index.is_file()


def load_store(store_dir) -> dict:
    """Read a complete store into memory.

    Returns:
        dict with ``images`` uint8 (N, C, H, W), ``group``, ``member``, ``c1``, ``c2`` int64 (N,),
        ``lam`` float32 (N,) in group-then-member order, and ``manifest``.

    Raises:
        ValueError: if a shard is missing (generation interrupted: rerun the same command).
    """
    manifest = read_manifest(store_dir)
    missing = [k for k in range(num_shards(manifest)) if not shard_done(store_dir, k)]
    if missing:
        raise UserError(f"store {store_dir} is incomplete: {len(missing)} shard(s) missing (first: {missing[0]}); "
                         "rerun the same `calibkit csm generate` command to finish it")
    parts = [load_file(shard_paths(store_dir, k)[0]) for k in range(num_shards(manifest))]
    keys = ("images", "group", "member", "c1", "c2", "lam")
    out: dict[str, Any] = {key: torch.cat([p[key] for p in parts]) for key in keys}
    expected = manifest["num_groups"] * manifest["group_size"]
    if out["images"].shape[0] != expected:
        raise UserError(f"store {store_dir} holds {out['images'].shape[0]} images, expected {expected}")
    out["manifest"] = manifest
    return out


def write_annotations(store_dir, tensors: dict, meta: dict) -> None:
    """Write ``annotations.safetensors`` then ``annotations.json`` (both atomically)."""
    atomic_write(Path(store_dir) / ANNOT_TENSORS, save({k: v.contiguous() for k, v in tensors.items()}))
    atomic_write(Path(store_dir) / ANNOT_META, json.dumps(meta, indent=2).encode())


def load_annotations(store_dir) -> tuple[dict, dict]:
    """(tensors, meta) written by :func:`write_annotations`; ``FileNotFoundError`` if not annotated."""
    t, m = Path(store_dir) / ANNOT_TENSORS, Path(store_dir) / ANNOT_META
    if not (t.is_file() and m.is_file()):
        raise FileNotFoundError(f"store {store_dir} has no annotations; run `calibkit csm annotate {store_dir} ...`")
    return load_file(t), json.loads(m.read_text())


def subset_store(src, dst, num_groups: int) -> dict:
    """Write the first ``num_groups`` groups of store ``src`` as a new store ``dst`` (one shard).

    Group g of a store does not depend on the store's size (its pair and its noise are functions
    of g and the seed), so the result equals a store generated with ``num_groups`` groups, up to the
    shard layout. Annotations are not copied.

    Returns:
        The new manifest (``num_groups``, ``groups_per_shard = num_groups`` and ``subset_of``).
    """
    s = load_store(src)
    man = s["manifest"]
    if not 1 <= num_groups <= man["num_groups"]:
        raise UserError(f"num_groups must be in [1, {man['num_groups']}], got {num_groups}")
    n = num_groups * man["group_size"]
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    new = {**man, "num_groups": int(num_groups), "groups_per_shard": int(num_groups),
           "subset_of": {"store": str(src), "num_groups": man["num_groups"]}}
    img, idx = shard_paths(dst, 0)
    atomic_write(img, save({k: s[k][:n].contiguous() for k in ("images", "group", "member", "c1", "c2", "lam")}))
    lines = []
    for k in range(num_shards(man)):
        lines += shard_paths(src, k)[1].read_text().splitlines()
        if len(lines) >= n:
            break
    atomic_write(idx, ("\n".join(lines[:n]) + "\n").encode())
    atomic_write(dst / MANIFEST, json.dumps(new, indent=2).encode())
    return new
