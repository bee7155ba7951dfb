"""What both results stores share: keys, column lists, JSON encoding, stored paths and the lease rule.

Stored paths (decided here; docs/store.md): ``run_dir`` and ``logits_path`` are written relative to
the bench directory (the folder holding ``runs.db``, or ``--out`` with a server store), with ``/``
separators, and handed back absolute, joined to wherever that directory is now. A path outside the
bench directory is kept absolute. So a bench directory can be moved, copied or mounted elsewhere.

Leases: a claim names its owner ``host:pid:token`` and carries ``heartbeat_at`` (seconds since the
epoch), refreshed by the owner every ``heartbeat_s``. A claim made on this host is alive while
its process is (a zombie, a process that has ended but whose parent has not reaped it yet, is
dead: ``kill(pid, 0)`` alone would call it alive); one made on another host is alive while its
heartbeat is younger than ``grace_s``.
"""

from __future__ import annotations

import json
import math
import os
import socket
from datetime import datetime, timezone
from pathlib import Path

from calibkit.errors import UserError, UserRuntimeError

SCHEMA_VERSION = 2
STATUSES = ("running", "done", "failed")
# Columns holding JSON documents: encoded on write, decoded on read.
JSON_COLUMNS = ("config", "versions", "metrics", "ood", "robustness", "extra", "hparams", "criterion")
# Columns holding a path (stored relative to the bench directory).
PATH_COLUMNS = ("run_dir", "logits_path")
#: The store's two tables of claimed rows: the bench's runs and the tuning's candidates.
RUNS, TUNING = "runs", "tuning"
KEY_COLUMN = {RUNS: "run_key", TUNING: "cand_key"}
#: What a claim records in each table: the columns set by the first claim, and those every claim
#: (a retry, a take-over) writes again.
CLAIM_COLUMNS = {RUNS: (("preset", "method", "seed"), ("config", "git_commit", "versions")),
                 TUNING: (("preset", "method", "seed", "hparams"), ("config", "git_commit"))}


def claim_fields(table: str, fields: dict) -> tuple[dict, dict]:
    """``(fixed, update)``: a claim's columns of ``table`` split as :data:`CLAIM_COLUMNS` says.

    Raises:
        ValueError: an unknown table, a column the table has not, or a missing first-claim column.
    """
    if table not in CLAIM_COLUMNS:
        raise ValueError(f"unknown store table {table!r}; expected one of {', '.join(CLAIM_COLUMNS)}")
    fixed_cols, update_cols = CLAIM_COLUMNS[table]
    extra = sorted(k for k, v in fields.items() if k not in fixed_cols + update_cols and v is not None)
    if extra:
        raise ValueError(f"a claim in {table!r} has no column {', '.join(extra)}")
    missing = [c for c in fixed_cols if fields.get(c) is None]
    if missing:
        raise ValueError(f"a claim in {table!r} needs {', '.join(missing)}")
    return {c: fields[c] for c in fixed_cols}, {c: fields.get(c) for c in update_cols}
# Columns a finish/fail may write, per table.
FIELDS = {"runs": {"config", "versions", "metrics", "ood", "robustness", "extra", "run_dir", "logits_path",
                   "train_time_s", "eval_time_s", "error"},
          "tuning": {"config", "metrics", "run_dir", "train_time_s", "error"}}
# Every column a row may carry (import_row), per table.
COLUMNS = {"runs": {"run_key", "preset", "method", "seed", "status", "owner", "config", "git_commit", "versions",
                    "metrics", "ood", "robustness", "extra", "run_dir", "logits_path", "train_time_s",
                    "eval_time_s", "error", "attempts", "created_at", "started_at", "finished_at", "heartbeat_at"},
           "tuning": {"cand_key", "preset", "method", "seed", "hparams", "status", "owner", "config", "metrics",
                      "criterion", "selected", "run_dir", "train_time_s", "git_commit", "error", "attempts",
                      "created_at", "started_at", "finished_at", "heartbeat_at"}}

# The owner of a claim refreshes its heartbeat this often (seconds) ...
HEARTBEAT_S = 30.0
# ... and a claim from another host whose heartbeat is older than this is taken over.
GRACE_S = 600.0
HEARTBEAT_ENV = "CALIBKIT_HEARTBEAT_S"
GRACE_ENV = "CALIBKIT_LEASE_GRACE_S"


class StoreError(UserRuntimeError):
    """The database cannot be used (not SQLite, corrupt, not calibkit's, unreachable), or a write
    would replace a finished result."""


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def iso_epoch(text: str | None) -> float | None:
    """Seconds since the epoch of an ISO timestamp written by :func:`now_iso` (None if unreadable)."""
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except (TypeError, ValueError):
        return None


def run_key(preset: str, method: str, seed: int) -> str:
    """The key of one run: ``preset/method/seed``."""
    for name, value in (("preset", preset), ("method", method)):
        if not value or "/" in value:
            raise UserError(f"{name} must be a non-empty name without '/', got {value!r}")
    return f"{preset}/{method}/{int(seed)}"


def dumps(value) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, allow_nan=True)


def lease_settings(heartbeat_s: float | None = None, grace_s: float | None = None) -> tuple[float, float]:
    """``(heartbeat_s, grace_s)``: the arguments, else the environment, else the defaults.

    Raises:
        ValueError: not a positive finite number, or a grace period under two heartbeats (a live
            owner's claim could then be taken over between two refreshes).
    """
    out = []
    given: float | str | None  # an argument, or the environment's text
    for given, env, default in ((heartbeat_s, HEARTBEAT_ENV, HEARTBEAT_S), (grace_s, GRACE_ENV, GRACE_S)):
        if given is None and os.environ.get(env):
            given = os.environ[env]
        try:
            value = float(default if given is None else given)
        except ValueError:
            raise UserError(f"{env}: not a number of seconds: {given!r}") from None
        if not math.isfinite(value) or value <= 0:
            raise UserError(f"{env}: must be a positive number of seconds, got {value!r}")
        out.append(value)
    if out[1] < 2 * out[0]:
        raise UserError(f"lease grace period {out[1]:g} s must be at least twice the heartbeat interval "
                         f"{out[0]:g} s ({GRACE_ENV}, {HEARTBEAT_ENV})")
    return out[0], out[1]


def owner_alive(owner: str | None, heartbeat_at: float | None, now: float, grace_s: float) -> bool:
    """Whether the claim of ``owner`` still holds.

    Same host: while the process lives (pid check, a zombie counting as dead; the heartbeat is
    not needed). Another host:
    while its heartbeat is younger than ``grace_s`` (a claim without a heartbeat has expired).
    A malformed owner never holds a claim.
    """
    try:
        host, pid_text, _ = (owner or "").split(":")
        pid = int(pid_text)
    except ValueError:
        return False
    if host != socket.gethostname():
        return heartbeat_at is not None and now - float(heartbeat_at) < grace_s
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """Whether process ``pid`` has ended and waits to be reaped (Linux: state ``Z`` or ``X`` in
    ``/proc/PID/stat``). False where ``/proc`` cannot tell (another system, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # "pid (comm) S ...": the name may hold spaces and parentheses, the state follows the last ')'
    fields = stat[stat.rfind(b")") + 1:].split()
    return bool(fields) and fields[0] in (b"Z", b"X")


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def stored_path(value, root: str) -> str | None:
    """The form of a path written to the database: relative to ``root`` (``/`` separators) when it
    lies inside it, else absolute. A relative ``value`` is relative to the current directory."""
    if value is None:
        return None
    full = os.path.abspath(os.fspath(value))
    if not _inside(full, root):
        # The same place reached through a symbolic link (e.g. a path made with Path.resolve()).
        real, real_root = os.path.realpath(full), os.path.realpath(root)
        if not _inside(real, real_root):
            return full
        full, root = real, real_root
    return Path(os.path.relpath(full, root)).as_posix()


def loaded_path(value: str | None, root: str) -> str | None:
    """The absolute path of a stored value (relative ones are joined to ``root``)."""
    if value is None or os.path.isabs(value):
        return value
    return os.path.normpath(os.path.join(root, *value.split("/")))


def legacy_path(value: str | None, root: str) -> str | None:
    """Where a path written by schema 1 (absolute, or relative to the bench's working directory,
    both as typed) lies relative to ``root``; None when it cannot be found.

    In order: an absolute path inside ``root``; the longest tail of its components that exists
    under ``root`` (the directory was moved, or the bench ran from another directory); a relative
    path that, read from the current directory, lies inside ``root``.
    """
    if value is None:
        return None
    if os.path.isabs(value) and _inside(os.path.normpath(value), root):
        return Path(os.path.relpath(os.path.normpath(value), root)).as_posix()
    parts = Path(value).parts[1:] if os.path.isabs(value) else Path(value).parts
    for i in range(len(parts)):
        if os.path.exists(os.path.join(root, *parts[i:])):
            return Path(*parts[i:]).as_posix()
    full = os.path.abspath(value)
    if not os.path.isabs(value) and _inside(full, root):
        return Path(os.path.relpath(full, root)).as_posix()
    return None
