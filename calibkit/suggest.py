"""The nearest valid name for an error message about a misspelt one (preset keys and names, CLI
subcommands and options): ``difflib``'s ratio, at least 0.5."""

from __future__ import annotations

import difflib

__all__ = ["closest", "nearest"]


def closest(name: str, valid) -> str | None:
    """The entry of ``valid`` nearest to the misspelt ``name`` (``difflib``'s ratio at least 0.5), or None."""
    close = difflib.get_close_matches(str(name), [str(v) for v in valid], n=1, cutoff=0.5)
    return close[0] if close else None


def nearest(name: str, valid) -> str:
    """`` (nearest valid name: X)`` for an error message, or ``""`` when nothing is close (:func:`closest`)."""
    close = closest(name, valid)
    return f" (nearest valid name: {close})" if close else ""
