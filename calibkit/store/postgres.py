"""The PostgreSQL results store (``--store postgresql://...``): the same tables and API as the
SQLite store, for benches on several hosts that share no filesystem lock.

* Needs psycopg 3 (``pip install 'calibkit[postgres]'``); imported only when used.
* One database (or schema, via ``?options=-csearch_path%3DNAME``) per bench directory: run keys
  do not name the directory.
* A claim locks its row with ``SELECT ... FOR UPDATE SKIP LOCKED``: a row another process is
  claiming at that instant is skipped (and retried later by the bench), never waited for; a new
  row is inserted with ``ON CONFLICT DO NOTHING``, so two hosts inserting the same key at once
  get one winner.
* Leases are measured on the server's clock (``now()``), so hosts whose clocks disagree still
  agree on which heartbeat is stale.
* A lost connection (a server restarted or stopped, a network cut) is re-opened, and the operation
  it broke is run again as a whole, for up to :data:`RETRY_S` seconds (``CALIBKIT_STORE_RETRY_S``,
  or the ``retry_s`` argument; 0: no retry) with a pause doubling from 0.25 s to 4 s. A transaction
  cut off is rolled back by the server, except a COMMIT whose answer was lost: every operation is
  therefore safe to run twice (:func:`calibkit.store.base.retried`): a claim or a finish that did
  commit is recognised by its owner, a fail or a selection writes the same values again, and an
  import finds its own row (it then counts it as already there). Then the operation raises one
  :class:`StoreError` line: the database is unreachable, finished runs are kept, run the same
  command again. Later operations of the same store try once more, without waiting again.
"""

from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager

from calibkit.errors import UserError
from calibkit.extras import MissingExtra
from calibkit.store.base import BaseStore
from calibkit.store.common import KEY_COLUMN, SCHEMA_VERSION, StoreError
from calibkit.store.pgowner import check_owned, split_shared
from calibkit.store.secrets import redact, scrub

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id BIGSERIAL PRIMARY KEY, run_key TEXT NOT NULL UNIQUE, preset TEXT NOT NULL, method TEXT NOT NULL,
    seed INTEGER NOT NULL, status TEXT NOT NULL CHECK (status IN ('running', 'done', 'failed')), owner TEXT,
    config TEXT, git_commit TEXT, versions TEXT, metrics TEXT, ood TEXT, robustness TEXT, extra TEXT,
    run_dir TEXT, logits_path TEXT, train_time_s DOUBLE PRECISION, eval_time_s DOUBLE PRECISION, error TEXT,
    attempts INTEGER NOT NULL DEFAULT 1, created_at TEXT NOT NULL, started_at TEXT, finished_at TEXT,
    heartbeat_at DOUBLE PRECISION
);
CREATE INDEX IF NOT EXISTS runs_by_preset ON runs (preset, method, seed);
CREATE TABLE IF NOT EXISTS tuning (
    id BIGSERIAL PRIMARY KEY, cand_key TEXT NOT NULL UNIQUE, preset TEXT NOT NULL, method TEXT NOT NULL,
    seed INTEGER NOT NULL, hparams TEXT NOT NULL, status TEXT NOT NULL CHECK (status IN ('running', 'done', 'failed')),
    owner TEXT, config TEXT, metrics TEXT, criterion TEXT, selected INTEGER NOT NULL DEFAULT 0, run_dir TEXT,
    train_time_s DOUBLE PRECISION, git_commit TEXT, error TEXT, attempts INTEGER NOT NULL DEFAULT 1,
    created_at TEXT NOT NULL, started_at TEXT, finished_at TEXT, heartbeat_at DOUBLE PRECISION
);
CREATE INDEX IF NOT EXISTS tuning_by_method ON tuning (preset, method, seed);
"""
# Serialises schema creation between hosts starting at once (CREATE ... IF NOT EXISTS can race).
_SCHEMA_LOCK = 0x63616C69
# Seconds an operation keeps reconnecting after its connection was lost, before it gives up.
RETRY_S = 30.0
RETRY_ENV = "CALIBKIT_STORE_RETRY_S"
# The pause between two connection attempts: doubles from the first to the last value.
_PAUSE_S = (0.25, 4.0)
# How long one connection attempt may take (seconds; libpq's connect_timeout): the time left, within these.
_CONNECT_S = (10, 30)


def retry_setting(value: float | None = None) -> float:
    """The retry window in seconds: ``value``, else ``CALIBKIT_STORE_RETRY_S``, else :data:`RETRY_S`.

    Raises:
        ValueError: not a finite number >= 0.
    """
    given: float | str = (os.environ.get(RETRY_ENV) or RETRY_S) if value is None else value
    try:
        seconds = float(given)
    except ValueError:
        raise UserError(f"{RETRY_ENV}: not a number of seconds: {given!r}") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise UserError(f"{RETRY_ENV}: must be a number of seconds >= 0, got {given!r}")
    return seconds


def is_url(location) -> bool:
    """Whether ``location`` names a PostgreSQL server rather than a file."""
    return isinstance(location, str) and location.startswith(("postgresql://", "postgres://"))


# A server that answered a connection with one of these is only busy for a moment (worth retrying).
_TRANSIENT = ("starting up", "shutting down", "recovery", "too many", "administrator command")


def _refused(exc) -> bool:
    """Whether a failed connection was refused for good: the server answered with a FATAL error
    (no such database or role, a wrong password) that is not a restart, or the host name is unknown."""
    text = str(exc)
    return ("FATAL:" in text and not any(word in text for word in _TRANSIENT)) or "translate host name" in text


def _psycopg():
    try:
        import psycopg  # noqa: PLC0415 (optional extra postgres: imported when a PostgreSQL store is opened)
    except ImportError:
        raise MissingExtra("a PostgreSQL store needs psycopg 3: pip install 'calibkit[postgres]'") from None
    return psycopg


class PostgresStore(BaseStore):
    """A calibkit results store in a PostgreSQL database.

    Args:
        url: ``postgresql://user:password@host:port/dbname`` (libpq syntax; ``?host=/socket/dir``
            for a Unix socket).
            ``calibkit_shared=1`` among its parameters: the database may hold other applications'
            tables, or calibkit's tables of another role (:mod:`calibkit.store.pgowner`).
        root: the bench directory the stored paths are relative to (``--out``).
        readonly, heartbeat_s, grace_s: as for :class:`calibkit.store.Store`.
        retry_s: how long an operation whose connection was lost reconnects and runs again
            (default: ``CALIBKIT_STORE_RETRY_S``, else :data:`RETRY_S`).

    Raises:
        StoreError: the server cannot be reached, the database holds a newer schema, or it is not
            calibkit's (:func:`calibkit.store.pgowner.check_owned`).
    """

    _LOCK = " FOR UPDATE"

    def __init__(self, url: str, root, readonly: bool = False, heartbeat_s: float | None = None,
                 grace_s: float | None = None, log=None, retry_s: float | None = None):
        url, self.shared = split_shared(url)
        self.url, self.where, self.readonly = url, redact(url), readonly
        self.path = self.where
        self.retry_s = retry_setting(retry_s)
        self._in_op, self._gave_up = False, False
        self._setup_lease(root, heartbeat_s, grace_s)
        self._con = self._connect(self.retry_s)
        try:
            self._check_or_create()
        except BaseException:
            self._con.close()
            raise

    def _connect(self, retry_s: float = 0):
        """A connection, tried for ``retry_s`` seconds while the server does not answer (at least once)."""
        con, err = self._open(time.monotonic() + retry_s)
        if con is None:
            waited = f" (tried for {retry_s:g} s, {RETRY_ENV})" if retry_s and not _refused(err) else ""
            raise StoreError(f"cannot connect to the results database {self.where}: {self._first_line(err)}{waited}")
        return con

    def _open(self, deadline: float):
        """``(connection, None)``, or ``(None, the last error)`` once ``deadline`` has passed or the
        server refused for good (:func:`_refused`); tries at least once, pausing between tries."""
        psycopg, pause = _psycopg(), _PAUSE_S[0]
        while True:
            try:
                wait = min(max(_CONNECT_S[0], math.ceil(deadline - time.monotonic())), _CONNECT_S[1])
                return psycopg.connect(self.url, autocommit=True, connect_timeout=wait), None
            except psycopg.Error as exc:
                last = exc
            left = deadline - time.monotonic()
            if left <= 0 or _refused(last):
                return None, last
            time.sleep(min(pause, left))
            pause = min(2 * pause, _PAUSE_S[1])

    def _first_line(self, exc) -> str:
        """The first line of a driver's error, passwords scrubbed (its text may quote the URL)."""
        return scrub((str(exc).strip().splitlines() or [type(exc).__name__])[0], self.url)

    # -- a lost connection ----------------------------------------------------------------------
    def _retry(self, op):
        """Run ``op``; after a lost connection reconnect and run it again (:data:`RETRY_S`)."""
        if self._in_op:  # an operation called by another: the outer one is run again as a whole
            return op()
        psycopg = _psycopg()
        self._in_op, deadline = True, None
        try:
            while True:
                try:
                    return op()
                except psycopg.OperationalError:
                    if not (self._con.closed or self._con.broken):
                        raise  # the server answered (a lock timeout, a full disk): not a lost connection
                    if deadline is None:
                        deadline = time.monotonic() + (0 if self._gave_up else self.retry_s)
                    self._reconnect(deadline)
                    self._replay = True
        finally:
            self._in_op, self._replay = False, False

    def _reconnect(self, deadline: float) -> None:
        """A new connection in place of the lost one; else one StoreError line (what is kept, what to run)."""
        self._con.close()
        con, err = self._open(deadline)
        self._gave_up = con is None
        if con is None:
            raise StoreError(f"the results database {self.where} is unreachable ({self._first_line(err)}; "
                             f"retried for {self.retry_s:g} s, {RETRY_ENV}); finished runs are kept in it and in "
                             "their run folders: run the same command again once the server answers")
        self._con = con

    def _check_or_create(self) -> None:
        check_owned(self._con, self.where, self.shared)  # another application's, another role's: refused
        tables = {r[0] for r in self._con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")}
        if tables and "runs" in tables:
            row = self._con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row and int(row[0]) > SCHEMA_VERSION:
                raise StoreError(f"{self.where} has schema version {row[0]}, "
                                 f"newer than this calibkit ({SCHEMA_VERSION})")
        elif tables and "meta" in tables:
            raise StoreError(f"{self.where} holds a meta table but no runs table: not a calibkit results database")
        if self.readonly:
            if "runs" not in tables:
                raise FileNotFoundError(f"no calibkit results in {self.where}")
            return
        with self._con.transaction():
            self._con.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    self._con.execute(statement)
            self._con.execute("INSERT INTO meta (key, value) VALUES ('schema_version', %s) ON CONFLICT DO NOTHING",
                              (str(SCHEMA_VERSION),))

    # -- backend hooks ------------------------------------------------------------------------
    def _sql(self, sql: str, args=()):
        return self._con.execute(sql.replace("?", "%s"), list(args))

    @contextmanager
    def _write(self):
        if self.readonly:
            raise StoreError(f"{self.where} was opened read-only")
        with self._con.transaction():
            yield self._con

    def _lock_row(self, table: str, key: str):
        col = KEY_COLUMN[table]
        row = self._sql(f"SELECT status, owner, heartbeat_at FROM {table} WHERE {col} = ? FOR UPDATE SKIP LOCKED",
                        (key,)).fetchone()
        if row is None and self._sql(f"SELECT 1 FROM {table} WHERE {col} = ?", (key,)).fetchone():
            return None, True
        return row, False

    def _clock(self) -> float:
        return float(self._con.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())").fetchone()[0])

    def _beat(self) -> None:
        con = getattr(self, "_beat_con", None)
        if con is None or con.closed or con.broken:  # a lost connection: a new one, the next beat at the latest
            if con is not None:
                con.close()
            con = self._beat_con = self._connect()
        for table in ("runs", "tuning"):
            con.execute(f"UPDATE {table} SET heartbeat_at = EXTRACT(EPOCH FROM clock_timestamp()) "
                        "WHERE owner = %s AND status = 'running'", (self.owner,))

    def _close_connection(self) -> None:
        con = getattr(self, "_beat_con", None)
        if con is not None:
            con.close()
            self._beat_con = None
        self._con.close()


