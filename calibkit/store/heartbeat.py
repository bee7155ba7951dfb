"""The heartbeat of a store's claims: a daemon thread that refreshes them every ``interval_s``.

A refresh that fails (a busy or briefly unreachable database) is logged as a warning on the
``calibkit.store`` logger and tried again at the next beat. After ``max_failures`` failures in a
row the thread logs an error naming the last one and stops (decided: a database that refuses
that many refreshes is not coming back soon, and a thread retrying it forever would hide that):
this process's claims then lapse once their heartbeat is older than the lease's grace period,
and another bench may take them over (:mod:`calibkit.store.common`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

logger = logging.getLogger("calibkit.store")

# Failed refreshes in a row after which the heartbeat stops.
MAX_FAILURES = 5


class Heartbeat:
    """Calls ``beat()`` every ``interval_s`` seconds in a daemon thread, from :meth:`start` to :meth:`stop`.

    Args:
        beat: one refresh of every claim this process holds.
        interval_s: seconds between two refreshes.
        where: how log messages name the database.
        max_failures: failed refreshes in a row after which the thread stops.

    Attributes:
        stopped_reason: None while the heartbeat runs or after :meth:`stop`; the logged reason
            when it gave up after ``max_failures`` failures.
    """

    def __init__(self, beat: Callable[[], None], interval_s: float, where: str = "?",
                 max_failures: int = MAX_FAILURES):
        if max_failures < 1:
            raise ValueError(f"max_failures must be >= 1, got {max_failures}")
        self.beat, self.interval_s, self.where, self.max_failures = beat, float(interval_s), where, max_failures
        self.stopped_reason: str | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the thread (once; a later call does nothing)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="calibkit-heartbeat", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the thread and wait for it (at most ``timeout_s``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            self._thread = None

    def _loop(self) -> None:
        failures = 0
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except Exception as exc:  # noqa: BLE001 - counted, logged, and given up on after max_failures
                failures += 1
                what = f"{type(exc).__name__}: {exc}"
                if failures >= self.max_failures:
                    self.stopped_reason = (f"heartbeat of {self.where} stopped after {failures} failed refreshes "
                                           f"in a row (last: {what}); this process's claims lapse after the "
                                           "lease's grace period and another bench may take them over")
                    logger.error("%s", self.stopped_reason)
                    return
                logger.warning("heartbeat of %s: refresh failed (%s); trying again in %g s (%d of %d)",
                               self.where, what, self.interval_s, failures, self.max_failures)
            else:
                failures = 0
