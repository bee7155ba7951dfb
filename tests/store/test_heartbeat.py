"""The heartbeat thread: it refreshes until stopped, logs a failed refresh and tries again, and
stops with a logged reason after ``max_failures`` failures in a row."""

import logging
import threading

import pytest

from calibkit.store.heartbeat import Heartbeat


def _beats(outcomes):
    """A ``beat`` that raises or returns per ``outcomes`` (True: success) and counts its calls."""
    calls, done = [], threading.Event()

    def beat():
        calls.append(1)
        ok = outcomes[len(calls) - 1] if len(calls) <= len(outcomes) else True
        if len(calls) >= len(outcomes):
            done.set()
        if not ok:
            raise ConnectionError(f"refused {len(calls)}")

    return beat, calls, done


def test_repeated_failures_stop_the_heartbeat_with_a_logged_reason(caplog):
    beat, calls, _ = _beats([False] * 10)
    hb = Heartbeat(beat, 0.01, where="db.sqlite", max_failures=3)
    with caplog.at_level(logging.WARNING, logger="calibkit.store"):
        hb.start()
        hb._thread.join(timeout=10)
    assert not hb.running and len(calls) == 3  # it gave up at the third failure, not later
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in warnings] == [
        f"heartbeat of db.sqlite: refresh failed (ConnectionError: refused {k}); trying again in 0.01 s ({k} of 3)"
        for k in (1, 2)]
    assert len(errors) == 1 and errors[0].getMessage() == hb.stopped_reason
    assert hb.stopped_reason.startswith("heartbeat of db.sqlite stopped after 3 failed refreshes in a row "
                                        "(last: ConnectionError: refused 3)")
    hb.stop()  # stopping a heartbeat that gave up is harmless


def test_a_success_resets_the_count_of_failures(caplog):
    beat, calls, done = _beats([False, False, True, False, False, True])
    hb = Heartbeat(beat, 0.01, max_failures=3)
    with caplog.at_level(logging.WARNING, logger="calibkit.store"):
        hb.start()
        assert done.wait(10)
        hb.stop()
    assert len(calls) >= 6 and hb.stopped_reason is None and not hb.running  # 2 + 2 failures: never 3 in a row
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert sum(r.levelno == logging.WARNING for r in caplog.records) == 4


def test_stop_ends_a_healthy_heartbeat_and_start_is_idempotent():
    beat, calls, done = _beats([True, True])
    hb = Heartbeat(beat, 0.01)
    hb.start()
    first = hb._thread
    hb.start()
    assert hb._thread is first
    assert done.wait(10)
    hb.stop()
    assert not hb.running and hb._thread is None and not first.is_alive()


def test_max_failures_below_one_is_refused():
    with pytest.raises(ValueError, match="max_failures must be >= 1, got 0"):
        Heartbeat(lambda: None, 1.0, max_failures=0)
