"""How the bench and the tuner work through a grid that other processes share.

One flow serves both: :func:`attempt` claims a :class:`Task` (a grid run or a tuning candidate),
produces it, records it and counts it in :class:`Counts`, speaking through a :class:`Report`.
:func:`work_queue` postpones what another process holds, :func:`claim_outcome` reads what a claim
meant (an :class:`Outcome`), :func:`run_recorded` records a failure instead of raising it,
:func:`broadcast` sends rank 0's answer to every rank of a DDP job (the other ranks hold a
:class:`~calibkit.store.null.NullStore`, whose answers it replaces).
"""

from __future__ import annotations

import enum
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from calibkit.errors import shown_name
from calibkit.rundir import disk_full

# Seconds between two looks at the database while waiting for another bench's run.
POLL_S = 5.0


def work_queue(items, ready, attempt, poll_s: float = POLL_S, sleep=time.sleep) -> None:
    """Call ``attempt(item)`` for every item, postponing those that are not ``ready`` yet.

    ``ready(item)`` is False while an item must wait (a run it builds on is being produced by
    another process), and ``attempt(item)`` returns False when the item itself is held by another
    process; postponed items are retried after the others, with a pause of ``poll_s`` when a whole
    pass makes no progress.
    """
    pending = list(items)
    while pending:
        later = []
        for item in pending:
            if not ready(item) or attempt(item) is False:
                later.append(item)
        if later and len(later) == len(pending):
            sleep(poll_s)
        pending = later


def reaping_sleep(reap, log, sleep=time.sleep, step_s: float = 0.5):
    """The pause of :func:`work_queue` for a process whose ``--workers`` it started itself: sleeps
    ``poll_s`` in steps of ``step_s``, calling ``reap()`` (one line per worker that has ended badly
    since the last call, the worker reaped) at each step, and returns as soon as one has ended, so
    that the runs it held are taken over at once (a reaped process's claims are dead:
    :func:`calibkit.store.common.owner_alive`). Each line goes to ``log``."""
    def pause(poll_s: float) -> None:
        end = time.monotonic() + poll_s
        while True:
            lines = reap()
            for line in lines:
                log(line)
            left = end - time.monotonic()
            if lines or left <= 0:
                return
            sleep(min(step_s, left))

    return pause


class Outcome(enum.Enum):
    """What a claim meant."""

    CLAIMED = "claimed"  # this process holds it now
    DONE = "done"  # finished, by this or another process
    ELSEWHERE = "elsewhere"  # held by another live process, or being claimed at this instant


@dataclass
class Counts:
    """How the attempts of one ``run`` ended: ``done`` here, ``skipped`` (finished earlier, or
    held elsewhere where nothing waits for it), ``failed`` (recorded as such)."""

    done: int = 0
    skipped: int = 0
    failed: int = 0


def claim_outcome(store, table: str, key: str, claimed: bool) -> Outcome:
    """What a claim's True/False meant (a refused claim is ``DONE`` when the row says so)."""
    if claimed:
        return Outcome.CLAIMED
    return Outcome.DONE if store.status(key, table) == "done" else Outcome.ELSEWHERE


def run_recorded(work, fail, is_main: bool, counts: Counts, report, failures: list | None = None,
                 name: str = "") -> None:
    """Call ``work()``; a failure is recorded (``fail(text)``, on the main rank), counted and
    reported (``report(line)``), not raised, so one broken run does not stop the others. With
    ``failures``, the line ``"<name> failed: <error>: <message>"`` is appended to it too, for the
    command to repeat on stderr once the work is over (the progress line is on stdout).

    Ctrl-C is recorded as ``interrupted`` and raised; :class:`~calibkit.train.preempt.Preempted`
    (a ``BaseException``) passes unrecorded: the checkpoint is written and the run resumes later.
    A full disk (:func:`calibkit.rundir.disk_full`, also while recording a failure) is recorded
    where it still can be and raised as :class:`~calibkit.rundir.DiskFull`: every later run would
    fail alike, so the work stops at the first. Shared by the bench and the tuner.
    """
    try:
        work()
    except KeyboardInterrupt:
        if is_main:
            fail("interrupted")
        raise
    except Exception as exc:
        full = disk_full(exc)
        if full is not None:
            if is_main:
                try:
                    fail(str(full))
                except Exception:  # noqa: BLE001 - the same full disk; the run is taken over next time
                    pass
            raise full from exc
        counts.failed += 1
        if is_main:
            try:
                fail("".join(traceback.format_exception(exc)))
            except Exception as again:
                full = disk_full(again)
                if full is None:
                    raise
                raise full from again
        report(f"FAILED: {shown_name(exc)}: {exc}")
        if failures is not None:
            failures.append(f"{name} failed: {shown_name(exc)}: {' '.join(str(exc).split())}")


def broadcast(value, dd):
    if not dd.enabled:
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


@dataclass(frozen=True)
class Task:
    """One unit of work for :func:`attempt`: a grid run or a tuning candidate.

    Attributes:
        key: its key in the store.
        table: its table (``runs`` or ``tuning``).
        name: how a failure line names it (``"run p/ls/0 (method ls, seed 0)"``).
        claim: claims it in the store (True: held by this process now).
        produce: trains (or reuses) it; returns what ``record`` reads.
        record: evaluates and records it (every rank calls it; rank 0 writes); returns the
            details of its "done" line (``" (acc ...)"``), or None.
        fail: records its failure in the store.
    """

    key: str
    table: str
    name: str
    claim: Callable[[], bool]
    produce: Callable[[], dict]
    record: Callable[[dict], str | None]
    fail: Callable[[str], None]


class Report(Protocol):
    """How the attempts of a bench or a tuning speak (progress lines, log lines)."""

    def held(self, key: str, waits: bool) -> None:
        """Another live process holds ``key`` (``waits``: it is retried later)."""

    def skipped(self, key: str) -> None:
        """``key`` was finished earlier."""

    def begin(self, key: str) -> None:
        """``key`` starts here."""

    def done(self, key: str, seconds: float, details: str | None) -> None:
        """``key`` was produced and recorded here in ``seconds``."""

    def failed(self, key: str, line: str, seconds: float) -> None:
        """``key`` failed here after ``seconds`` (``line``: ``FAILED: <error>: <message>``)."""


def attempt(task: Task, store, dd, counts: Counts, report: Report, failures: list | None = None,
            waits: bool = True) -> bool:
    """Claim, produce, record and count ``task`` (a failure is recorded and counted, not raised;
    :func:`run_recorded`).

    Rank 0 claims; its :class:`Outcome` is broadcast to the other ranks, which train alongside.
    Returns False when another live process holds the task and ``waits``: the caller retries it
    later (:func:`work_queue`), and takes it over when its holder dies. Without ``waits`` (one
    scheduled task) such a task is counted as skipped. True when the task is settled here.
    """
    outcome = broadcast(claim_outcome(store, task.table, task.key, task.claim()), dd)
    if outcome is Outcome.ELSEWHERE:
        report.held(task.key, waits)
        if waits:
            return False
        counts.skipped += 1
        return True
    if outcome is Outcome.DONE:
        counts.skipped += 1
        report.skipped(task.key)
        return True
    t0 = time.time()
    report.begin(task.key)

    def work() -> None:
        details = task.record(task.produce())
        counts.done += 1
        report.done(task.key, time.time() - t0, details)

    run_recorded(work, task.fail, dd.is_main, counts, lambda line: report.failed(task.key, line, time.time() - t0),
                 failures, task.name)
    return True
