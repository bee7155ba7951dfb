"""How the bench and the tuner work through a grid that other processes share.

:func:`work_queue` postpones what another process holds, :func:`claim_outcome` reads what a claim
meant, :func:`run_recorded` records a failure instead of raising it, :func:`broadcast` sends rank
0's answer to every rank of a DDP job.
"""

from __future__ import annotations

import time
import traceback

import torch

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


def claim_outcome(store, table: str, key: str, claimed: bool) -> str:
    """``claimed``, ``done`` (finished, by this or another process) or ``elsewhere`` (held by
    another live process, or being claimed at this instant): what a claim's True/False meant."""
    if claimed:
        return "claimed"
    return "done" if store.status(key, table) == "done" else "elsewhere"


def run_recorded(work, fail, is_main: bool, counts: dict, report, failures: list | None = None,
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
    from calibkit.errors import shown_name
    from calibkit.rundir import disk_full

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
        counts["failed"] += 1
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
