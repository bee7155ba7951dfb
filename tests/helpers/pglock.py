"""One lock file shared by every test process (``pytest -n``) that uses the PostgreSQL test server.

A test of a schema holds it shared for its whole length (:func:`shared`, the ``pg_url`` fixture);
a test that stops the server (:class:`tests.helpers.pgserver.PgServer`) turns its own hold into an
exclusive one first, so no other process's test loses its connection to that restart, and back to
shared once the server is up again. One open file per process: a process converts its lock, never
waits on itself.
"""

import fcntl
import os
import tempfile

PATH = os.path.join(tempfile.gettempdir(), "calibkit-tests-postgres.lock")
_fd = None


def _file() -> int:
    global _fd
    if _fd is None:
        _fd = os.open(PATH, os.O_RDWR | os.O_CREAT, 0o666)
    return _fd


def shared() -> None:
    fcntl.flock(_file(), fcntl.LOCK_SH)


def exclusive() -> None:
    fcntl.flock(_file(), fcntl.LOCK_EX)


def release() -> None:
    fcntl.flock(_file(), fcntl.LOCK_UN)
