"""The results database of ``calibkit bench`` and ``calibkit tune``: one row per run, one per
tuning candidate.

By default one SQLite file, ``runs.db``, in the bench directory (:class:`Store`); with
``--store postgresql://...`` a PostgreSQL database (:class:`PostgresStore`, psycopg 3) that benches
on several hosts share. Both have the same tables and API; :func:`open_store` picks one. The
operations the bench and the tuner use are declared by :class:`ResultStore`, which the result
files of a scheduler's task (:class:`calibkit.bench.resultfiles.ResultFiles`) and the non-main
ranks' :class:`NullStore` answer too.

A run is identified by its key ``preset/method/seed``. Its row records the status
(``running``, ``done``, ``failed``), the owner and its heartbeat, the full config, the seed, the
git commit, the package versions, the metrics before and after temperature scaling, the OOD and
robustness figures, the paths of the run directory and logits file (relative to the bench
directory), the training wall time and timestamps. The ``tuning`` table holds ``calibkit tune``'s
candidates (one row per method and hyperparameter point: status, validation metrics,
``selected`` flag), claimed and finished like runs. A finished (``done``) row is never
overwritten. Schema, paths and leases: docs/store.md.

Example:
    >>> import tempfile, os
    >>> db = Store(os.path.join(tempfile.mkdtemp(), "runs.db"))
    >>> db.claim("smoke/ce/0", preset="smoke", method="ce", seed=0, config={"epochs": 1})
    True
    >>> db.finish("smoke/ce/0", metrics={"before": {"ece": 0.1}})
    >>> db.get("smoke/ce/0")["status"]
    'done'
    >>> db.close()
"""

from __future__ import annotations

import os
import re

from calibkit.errors import UserError
from calibkit.store.common import (
    GRACE_ENV,
    GRACE_S,
    HEARTBEAT_ENV,
    HEARTBEAT_S,
    SCHEMA_VERSION,
    StoreError,
    owner_alive,
    run_key,
)
from calibkit.store.null import NullStore
from calibkit.store.postgres import PostgresStore, is_url
from calibkit.store.protocol import ResultStore
from calibkit.store.secrets import redact
from calibkit.store.sqlite import BUSY_TIMEOUT_S, SQLITE_HEADER, Store, check_database_file

__all__ = ["Store", "PostgresStore", "NullStore", "ResultStore",
           "StoreError", "run_key", "open_store", "describe_store", "check_store",
           "check_database_file", "SCHEMA_VERSION", "HEARTBEAT_S", "GRACE_S", "HEARTBEAT_ENV", "GRACE_ENV",
           "BUSY_TIMEOUT_S", "SQLITE_HEADER", "owner_alive", "is_url", "redact", "resolve_store"]

# The option value that means "runs.db in the bench directory".
DEFAULT = None


def resolve_store(value: str | None) -> str | None:
    """The ``--store`` value to use: ``env:NAME`` is the URL held by environment variable ``NAME``
    (a command line is visible to every user of the machine, a process's environment only to its
    owner); anything else is returned as given.

    Raises:
        ValueError: ``NAME`` is not a variable name, or the variable is unset or empty.
    """
    if not isinstance(value, str) or not value.startswith("env:"):
        return value
    name = value[4:]
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise UserError(f"--store {value}: expected env:NAME with NAME an environment variable's name")
    if not os.environ.get(name):
        raise UserError(f"--store {value}: the environment variable {name} is not set (it should hold the "
                         "postgresql:// URL)")
    return os.environ[name]


def open_store(out, store: str | None = DEFAULT, readonly: bool = False, **kwargs):
    """The results store of bench directory ``out``: ``out/runs.db``, or the PostgreSQL database
    at ``store`` (a ``postgresql://`` URL) with paths relative to ``out``.

    Raises:
        ValueError: ``store`` is neither None nor a PostgreSQL URL.
    """
    if store is None:
        return Store(os.path.join(os.fspath(out), "runs.db"), readonly=readonly, **kwargs)
    if not is_url(store):
        raise UserError(f"--store: expected a postgresql:// URL, got {redact(store)!r} "
                         "(leave it out for OUT/runs.db)")
    return PostgresStore(store, root=out, readonly=readonly, **kwargs)


def describe_store(out, store: str | None = DEFAULT) -> str:
    """How messages name the store: ``OUT/runs.db`` or the URL without its password."""
    return os.path.join(os.fspath(out), "runs.db") if store is None else redact(store)


def check_store(out, store: str | None = DEFAULT) -> None:
    """Before a bench writes anything: the SQLite file is healthy, or the server answers and holds
    no newer schema (nothing is created on it).

    Raises:
        StoreError, ValueError, calibkit.extras.MissingExtra: the first problem found.
    """
    if store is None:
        check_database_file(os.path.join(os.fspath(out), "runs.db"))
        return
    if not is_url(store):
        raise UserError(f"--store: expected a postgresql:// URL, got {redact(store)!r} "
                         "(leave it out for OUT/runs.db)")
    try:
        PostgresStore(store, root=out, readonly=True, retry_s=0).close()  # no wait: a wrong URL is named at once
    except FileNotFoundError:  # no tables yet: the bench creates them
        pass
