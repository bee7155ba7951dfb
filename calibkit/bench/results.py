"""What a scheduler's task left in its run directory, read back for the message of a task that stopped.

The result files themselves (their format, :class:`~calibkit.bench.resultfiles.ResultFiles`, a
store backend) are :mod:`calibkit.bench.resultfiles`.
"""

from __future__ import annotations

from pathlib import Path

from calibkit import rundir
from calibkit.bench.resultfiles import candidate_path, result_path


def task_kept(out: Path, key: str) -> str:
    """What the scheduler's task of ``key`` (a run or candidate key) kept when it stopped without
    finishing, read from its run directory, and how the run continues: the command line's last words."""
    again = "a requeued task, or the same submission command run again,"
    try:
        path = result_path(out, key) if key.count("/") == 2 else candidate_path(out, key)
    except ValueError:
        return f"{again} runs it again"
    run_dir = path.parent
    if (run_dir / rundir.CHECKPOINT).is_file():
        return f"{run_dir} keeps the run up to its last checkpoint; {again} resumes it from there"
    if (run_dir / rundir.CONFIG).is_file():
        return f"{run_dir} holds the run, not yet checkpointed; {again} starts it again"
    if path.is_file():
        return f"{run_dir} holds only this attempt's record ({path.name}); {again} starts the run there"
    return f"nothing of {key} was written yet; {again} starts it"
