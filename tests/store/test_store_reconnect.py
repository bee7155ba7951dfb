"""A PostgreSQL store whose server goes away mid-bench: it reconnects and runs the broken operation
again for ``retry_s`` seconds, then stops with one line (the database is unreachable, what is kept,
what to run). The server cases stop the real test server (``.ci/services.sh``) and start it again."""

import threading
import time

import pytest

from calibkit.store import PostgresStore, Store, StoreError
from calibkit.store.postgres import RETRY_ENV, retry_setting
from tests.helpers.pgserver import PgServer


def _claim(db, key="p/ce/0"):
    preset, method, seed = key.split("/")
    return db.claim(key, preset=preset, method=method, seed=int(seed), config={"k": key})


@pytest.mark.postgres
def test_a_finish_waits_for_a_restarted_server_and_is_recorded_once(pg_url, tmp_path):
    server = PgServer(pg_url)
    db = PostgresStore(pg_url, root=tmp_path, retry_s=30)
    try:
        assert _claim(db)
        server.stop()
        restart = threading.Timer(1.0, server.start)
        restart.start()
        t0 = time.monotonic()
        try:
            db.finish("p/ce/0", metrics={"before": {"ece": 0.1}}, run_dir=str(tmp_path / "runs" / "x"))
        finally:
            restart.join()
            if not server.running():
                server.start()
        assert time.monotonic() - t0 >= 0.5  # it waited for the server rather than failing at once
        row = db.get("p/ce/0")
        assert (row["status"], row["attempts"], row["metrics"], row["run_dir"]) == (
            "done", 1, {"before": {"ece": 0.1}}, str(tmp_path / "runs" / "x"))
    finally:
        db.close()


@pytest.mark.postgres
def test_a_server_that_stays_down_ends_in_one_line_and_the_store_recovers(pg_url, tmp_path):
    server = PgServer(pg_url)
    db = PostgresStore(pg_url, root=tmp_path, retry_s=0.5)
    try:
        assert _claim(db)
        server.stop()
        try:
            t0 = time.monotonic()
            with pytest.raises(StoreError) as err:
                db.status("p/ce/0")
            assert time.monotonic() - t0 < 10
            again = time.monotonic()
            with pytest.raises(StoreError):  # it gave up: the next operation tries once, no new wait
                db.get("p/ce/0")
            assert time.monotonic() - again < 5
        finally:
            server.start()
        text = str(err.value)
        assert "\n" not in text
        assert text.startswith(f"the results database {db.where} is unreachable (")
        assert text.endswith(f"retried for 0.5 s, {RETRY_ENV}); finished runs are kept in it and in their run "
                             "folders: run the same command again once the server answers")
        assert db.status("p/ce/0") == "running"  # back: the same store reconnects
    finally:
        db.close()


@pytest.mark.postgres
def test_opening_waits_for_a_restarting_server_but_not_for_a_refusal(pg_url, tmp_path):
    # a --workers process released while the server restarts: it opens its store once it is back
    server = PgServer(pg_url)
    server.stop()
    restart = threading.Timer(1.0, server.start)
    restart.start()
    try:
        db = PostgresStore(pg_url, root=tmp_path, retry_s=30)
    finally:
        restart.join()
        if not server.running():
            server.start()
    assert _claim(db)
    db.close()
    t0 = time.monotonic()  # an answer that no wait changes (no such database): at once, as before
    with pytest.raises(StoreError, match=r"^cannot connect to the results database .*no_such_db.*does not exist$"):
        PostgresStore(pg_url.replace("calibkit_test", "no_such_db"), root=tmp_path, retry_s=30)
    assert time.monotonic() - t0 < 5


def test_an_operation_run_again_after_its_commit_leaves_one_result(tmp_path):
    # What a retry meets when the first try committed and only the answer was lost (_replay).
    db = Store(tmp_path / "runs.db")
    try:
        assert _claim(db)
        db._replay = True
        assert _claim(db)  # its own claim: kept, not counted as a second attempt
        db.finish("p/ce/0", metrics={"before": {"ece": 0.1}})
        db.finish("p/ce/0", metrics={"before": {"ece": 0.1}})  # its own finish: no "already done"
        db.retire("p/ce/0", "p/ce/0@old", None, None)
        db.retire("p/ce/0", "p/ce/0@old", None, None)
        db._replay = False
        with pytest.raises(StoreError, match="already done"):
            db.finish("p/ce/0@old", metrics={})
        row = db.get("p/ce/0@old")
        assert (row["status"], row["attempts"], db.get("p/ce/0")) == ("done", 1, None)
    finally:
        db.close()


def test_the_retry_window_is_validated(monkeypatch):
    monkeypatch.setenv(RETRY_ENV, "soon")
    with pytest.raises(ValueError, match=rf"^{RETRY_ENV}: not a number of seconds: 'soon'"):
        retry_setting()
    monkeypatch.setenv(RETRY_ENV, "-1")
    with pytest.raises(ValueError, match=rf"^{RETRY_ENV}: must be a number of seconds >= 0"):
        retry_setting()
    monkeypatch.setenv(RETRY_ENV, "2.5")
    assert retry_setting() == 2.5 and retry_setting(0) == 0.0
