"""Progress of a bench over its runs: one line per run with elapsed time and ETA, and a bar on a terminal.

Each finished, skipped or failed run prints one line::

    [ 7/30] default/mbls/0: done in 41 s (acc 86.89%, ECE 5.60 -> 1.74 after TS) | elapsed 4:51, ETA ~16:10

The ETA is the mean duration of the runs this bench has executed (skipped runs cost nothing)
times the runs still to do. When stderr is a terminal a tqdm bar over the runs stays at the
bottom (the training bar of the current run appears under it) and the lines scroll above it.
"""

from __future__ import annotations

import sys
import time


def clock(seconds: float) -> str:
    """``M:SS`` or ``H:MM:SS``."""
    s = int(round(max(seconds, 0.0)))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class RunProgress:
    """Counts runs and writes their lines.

    Args:
        total: runs in the bench.
        write: where lines go (``print`` by default; ignored while the bar is shown, which writes
            through ``tqdm.write`` so that the bar is redrawn below the lines).
        bar: show a tqdm bar over the runs (default: when stderr is a terminal).
        now: the clock (a parameter so that tests can drive it).
    """

    def __init__(self, total: int, write=print, bar: bool | None = None, now=time.monotonic):
        self.total = total
        self.now = now
        self.start = now()
        self.done = 0          # runs accounted for (executed, skipped or failed)
        self.executed = 0      # runs that did work (their durations feed the ETA)
        self.busy = 0.0        # seconds spent in executed runs
        self._write = write
        self._bar = None
        if bar is None:
            bar = sys.stderr.isatty()
        if bar and total:
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit="run", dynamic_ncols=True, position=0, leave=False,
                             bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} runs [{elapsed}<{remaining}]")

    def begin(self, key: str) -> None:
        """A run starts (shown in the bar only)."""
        if self._bar is not None:
            self._bar.set_description_str(key, refresh=True)

    def eta(self) -> float | None:
        """Seconds left (None before any run was executed)."""
        if not self.executed:
            return None
        return self.busy / self.executed * (self.total - self.done)

    def line(self, key: str, text: str) -> str:
        elapsed = self.now() - self.start
        eta = self.eta()
        tail = f"elapsed {clock(elapsed)}" + (f", ETA ~{clock(eta)}" if eta is not None and self.done < self.total
                                              else "")
        width = len(str(self.total))
        return f"[{self.done:>{width}}/{self.total}] {key}: {text} | {tail}"

    def end(self, key: str, text: str, seconds: float | None = None) -> str:
        """A run is accounted for; ``seconds`` is its duration when it did work. Writes its line."""
        self.done += 1
        if seconds is not None:
            self.executed += 1
            self.busy += seconds
        out = self.line(key, text)
        if self._bar is not None:
            from tqdm import tqdm

            self._bar.update(1)
            tqdm.write(out, file=sys.stdout)
        else:
            self._write(out)
        return out

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
