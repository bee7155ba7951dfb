"""The results database: schema, claims, no overwrite of results, corrupt files, concurrent writers."""

import multiprocessing as mp
import os
import sqlite3

import pytest

from calibkit.store import Store, StoreError, run_key


def test_claim_finish_roundtrip(tmp_path):
    db = Store(tmp_path / "runs.db")
    key = run_key("p", "ce", 0)
    assert db.claim(key, preset="p", method="ce", seed=0, config={"lr": 0.1}, git_commit="abc",
                    versions={"torch": "x"})
    db.finish(key, metrics={"before": {"ece": 0.07}, "after": {"ece": 0.01}}, train_time_s=1.5,
              run_dir="d", logits_path="d/logits.safetensors")
    row = db.get(key)
    assert row["status"] == "done" and row["seed"] == 0 and row["method"] == "ce"
    assert row["config"] == {"lr": 0.1} and row["versions"] == {"torch": "x"}
    assert row["metrics"]["before"]["ece"] == 0.07 and row["train_time_s"] == 1.5
    assert row["created_at"] <= row["finished_at"]
    # A finished run is skipped by the next claim and its results are never replaced.
    assert not db.claim(key, preset="p", method="ce", seed=0)
    with pytest.raises(StoreError, match="already done"):
        db.finish(key, metrics={})
    assert db.get(key)["metrics"]["before"]["ece"] == 0.07
    assert [r["run_key"] for r in db.runs("p")] == [key]


def test_failed_and_stale_runs_are_retried(tmp_path):
    path = tmp_path / "runs.db"
    db = Store(path)
    assert db.claim("p/ce/0", preset="p", method="ce", seed=0)
    db.fail("p/ce/0", "boom")
    assert db.get("p/ce/0")["status"] == "failed" and db.get("p/ce/0")["error"] == "boom"
    assert db.claim("p/ce/0", preset="p", method="ce", seed=0)
    assert db.get("p/ce/0")["attempts"] == 2
    # A claim held by a dead process (interrupted bench) is taken over; a live one is not.
    con = sqlite3.connect(path)
    con.execute("UPDATE runs SET owner = ? WHERE run_key = 'p/ce/0'", (f"{os.uname().nodename}:999999999:x",))
    con.commit()
    con.close()
    assert Store(path).claim("p/ce/0", preset="p", method="ce", seed=0)
    other = Store(path)
    assert other.claim("p/ls/0", preset="p", method="ls", seed=0)
    assert not db.claim("p/ls/0", preset="p", method="ls", seed=0)


def test_bad_fields_and_unclaimed(tmp_path):
    db = Store(tmp_path / "runs.db")
    with pytest.raises(KeyError, match="never claimed"):
        db.finish("p/ce/0", metrics={})
    db.claim("p/ce/0", preset="p", method="ce", seed=0)
    with pytest.raises(ValueError, match="unknown run fields"):
        db.finish("p/ce/0", metricz={})
    with pytest.raises(ValueError, match="without '/'"):
        run_key("a/b", "ce", 0)


@pytest.mark.parametrize("content", [
    b"this is not a database at all, just text\n" * 20,
    b"SQLite format 3\x00" + b"\xff" * 4000,  # right header, garbage pages
])
def test_corrupt_file_is_refused_and_unchanged(tmp_path, content):
    path = tmp_path / "runs.db"
    path.write_bytes(content)
    with pytest.raises(StoreError, match="refusing"):
        Store(path)
    with pytest.raises(StoreError):
        Store(path, readonly=True)
    assert path.read_bytes() == content
    assert sorted(os.listdir(tmp_path)) == ["runs.db"]  # no -wal/-shm side files either


def test_foreign_sqlite_database_is_refused(tmp_path):
    path = tmp_path / "runs.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE customers (name TEXT)")
    con.execute("INSERT INTO customers VALUES ('x')")
    con.commit()
    con.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="not a calibkit results database"):
        Store(path)
    assert path.read_bytes() == before


def test_readonly_needs_existing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        Store(tmp_path / "absent.db", readonly=True)
    Store(tmp_path / "runs.db").close()
    ro = Store(tmp_path / "runs.db", readonly=True)
    with pytest.raises(StoreError, match="read-only"):
        ro.claim("p/ce/0", preset="p", method="ce", seed=0)


def _worker(path, keys, queue):
    db = Store(path)
    claimed = []
    for key in keys:
        preset, method, seed = key.split("/")
        if db.claim(key, preset=preset, method=method, seed=int(seed), config={"who": db.owner}):
            db.finish(key, metrics={"owner": db.owner}, train_time_s=0.0)
            claimed.append(key)
    queue.put(claimed)


def test_two_concurrent_writers_keep_database_consistent(tmp_path):
    path = str(tmp_path / "runs.db")
    Store(path).close()
    keys = [run_key("p", f"m{i}", s) for i in range(25) for s in range(2)]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    # Same keys, opposite orders: the writers collide on every run.
    procs = [ctx.Process(target=_worker, args=(path, order, queue)) for order in (keys, keys[::-1])]
    for p in procs:
        p.start()
    got = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    # Every run was done by exactly one writer, and its row is whole (config and metrics by one owner).
    assert sorted(got[0] + got[1]) == sorted(keys)
    assert not set(got[0]) & set(got[1])
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()
    rows = Store(path, readonly=True).runs("p", status=None)
    assert len(rows) == len(keys)
    for row in rows:
        assert row["status"] == "done" and row["config"]["who"] == row["metrics"]["owner"] == row["owner"]


def test_import_row_writes_once_and_never_rewrites_a_done_row(tmp_path):
    db = Store(tmp_path / "runs.db")
    row = {"run_key": "p/ce/0", "preset": "p", "method": "ce", "seed": 0, "status": "done",
           "metrics": {"before": {"ece": 0.05}}, "train_time_s": 2.0, "id": 77}
    assert db.import_row("runs", row)
    assert not db.import_row("runs", {**row, "metrics": {"before": {"ece": 0.9}}})
    got = db.get("p/ce/0")
    assert got["metrics"] == {"before": {"ece": 0.05}} and got["id"] == 1 and got["train_time_s"] == 2.0
    # A failed claim is replaced by an imported finished row; a done claim is skipped by claim().
    assert db.claim("p/ls/0", preset="p", method="ls", seed=0)
    db.fail("p/ls/0", "boom")
    assert db.import_row("runs", {**row, "run_key": "p/ls/0", "method": "ls"})
    assert db.get("p/ls/0")["status"] == "done" and not db.claim("p/ls/0", preset="p", method="ls", seed=0)
    with pytest.raises(ValueError, match="lacks"):
        db.import_row("runs", {"run_key": "p/x/0"})
    with pytest.raises(ValueError, match="unknown runs columns"):
        db.import_row("runs", {**row, "run_key": "p/y/0", "colour": 1})
    with pytest.raises(ValueError, match="unknown table"):
        db.import_row("jobs", row)
