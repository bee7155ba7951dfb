"""One conformance suite for both results stores (SQLite file, PostgreSQL server): claims, leases,
heartbeats, stored paths, import_row, tuning candidates. The PostgreSQL cases need the server of
``.ci/services.sh`` (``CALIBKIT_TEST_POSTGRES``) and skip without it."""

import os
import socket
import subprocess
import sys
import time

import pytest

from calibkit.store import PostgresStore, Store, StoreError, open_store, redact
from calibkit.store.common import lease_settings, legacy_path, loaded_path, stored_path

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def make(request, tmp_path):
    """``make(**kwargs)``: a store of bench directory ``tmp_path/bench`` on the backend under test."""
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    opened = []

    def factory(**kwargs):
        db = open_store(tmp_path / "bench", url, **kwargs)
        opened.append(db)
        return db

    factory.kind, factory.url, factory.root = request.param, url, tmp_path / "bench"
    yield factory
    for db in opened:
        try:
            db.close()
        except Exception:
            pass


def _raw(db, sql, args=()):
    return db._sql(sql, args).fetchall()


def _claim(db, key="p/ce/0"):
    preset, method, seed = key.split("/")
    return db.claim(key, preset=preset, method=method, seed=int(seed), config={"k": key})


def test_claim_finish_and_done_is_final(make):
    db = make()
    assert _claim(db) and db.status("p/ce/0") == "running" and db.status("p/ls/0") is None
    run = make.root / "runs" / "p" / "ce" / "seed0"
    db.finish("p/ce/0", metrics={"before": {"ece": 0.25}}, run_dir=run, logits_path=run / "logits.safetensors",
              train_time_s=1.5)
    row = db.get("p/ce/0")
    assert row["status"] == "done" and row["metrics"] == {"before": {"ece": 0.25}} and row["train_time_s"] == 1.5
    # Stored relative to the bench directory, handed back absolute.
    assert (_raw(db, "SELECT run_dir, logits_path FROM runs")
            == [("runs/p/ce/seed0", "runs/p/ce/seed0/logits.safetensors")])
    assert row["run_dir"] == str(run) and row["logits_path"] == str(run / "logits.safetensors")
    assert not _claim(db)
    with pytest.raises(StoreError, match="already done"):
        db.finish("p/ce/0", metrics={})
    db.fail("p/ce/0", "late")  # a done run is never marked failed
    assert db.get("p/ce/0")["status"] == "done" and db.get("p/ce/0")["error"] is None
    with pytest.raises(KeyError, match="never claimed"):
        db.finish("p/x/0", metrics={})
    assert db.presets() == ["p"] and [r["run_key"] for r in db.runs("p")] == ["p/ce/0"]


def test_failed_run_is_retried_with_attempts_counted(make):
    db = make()
    assert _claim(db)
    db.fail("p/ce/0", "boom")
    assert db.get("p/ce/0")["error"] == "boom" and db.status("p/ce/0") == "failed"
    assert make().claim("p/ce/0", preset="p", method="ce", seed=0)
    row = db.get("p/ce/0")
    assert row["attempts"] == 2 and row["error"] is None and row["status"] == "running"


def _set(db, key, **cols):
    sets = ", ".join(f"{c} = ?" for c in cols)
    with db._write():
        db._sql(f"UPDATE runs SET {sets} WHERE run_key = ?", [*cols.values(), key])


def test_lease_rule_other_host_by_heartbeat_same_host_by_pid(make):
    db, other = make(grace_s=100, heartbeat_s=10), make(grace_s=100, heartbeat_s=10)
    assert _claim(db)
    assert other.busy_elsewhere("p/ce/0") and not _claim(other)  # live process on this host
    now = other._clock()
    elsewhere = f"{socket.gethostname()}-elsewhere:1:abcd"
    # Another host, heartbeat 99 s old (< 100 s grace): held; 101 s old: expired and taken over.
    _set(db, "p/ce/0", owner=elsewhere, heartbeat_at=now - 99)
    assert other.busy_elsewhere("p/ce/0") and not _claim(other)
    _set(db, "p/ce/0", owner=elsewhere, heartbeat_at=now - 101)
    assert not other.busy_elsewhere("p/ce/0") and _claim(other)
    assert other.get("p/ce/0")["owner"] == other.owner and other.get("p/ce/0")["attempts"] == 2
    # No heartbeat at all (a schema-1 claim from another host): expired.
    _set(db, "p/ce/0", owner=elsewhere, heartbeat_at=None)
    assert _claim(db)
    # This host, a fresh heartbeat but a dead pid: taken over at once.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _set(db, "p/ce/0", owner=f"{socket.gethostname()}:{dead.pid}:feed", heartbeat_at=other._clock())
    assert _claim(other)
    if os.path.isdir("/proc/self"):  # This host, a fresh heartbeat, a zombie (killed, not reaped): taken at once.
        zombie = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            zombie.kill()
            t0 = time.time()
            while open(f"/proc/{zombie.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
                assert time.time() - t0 < 10
                time.sleep(0.01)
            _set(db, "p/ce/0", owner=f"{socket.gethostname()}:{zombie.pid}:feed", heartbeat_at=other._clock())
            assert not other.busy_elsewhere("p/ce/0") and _claim(other)
        finally:
            zombie.wait()


def test_failing_a_claim_taken_over_leaves_the_new_owner_alone(make):
    db, other = make(grace_s=100, heartbeat_s=10), make(grace_s=100, heartbeat_s=10)
    assert _claim(db)
    _set(db, "p/ce/0", owner="elsewhere-host:1:x", heartbeat_at=0.0)
    assert _claim(other)
    db.fail("p/ce/0", "interrupted")  # db lost its lease: not its claim to fail
    assert other.get("p/ce/0")["status"] == "running" and other.get("p/ce/0")["owner"] == other.owner


def test_heartbeat_thread_refreshes_only_the_owners_running_claims(make):
    db, other = make(heartbeat_s=0.1, grace_s=0.5), make(heartbeat_s=10, grace_s=100)
    assert _claim(db, "p/ce/0") and _claim(db, "p/ls/0") and _claim(other, "p/mbls/0")
    db.finish("p/ls/0", metrics={})
    for key in ("p/ce/0", "p/ls/0", "p/mbls/0"):
        _set(db, key, heartbeat_at=1000.0)
    deadline = time.time() + 10
    while time.time() < deadline and db.get("p/ce/0")["heartbeat_at"] == 1000.0:
        time.sleep(0.05)
    assert db.get("p/ce/0")["heartbeat_at"] > db._clock() - 5
    assert db.get("p/ls/0")["heartbeat_at"] == 1000.0 and db.get("p/mbls/0")["heartbeat_at"] == 1000.0
    db.close()
    assert not db._heartbeat.running and db._heartbeat.stopped_reason is None


def test_import_row_is_idempotent_and_stores_paths_relative(make):
    db = make()
    run = make.root / "runs" / "p" / "ce" / "seed0"
    row = {"run_key": "p/ce/0", "preset": "p", "method": "ce", "seed": 0, "status": "done",
           "metrics": {"before": {"ece": 0.1}}, "run_dir": str(run), "logits_path": str(run / "logits.safetensors"),
           "config": {"lr": 0.1}, "id": 99}
    assert db.import_row("runs", row)
    assert not db.import_row("runs", {**row, "metrics": {"before": {"ece": 0.9}}})
    got = db.get("p/ce/0")
    assert got["metrics"] == {"before": {"ece": 0.1}} and got["run_dir"] == str(run) and got["config"] == {"lr": 0.1}
    assert _raw(db, "SELECT run_dir FROM runs") == [("runs/p/ce/seed0",)]
    # A failed row is replaced (same id); a live claim only by a done row.
    assert _claim(db, "p/ls/0")
    first_id = db.get("p/ls/0")["id"]
    other = make()
    assert not other.import_row("runs", {**row, "run_key": "p/ls/0", "method": "ls", "status": "failed"})
    assert other.import_row("runs", {**row, "run_key": "p/ls/0", "method": "ls"})
    assert db.get("p/ls/0")["status"] == "done" and db.get("p/ls/0")["id"] == first_id
    cand = {"cand_key": "p/ls/0/a", "preset": "p", "method": "ls", "seed": 0, "hparams": {"a": 1}, "status": "done",
            "metrics": {"ece": 0.2}}
    assert db.import_row("tuning", cand) and not db.import_row("tuning", cand)
    assert db.candidates("p")[0]["hparams"] == {"a": 1}
    for bad, match in (({"run_key": "x"}, "lacks"), ({**row, "run_key": "q", "colour": 1}, "unknown runs columns"),
                       ({**row, "run_key": "q", "status": "maybe"}, "bad status")):
        with pytest.raises(ValueError, match=match):
            db.import_row("runs", bad)


def test_candidates_claim_finish_select(make):
    db = make()
    for i, key in enumerate(("p/ls/0/a1", "p/ls/0/a2")):
        assert db.claim(key, table="tuning", preset="p", method="ls", seed=0, hparams={"a": i}, config={"c": i})
        db.finish(key, table="tuning",
                  metrics={"ece": 0.1 * (i + 1)}, run_dir=make.root / "tune" / key.replace("/", "_"))
    assert not db.claim("p/ls/0/a1", table="tuning", preset="p", method="ls", seed=0, hparams={"a": 0})
    db.select_candidate("p", "ls", 0, "p/ls/0/a2", {"metric": "ece"})
    rows = db.candidates("p", "ls", 0)
    assert [r["selected"] for r in rows] == [0, 1] and rows[1]["criterion"] == {"metric": "ece"}
    assert rows[0]["run_dir"] == str(make.root / "tune" / "p_ls_0_a1")
    with pytest.raises(KeyError, match="no finished candidate"):
        db.select_candidate("p", "ls", 1, "p/ls/0/a2", {})


def test_readonly_refuses_writes(make):
    make().close()
    ro = make(readonly=True)
    with pytest.raises(StoreError, match="read-only"):
        _claim(ro)


def test_lease_settings_are_validated(monkeypatch):
    assert lease_settings(1, 3) == (1.0, 3.0)
    monkeypatch.setenv("CALIBKIT_LEASE_GRACE_S", "7")
    monkeypatch.setenv("CALIBKIT_HEARTBEAT_S", "2")
    assert lease_settings() == (2.0, 7.0) and lease_settings(heartbeat_s=3) == (3.0, 7.0)
    for hb, grace, match in ((1, 1.5, "at least twice"), (0, 10, "positive"), (float("nan"), 10, "positive"),
                             ("x", 10, "not a number")):
        with pytest.raises(ValueError, match=match):
            lease_settings(hb, grace)


def test_path_rules(tmp_path, monkeypatch):
    root = str(tmp_path / "bench")
    assert stored_path(tmp_path / "bench" / "runs" / "a", root) == "runs/a"
    assert stored_path(tmp_path / "elsewhere", root) == str(tmp_path / "elsewhere")  # outside: absolute
    monkeypatch.chdir(tmp_path)
    assert stored_path("bench/runs/a", root) == "runs/a"  # relative to the working directory
    (tmp_path / "bench").mkdir()
    os.symlink(tmp_path / "bench", tmp_path / "link")
    assert stored_path(tmp_path / "link" / "runs" / "a", root) == "runs/a"  # through a symbolic link
    assert stored_path(tmp_path / "bench" / "runs" / "a", str(tmp_path / "link")) == "runs/a"
    assert loaded_path("runs/a", "/x/y") == os.path.normpath("/x/y/runs/a") and loaded_path("/abs", "/x") == "/abs"
    # Schema-1 values: absolute inside the root; a moved directory (the longest tail that exists);
    # a working-directory path; nothing found.
    (tmp_path / "bench" / "runs" / "p" / "ce").mkdir(parents=True)
    assert legacy_path(str(tmp_path / "bench" / "runs" / "gone"), root) == "runs/gone"
    assert legacy_path("/old/place/bench/runs/p/ce", root) == "runs/p/ce"
    assert legacy_path("runs/bench/runs/p/ce", root) == "runs/p/ce"
    assert legacy_path("bench/runs/q", root) == "runs/q"
    assert legacy_path("/old/place/runs/q", root) is None


def test_open_store_names_and_errors(tmp_path):
    with pytest.raises(ValueError, match="postgresql:// URL"):
        open_store(tmp_path, "mysql://x")
    assert isinstance(open_store(tmp_path), Store)


@pytest.mark.postgres
def test_postgres_errors_are_one_line(pg_url, tmp_path):
    bad = pg_url.replace("calibkit_test", "no_such_db")
    with pytest.raises(StoreError, match=r"cannot connect to the results database .*no_such_db"):
        PostgresStore(bad, root=tmp_path)
    db = PostgresStore(pg_url, root=tmp_path)
    with db._write():
        db._sql("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    db.close()
    with pytest.raises(StoreError, match="schema version 99, newer than"):
        PostgresStore(pg_url, root=tmp_path)
    assert redact("postgresql://u:secret@h:5/db?x=1") == "postgresql://u:***@h:5/db?x=1"


def test_bench_waits_for_runs_held_elsewhere_and_never_counts_them_finished(make):
    from calibkit.bench.attempts import Outcome, claim_outcome, work_queue

    db, other = make(grace_s=100, heartbeat_s=10), make(grace_s=100, heartbeat_s=10)
    assert _claim(other, "p/ce/0") and _claim(other, "p/ls/0")
    other.finish("p/ls/0", metrics={})
    assert claim_outcome(db, "runs", "p/ce/0", _claim(db, "p/ce/0")) == Outcome.ELSEWHERE
    assert claim_outcome(db, "runs", "p/ls/0", _claim(db, "p/ls/0")) == Outcome.DONE
    assert claim_outcome(db, "runs", "p/x/0", _claim(db, "p/x/0")) == Outcome.CLAIMED
    assert db.claim("p/ls/0/a", table="tuning", preset="p", method="ls", seed=0, hparams={})
    assert claim_outcome(other, "tuning", "p/ls/0/a", False) == Outcome.ELSEWHERE
    # work_queue retries an item whose attempt returns False, pausing when a pass makes no progress.
    calls, sleeps = [], []
    held = {"b": 2}

    def attempt(item):
        calls.append(item)
        if held.get(item):
            held[item] -= 1
            return False
        return None

    work_queue(["a", "b", "c"], lambda item: True, attempt, poll_s=7, sleep=sleeps.append)
    assert calls == ["a", "b", "c", "b", "b"] and sleeps == [7]


def test_bench_opens_the_store_it_is_given(make):
    from calibkit.bench.grid import get_preset
    from calibkit.bench.runner import Bench

    given = make()
    bench = Bench(get_preset("smoke"), make.root, methods=["ce"], store=given)
    assert bench.store is given
    by_name = Bench(get_preset("smoke"), make.root, methods=["ce"], store=make.url)
    assert type(by_name.store) is type(given) and by_name.store.root == str(make.root)
    by_name.close()


def test_meta_values_and_retired_runs(make):
    from calibkit.store import SCHEMA_VERSION

    s = make()
    assert s.get_meta("tune/p/0/ls") is None
    s.put_meta("tune/p/0/ls", "{}")
    s.put_meta("tune/p/0/ls", '{"added": {}}')  # replaced
    assert s.get_meta("tune/p/0/ls") == '{"added": {}}' and s.get_meta("schema_version") == str(SCHEMA_VERSION)
    with pytest.raises(ValueError, match="schema_version"):
        s.put_meta("schema_version", "2")
    assert s.get_meta("schema_version") == str(SCHEMA_VERSION)
    s.claim("p/ls/0", preset="p", method="ls", seed=0, config={"hparams": {"loss.alpha": 0.1}})
    with pytest.raises(KeyError, match="no finished run"):
        s.retire("p/ls/0", "p/ls/0~alpha=0.1", None, None)  # only a finished run moves
    d = make.root / "runs" / "seed0"
    s.finish("p/ls/0", metrics={"before": {"ece": 0.1}}, run_dir=str(d))
    s.retire("p/ls/0", "p/ls/0~alpha=0.1", f"{d}~alpha=0.1", f"{d}~alpha=0.1/logits.safetensors")
    assert s.get("p/ls/0") is None
    moved = s.get("p/ls/0~alpha=0.1")
    assert moved["metrics"] == {"before": {"ece": 0.1}} and moved["run_dir"] == f"{d}~alpha=0.1"
    assert moved["logits_path"] == f"{d}~alpha=0.1/logits.safetensors"
    # stored relative to the bench directory, like every path
    assert _raw(s, "SELECT run_dir FROM runs WHERE run_key = ?", ("p/ls/0~alpha=0.1",)) == [("runs/seed0~alpha=0.1",)]
    with pytest.raises(StoreError):  # still a done row: never overwritten
        s.finish("p/ls/0~alpha=0.1", metrics={})
    # the method's key is free again for its new run
    assert s.claim("p/ls/0", preset="p", method="ls", seed=0)
