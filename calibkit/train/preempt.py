"""Stopping a training run early on request (a scheduler's warning signal), at an epoch boundary.

A scheduler that is about to end a job (time limit, preemption) can warn it first: SLURM's
``--signal=B:USR1@<s>`` sends SIGUSR1 ``s`` seconds before. :func:`install` makes that signal set a
flag; the training loop looks at it after every epoch (all processes of a ``torchrun`` run agree on
it with one all-reduce, so they stop after the same epoch), writes the checkpoint of that epoch and
raises :class:`Preempted`. The run directory is then an ordinary interrupted run: the next
``train`` call resumes it from ``checkpoint.pt`` and ends with exactly the weights of an
uninterrupted run (the loop's resume guarantee).

The stop happens at the end of the epoch in progress, never inside one: a resumed run replays
whole epochs (each epoch's random streams are seeded from the seed and the epoch), so a mid-epoch
checkpoint could not be resumed bit for bit. The warning must therefore come at least one epoch
plus one checkpoint write before the end.
"""

from __future__ import annotations

import signal

import torch
import torch.distributed as dist

_state = {"requested": False}


class Preempted(BaseException):
    """Training stopped on request after ``epoch`` epochs, with a checkpoint of that epoch.

    A ``BaseException`` (like ``KeyboardInterrupt``): code that records ordinary failures lets it
    pass, since the run is not broken and resumes.
    """

    def __init__(self, epoch: int, run_dir=None):
        super().__init__(f"stopped on request after epoch {epoch}" + (f" ({run_dir})" if run_dir else ""))
        self.epoch = epoch
        self.run_dir = run_dir


def request(*_args) -> None:
    """Ask the running training loop to stop after the epoch in progress (a signal handler)."""
    _state["requested"] = True


def requested() -> bool:
    return _state["requested"]


def clear() -> None:
    _state["requested"] = False


def install(signum: int = signal.SIGUSR1) -> None:
    """Make ``signum`` request a stop (:func:`request`) instead of ending the process."""
    signal.signal(signum, request)


def agreed(dd) -> bool:
    """Whether any process of the run was asked to stop (one all-reduce under ``torchrun``)."""
    flag = requested()
    if not dd.enabled:
        return flag

    device = dd.device if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([int(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())
