"""Atomic file writes, and the error that says a write failed because the disk is full.

:func:`atomic_write` writes to a temporary file in the same directory and moves it into place with
``os.replace``, so a process killed mid-write leaves the previous version intact, never half a
file. A write that fails on a full disk is re-raised as an ``OSError`` with ``errno.ENOSPC`` naming
the file meant, whatever the writer (safetensors, torch, SQLite) said; :func:`disk_full` turns
such an error into :class:`DiskFull`, the one-line error the bench and the tuner stop with.

:mod:`calibkit.rundir` re-exports the three names (the run directory's files are written here).
"""

from __future__ import annotations

import errno
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from calibkit.errors import UserRuntimeError


def atomic_write(path: str | os.PathLike, write: Callable[[str], object]) -> None:
    """Call ``write(tmp_path)`` for a temporary file beside ``path``, then move it onto ``path``."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:  # name the file meant, not the temporary one (OSError picks the subclass)
        raise OSError(exc.errno, f"cannot write ({exc.strerror})", str(path)) from exc
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; run files are meant to be shared and read
        os.replace(tmp, path)
    except BaseException as exc:
        # Measured before the temporary file goes: a full disk is full with it, not after.
        full = isinstance(exc, Exception) and (_says_no_space(exc) or _no_space_left(path.parent))
        if os.path.exists(tmp):
            os.remove(tmp)
        if full and not (isinstance(exc, OSError) and exc.errno == errno.ENOSPC and exc.filename == str(path)):
            # Named by the file meant: a writer's own error (safetensors, torch) names no file or a temporary one.
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from exc
        raise


# How the writers say "no space left": the OS error, Rust's I/O error inside a SafetensorError,
# SQLite's SQLITE_FULL.
_NO_SPACE = re.compile(r"no space left on device|os error 28\b|code: 28\b|storagefull|database or disk is full")
# Below this many free bytes a write that failed for a reason it did not name failed for the full disk
# (torch.save says only "file write failed" or "unexpected pos").
_FULL_BYTES = 1 << 20


def _chain(exc: BaseException | None):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _says_no_space(exc: BaseException) -> bool:
    return any((isinstance(e, OSError) and e.errno == errno.ENOSPC)
               or _NO_SPACE.search(str(e).lower()) for e in _chain(exc))


def _no_space_left(folder) -> bool:
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):  # no statvfs (Windows) or the folder is gone: say nothing
        return False
    return st.f_bavail * st.f_frsize < _FULL_BYTES


class DiskFull(UserRuntimeError):
    """A write failed because the disk is full. Raised (by the bench and the tuner) at the first
    such failure: every later run would fail alike, so they stop there, and finished runs are kept."""

    def __init__(self, where: str):
        self.where = where
        super().__init__(f"disk full while writing {where}: free space and run the same command again; "
                         "finished runs are kept")


def disk_full(exc: BaseException) -> DiskFull | None:
    """The :class:`DiskFull` that ``exc`` (or an error it was raised from) stands for, else None.

    An ``OSError`` with ``errno.ENOSPC`` names its file (:func:`atomic_write` raises one naming the
    file meant); SQLite's "database or disk is full" is the results database; a writer's own error
    saying "os error 28" or "No space left on device" names no file.
    """
    found = None
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return DiskFull(str(e.filename) if e.filename else "a file")
        text = str(e).lower()
        if found is None and "database or disk is full" in text:
            found = DiskFull("the results database")
        elif found is None and _NO_SPACE.search(text):
            found = DiskFull("a file")
    return found
