"""Edge cases of the results database: claims held on another host, schema versions, folders."""

import os
import socket
import sqlite3
import subprocess
import sys

import pytest

from calibkit.store import SCHEMA_VERSION, Store, StoreError, check_database_file


def _set_owner(path, key, owner):
    con = sqlite3.connect(path)
    con.execute("UPDATE runs SET owner = ? WHERE run_key = ?", (owner, key))
    con.commit()
    con.close()


def _claimed(path, key="p/ce/0"):
    db = Store(path)
    assert db.claim(key, preset="p", method="ce", seed=0)
    db.close()
    return key


def test_claim_held_on_another_host_is_never_taken_over(tmp_path):
    # The pid cannot be checked on another host, so the claim counts as live even though no
    # process with that pid exists here.
    path = tmp_path / "runs.db"
    key = _claimed(path)
    other_host = socket.gethostname() + "-elsewhere"
    _set_owner(path, key, f"{other_host}:999999999:abcd1234")
    db = Store(path)
    assert db.busy_elsewhere(key)
    assert not db.claim(key, preset="p", method="ce", seed=0)
    row = db.get(key)
    assert row["owner"].startswith(other_host) and row["attempts"] == 1


def test_claim_of_a_live_process_on_this_host_is_kept_and_a_dead_one_taken(tmp_path):
    path = tmp_path / "runs.db"
    key = _claimed(path)
    host = socket.gethostname()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _set_owner(path, key, f"{host}:{live.pid}:feedbeef")
        db = Store(path)
        assert db.busy_elsewhere(key)
        assert not db.claim(key, preset="p", method="ce", seed=0)
    finally:
        live.kill()
        live.wait()
    # The same pid, now dead (and reaped): the claim is stale and is taken over.
    assert not db.busy_elsewhere(key)
    assert db.claim(key, preset="p", method="ce", seed=0)
    row = db.get(key)
    assert row["owner"] == db.owner and row["attempts"] == 2


@pytest.mark.parametrize("owner", [None, "garbage", "host:notapid:x", "a:b"])
def test_malformed_owner_is_not_alive(tmp_path, owner):
    path = tmp_path / "runs.db"
    key = _claimed(path)
    _set_owner(path, key, owner)
    db = Store(path)
    assert not db.busy_elsewhere(key)
    assert db.claim(key, preset="p", method="ce", seed=0)


def test_own_claim_is_not_busy_elsewhere(tmp_path):
    db = Store(tmp_path / "runs.db")
    assert db.claim("p/ce/0", preset="p", method="ce", seed=0)
    assert not db.busy_elsewhere("p/ce/0")
    assert not db.busy_elsewhere("p/ce/1")  # no such row
    # Claiming again from the same Store re-takes it (same owner): a retry in one process.
    assert db.claim("p/ce/0", preset="p", method="ce", seed=0)
    assert db.get("p/ce/0")["attempts"] == 2


def _set_version(path, version):
    con = sqlite3.connect(path)
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version),))
    con.commit()
    con.close()


def test_newer_schema_version_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "runs.db"
    _claimed(path)
    _set_version(path, SCHEMA_VERSION + 1)
    before = path.read_bytes()
    for readonly in (False, True):
        with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}, newer than"):
            Store(path, readonly=readonly)
    assert path.read_bytes() == before


@pytest.mark.parametrize("delta", [0, -1])
def test_same_or_older_schema_version_opens(tmp_path, delta):
    path = tmp_path / "runs.db"
    _claimed(path)
    _set_version(path, SCHEMA_VERSION + delta)
    check_database_file(str(path))
    assert Store(path, readonly=True).get("p/ce/0")["status"] == "running"


def test_fresh_store_records_its_schema_version(tmp_path):
    path = tmp_path / "runs.db"
    Store(path).close()
    con = sqlite3.connect(path)
    assert con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
    con.close()


def test_path_that_is_a_folder_is_refused(tmp_path):
    folder = tmp_path / "runs.db"
    folder.mkdir()
    (folder / "keep.txt").write_text("x")
    for readonly in (False, True):
        with pytest.raises(StoreError, match="is a directory, not a results database"):
            Store(folder, readonly=readonly)
    assert os.listdir(folder) == ["keep.txt"]


def test_empty_file_becomes_a_database(tmp_path):
    path = tmp_path / "runs.db"
    path.write_bytes(b"")
    check_database_file(str(path))
    db = Store(path)
    assert db.claim("p/ce/0", preset="p", method="ce", seed=0)
    assert db.runs(status="running")[0]["run_key"] == "p/ce/0"


def test_readonly_store_refuses_writes(tmp_path):
    path = tmp_path / "runs.db"
    _claimed(path)
    ro = Store(path, readonly=True)
    with pytest.raises(StoreError, match="opened read-only"):
        ro.fail("p/ce/0", "x")
    assert Store(path).get("p/ce/0")["status"] == "running"
