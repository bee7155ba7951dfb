"""Bounded number types for the command line's options (argparse ``type=``).

Every numeric option of ``calibkit`` takes its value through one of these, so that a value out of
range (negative, zero where zero means nothing, NaN, an infinity, an absurdly large number, or not a
number at all) is refused while the command line is parsed: argparse prints the usage and one line,
``calibkit CMD: error: argument --opt: must be ..., got '...'``, exits with status 2, and nothing is
read or written. The checks further in (the presets' and configs' own) stay, for the Python API.

The lower bounds are the options' domains (a count >= 1, a rate in (0, 1), a seed >= 0). The upper
bounds are not in the method or metric specifications: they are calibkit's choice, set far above
any value that makes sense (e.g. 100000 epochs, a learning rate of 100) and low enough that a typo
of a few extra digits, or a value that would overflow a 64-bit integer, is caught at once
(docs/input_audit.md lists them).
"""

from __future__ import annotations

import argparse
import math

__all__ = ["Bounded", "CountOrFraction", "IntList", "MAX_SEED", "count", "fraction", "integer", "number", "seed"]

MAX_SEED = 2**63 - 1  # the results database stores 64-bit integers


def _show(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


class Bounded:
    """An argparse type: an ``int`` or a finite ``float`` between ``low`` and ``high``.

    Attributes:
        kind: ``int`` or ``float``.
        low: the lower bound (finite).
        high: the upper bound (finite).
        low_open: whether the lower bound itself is excluded.
        high_open: whether the upper bound itself is excluded.
    """

    def __init__(self, kind: type, low: float, high: float, low_open: bool = False, high_open: bool = False):
        if kind not in (int, float) or not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise TypeError(f"Bounded({kind!r}, {low!r}, {high!r}): a kind of int or float and finite low < high")
        self.kind, self.low, self.high = kind, low, high
        self.low_open, self.high_open = low_open, high_open
        self.__name__ = kind.__name__  # argparse names the type in its "invalid ... value" message

    def describe(self) -> str:
        """``an integer in [1, 1024]``, ``a number in (0, 1)``."""
        what = "an integer" if self.kind is int else "a number"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"{what} in {left}{_show(self.low)}, {_show(self.high)}{right}"

    def inside(self, value) -> bool:
        """Whether ``value`` lies within the bounds (NaN never does)."""
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return bool(above and below)

    def __call__(self, text: str):
        try:
            value = self.kind(text)
        except (TypeError, ValueError):
            value = None
        if value is None or not self.inside(value):  # float('nan') and float('inf') fail inside()
            raise argparse.ArgumentTypeError(f"must be {self.describe()}, got {text!r}")
        return value

    def __repr__(self) -> str:
        return f"Bounded({self.describe()})"


class IntList:
    """An argparse type: comma- (or space-) separated integers, each within ``item``'s bounds; an
    empty text is an empty list only where ``empty`` says so (``--milestones ""``: no drop)."""

    def __init__(self, item: Bounded, tuple_: bool = False, empty: bool = False):
        self.item, self.tuple_, self.empty = item, tuple_, empty
        self.__name__ = "int list"

    def __call__(self, text: str):
        parts = text.replace(",", " ").split()
        if not parts and not self.empty:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
        values = []
        for part in parts:
            try:
                values.append(self.item(part))
            except argparse.ArgumentTypeError:
                raise argparse.ArgumentTypeError(f"every value must be {self.item.describe()}, got {part!r} in "
                                                 f"{text!r}") from None
        return tuple(values) if self.tuple_ else values


def integer(low: int, high: int) -> Bounded:
    """An integer in [low, high]."""
    return Bounded(int, low, high)


def count(high: int = 2**31 - 1) -> Bounded:
    """A count >= 1 (sizes, steps, threads)."""
    return Bounded(int, 1, high)


def seed() -> Bounded:
    """A seed: an integer in [0, 2**63 - 1]."""
    return Bounded(int, 0, MAX_SEED)


def number(low: float, high: float, low_open: bool = False, high_open: bool = False) -> Bounded:
    """A finite float in the given interval."""
    return Bounded(float, low, high, low_open, high_open)


def fraction() -> Bounded:
    """A float strictly between 0 and 1 (a miscoverage, a split share)."""
    return Bounded(float, 0.0, 1.0, low_open=True, high_open=True)


class CountOrFraction:
    """An argparse type: an image count in [1, ``high``] (``5000``) or a fraction in (0, 1) (``0.1``),
    as ``--val-size`` takes it."""

    def __init__(self, high: int = 2**31 - 1):
        self.count, self.fraction = count(high), fraction()
        self.__name__ = "count or fraction"

    def __call__(self, text: str):
        try:
            return self.count(text)
        except argparse.ArgumentTypeError:
            pass
        try:
            return self.fraction(text)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"must be an image count in [1, {self.count.high}] (e.g. 5000) or a "
                                             f"fraction in (0, 1) (e.g. 0.1), got {text!r}") from None


# The bounds that several commands share (one place, so that train, bench, tune and maccal agree).
EPOCHS = count(100_000)
BATCH = count(2**20)
STEPS = count(10**9)
LR = number(0.0, 100.0, low_open=True)
WEIGHT_DECAY = number(0.0, 1.0)
THREADS = count(1024)
N_BINS = count(10_000)
DPI = integer(10, 2400)
N_BOOT = integer(10, 10**7)  # the low end: calibkit.bootstrap.MIN_RESAMPLES (tests/commands check they agree)
ALPHA = fraction()
SEED = seed()
SUBSET = count()
