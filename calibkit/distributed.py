"""Plain ``torch.distributed`` helpers for the trainer: process group, sharding, gathering.

A run launched with ``torchrun --nproc_per_node N -m calibkit train ...`` finds ``WORLD_SIZE``,
``RANK`` and ``LOCAL_RANK`` in its environment; everything here degrades to a no-op for a single
process, so the training loop has one code path.

Sharding rules (the same idea as ``torch.utils.data.DistributedSampler``, written out so that the
evaluation order is explicit):

- training: one permutation of the train set drawn from a generator seeded identically on every
  rank, padded by repeating its head to a multiple of the world size, rank ``r`` takes
  ``perm[r::world]``;
- evaluation: indices ``0..N-1`` padded to a multiple of the world size, rank ``r`` takes the
  ``r``-th contiguous chunk, and the gathered rows are trimmed back to ``N``, so the sharded
  evaluation covers exactly the samples of a single-process one, in the same order.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from calibkit.errors import UserError


@dataclass(frozen=True)
class Dist:
    """Where this process sits in the run: ``rank`` of ``world`` processes, on ``device``."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    owns_group: bool = False  # True when setup() created the process group (and teardown ends it)

    @property
    def is_main(self) -> bool:
        """Only the main process (rank 0) writes files and prints."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``"auto"`` -> the local CUDA device if there is one, else CPU; otherwise ``torch.device(name)``."""
    if name == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise UserError(f"device: unknown device {name!r} (use auto, cpu, cuda or cuda:N)") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device: {name!r} requested but CUDA is not available")
    return device


# Inputs per forward pass when computing logits or features, by device type. On a CPU, batches whose
# activations stay in cache are faster: batches of 128 took 0.27x (small CNN), 0.39x (ResNet-20) and
# 0.93x (MLP) the time of batches of 1024, with the same logits to the bit (benchmarks/eval_batch.py, one
# thread); accelerators want large batches (fewer launches).
EVAL_BATCH = {"cpu": 128}
EVAL_BATCH_ACCELERATOR = 1024


def eval_batch_size(device, requested: int | None = None) -> int:
    """``requested`` when given, else the default for ``device``'s type (128 on a CPU, 1024 on an accelerator).

    In eval mode every sample is computed on its own, so the batch size changes an evaluation
    pass's speed and memory, and its results only by rounding where a small last batch takes
    another matrix-multiply kernel (at most ~1e-7 on this machine's models; none for batch sizes
    that are multiples of 8).
    """
    if requested is not None:
        return int(requested)
    kind = torch.device(device).type if device is not None else "cpu"
    return EVAL_BATCH.get(kind, EVAL_BATCH_ACCELERATOR)


def setup(device: str = "auto") -> Dist:
    """Join the process group when launched by ``torchrun`` (gloo on CPU, nccl on CUDA).

    Returns:
        The process's :class:`Dist`; a single process gets rank 0 of 1 and no process group.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist(0, 1, resolve_device(device))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    owns = not dist.is_initialized()  # a caller may have created the group already
    if owns:
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), dev, owns)


def teardown(d: Dist) -> None:
    """Leave the process group, only if :func:`setup` created it.

    Unreachable objects are collected first: a ``DistributedDataParallel`` wrapper left in a
    reference cycle would otherwise outlive the group, and its reducer, destroyed at interpreter
    exit, aborts the process ("terminate called without an active exception", SIGABRT) after
    the work is done. Callers drop their own references to the wrapper before calling this.
    """
    if d.owns_group and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def barrier(d: Dist) -> None:
    if d.enabled:
        dist.barrier()


def train_shard(n: int, generator: torch.Generator, d: Dist) -> torch.Tensor:
    """This rank's share of one seeded permutation of ``range(n)``.

    Every rank draws the same permutation (same generator seed); padding repeats its head so that
    all ranks get the same number of samples, as ``DistributedSampler`` does.
    """
    perm = torch.randperm(n, generator=generator)
    if d.world == 1:
        return perm
    per_rank = -(-n // d.world)
    pad = per_rank * d.world - n
    perm = torch.cat([perm, perm[:pad]])
    return perm[d.rank :: d.world]


def eval_shard(n: int, d: Dist) -> tuple[torch.Tensor, int]:
    """Contiguous evaluation chunk of ``range(n)`` for this rank, padded with index 0.

    Returns:
        ``(indices, per_rank)``: this rank's ``per_rank`` indices (the last rank's chunk may end
        with padding that :func:`gather_rows` removes again).
    """
    per_rank = -(-n // d.world) if n else 0
    idx = torch.arange(d.rank * per_rank, (d.rank + 1) * per_rank)
    return idx.clamp(max=max(n - 1, 0)), per_rank


def gather_rows(t: torch.Tensor, n: int, d: Dist) -> torch.Tensor:
    """Concatenate every rank's equal-sized chunk in rank order and drop the padding rows.

    Args:
        t: this rank's rows, shape ``(per_rank, ...)`` (the same shape on every rank).
        n: number of real rows over all ranks.
    """
    if not d.enabled:
        return t[:n]
    parts = [torch.empty_like(t) for _ in range(d.world)]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts)[:n]


def all_reduce_sum(values: list[float], d: Dist) -> list[float]:
    """Sum a few scalars (loss sums, correct counts) over ranks, in float64."""
    if not d.enabled:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=d.device)
    dist.all_reduce(t)
    return t.tolist()


def average_grads(params: list[torch.nn.Parameter], d: Dist) -> None:
    """Average gradients of parameters DDP does not own (e.g. a loss's gate) over ranks."""
    if not d.enabled:
        return
    for p in params:
        # A missing gradient counts as zero, so every rank joins every all_reduce (no hang).
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)
        p.grad /= d.world
