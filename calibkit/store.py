"""The results database of ``calibkit bench``: one SQLite file, ``runs.db``, one row per run.

The ``tuning`` table holds ``calibkit tune``'s candidates (one row per method and hyperparameter
point: status, validation metrics, ``selected`` flag), claimed and finished like runs.

A run is identified by its key ``preset/method/seed``. Its row records the status
(``running``, ``done``, ``failed``), the full config, the seed, the git commit, the package
versions, the metrics before and after temperature scaling, the OOD and robustness figures,
the paths of the run directory and logits file, the training wall time and timestamps.

Safety rules, each with a reason:

* An existing file is checked **before** SQLite is allowed to write anything to it: it must start
  with the SQLite header, pass ``PRAGMA quick_check`` when opened read-only, and either be empty
  or hold calibkit's ``runs`` and ``meta`` tables. Anything else raises :class:`StoreError` and the
  file's bytes stay as they were (a bench must never "repair" a database by overwriting it).
* WAL journal mode plus a busy timeout let two benches (or a bench and ``calibkit report``) use
  the same database at once; every write is one ``BEGIN IMMEDIATE`` transaction, so a claim or a
  result is either fully written or not at all.
* A finished (``done``) row is never overwritten: results already written are never lost.

Example:
    >>> import tempfile, os
    >>> db = Store(os.path.join(tempfile.mkdtemp(), "runs.db"))
    >>> db.claim("smoke/ce/0", preset="smoke", method="ce", seed=0, config={"epochs": 1})
    True
    >>> db.finish("smoke/ce/0", metrics={"before": {"ece": 0.1}})
    >>> db.get("smoke/ce/0")["status"]
    'done'
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone

SCHEMA_VERSION = 1
SQLITE_HEADER = b"SQLite format 3\x00"
# Seconds a writer waits for another writer's lock before giving up with an error.
BUSY_TIMEOUT_S = 60.0

# Columns holding JSON documents: encoded on write, decoded on read.
JSON_COLUMNS = ("config", "versions", "metrics", "ood", "robustness", "extra", "hparams", "criterion")

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
    owner         TEXT,                         -- host:pid:token of the bench that claimed it
    config        TEXT,                         -- JSON: the full config of the run
    git_commit    TEXT,
    versions      TEXT,                         -- JSON: python, torch, numpy, calibkit, ...
    metrics       TEXT,                         -- JSON: {"before": {...}, "after": {...}, "temperature": T}
    ood           TEXT,                         -- JSON: OOD AUROC and FPR@95 (entropy, max-conf)
    robustness    TEXT,                         -- JSON: per corruption/severity acc and ECE + means
    extra         TEXT,                         -- JSON: method-specific facts (e.g. MaC-Cal keep rates)
    run_dir       TEXT,
    logits_path   TEXT,
    train_time_s  REAL,
    eval_time_s   REAL,
    error         TEXT,
    attempts      INTEGER NOT NULL DEFAULT 1,
    created_at    TEXT    NOT NULL,
    started_at    TEXT,
    finished_at   TEXT
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
    run_dir       TEXT,
    train_time_s  REAL,
    git_commit    TEXT,
    error         TEXT,
    attempts      INTEGER NOT NULL DEFAULT 1,
    created_at    TEXT    NOT NULL,
    started_at    TEXT,
    finished_at   TEXT
);
CREATE INDEX IF NOT EXISTS tuning_by_method ON tuning (preset, method, seed);
"""


class StoreError(RuntimeError):
    """The database file cannot be used (not SQLite, corrupt, or not calibkit's)."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def run_key(preset: str, method: str, seed: int) -> str:
    """The key of one run: ``preset/method/seed``."""
    for name, value in (("preset", preset), ("method", method)):
        if not value or "/" in value:
            raise ValueError(f"{name} must be a non-empty name without '/', got {value!r}")
    return f"{preset}/{method}/{int(seed)}"


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
        raise StoreError(
            f"{path} is not an SQLite database (bad header {header[:16]!r}); "
            "refusing to use or overwrite it: move it away, or use another folder"
        )
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
        try:
            verdict = con.execute("PRAGMA quick_check").fetchone()[0]
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            version = None
            if "meta" in tables:
                row = con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
                version = row[0] if row else None
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path} is a corrupt SQLite database ({exc}); refusing to use or overwrite it") from exc
    if verdict != "ok":
        raise StoreError(f"{path} failed the SQLite integrity check ({verdict}); refusing to use or overwrite it")
    if tables and not {"runs", "meta"} <= tables:
        raise StoreError(
            f"{path} is an SQLite database but not a calibkit results database "
            f"(tables: {sorted(tables)}); refusing to modify it"
        )
    if version is not None and int(version) > SCHEMA_VERSION:
        raise StoreError(f"{path} has schema version {version}, newer than this calibkit ({SCHEMA_VERSION})")


class Store:
    """A calibkit results database (``runs.db``).

    Args:
        path: the database file; created (with its directory) if absent.
        readonly: open without creating or writing anything (used by ``calibkit report``).

    Raises:
        StoreError: the file exists but is not a healthy calibkit database.
        FileNotFoundError: ``readonly`` and the file does not exist.
    """

    def __init__(self, path: str, readonly: bool = False):
        self.path = os.fspath(path)
        self.readonly = readonly
        check_database_file(self.path)
        if readonly:
            if not os.path.exists(self.path):
                raise FileNotFoundError(f"no results database at {self.path}")
            self._con = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S,
                                        isolation_level=None, check_same_thread=False)
        else:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            # isolation_level=None: we issue BEGIN IMMEDIATE / COMMIT ourselves.
            self._con = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                        check_same_thread=False)
            self._con.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            self._con.execute("PRAGMA journal_mode = WAL")
            self._con.execute("PRAGMA synchronous = NORMAL")
            with self._write():
                # One statement at a time: executescript() would commit our open transaction.
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        self._con.execute(statement)
                self._con.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
                                  (str(SCHEMA_VERSION),))
        self._con.row_factory = sqlite3.Row
        # Identifies this bench in the rows it claims (host and pid let a later bench tell a
        # crashed claim from one still running).
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    # -- plumbing ---------------------------------------------------------------------------
    def close(self) -> None:
        self._con.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

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

    @staticmethod
    def _decode(row: sqlite3.Row | None) -> dict | None:
        if row is None:
            return None
        out = dict(row)
        for col in JSON_COLUMNS:
            if out.get(col) is not None:
                out[col] = json.loads(out[col])
        return out

    # -- queries ----------------------------------------------------------------------------
    def get(self, key: str) -> dict | None:
        """The row of run ``key`` as a dict (JSON columns decoded), or ``None``."""
        return self._decode(self._con.execute("SELECT * FROM runs WHERE run_key = ?", (key,)).fetchone())

    def runs(self, preset: str | None = None, status: str | None = "done") -> list[dict]:
        """Rows, optionally filtered by preset and status, ordered by id (insertion order)."""
        sql, args = "SELECT * FROM runs WHERE 1=1", []
        if preset is not None:
            sql += " AND preset = ?"
            args.append(preset)
        if status is not None:
            sql += " AND status = ?"
            args.append(status)
        return [self._decode(r) for r in self._con.execute(sql + " ORDER BY id", args)]

    def presets(self) -> list[str]:
        """The presets that have rows, in order of first appearance."""
        rows = self._con.execute("SELECT preset FROM runs GROUP BY preset ORDER BY MIN(id)")
        return [r[0] for r in rows]

    def busy_elsewhere(self, key: str, table: str = "runs") -> bool:
        """Whether run (or candidate) ``key`` is being run right now by another live process."""
        col = _KEY_COLUMN[table]
        row = self._con.execute(f"SELECT status, owner FROM {table} WHERE {col} = ?", (key,)).fetchone()
        return bool(row) and row[0] == "running" and row[1] != self.owner and _owner_alive(row[1])

    def candidates(self, preset: str | None = None, method: str | None = None, seed: int | None = None,
                   status: str | None = "done") -> list[dict]:
        """Rows of the ``tuning`` table (JSON decoded), filtered, in insertion order."""
        tables = {r[0] for r in self._con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "tuning" not in tables:  # a database written before tuning existed
            return []
        sql, args = "SELECT * FROM tuning WHERE 1=1", []
        for col, value in (("preset", preset), ("method", method), ("seed", seed), ("status", status)):
            if value is not None:
                sql += f" AND {col} = ?"
                args.append(value)
        return [self._decode(r) for r in self._con.execute(sql + " ORDER BY id", args)]

    def get_meta(self, key: str) -> str | None:
        """The ``meta`` value under ``key`` (``None`` when absent)."""
        row = self._con.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    # -- writes -----------------------------------------------------------------------------
    def put_meta(self, key: str, value: str) -> None:
        """Set the ``meta`` value under ``key`` (``schema_version`` is not writable)."""
        if key == "schema_version":
            raise ValueError("meta key 'schema_version' is the store's own")
        with self._write() as con:
            con.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, str(value)))

    def claim(self, key: str, *, preset: str, method: str, seed: int, config: dict | None = None,
              git_commit: str | None = None, versions: dict | None = None) -> bool:
        """Mark run ``key`` as being run by this bench; ``False`` if it must be skipped.

        Skipped: the run is ``done``, or another live bench on this host holds it (a claim
        whose owner process has died, e.g. after Ctrl-C or a crash, is taken over).
        """
        return self._claim("runs", key, {"preset": preset, "method": method, "seed": int(seed)},
                           {"config": config, "git_commit": git_commit, "versions": versions})

    def claim_candidate(self, key: str, *, preset: str, method: str, seed: int, hparams: dict,
                        config: dict | None = None, git_commit: str | None = None) -> bool:
        """:meth:`claim` for a tuning candidate (``tuning`` table)."""
        return self._claim("tuning", key, {"preset": preset, "method": method, "seed": int(seed), "hparams": hparams},
                           {"config": config, "git_commit": git_commit})

    def _claim(self, table: str, key: str, fixed: dict, update: dict) -> bool:
        col = _KEY_COLUMN[table]
        enc = lambda d: {k: _dumps(v) if k in JSON_COLUMNS else v for k, v in d.items()}  # noqa: E731
        with self._write() as con:
            row = con.execute(f"SELECT status, owner FROM {table} WHERE {col} = ?", (key,)).fetchone()
            now = _now()
            if row is None:
                cols = {col: key, **enc(fixed), **enc(update), "status": "running", "owner": self.owner,
                        "created_at": now, "started_at": now}
                con.execute(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                            list(cols.values()))
                return True
            status, owner = row
            if status == "done":
                return False
            if status == "running" and owner != self.owner and _owner_alive(owner):
                return False
            sets = "".join(f", {c} = ?" for c in update)
            con.execute(f"UPDATE {table} SET status='running', owner=?{sets}, error=NULL, started_at=?,"
                        f" attempts=attempts+1 WHERE {col}=?", [self.owner, *enc(update).values(), now, key])
            return True

    def finish(self, key: str, **fields) -> None:
        """Store the results of run ``key`` and mark it ``done`` in one transaction.

        Keyword fields are column names (``metrics``, ``ood``, ``robustness``, ``extra``,
        ``run_dir``, ``logits_path``, ``train_time_s``, ``eval_time_s``).
        """
        self._update("runs", key, "done", fields)

    def retire(self, key: str, new_key: str, run_dir: str | None, logits_path: str | None) -> None:
        """Move finished run ``key`` (results intact) to ``new_key``, whose run directory is now
        ``run_dir``: a re-tuned method's old run, kept but out of the way of the new one."""
        with self._write() as con:
            row = con.execute("SELECT status FROM runs WHERE run_key = ?", (key,)).fetchone()
            if row is None or row[0] != "done":
                raise KeyError(f"no finished run {key!r} in {self.path}")
            con.execute("UPDATE runs SET run_key = ?, run_dir = ?, logits_path = ? WHERE run_key = ?",
                        (new_key, run_dir, logits_path, key))

    def fail(self, key: str, error: str) -> None:
        """Mark run ``key`` as ``failed`` with its error message (a later bench retries it)."""
        self._update("runs", key, "failed", {"error": str(error)[:4000]})

    def finish_candidate(self, key: str, **fields) -> None:
        """:meth:`finish` for a tuning candidate (``metrics``, ``run_dir``, ``train_time_s``)."""
        self._update("tuning", key, "done", fields)

    def fail_candidate(self, key: str, error: str) -> None:
        """:meth:`fail` for a tuning candidate."""
        self._update("tuning", key, "failed", {"error": str(error)[:4000]})

    def select_candidate(self, preset: str, method: str, seed: int, key: str, criterion: dict) -> None:
        """Flag candidate ``key`` as the selection of ``(preset, method, seed)`` (the others unflagged).

        Only the flag and the criterion change: the candidates' results stay as written.
        """
        with self._write() as con:
            row = con.execute("SELECT status, preset, method, seed FROM tuning WHERE cand_key = ?", (key,)).fetchone()
            if row is None or row[0] != "done" or tuple(row[1:]) != (preset, method, int(seed)):
                raise KeyError(f"no finished candidate {key!r} of {preset}/{method}/{seed} in {self.path}")
            con.execute("UPDATE tuning SET selected = 0, criterion = NULL WHERE preset = ? AND method = ? AND seed = ?",
                        (preset, method, int(seed)))
            con.execute("UPDATE tuning SET selected = 1, criterion = ? WHERE cand_key = ?", (_dumps(criterion), key))

    def _update(self, table: str, key: str, status: str, fields: dict) -> None:
        allowed = _FIELDS[table]
        what = "run" if table == "runs" else "candidate"
        unknown = set(fields) - allowed
        if unknown:
            raise ValueError(f"unknown {what} fields {sorted(unknown)}; expected some of {sorted(allowed)}")
        cols = sorted(fields)
        values = [_dumps(fields[c]) if c in JSON_COLUMNS else fields[c] for c in cols]
        sets = "".join(f", {c} = ?" for c in cols)
        col = _KEY_COLUMN[table]
        with self._write() as con:
            row = con.execute(f"SELECT status FROM {table} WHERE {col} = ?", (key,)).fetchone()
            if row is None:
                raise KeyError(f"{what} {key!r} was never claimed in {self.path}")
            if row[0] == "done":
                # Results already written are never replaced.
                raise StoreError(f"{what} {key!r} is already done in {self.path}; not overwriting it")
            con.execute(f"UPDATE {table} SET status = ?, finished_at = ?{sets} WHERE {col} = ?",
                        [status, _now(), *values, key])


_KEY_COLUMN = {"runs": "run_key", "tuning": "cand_key"}
# Columns a finish/fail may write, per table.
_FIELDS = {"runs": {"config", "versions", "metrics", "ood", "robustness", "extra", "run_dir", "logits_path",
                    "train_time_s", "eval_time_s", "error"},
           "tuning": {"config", "metrics", "run_dir", "train_time_s", "error"}}


def _dumps(value) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, allow_nan=True)


def _owner_alive(owner: str | None) -> bool:
    """Whether the process that claimed a run still runs (always assumed so on another host)."""
    try:
        host, pid, _ = (owner or "").split(":")
        pid = int(pid)
    except ValueError:
        return False
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

