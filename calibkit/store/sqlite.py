"""The SQLite results store: one file, ``runs.db``, in the bench directory.

Safety rules, each with a reason:

* An existing file is checked **before** SQLite is allowed to write anything to it: it must start
  with the SQLite header, pass ``PRAGMA quick_check`` when opened read-only, and either be empty
  or hold calibkit's ``runs`` and ``meta`` tables. Anything else raises :class:`StoreError` and the
  file's bytes stay as they were (a bench must never "repair" a database by overwriting it).
* WAL journal mode plus a busy timeout let two benches (or a bench and ``calibkit report``) use
  the same database at once; every write is one ``BEGIN IMMEDIATE`` transaction, so a claim or a
  result is either fully written or not at all. WAL needs shared memory between the processes:
  it does not work over a network filesystem (docs/store.md).
* A finished (``done``) row is never overwritten: results already written are never lost.
* A schema-1 database (absolute or working-directory paths, no heartbeat) is migrated once when
  opened for writing, with one line on standard error; opened read-only it is read through the
  same path rules without being changed.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from contextlib import contextmanager

from calibkit.store.base import BaseStore
from calibkit.store.common import SCHEMA_VERSION, StoreError, iso_epoch, legacy_path, loaded_path

SQLITE_HEADER = b"SQLite format 3\x00"
# Seconds a writer waits for another writer's lock before giving up with an error.
BUSY_TIMEOUT_S = 60.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    run_key       TEXT    NOT NULL UNIQUE,      -- preset/method/seed
    preset        TEXT    NOT NULL,
    method        TEXT    NOT NULL,
    seed          INTEGER NOT NULL,
    status        TEXT    NOT NULL CHECK (status IN ('running', 'done', 'failed')),
    owner         TEXT,                         -- host:pid:token of the process that claimed it
    config        TEXT,                         -- JSON: the full config of the run
    git_commit    TEXT,
    versions      TEXT,                         -- JSON: python, torch, numpy, calibkit, ...
    metrics       TEXT,                         -- JSON: {"before": {...}, "after": {...}, "temperature": T}
    ood           TEXT,                         -- JSON: OOD AUROC and FPR@95 (entropy, max-conf)
    robustness    TEXT,                         -- JSON: per corruption/severity acc and ECE + means
    extra         TEXT,                         -- JSON: method-specific facts (e.g. MaC-Cal keep rates)
    run_dir       TEXT,                         -- relative to the bench directory
    logits_path   TEXT,                         -- relative to the bench directory
    train_time_s  REAL,
    eval_time_s   REAL,
    error         TEXT,
    attempts      INTEGER NOT NULL DEFAULT 1,
    created_at    TEXT    NOT NULL,
    started_at    TEXT,
    finished_at   TEXT,
    heartbeat_at  REAL                          -- seconds since the epoch: the owner's last sign of life
);
CREATE INDEX IF NOT EXISTS runs_by_preset ON runs (preset, method, seed);
CREATE TABLE IF NOT EXISTS tuning (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    cand_key      TEXT    NOT NULL UNIQUE,      -- preset/method/seed/<hyperparameters>
    preset        TEXT    NOT NULL,
    method        TEXT    NOT NULL,
    seed          INTEGER NOT NULL,             -- the selection seed
    hparams       TEXT    NOT NULL,             -- JSON: {address: value} of the candidate
    status        TEXT    NOT NULL CHECK (status IN ('running', 'done', 'failed')),
    owner         TEXT,
    config        TEXT,                         -- JSON: the candidate's run record
    metrics       TEXT,                         -- JSON: validation metrics only (never test)
    criterion     TEXT,                         -- JSON: how the selection was made
    selected      INTEGER NOT NULL DEFAULT 0,   -- 1: the method's chosen candidate
    run_dir       TEXT,                         -- relative to the bench directory
    train_time_s  REAL,
    git_commit    TEXT,
    error         TEXT,
    attempts      INTEGER NOT NULL DEFAULT 1,
    created_at    TEXT    NOT NULL,
    started_at    TEXT,
    finished_at   TEXT,
    heartbeat_at  REAL
);
CREATE INDEX IF NOT EXISTS tuning_by_method ON tuning (preset, method, seed);
"""


def check_database_file(path: str) -> None:
    """Raise :class:`StoreError` unless ``path`` is absent, empty, or a healthy calibkit database.

    Only reads: the header bytes, then a read-only connection for the integrity check and the
    table list. Nothing is written, so a file that fails the check keeps its bytes.
    """
    if not os.path.exists(path):
        return
    if os.path.isdir(path):
        raise StoreError(f"{path} is a directory, not a results database")
    if os.path.getsize(path) == 0:
        return
    with open(path, "rb") as fh:
        header = fh.read(len(SQLITE_HEADER))
    if header != SQLITE_HEADER:
        raise StoreError(f"{path} is not an SQLite database (bad header {header[:16]!r}); {_move_away(path)}")
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
        try:
            verdict = con.execute("PRAGMA quick_check").fetchone()[0]
            tables = _tables(con)
            version = _version(con, tables)
        finally:
            con.close()
    except sqlite3.OperationalError as exc:  # not damaged: it cannot be opened (permissions, a read-only folder)
        raise StoreError(f"{path} cannot be opened ({exc}); SQLite also writes beside it ({os.path.basename(path)}"
                         f"-wal, -shm): check that you may write to {os.path.dirname(os.path.abspath(path))}") from exc
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path} is a corrupt SQLite database ({exc}); {_move_away(path)}") from exc
    if verdict != "ok":  # one line: SQLite lists its findings under a "*** in database main ***" banner
        found = "; ".join(line.strip() for line in verdict.splitlines() if line.strip() and not line.startswith("***"))
        raise StoreError(f"{path} failed the SQLite integrity check ({found}); {_move_away(path)}")
    if tables and not {"runs", "meta"} <= tables:
        raise StoreError(
            f"{path} is an SQLite database but not a calibkit results database "
            f"(tables: {sorted(tables)}); refusing to modify it"
        )
    if version is not None and version > SCHEMA_VERSION:
        raise StoreError(f"{path} has schema version {version}, newer than this calibkit ({SCHEMA_VERSION})")


def _move_away(path: str) -> str:
    """What to do with a database file calibkit will not touch, and what survives without it."""
    return (f"refusing to use or overwrite it: move it away with its -wal and -shm files, if any (e.g. to "
            f"{path}.bad), or use another folder; the run "
            "folders keep their training, so running the same bench or tune command again rebuilds the database "
            "from them (finished training is reused, only the evaluation is redone), and a SLURM bench's result "
            "files are imported again by --collect")


def _tables(con) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _version(con, tables) -> int | None:
    """The schema version of a calibkit database (1 when its version row is missing), None when empty."""
    if "runs" not in tables:
        return None
    row = con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() if "meta" in tables else None
    return int(row[0]) if row else 1


class Store(BaseStore):
    """A calibkit results database (``runs.db``).

    Args:
        path: the database file; created (with its directory) if absent. Its folder is the bench
            directory the stored paths are relative to.
        readonly: open without creating or writing anything (used by ``calibkit report``).
        heartbeat_s, grace_s: the lease (default: ``CALIBKIT_HEARTBEAT_S`` and
            ``CALIBKIT_LEASE_GRACE_S``, else 30 s and 600 s; see :mod:`calibkit.store.common`).
        log: where the one-line migration notice goes (default: standard error).

    Raises:
        StoreError: the file exists but is not a healthy calibkit database.
        FileNotFoundError: ``readonly`` and the file does not exist.
    """

    def __init__(self, path, readonly: bool = False, heartbeat_s: float | None = None,
                 grace_s: float | None = None, log=None):
        self.path = self.where = os.fspath(path)
        self.readonly = readonly
        self._setup_lease(os.path.dirname(os.path.abspath(self.path)), heartbeat_s, grace_s)
        check_database_file(self.path)
        self._legacy = False
        if readonly:
            if not os.path.exists(self.path):
                raise FileNotFoundError(f"no results database at {self.path}")
            self._con = self._connect(readonly=True)
            tables = _tables(self._con)
            self._legacy = (_version(self._con, tables) or SCHEMA_VERSION) < 2
            if self._legacy:
                self._BEAT = "NULL"
        else:
            os.makedirs(self.root, exist_ok=True)
            self._con = self._connect(readonly=False)
            self._con.execute("PRAGMA journal_mode = WAL")
            with self._write():
                self._create_or_migrate(log or (lambda line: print(line, file=sys.stderr)))

    def _connect(self, readonly: bool):
        # isolation_level=None: we issue BEGIN IMMEDIATE / COMMIT ourselves.
        if readonly:
            return sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S,
                                   isolation_level=None, check_same_thread=False)
        con = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        con.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        con.execute("PRAGMA synchronous = NORMAL")
        return con

    def _create_or_migrate(self, log) -> None:
        con = self._con
        version = _version(con, _tables(con))
        # One statement at a time: executescript() would commit our open transaction.
        for statement in SCHEMA.split(";"):
            if statement.strip():
                con.execute(statement)
        if version is not None and version < 2:
            self._migrate_1_to_2(log)
        con.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))

    def _migrate_1_to_2(self, log) -> None:
        """Schema 1 -> 2: a heartbeat column (set from ``started_at``) and stored paths made
        relative to the bench directory (:func:`~calibkit.store.common.legacy_path`)."""
        con = self._con
        rewritten, lost = 0, []
        for table, key, paths in (("runs", "run_key", ("run_dir", "logits_path")),
                                  ("tuning", "cand_key", ("run_dir",))):
            if "heartbeat_at" not in {r[1] for r in con.execute(f"PRAGMA table_info({table})")}:
                con.execute(f"ALTER TABLE {table} ADD COLUMN heartbeat_at REAL")
            for row in con.execute(f"SELECT {key}, started_at, {', '.join(paths)} FROM {table}").fetchall():
                new = {}
                for col, value in zip(paths, row[2:]):
                    if value is None:
                        continue
                    rel = legacy_path(value, self.root)
                    if rel is None:
                        lost.append(f"{row[0]} {col}")
                    elif rel != value:
                        new[col] = rel
                rewritten += len(new)
                sets = "".join(f", {c} = ?" for c in new)
                con.execute(f"UPDATE {table} SET heartbeat_at = ?{sets} WHERE {key} = ?",
                            [iso_epoch(row[1]), *new.values(), row[0]])
        more = ", ..." if len(lost) > 3 else ""
        note = f"; {len(lost)} not found under it, left as they were ({', '.join(lost[:3])}{more})" if lost else ""
        log(f"{self.path}: migrated from schema 1 to {SCHEMA_VERSION}: {rewritten} stored path(s) rewritten "
            f"relative to {self.root}{note}; claims now expire without a heartbeat")

    # -- backend hooks ------------------------------------------------------------------------
    def _sql(self, sql: str, args=()):
        return self._con.execute(sql, args)

    @contextmanager
    def _write(self):
        """One write transaction; BEGIN IMMEDIATE takes the write lock up front (no upgrade deadlock)."""
        if self.readonly:
            raise StoreError(f"{self.path} was opened read-only")
        self._con.execute("BEGIN IMMEDIATE")
        try:
            yield self._con
        except BaseException:
            self._con.execute("ROLLBACK")
            raise
        self._con.execute("COMMIT")

    def _clock(self) -> float:
        return time.time()

    def _has_table(self, name: str) -> bool:
        return name in _tables(self._con)

    def _load_path(self, value):
        if self._legacy and value is not None:
            value = legacy_path(value, self.root) or value
        return loaded_path(value, self.root)

    def _beat(self) -> None:
        con = getattr(self, "_beat_con", None)
        if con is None:
            con = self._beat_con = self._connect(readonly=False)
        now = time.time()
        for table in ("runs", "tuning"):
            con.execute(f"UPDATE {table} SET heartbeat_at = ? WHERE owner = ? AND status = 'running'",
                        (now, self.owner))

    def _close_connection(self) -> None:
        con = getattr(self, "_beat_con", None)
        if con is not None:
            con.close()
            self._beat_con = None
        self._con.close()
