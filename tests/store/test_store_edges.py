"""Edge cases of the results database: claims held on another host, schema versions, folders."""

import os
import re
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


def test_claim_held_on_another_host_is_kept_while_its_heartbeat_is_fresh(tmp_path):
    # The pid cannot be checked on another host: the claim counts as live (although no process
    # with that pid exists here) while its heartbeat is younger than the grace period.
    path = tmp_path / "runs.db"
    key = _claimed(path)
    other_host = socket.gethostname() + "-elsewhere"
    _set_owner(path, key, f"{other_host}:999999999:abcd1234")
    db = Store(path, heartbeat_s=1, grace_s=60)
    assert db.busy_elsewhere(key)
    assert not db.claim(key, preset="p", method="ce", seed=0)
    row = db.get(key)
    assert row["owner"].startswith(other_host) and row["attempts"] == 1
    con = sqlite3.connect(path)
    con.execute("UPDATE runs SET heartbeat_at = heartbeat_at - 61 WHERE run_key = ?", (key,))
    con.commit()
    con.close()
    assert not db.busy_elsewhere(key) and db.claim(key, preset="p", method="ce", seed=0)
    assert db.get(key)["owner"] == db.owner and db.get(key)["attempts"] == 2


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


def _state(pid: int) -> str:
    stat = open(f"/proc/{pid}/stat").read()
    return stat[stat.rfind(")") + 1:].split()[0]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_claim_of_a_zombie_on_this_host_is_taken_at_once(tmp_path):
    # A process killed by SIGKILL stays a zombie until its parent reaps it: kill(pid, 0) still
    # succeeds, yet it can never finish its run.
    import signal
    import time

    path = tmp_path / "runs.db"
    key = _claimed(path)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _set_owner(path, key, f"{socket.gethostname()}:{proc.pid}:feedbeef")
        db = Store(path)
        assert db.busy_elsewhere(key)  # alive
        os.kill(proc.pid, signal.SIGKILL)
        t0 = time.time()
        while _state(proc.pid) != "Z":  # not reaped: still in the process table
            assert time.time() - t0 < 10, "the killed process did not become a zombie"
            time.sleep(0.01)
        os.kill(proc.pid, 0)  # what the pid check alone sees: a process
        assert not db.busy_elsewhere(key)
        assert db.claim(key, preset="p", method="ce", seed=0) and db.get(key)["owner"] == db.owner
        db.close()
    finally:
        proc.kill()
        proc.wait()


def test_owner_alive_reads_the_state_after_the_last_parenthesis(monkeypatch):
    # a process name may hold spaces and parentheses ("(a) Z b"): only the field after the last ')' counts
    import builtins
    import io

    from calibkit.store import common

    stats = {}
    real_open = builtins.open

    def fake_open(path, *a, **k):
        if isinstance(path, str) and path in stats:
            return io.BytesIO(stats[path])
        return real_open(path, *a, **k)

    monkeypatch.setattr(builtins, "open", fake_open)
    me = os.getpid()
    host = socket.gethostname()
    stats[f"/proc/{me}/stat"] = f"{me} (a) Z b) S 1 2 3".encode()
    assert common.owner_alive(f"{host}:{me}:x", None, 0.0, 60.0)
    stats[f"/proc/{me}/stat"] = f"{me} (a) S b) Z 1 2 3".encode()
    assert not common.owner_alive(f"{host}:{me}:x", None, 0.0, 60.0)
    stats[f"/proc/{me}/stat"] = f"{me} (py) X 1".encode()  # dead, being removed
    assert not common.owner_alive(f"{host}:{me}:x", None, 0.0, 60.0)


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


def _cand(db, key, seed=0, method="ls", hparams=None):
    return db.claim(key, table="tuning", preset="p", method=method, seed=seed, hparams=hparams or {"a": key},
                    config={"c": 1}, git_commit="g")


def test_one_claim_finish_fail_set_keyed_by_the_named_table(tmp_path):
    db = Store(tmp_path / "runs.db")
    assert db.claim("p/ls/0", preset="p", method="ls", seed=0, versions={"torch": "x"})  # "runs" by default
    assert db.claim("p/ls/0", table="tuning", preset="p", method="ls", seed=0, hparams={"a": 1})  # same key, own table
    db.finish("p/ls/0", table="tuning", metrics={"ece": 0.1})
    assert db.status("p/ls/0", "tuning") == "done" and db.status("p/ls/0") == "running"
    assert db.get("p/ls/0")["versions"] == {"torch": "x"} and db.candidates()[0]["hparams"] == {"a": 1}
    with pytest.raises(ValueError, match="unknown store table 'cands'; expected one of runs, tuning"):
        db.claim("k", table="cands", preset="p", method="ls", seed=0)
    with pytest.raises(ValueError, match="a claim in 'tuning' needs hparams"):
        db.claim("k", table="tuning", preset="p", method="ls", seed=0)
    with pytest.raises(ValueError, match="a claim in 'tuning' has no column versions"):
        db.claim("k", table="tuning", preset="p", method="ls", seed=0, hparams={}, versions={})
    with pytest.raises(ValueError, match="a claim in 'runs' has no column hparams"):
        db.claim("k", preset="p", method="ls", seed=0, hparams={"a": 1})
    with pytest.raises(ValueError, match="unknown store table 'cands'"):
        db.finish("p/ls/0", table="cands", metrics={})
    assert db.status("k") is None and db.status("k", "tuning") is None  # nothing written by a refused claim


def test_tuning_candidates_claim_finish_fail_and_filter(tmp_path):
    db = Store(tmp_path / "runs.db")
    assert db.candidates() == [] and db.candidates(status=None) == []
    assert _cand(db, "k1") and _cand(db, "k2") and _cand(db, "k3", seed=1) and _cand(db, "k4", method="mbls")
    assert _cand(db, "k1")  # a retry by the same bench re-takes its own claim
    db.finish("k1", table="tuning", metrics={"val": {"ece": 0.05}}, run_dir=tmp_path / "d1", train_time_s=2.0)
    db.finish("k2", table="tuning", metrics={"val": {"ece": 0.03}}, run_dir=tmp_path / "d2", train_time_s=3.0)
    db.fail("k3", "x" * 5000, table="tuning")
    done = db.candidates("p", "ls", 0)
    assert [c["cand_key"] for c in done] == ["k1", "k2"]  # insertion order, done only
    c1 = done[0]
    assert c1["hparams"] == {"a": "k1"} and c1["config"] == {"c": 1} and c1["git_commit"] == "g"
    assert (c1["metrics"] == {"val": {"ece": 0.05}} and c1["run_dir"] == str(tmp_path / "d1")
            and c1["train_time_s"] == 2.0)
    assert c1["selected"] == 0 and c1["criterion"] is None and c1["attempts"] == 2
    failed = db.candidates(status="failed")
    assert [c["cand_key"] for c in failed] == ["k3"] and len(failed[0]["error"]) == 4000
    assert [c["cand_key"] for c in db.candidates(method="mbls", status="running")] == ["k4"]
    assert [c["cand_key"] for c in db.candidates(seed=1, status=None)] == ["k3"]
    assert [c["cand_key"] for c in db.candidates(preset="q", status=None)] == []
    # Done candidates are skipped and never overwritten; failed ones are retried.
    assert not _cand(db, "k1")
    with pytest.raises(StoreError, match="candidate 'k1' is already done"):
        db.finish("k1", table="tuning", metrics={})
    with pytest.raises(ValueError, match=r"unknown candidate fields \['ood'\]"):
        db.finish("k2", table="tuning", ood={})
    with pytest.raises(KeyError, match="candidate 'zz' was never claimed"):
        db.fail("zz", "e", table="tuning")
    assert _cand(db, "k3") and db.candidates(status="running", seed=1)[0]["error"] is None


def test_select_candidate_flags_one_and_keeps_results(tmp_path):
    db = Store(tmp_path / "runs.db")
    for key in ("k1", "k2"):
        _cand(db, key)
        db.finish(key, table="tuning", metrics={"val": {"ece": 0.1}})
    _cand(db, "other", seed=1)
    db.finish("other", table="tuning", metrics={})
    db.select_candidate("p", "ls", 0, "k1", {"rule": "min val ece"})
    db.select_candidate("p", "ls", 1, "other", {"rule": "r"})
    db.select_candidate("p", "ls", 0, "k2", {"rule": "second"})
    rows = {c["cand_key"]: c for c in db.candidates()}
    assert (rows["k1"]["selected"], rows["k1"]["criterion"]) == (0, None)
    assert (rows["k2"]["selected"], rows["k2"]["criterion"]) == (1, {"rule": "second"})
    assert (rows["other"]["selected"], rows["other"]["criterion"]) == (1, {"rule": "r"})  # another seed: kept
    assert rows["k1"]["metrics"] == {"val": {"ece": 0.1}}
    _cand(db, "running")
    for args in (("p", "ls", 0, "running"), ("p", "ls", 1, "k1"), ("p", "mbls", 0, "k1"), ("q", "ls", 0, "k1"),
                 ("p", "ls", 0, "nope")):
        with pytest.raises(KeyError, match=f"no finished candidate '{args[3]}' of {args[0]}/{args[1]}/{args[2]}"):
            db.select_candidate(*args, {})
    assert db.candidates(status=None)[1]["selected"] == 1  # a refused selection changes nothing


def test_a_database_without_tuning_table_has_no_candidates(tmp_path):
    path = tmp_path / "runs.db"
    Store(path).close()
    con = sqlite3.connect(path)
    con.execute("DROP TABLE tuning")
    con.commit()
    con.close()
    assert Store(path, readonly=True).candidates(status=None) == []


def test_presets_runs_filters_and_json_round_trip(tmp_path):
    db = Store(tmp_path / "runs.db")
    for preset, method in (("b", "ce"), ("a", "ce"), ("b", "ls")):
        key = f"{preset}/{method}/0"
        assert db.claim(key, preset=preset, method=method, seed=0, config={"nan": float("nan")})
    db.finish("b/ce/0", metrics={"x": [1, 2], "a": 0}, extra={"z": None})
    assert db.presets() == ["b", "a"]  # order of first appearance
    assert [r["run_key"] for r in db.runs()] == ["b/ce/0"]
    assert [r["run_key"] for r in db.runs("b", status=None)] == ["b/ce/0", "b/ls/0"]
    assert [r["run_key"] for r in db.runs(status="running")] == ["a/ce/0", "b/ls/0"]
    row = db.get("b/ce/0")
    assert row["metrics"] == {"x": [1, 2], "a": 0} and row["extra"] == {"z": None} and row["ood"] is None
    assert row["config"]["nan"] != row["config"]["nan"]  # NaN survives the JSON round trip
    assert db.get("nope") is None
    raw = sqlite3.connect(tmp_path / "runs.db").execute(
        "SELECT metrics, ood FROM runs WHERE run_key='b/ce/0'").fetchone()
    assert raw == ('{"a": 0, "x": [1, 2]}', None)  # JSON text with sorted keys, NULL for absent values


def test_errors_name_the_problem(tmp_path):
    from calibkit.store import run_key

    with pytest.raises(ValueError, match="preset must be a non-empty name without '/', got ''"):
        run_key("", "ce", 0)
    with pytest.raises(ValueError, match="method must be a non-empty name without '/', got 'a/b'"):
        run_key("p", "a/b", 0)
    with pytest.raises(FileNotFoundError, match=f"no results database at {tmp_path / 'none.db'}"):
        Store(tmp_path / "none.db", readonly=True)
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"0123456789abcdefXYZ" * 10)
    with pytest.raises(StoreError, match=r"bad header b'0123456789abcdef'\); refusing to use or overwrite it: "
                                         r"move it away with its -wal and -shm files, if any"):
        Store(bad)


@pytest.mark.parametrize("damage", ["truncated", "bad middle page"])
def test_a_damaged_database_is_refused_with_what_to_move_and_what_rebuilds_it(tmp_path, damage):
    path = tmp_path / "runs.db"
    db = Store(path)
    for seed in range(30):  # some 40 pages of 4 KiB
        db.claim(f"p/ce/{seed}", preset="p", method="ce", seed=seed, config={"pad": "x" * 4000})
    db.close()
    size = path.stat().st_size
    if damage == "truncated":
        os.truncate(path, size // 2)
    else:
        with open(path, "r+b") as f:
            f.seek(4096 * (size // 8192))
            f.write(b"\xa5" * 4096)
    before = path.read_bytes()
    with pytest.raises(StoreError) as err:
        Store(path)
    what = (r"is a corrupt SQLite database \(database disk image is malformed\)" if damage == "truncated" else
            r"failed the SQLite integrity check \(On tree page \d+ cell \d+: [^\n]+\)")  # one line of SQLite's list
    advice = ("refusing to use or overwrite it: move it away with its -wal and -shm files, "
              f"if any (e.g. to {path}.bad), or use another folder; the run folders keep their training, "
              "so running the same bench or tune command again rebuilds the database from them "
              "(finished training is reused, only the evaluation is redone), "
              "and a SLURM bench's result files are imported again by --collect")
    assert re.fullmatch(f"{re.escape(str(path))} {what}; {re.escape(advice)}", str(err.value)), str(err.value)
    assert path.read_bytes() == before


def test_sqlite_file_without_tables_or_version_opens(tmp_path):
    empty = tmp_path / "empty.db"
    con = sqlite3.connect(empty)
    con.execute("PRAGMA user_version = 1")  # writes the header, creates no table
    con.commit()
    con.close()
    check_database_file(str(empty))
    assert Store(empty).claim("p/ce/0", preset="p", method="ce", seed=0)
    # A calibkit database whose version row is missing (an older writer) opens as well.
    path = tmp_path / "runs.db"
    _claimed(path)
    con = sqlite3.connect(path)
    con.execute("DELETE FROM meta WHERE key = 'schema_version'")
    con.commit()
    con.close()
    check_database_file(str(path))


def test_failed_run_error_is_truncated(tmp_path):
    db = Store(tmp_path / "runs.db")
    db.claim("p/ce/0", preset="p", method="ce", seed=0)
    db.fail("p/ce/0", "e" * 5000)
    assert db.get("p/ce/0")["error"] == "e" * 4000
