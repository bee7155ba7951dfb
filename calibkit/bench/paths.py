"""Where a bench keeps its runs: one directory per (preset, method, seed), one per tuning candidate.

The layout is written here: :func:`run_dir_for` and :func:`candidate_dir_for` (the result files
of a scheduler's task, :mod:`calibkit.bench.resultfiles`, read it too). The bench's files around
its runs are named here as well: its database (:data:`BENCH_DB`), which command owns a directory
(:data:`OWNERS`), the config paths a run records relative to the bench directory (:func:`rooted`),
and a run directory that holds only the records of a scheduler's attempts (:func:`only_records`);
:func:`placement` hands the last two to the training loop (:class:`calibkit.train.state.Placement`),
which knows nothing of benches.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from calibkit.bench.grid import REFERENCE
from calibkit.rundir import CONFIG
from calibkit.store.common import legacy_path, stored_path
from calibkit.train.state import Placement

__all__ = ["RETIRED", "BENCH_DB", "OWNERS", "ROOTED_FIELDS", "candidate_dir_for", "run_dir_for", "directory_owner",
           "rooted", "rooted_config", "only_records", "placement"]

# Marks the key of a run moved aside after a re-tuning (``preset/method/seed~<values>``; its run
# directory ``seed<k>~<values>``): see ``calibkit.bench.runner.Bench.supersede``.
RETIRED = "~"

BENCH_DB = "runs.db"  # a bench's (and tune's) results database, at the top of its output directory
# The per-run result records a scheduler's task writes in the run directory (calibkit.bench.resultfiles,
# which reads and writes them; only_records reads them too).
RECORD_FORMAT = "calibkit-result"
RESULT = "result.json"
CANDIDATE = "candidate.json"


def run_dir_for(out, preset: str, method: str, seed: int) -> Path:
    """``OUT/runs/<preset>/<method>/seed<k>``: the run directory of one grid run."""
    return Path(out) / "runs" / preset / method / f"seed{seed}"


def candidate_dir_for(out, preset: str, method: str, seed: int, slug: str) -> Path:
    """The run directory of one tuning candidate: ``OUT/tune/<preset>/<method>/<values>``
    (the reference method's, which has nothing to tune, is its run of the selection seed)."""
    if method == REFERENCE:
        return run_dir_for(out, preset, method, seed)
    return Path(out) / "tune" / preset / method / slug

# TrainConfig fields holding a directory that may lie inside the bench directory a run belongs to
# (the annotated CSM set under DIR/cache/): config.json records them relative to that directory.
ROOTED_FIELDS = ("csm_data",)

# Which command a directory belongs to, by the file that command writes first at its top level
# (docs/design.md, "Who owns a directory"). Commands refuse to write into a directory another owns.
OWNERS = {CONFIG: "a training run's directory (calibkit train)", BENCH_DB: "a bench directory (calibkit bench/tune)"}


def directory_owner(path) -> str | None:
    """What ``path`` belongs to (an :data:`OWNERS` description), or None: absent, empty or plain."""
    path = Path(path)
    if not path.is_dir():
        return None
    for marker, owner in OWNERS.items():
        if (path / marker).exists():
            return f"{owner}: it holds {marker}"
    return None


def rooted(value, root, recorded: bool = False) -> str | None:
    """A :data:`ROOTED_FIELDS` value in the form ``config.json`` records it for a run of the bench
    directory ``root``: relative to ``root`` (``/`` separators) when it lies inside it, else absolute;
    so a bench directory moved or copied with its runs still holds the same runs.

    Args:
        value: the path (None passes through).
        root: the bench directory.
        recorded: ``value`` was read from a ``config.json``: a relative one is already relative to
            ``root``; an absolute one (written before these fields were recorded relative) is read
            as the same place when it lies inside ``root``, or, gone since, when its tail names a
            path that exists under ``root`` (the directory was moved: :func:`calibkit.store.common.legacy_path`).
            Without it, ``value`` is a path of this process (relative to the current directory).
    """
    if value is None:
        return None
    root = os.path.abspath(os.fspath(root))
    value = os.fspath(value)
    if not recorded:
        return stored_path(value, root)
    if os.path.isabs(value) and os.path.exists(value) and stored_path(value, root) == os.path.normpath(value):
        return os.path.normpath(value)  # an existing place outside root: never re-read as one inside it
    return legacy_path(value, root) or value


def rooted_config(config: dict, root, recorded: bool = False) -> dict:
    """``config`` (``TrainConfig.to_dict()``) with its :data:`ROOTED_FIELDS` :func:`rooted` under ``root``."""
    return {**config, **{k: rooted(config.get(k), root, recorded) for k in ROOTED_FIELDS if k in config}}


def only_records(run_dir) -> bool:
    """True when ``run_dir`` holds nothing but the records of attempts that did not finish.

    A scheduler's task interrupted (cancelled, requeued) or failed before training wrote anything
    leaves only its record there (:mod:`calibkit.bench.resultfiles`), saying ``failed`` (e.g.
    "interrupted"). That directory is calibkit's and holds no run: the next attempt starts the run
    in it (the record stays until the attempt writes its own). A record saying ``done``, an
    unreadable one or any other file means otherwise. Temporary files of a record's write are ignored.
    """
    records_named = (RESULT, CANDIDATE)
    run_dir = Path(run_dir)
    names = [p.name for p in run_dir.iterdir()] if run_dir.is_dir() else []
    records = [n for n in names if n in records_named]
    others = [n for n in names if n not in records_named
              and not any(n.startswith(f".{r}.") and n.endswith(".tmp") for r in records_named)]
    if not records or others:
        return False
    for name in records:
        try:
            doc = json.loads((run_dir / name).read_text())
        except (OSError, ValueError):
            return False
        row = doc.get("row") if isinstance(doc, dict) else None
        if not isinstance(row, dict) or doc.get("format") != RECORD_FORMAT or row.get("status") == "done":
            return False
    return True


def placement(root) -> Placement:
    """How a run of the bench directory ``root`` sits in it, for :func:`calibkit.train.train`:
    ``config.json`` records the config's paths inside ``root`` relative to it (:func:`rooted_config`),
    so the directory can be moved or copied and its runs still resume, and a run directory holding
    only the records of attempts that did not finish (:func:`only_records`) starts the run."""
    return Placement(record=lambda config: rooted_config(config, root),
                     recorded=lambda config: rooted_config(config, root, recorded=True),
                     fresh=only_records)
