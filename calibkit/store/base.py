"""The results store's logic, written once for both databases (:mod:`.sqlite`, :mod:`.postgres`).

A backend supplies a connection, a write transaction (:meth:`_write`), row locking for claims
(:meth:`_lock_row`), the clock leases are measured on (:meth:`_clock`) and a second connection
for the heartbeat thread. SQL is written with ``?`` placeholders; a backend may translate them.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from contextlib import contextmanager
from functools import wraps

from calibkit.errors import UserError, UserKeyError
from calibkit.store.common import (
    COLUMNS,
    FIELDS,
    JSON_COLUMNS,
    KEY_COLUMN,
    PATH_COLUMNS,
    RUNS,
    STATUSES,
    StoreError,
    claim_fields,
    dumps,
    lease_settings,
    loaded_path,
    now_iso,
    owner_alive,
    stored_path,
)
from calibkit.store.heartbeat import Heartbeat


def retried(method):
    """A store operation the backend may run again as a whole (:meth:`BaseStore._retry`): after a
    lost connection, or a commit whose outcome is unknown. Each is idempotent: run twice, it
    leaves the database as running it once would, and ``self._replay`` tells the second run."""
    @wraps(method)
    def call(self, *args, **kwargs):
        return self._retry(lambda: method(self, *args, **kwargs))

    return call


class BaseStore:
    """The public API of a results store (see :class:`calibkit.store.Store`)."""

    # SQL appended to the SELECT that precedes an update (PostgreSQL: FOR UPDATE).
    _LOCK = ""
    # What messages call the database (a file path, or a URL without its password).
    where = "?"
    # The heartbeat column in claim queries ("NULL" for a read-only view of a schema-1 database).
    _BEAT = "heartbeat_at"
    # True while an operation runs again after a lost connection (its first try may have committed).
    _replay = False
    # A database keeps tuning records (calibkit.store.protocol.ResultStore).
    keeps_records = True

    def _setup_lease(self, root, heartbeat_s, grace_s) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.heartbeat_s, self.grace_s = lease_settings(heartbeat_s, grace_s)
        # Identifies this process in the rows it claims (host and pid let a later bench on this
        # host tell a crashed claim from a live one; other hosts go by the heartbeat).
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._heartbeat: Heartbeat | None = None

    # -- backend hooks ------------------------------------------------------------------------
    def _sql(self, sql: str, args=()):
        raise NotImplementedError

    @contextmanager
    def _write(self):
        raise NotImplementedError
        yield

    def _lock_row(self, table: str, key: str):
        """``(row, locked)``: the claim columns of ``key`` (None if absent) inside the write
        transaction; ``locked`` when another process is claiming it at this very moment."""
        col = KEY_COLUMN[table]
        row = self._sql(f"SELECT status, owner, {self._BEAT} FROM {table} WHERE {col} = ?", (key,)).fetchone()
        return row, False

    def _clock(self) -> float:
        raise NotImplementedError

    def _retry(self, op):
        """Run ``op`` (one whole operation); a backend whose connection can be lost runs it again."""
        return op()

    def _has_table(self, name: str) -> bool:
        return True

    def _beat(self) -> None:
        """Refresh the heartbeat of every claim this process holds (from the heartbeat thread)."""
        raise NotImplementedError

    def _close_connection(self) -> None:
        raise NotImplementedError

    # -- plumbing ---------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the heartbeat and close the connection."""
        if self._heartbeat is not None:
            self._heartbeat.stop()
        self._close_connection()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _start_heartbeat(self) -> None:
        """Refresh this process's claims every ``heartbeat_s`` in a daemon thread
        (:class:`~calibkit.store.heartbeat.Heartbeat`; decided: a thread rather than the training
        loop's callbacks, so evaluation and two-stage methods, which have no epoch loop, keep their
        claims too). Started by the first claim."""
        if self._heartbeat is None:
            self._heartbeat = Heartbeat(self._beat, self.heartbeat_s, self.where)
        self._heartbeat.start()

    def _decode(self, cursor, row, tolerant: bool = False) -> dict:
        """A row as a dict, JSON columns decoded. A cell that is not valid JSON raises a
        ``ValueError`` naming the run and the column, or with ``tolerant`` becomes None and is
        recorded in ``row["corrupt"]`` (``{column: reason}``), so one damaged cell does not hide the rest."""
        out = dict(zip([d[0] for d in cursor.description], row))
        for col in JSON_COLUMNS:
            if out.get(col) is not None:
                try:
                    out[col] = json.loads(out[col])
                except (TypeError, ValueError) as exc:
                    if not tolerant:
                        raise UserError(f"results database: run {out.get('run_key')}: {col} is not valid JSON "
                                         f"({exc})") from exc
                    out[col] = None
                    out.setdefault("corrupt", {})[col] = f"not valid JSON ({exc})"
        for col in PATH_COLUMNS:
            if col in out:
                out[col] = self._load_path(out[col])
        return out

    def _load_path(self, value):
        return loaded_path(value, self.root)

    def _select(self, sql: str, args=(), tolerant: bool = False) -> list[dict]:
        cur = self._sql(sql, args)
        return [self._decode(cur, r, tolerant) for r in cur.fetchall()]

    def _alive(self, owner, heartbeat_at, now) -> bool:
        return owner != self.owner and owner_alive(owner, heartbeat_at, now, self.grace_s)

    # -- queries ----------------------------------------------------------------------------
    @retried
    def get(self, key: str) -> dict | None:
        """The row of run ``key`` as a dict (JSON decoded, paths absolute), or ``None``."""
        rows = self._select("SELECT * FROM runs WHERE run_key = ?", (key,))
        return rows[0] if rows else None

    @retried
    def runs(self, preset: str | None = None, status: str | None = "done", tolerant: bool = False) -> list[dict]:
        """Rows, optionally filtered by preset and status, ordered by id (insertion order).
        ``tolerant``: a JSON cell that cannot be decoded is None and named in ``row["corrupt"]``
        (the report names and leaves out such a row) instead of an error."""
        sql, args = "SELECT * FROM runs WHERE 1=1", []
        for col, value in (("preset", preset), ("status", status)):
            if value is not None:
                sql += f" AND {col} = ?"
                args.append(value)
        return self._select(sql + " ORDER BY id", args, tolerant)

    @retried
    def presets(self) -> list[str]:
        """The presets that have rows, in order of first appearance."""
        return [r[0] for r in self._sql("SELECT preset FROM runs GROUP BY preset ORDER BY MIN(id)").fetchall()]

    @retried
    def status(self, key: str, table: str = "runs") -> str | None:
        """The status of run (or candidate) ``key``: ``running``, ``done``, ``failed``, or None."""
        row = self._sql(f"SELECT status FROM {table} WHERE {KEY_COLUMN[table]} = ?", (key,)).fetchone()
        return row[0] if row else None

    @retried
    def busy_elsewhere(self, key: str, table: str = "runs") -> bool:
        """Whether run (or candidate) ``key`` is held right now by another live process."""
        col = KEY_COLUMN[table]
        row = self._sql(f"SELECT status, owner, {self._BEAT} FROM {table} WHERE {col} = ?", (key,)).fetchone()
        return bool(row) and row[0] == "running" and self._alive(row[1], row[2], self._clock())

    @retried
    def candidates(self, preset: str | None = None, method: str | None = None, seed: int | None = None,
                   status: str | None = "done") -> list[dict]:
        """Rows of the ``tuning`` table (JSON decoded), filtered, in insertion order."""
        if not self._has_table("tuning"):  # a database written before tuning existed
            return []
        sql, args = "SELECT * FROM tuning WHERE 1=1", []
        for col, value in (("preset", preset), ("method", method), ("seed", seed), ("status", status)):
            if value is not None:
                sql += f" AND {col} = ?"
                args.append(value)
        return self._select(sql + " ORDER BY id", args)

    # -- claims -----------------------------------------------------------------------------
    def claim(self, key: str, *, preset: str, method: str, seed: int, table: str = RUNS, hparams: dict | None = None,
              config: dict | None = None, git_commit: str | None = None, versions: dict | None = None) -> bool:
        """Mark row ``key`` of ``table`` (a run, or a tuning candidate with its ``hparams``) as being
        computed by this process; ``False`` if it must be skipped.

        Skipped: the row is ``done``, or another live process holds it. A claim is taken over
        when it failed, when its owner on this host has died, or when its owner on another host
        has not refreshed its heartbeat for ``grace_s`` seconds. The columns each table takes are
        :data:`~calibkit.store.common.CLAIM_COLUMNS` (``versions`` for runs, ``hparams`` for candidates).
        """
        fixed, update = claim_fields(table, {"preset": preset, "method": method, "seed": int(seed), "hparams": hparams,
                                             "config": config, "git_commit": git_commit, "versions": versions})
        return self._claim(table, key, fixed, update)

    @retried
    def _claim(self, table: str, key: str, fixed: dict, update: dict) -> bool:
        col = KEY_COLUMN[table]
        enc = {k: dumps(v) if k in JSON_COLUMNS else v for k, v in {**fixed, **update}.items()}
        with self._write():
            row, locked = self._lock_row(table, key)
            if locked:
                return False
            now, stamp = self._clock(), now_iso()
            if row is None:
                cols = {col: key, **enc, "status": "running", "owner": self.owner, "created_at": stamp,
                        "started_at": stamp, "heartbeat_at": now}
                cur = self._sql(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
                                f" ON CONFLICT ({col}) DO NOTHING", list(cols.values()))
                if cur.rowcount != 1:  # inserted by another process a moment ago
                    return False
            else:
                status, owner, beat = row
                if status == "done" or (status == "running" and self._alive(owner, beat, now)):
                    return False
                if self._replay and status == "running" and owner == self.owner:
                    self._start_heartbeat()  # the first try committed: the claim is this process's
                    return True
                sets = "".join(f", {c} = ?" for c in update)
                self._sql(f"UPDATE {table} SET status='running', owner=?{sets}, error=NULL, started_at=?,"
                          f" heartbeat_at=?, attempts=attempts+1 WHERE {col}=?",
                          [self.owner, *(enc[c] for c in update), stamp, now, key])
        self._start_heartbeat()
        return True

    # -- results ----------------------------------------------------------------------------
    def finish(self, key: str, table: str = RUNS, **fields) -> None:
        """Store the results of row ``key`` of ``table`` and mark it ``done`` in one transaction.

        Keyword fields are column names (runs: ``metrics``, ``ood``, ``robustness``, ``extra``,
        ``run_dir``, ``logits_path``, ``train_time_s``, ``eval_time_s``; candidates: ``metrics``,
        ``run_dir``, ``train_time_s``). Paths are stored relative to the bench directory.

        Raises:
            KeyError: the row was never claimed.
            StoreError: it is already done (results are never replaced).
        """
        self._update(table, key, "done", fields)

    def fail(self, key: str, error: str, table: str = RUNS) -> None:
        """Mark row ``key`` of ``table`` as ``failed`` with its error message (a later bench retries it).

        Nothing is written when the row is already done, or when another process has taken the
        claim over (this one's lease had expired): its claim is not this process's to fail.
        """
        self._update(table, key, "failed", {"error": str(error)[:4000]})

    @retried
    def select_candidate(self, preset: str, method: str, seed: int, key: str, criterion: dict) -> None:
        """Flag candidate ``key`` as the selection of ``(preset, method, seed)`` (the others unflagged).

        Only the flag and the criterion change: the candidates' results stay as written.
        """
        with self._write():
            row = self._sql(f"SELECT status, preset, method, seed FROM tuning WHERE cand_key = ?{self._LOCK}",
                            (key,)).fetchone()
            if row is None or row[0] != "done" or tuple(row[1:]) != (preset, method, int(seed)):
                raise UserKeyError(f"no finished candidate {key!r} of {preset}/{method}/{seed} in {self.where}")
            self._sql("UPDATE tuning SET selected = 0, criterion = NULL WHERE preset = ? AND method = ? AND seed = ?",
                      (preset, method, int(seed)))
            self._sql("UPDATE tuning SET selected = 1, criterion = ? WHERE cand_key = ?", (dumps(criterion), key))

    @retried
    def get_meta(self, key: str) -> str | None:
        """The ``meta`` value under ``key`` (``None`` when absent)."""
        row = self._sql("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    @retried
    def put_meta(self, key: str, value: str) -> None:
        """Set the ``meta`` value under ``key`` (``schema_version`` is not writable)."""
        if key == "schema_version":
            raise ValueError("meta key 'schema_version' is the store's own")
        with self._write():
            self._sql("DELETE FROM meta WHERE key = ?", (key,))
            self._sql("INSERT INTO meta (key, value) VALUES (?, ?)", (key, str(value)))

    @retried
    def retire(self, key: str, new_key: str, run_dir: str | None, logits_path: str | None) -> None:
        """Move finished run ``key`` (results intact) to ``new_key``, whose run directory is now
        ``run_dir``: a re-tuned method's old run, kept but out of the way of the new one."""
        with self._write():
            row = self._sql(f"SELECT status FROM runs WHERE run_key = ?{self._LOCK}", (key,)).fetchone()
            if (row is None and self._replay
                    and self._sql("SELECT 1 FROM runs WHERE run_key = ?", (new_key,)).fetchone()):
                return  # moved by the first try, committed before the connection was lost
            if row is None or row[0] != "done":
                raise UserKeyError(f"no finished run {key!r} in {self.where}")
            self._sql("UPDATE runs SET run_key = ?, run_dir = ?, logits_path = ? WHERE run_key = ?",
                      (new_key, stored_path(run_dir, self.root), stored_path(logits_path, self.root), key))

    def _encode(self, fields: dict) -> dict:
        out = {}
        for c, v in fields.items():
            out[c] = dumps(v) if c in JSON_COLUMNS else stored_path(v, self.root) if c in PATH_COLUMNS else v
        return out

    @retried
    def _update(self, table: str, key: str, status: str, fields: dict) -> None:
        if table not in KEY_COLUMN:
            raise ValueError(f"unknown store table {table!r}; expected one of {', '.join(KEY_COLUMN)}")
        what = "run" if table == RUNS else "candidate"
        unknown = set(fields) - FIELDS[table]
        if unknown:
            raise ValueError(f"unknown {what} fields {sorted(unknown)}; expected some of {sorted(FIELDS[table])}")
        enc = self._encode(fields)
        cols = sorted(enc)
        sets = "".join(f", {c} = ?" for c in cols)
        col = KEY_COLUMN[table]
        with self._write():
            row = self._sql(f"SELECT status, owner FROM {table} WHERE {col} = ?{self._LOCK}", (key,)).fetchone()
            if row is None:
                raise KeyError(f"{what} {key!r} was never claimed in {self.where}")
            if status == "failed" and (row[0] == "done" or (row[0] == "running" and row[1] != self.owner)):
                return
            if row[0] == "done" and self._replay and row[1] == self.owner:
                return  # this very finish, committed before the connection was lost
            if row[0] == "done":
                # Results already written are never replaced.
                raise StoreError(f"{what} {key!r} is already done in {self.where}; not overwriting it")
            self._sql(f"UPDATE {table} SET status = ?, finished_at = ?{sets} WHERE {col} = ?",
                      [status, now_iso(), *(enc[c] for c in cols), key])

    @retried
    def import_row(self, table: str, row: dict) -> bool:
        """Write a whole row (e.g. read from a run's ``result.json``) unless a ``done`` one exists.

        ``row`` maps column names to values, JSON columns as Python objects (what :meth:`get`
        returns), paths absolute or relative to the current directory (stored relative to the
        bench directory); ``id`` is ignored. It must name the key (``run_key`` / ``cand_key``),
        ``preset``, ``method``, ``seed`` and ``status`` (``hparams`` too for ``tuning``). A ``done``
        row in the database is never rewritten, and a live claim is only replaced by a ``done``
        row. Returns True if the row was written.

        Raises:
            ValueError: unknown table or column, a missing required column, a bad status.
        """
        if table not in KEY_COLUMN:
            raise UserError(f"unknown table {table!r}; expected one of {sorted(KEY_COLUMN)}")
        col = KEY_COLUMN[table]
        row = {k: v for k, v in row.items() if k != "id"}
        required = {col, "preset", "method", "seed", "status"} | ({"hparams"} if table == "tuning" else set())
        missing = sorted(required - set(row))
        if missing:
            raise UserError(f"{table} row lacks {missing}")
        unknown = sorted(set(row) - COLUMNS[table])
        if unknown:
            raise UserError(f"unknown {table} columns {unknown}")
        if row["status"] not in STATUSES:
            raise UserError(f"{table} row {row[col]!r}: bad status {row['status']!r}")
        enc = self._encode({"created_at": now_iso(), **row})
        with self._write():
            old, locked = self._lock_row(table, row[col])
            if locked:
                return False
            if old is not None:
                status, owner, beat = old
                if status == "done" or (status == "running" and row["status"] != "done"
                                        and self._alive(owner, beat, self._clock())):
                    return False
                enc["id"] = self._sql(f"SELECT id FROM {table} WHERE {col} = ?", (row[col],)).fetchone()[0]
                self._sql(f"DELETE FROM {table} WHERE {col} = ?", (row[col],))
            cols = sorted(enc)
            self._sql(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                      [enc[c] for c in cols])
        return True
