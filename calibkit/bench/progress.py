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

from tqdm import tqdm


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
            self._bar.update(1)
            tqdm.write(out, file=sys.stdout)
        else:
            self._write(out)
        return out

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class Phases:
    """Says which phase of a long job (the report build, a calibration) is running, and times each.

    On a terminal (stderr a tty) each phase shows a tqdm bar over its steps, removed when it ends;
    elsewhere (a log, a pipe, CI) each phase writes one line to stderr when it starts, e.g.
    ``report: fitting 14 post-hoc calibrators on 15 runs``. ``quiet`` writes nothing. Either way
    :attr:`times` holds every phase's wall time in seconds, in order (the report-build benchmark
    reads it), and :meth:`summary` one line of them.

    Args:
        label: the prefix of every line (``report``, ``calibrate``).
        quiet: write nothing.
        bar: tqdm bars instead of lines (default: when stderr is a terminal).
        write: where lines go (default: stderr, flushed).
        now: the clock (a parameter so that tests can drive it).
    """

    def __init__(self, label: str, quiet: bool = False, bar: bool | None = None, write=None,
                 now=time.monotonic):
        self.label = label
        self.quiet = quiet
        self.bar = sys.stderr.isatty() if bar is None else bar
        self._write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self.now = now
        self.times: dict[str, float] = {}
        self.cpu: dict[str, float] = {}  # CPU seconds of this process per phase (time.process_time)

    def phase(self, name: str, total: int | None = None, say: bool = True) -> _Phase:
        """A context manager for one phase; ``tick()`` on it advances the bar by one of ``total`` steps.
        ``say=False``: timed, but neither a line nor a bar (a phase known to take well under a second)."""
        return _Phase(self, name, total, say)

    def summary(self) -> str:
        """One line of every phase's time ("" when no phase ran)."""
        if not self.times:
            return ""
        parts = ", ".join(f"{name} {sec:.1f} s" for name, sec in self.times.items())
        return f"{self.label}: {sum(self.times.values()):.1f} s ({parts})"


class _Phase:
    def __init__(self, phases: Phases, name: str, total: int | None, say: bool = True):
        self.phases, self.name, self.total, self.say = phases, name, total, say
        self._bar = None
        self._start = self._cpu = 0.0

    def __enter__(self) -> _Phase:
        p = self.phases
        self._start, self._cpu = p.now(), time.process_time()
        if p.quiet or not self.say:
            return self
        if p.bar:
            self._bar = tqdm(total=self.total, desc=f"{p.label}: {self.name}", leave=False, dynamic_ncols=True,
                             file=sys.stderr)
        else:
            p._write(f"{p.label}: {self.name}")
        return self

    def tick(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def __exit__(self, *exc) -> None:
        p = self.phases
        p.times[self.name] = p.times.get(self.name, 0.0) + p.now() - self._start
        p.cpu[self.name] = p.cpu.get(self.name, 0.0) + time.process_time() - self._cpu
        if self._bar is not None:
            self._bar.close()
            self._bar = None
