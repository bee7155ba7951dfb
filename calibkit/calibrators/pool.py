"""Candidate calibrators fitted in several processes: the same fits, shared over the cores.

Cross-fitting a calibrator is one full fit on the validation rows and one fit per fold, and no
candidate depends on another, so :func:`calibkit.calibrators.crossfit.cross_fit` can share whole
candidates between processes (``jobs``): this process and ``jobs - 1`` started ones take the next
candidate from a shared counter until none is left (the slow ones first, :func:`order`), so this
process fits candidates while the others are still starting. A started process is a fresh
interpreter (``spawn``: a process whose torch may hold threads is never forked) with the caller's
torch thread count; the data travel to it once, and each fitted calibrator and its out-of-fold
probabilities travel back (calibrators pickle). A candidate a started process did not return (it
died) is fitted here.

The numbers do not depend on ``jobs``: every fit is seeded by its own arguments (no calibrator
draws from a global generator) and runs with the same torch thread count (``calibkit calibrate``
pins one; torch may sum in another order with another count). Without ``--jobs``, ``calibkit
calibrate`` asks :func:`auto_jobs`: one process for small fits (a started process costs its
interpreter and torch's import, about 2 s of CPU), one per core (at most :data:`MAX_JOBS`) once the
K x K maps' fits are long (docs/performance.md has the measurements).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

#: Candidates fitted first, so that the slowest are not left to the end: the K x K maps and the
#: strength-searching structured maps, then the vector maps; the rest keep their order.
SLOW_FIRST = ("dirichlet", "sms", "matrix", "svs", "vector", "bbq", "beta", "platt")


#: ``rows x K^2`` of the validation logits (the cost of one iteration of the K x K maps, which dominate
#: the fits) from which :func:`auto_jobs` starts processes. At 5,000 x 100 (5e7) two processes took
#: 0.62 of one process's wall time on the quiet 2-core machine; the value between is set from the
#: 5,000 x 10 measurement (docs/performance.md, "calibrate: one process per core for long fits").
MIN_PARALLEL_WORK = 2_000_000
#: The most processes :func:`auto_jobs` starts for one cross-fitting (19 candidates, the slowest
#: four take half the time: more processes would wait on them).
MAX_JOBS = 4


def cores() -> int:
    """The cores this process may run on (its CPU affinity on Linux, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def auto_jobs(n_rows: int, k: int, threads: int | None = None) -> int:
    """The processes cross-fitting uses by default for ``n_rows`` validation rows of ``k`` classes:
    1 below :data:`MIN_PARALLEL_WORK` (``n_rows * k**2``), else one per ``threads`` cores, at most
    :data:`MAX_JOBS`."""
    if n_rows * k * k < MIN_PARALLEL_WORK:
        return 1
    return max(1, min(MAX_JOBS, cores() // max(1, threads or 1)))


def order(names: Sequence[str]) -> list[str]:
    """``names`` with the slow candidates first (:data:`SLOW_FIRST`), the others in their order."""
    rank = {n: i for i, n in enumerate(SLOW_FIRST)}
    return sorted(names, key=lambda n: rank.get(n, len(rank)))


def _take(counter) -> int:
    with counter.get_lock():
        i = counter.value
        counter.value += 1
    return i


def _work(fn: Callable, packed: bytes, counter, results, threads: int | None) -> None:
    """Run ``fn(*tasks[i])`` for each ``i`` taken from ``counter``; put the pickled ``(i, result,
    None)`` or ``(i, None, exception)`` on ``results`` (a started process). Plain pickles both ways:
    the queue's own pickler would share tensors through this process, which ends before they are read."""
    if threads is not None:
        torch.set_num_threads(threads)
    tasks = pickle.loads(packed)
    while (i := _take(counter)) < len(tasks):
        try:
            results.put(pickle.dumps((i, fn(*tasks[i]), None)))
        except Exception as exc:  # noqa: BLE001 - handed to the caller, which raises it
            results.put(pickle.dumps((i, None, exc)))


@contextmanager
def started(procs: list) -> Iterator[None]:
    """Start ``procs`` for the block; an exception in it terminates them; they are joined after."""
    for p in procs:
        p.start()
    try:
        yield
    except BaseException:
        for p in procs:
            p.terminate()
        raise
    finally:
        for p in procs:
            p.join()


def run(fn: Callable, tasks: list[tuple], jobs: int) -> list[Any]:
    """``[fn(*t) for t in tasks]``, computed by this process and ``jobs - 1`` started ones.

    ``fn`` must be importable by name (a module-level function) and its arguments and results
    picklable. An exception ``fn`` raises is raised here (the first task's in order). Raises the
    same as the list comprehension with ``jobs`` 1."""
    jobs = min(jobs, len(tasks))
    if jobs <= 1:
        return [fn(*t) for t in tasks]
    ctx = multiprocessing.get_context("spawn")
    counter, results = ctx.Value("i", 0), ctx.Queue()
    packed = pickle.dumps(tasks)
    procs = [ctx.Process(target=_work, args=(fn, packed, counter, results, torch.get_num_threads()), daemon=True)
             for _ in range(jobs - 1)]
    out: dict[int, tuple] = {}
    with started(procs):
        while (i := _take(counter)) < len(tasks):
            out[i] = (fn(*tasks[i]), None)
        while len(out) < len(tasks):
            try:
                i, value, exc = pickle.loads(results.get(timeout=1.0))
                out[i] = (value, exc)
            except queue.Empty:
                if not any(p.is_alive() for p in procs) and results.empty():
                    break  # a started process died holding a task: fitted here below
        for i in range(len(tasks)):
            if i not in out:
                out[i] = (fn(*tasks[i]), None)
    for i in range(len(tasks)):
        if out[i][1] is not None:
            raise out[i][1]
    return [out[i][0] for i in range(len(tasks))]
