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
"""

from __future__ import annotations

from contextlib import contextmanager

from calibkit.store.base import BaseStore
from calibkit.store.common import KEY_COLUMN, SCHEMA_VERSION, StoreError
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


def is_url(location) -> bool:
    """Whether ``location`` names a PostgreSQL server rather than a file."""
    return isinstance(location, str) and location.startswith(("postgresql://", "postgres://"))


def _psycopg():
    try:
        import psycopg
    except ImportError:
        from calibkit.extras import MissingExtra

        raise MissingExtra("a PostgreSQL store needs psycopg 3: pip install 'calibkit[postgres]'") from None
    return psycopg


class PostgresStore(BaseStore):
    """A calibkit results store in a PostgreSQL database.

    Args:
        url: ``postgresql://user:password@host:port/dbname`` (libpq syntax; ``?host=/socket/dir``
            for a Unix socket).
        root: the bench directory the stored paths are relative to (``--out``).
        readonly, heartbeat_s, grace_s: as for :class:`calibkit.store.Store`.

    Raises:
        StoreError: the server cannot be reached, or the database holds a newer schema.
    """

    _LOCK = " FOR UPDATE"

    def __init__(self, url: str, root, readonly: bool = False, heartbeat_s: float | None = None,
                 grace_s: float | None = None, log=None):
        self.url, self.where, self.readonly = url, redact(url), readonly
        self.path = self.where
        self._setup_lease(root, heartbeat_s, grace_s)
        self._con = self._connect()
        try:
            self._check_or_create()
        except BaseException:
            self._con.close()
            raise

    def _connect(self):
        psycopg = _psycopg()
        try:
            return psycopg.connect(self.url, autocommit=True, connect_timeout=30)
        except psycopg.Error as exc:  # its text may quote the connection string: scrubbed
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise StoreError(f"cannot connect to the results database {self.where}: "
                             f"{scrub(first, self.url)}") from None

    def _check_or_create(self) -> None:
        tables = {r[0] for r in self._con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")}
        if tables and "runs" in tables:
            row = self._con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row and int(row[0]) > SCHEMA_VERSION:
                raise StoreError(f"{self.where} has schema version {row[0]}, newer than this calibkit ({SCHEMA_VERSION})")
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
        if con is None or con.closed:
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


