"""Stored paths relative to the bench directory: a bench directory copied or moved keeps working
from any working directory, and a schema-1 database (paths as typed) is migrated once."""

import shutil
import sqlite3
import subprocess
import sys

import pytest

from calibkit.store import SCHEMA_VERSION, Store
from calibkit.store.sqlite import SCHEMA

PYTHON = sys.executable


def _downgrade_to_schema_1(path, paths: dict):
    """Make ``path`` look as calibkit's schema 1 wrote it: no heartbeat column, version 1, and
    the given ``{run_key: (run_dir, logits_path)}`` as typed at bench time."""
    con = sqlite3.connect(path)
    for table in ("runs", "tuning"):
        con.execute(f"ALTER TABLE {table} DROP COLUMN heartbeat_at")
    for key, (run_dir, logits) in paths.items():
        con.execute("UPDATE runs SET run_dir = ?, logits_path = ? WHERE run_key = ?", (run_dir, logits, key))
    con.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    con.execute("UPDATE runs SET owner = 'calibkit-node9:1:x' WHERE status = 'running'")  # claims from another host
    con.commit()
    con.close()


def _raw(path, sql):
    con = sqlite3.connect(path)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_schema_1_database_is_migrated_once(tmp_path, monkeypatch):
    bench = tmp_path / "moved" / "bench"
    for m in ("ce", "ls", "mbls"):
        (bench / "runs" / "p" / m / "seed0").mkdir(parents=True)
    (bench / "runs" / "p" / "ce" / "seed0" / "logits.safetensors").write_bytes(b"")
    path = bench / "runs.db"
    db = Store(path)
    for m in ("ce", "ls", "mbls", "focal"):
        db.claim(f"p/{m}/0", preset="p", method=m, seed=0)
    db.close()
    started = _raw(path, "SELECT started_at FROM runs WHERE run_key = 'p/ce/0'")[0][0]
    _downgrade_to_schema_1(path, {
        "p/ce/0": (str(tmp_path / "old" / "bench" / "runs" / "p" / "ce" / "seed0"),    # absolute, moved since
                   str(tmp_path / "old" / "bench" / "runs" / "p" / "ce" / "seed0" / "logits.safetensors")),
        "p/ls/0": ("work/bench/runs/p/ls/seed0", None),                                  # relative to another cwd
        "p/mbls/0": (str(bench / "runs" / "p" / "mbls" / "seed0"), None),                # absolute, in place
        "p/focal/0": ("/gone/runs/q/focal/seed0", None)})                                # nowhere to be found
    before = path.read_bytes()
    # Read-only (calibkit report): read through the same rules, nothing written.
    ro = Store(path, readonly=True)
    assert ro.get("p/ce/0")["run_dir"] == str(bench / "runs" / "p" / "ce" / "seed0")
    assert ro.get("p/ls/0")["run_dir"] == str(bench / "runs" / "p" / "ls" / "seed0")
    assert not ro.busy_elsewhere("p/ce/0")  # another host's claim without a heartbeat has expired
    ro.close()
    assert path.read_bytes() == before
    # Opened for writing: rewritten once, with one line.
    monkeypatch.chdir(tmp_path)
    lines = []
    db = Store(path, log=lines.append)
    assert len(lines) == 1 and "migrated from schema 1 to 2: 4 stored path(s) rewritten" in lines[0]
    assert "1 not found under it, left as they were (p/focal/0 run_dir)" in lines[0]
    assert _raw(path, "SELECT run_key, run_dir, logits_path FROM runs ORDER BY id") == [
        ("p/ce/0", "runs/p/ce/seed0", "runs/p/ce/seed0/logits.safetensors"), ("p/ls/0", "runs/p/ls/seed0", None),
        ("p/mbls/0", "runs/p/mbls/seed0", None), ("p/focal/0", "/gone/runs/q/focal/seed0", None)]
    assert _raw(path, "SELECT value FROM meta WHERE key = 'schema_version'") == [(str(SCHEMA_VERSION),)]
    from calibkit.store.common import iso_epoch

    assert db.get("p/ce/0")["heartbeat_at"] == pytest.approx(iso_epoch(started))
    db.close()
    lines.clear()
    Store(path, log=lines.append).close()
    assert lines == []
    assert "heartbeat_at" in SCHEMA


@pytest.mark.slow
def test_copied_and_moved_bench_directory_from_any_cwd(tmp_path, cli_env):
    cmd = [PYTHON, "-m", "calibkit", "bench", "--preset", "smoke", "--methods", "ce", "ls"]
    res = subprocess.run([*cmd, "--out", "a", "--no-report"], cwd=tmp_path, env=cli_env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _raw(tmp_path / "a" / "runs.db", "SELECT run_dir, logits_path FROM runs ORDER BY id") == [
        ("runs/smoke/ce/seed0", "runs/smoke/ce/seed0/logits.safetensors"),
        ("runs/smoke/ls/seed0", "runs/smoke/ls/seed0/logits.safetensors")]
    finished = _raw(tmp_path / "a" / "runs.db", "SELECT run_key, finished_at FROM runs ORDER BY id")
    shutil.move(tmp_path / "a", tmp_path / "c")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # The report of the moved directory, from another working directory.
    res = subprocess.run([PYTHON, "-m", "calibkit", "report", str(tmp_path / "c")], cwd=elsewhere, env=cli_env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (tmp_path / "c" / "report" / "index.html").is_file() and "2 finished runs" in res.stdout
    # A copy of it (its report caches too, keyed by content: the copy's report refits nothing; its
    # report folder is removed, so the bench below must write one).
    shutil.copytree(tmp_path / "c", tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "report")
    # The bench again on the copy: both runs found finished (same rows), the report builds.
    res = subprocess.run([*cmd, "--out", str(tmp_path / "b")], cwd=elsewhere, env=cli_env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "0 run(s) done, 2 skipped (finished earlier), 0 failed" in res.stdout
    assert (tmp_path / "b" / "report" / "index.html").is_file()
    assert _raw(tmp_path / "b" / "runs.db", "SELECT run_key, finished_at FROM runs ORDER BY id") == finished
    # A copy whose database schema 1 wrote (paths relative to the first bench's cwd): the report
    # reads it unchanged, the next bench migrates it once and skips the finished runs.
    shutil.copytree(tmp_path / "c", tmp_path / "d")
    db = tmp_path / "d" / "runs.db"
    _downgrade_to_schema_1(db,
                           {f"smoke/{m}/0": (f"a/runs/smoke/{m}/seed0", f"a/runs/smoke/{m}/seed0/logits.safetensors")
                                for m in ("ce", "ls")})
    before = db.read_bytes()
    res = subprocess.run([PYTHON, "-m", "calibkit", "report", str(tmp_path / "d")], cwd=elsewhere, env=cli_env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert db.read_bytes() == before
    res = subprocess.run([*cmd, "--out", str(tmp_path / "d"), "--no-report"], cwd=elsewhere, env=cli_env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stderr.count("migrated from schema 1 to 2: 4 stored path(s) rewritten") == 1
    assert "2 skipped (finished earlier)" in res.stdout
    assert _raw(db, "SELECT run_dir FROM runs ORDER BY id") == [("runs/smoke/ce/seed0",), ("runs/smoke/ls/seed0",)]
