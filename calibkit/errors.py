"""The errors calibkit raises on purpose.

The rule: raise :class:`UserError` (or a subclass) for anything the user can fix (a bad argument
or option, a malformed file, a preset that breaks a rule, data that does not fit, a run that
diverged at the learning rate the user chose, a database or scheduler that refuses what it was
given); the message says what is wrong and, where it helps, what to do. Anything else that goes
wrong is a bug in calibkit.

The command line (:func:`calibkit.cli.main`) relies on the rule: a :class:`UserError` ends in
one line on stderr, ``calibkit CMD: error: ...``, while any other exception prints its full
traceback and asks for a report. So an internal failure (a tensor shape mismatch, an index out
of range) is never dressed up as bad input.

:class:`UserError` subclasses ``ValueError``, so code written as ``except ValueError`` and tests
written as ``pytest.raises(ValueError)`` keep working. Two subclasses keep the other classes
that callers already catch:

- :class:`UserKeyError` is also a ``KeyError`` (a name that is not there: an unknown run or
  candidate); its message prints as given, without the quotes ``KeyError`` adds.
- :class:`UserRuntimeError` is also a ``RuntimeError`` (a run that cannot go on for a reason the
  user can change: a loss that diverged, a reference run that failed, ``sbatch`` refusing a job).
"""

from __future__ import annotations

__all__ = ["UserError", "UserFileNotFoundError", "UserKeyError", "UserRuntimeError", "shown_name"]


class UserError(ValueError):
    """Something the user can fix; the message names the problem."""


class UserKeyError(UserError, KeyError):
    """A :class:`UserError` that is also a ``KeyError``: the named thing is not there."""

    def __str__(self) -> str:  # KeyError's own str() would quote the message
        return Exception.__str__(self)


class UserRuntimeError(UserError, RuntimeError):
    """A :class:`UserError` that is also a ``RuntimeError``: a run stopped for a reason the user can change."""


class UserFileNotFoundError(UserError, FileNotFoundError):
    """A :class:`UserError` that is also a ``FileNotFoundError``: a file or folder the user named is missing
    (the message names it and the next step)."""


def shown_name(exc: BaseException) -> str:
    """The class name a one-line report gives ``exc`` (``FAILED: ValueError: ...``).

    The three classes above show as the built-in class they stand for (``ValueError``,
    ``KeyError``, ``RuntimeError``), as before they existed, so progress lines and the failure
    lines of the bench read the same; any other class shows its own name.
    """
    return _SHOWN.get(type(exc), type(exc).__name__)


_SHOWN: dict[type[BaseException], str] = {UserError: "ValueError", UserKeyError: "KeyError",
                                           UserRuntimeError: "RuntimeError",
                                           UserFileNotFoundError: "FileNotFoundError"}
