"""``calibkit bench --workers 2`` end to end: two processes share the smoke runs, and a worker
killed with SIGKILL while it holds a run (what the OOM killer does) is noticed at once: its run
is taken over and the bench finishes by itself with the clean bench's metrics."""

import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from calibkit.store import Store
from tests.conftest import PYTHON, ROOT

METHODS = ["ls", "mbls", "focal", "flsd", "dfl"]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _command(out):
    return [PYTHON, "-m", "calibkit", "bench", "--preset", "smoke", "--out", str(out), "--seeds", "0", "--methods",
            *METHODS, "--workers", "2", "--num-threads", "1"]


def _rows(out) -> dict:
    with Store(out / "runs.db", readonly=True) as db:
        return {r["run_key"]: r for r in db.runs("smoke", status=None)}


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A bench of the smoke runs shared by two processes, nothing killed: ``(out, result)``."""
    out = tmp_path_factory.mktemp("clean") / "b"
    res = subprocess.run(_command(out), env=_env(), capture_output=True, text=True, timeout=600, cwd=ROOT)
    return out, res


def test_two_workers_share_the_smoke_runs(clean):
    out, res = clean
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = list(_rows(out).values())
    assert sorted(r["method"] for r in rows) == sorted(["ce", *METHODS])
    assert all(r["status"] == "done" for r in rows)
    # two processes trained them: two owners (host:pid:token), each run claimed by exactly one
    owners = {r["owner"].rsplit(":", 1)[0] for r in rows}
    assert len(owners) == 2, owners
    log = (out / "logs" / "worker-1.log").read_text()
    assert "bench smoke:" in log and "report" not in log.lower().split("bench smoke:")[-1]
    assert "Ranking by test ECE" in res.stdout  # the report is written once, by the calling process


def test_two_workers_record_what_one_process_records_bit_for_bit(clean, tmp_path):
    """The fingerprint: the runs the two processes shared (each worker reading the bench's spec
    file) hold the same results and the same logits, byte for byte, as one process's bench."""
    out = tmp_path / "inline"
    command = [w for w in _command(out) if w not in ("--workers", "2")] + ["--no-report"]
    res = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert not (out / "specs").exists()  # one process: no file to hand on
    (spec,) = (clean[0] / "specs").iterdir()  # the workers': the bench's options, once
    assert spec.name.startswith("bench-") and '"methods": [' in spec.read_text()
    shared, alone = _rows(clean[0]), _rows(out)
    assert sorted(shared) == sorted(alone)
    for key, row in alone.items():
        for col in ("config", "metrics", "ood", "robustness"):
            assert shared[key][col] == row[col], (key, col)
        preset, method, seed = key.split("/")
        logits = [Path(d, "runs", preset, method, f"seed{seed}", "logits.safetensors") for d in (clean[0], out)]
        assert logits[0].read_bytes() == logits[1].read_bytes(), key


def _held_by_worker(out, parent: int):
    """``(key, pid)`` of a run a process other than ``parent`` holds now, else None."""
    try:
        con = sqlite3.connect(f"file:{out / 'runs.db'}?mode=ro", uri=True, timeout=5)
        try:
            rows = con.execute("SELECT run_key, owner FROM runs WHERE status = 'running'").fetchall()
        finally:
            con.close()
    except sqlite3.Error:  # not created yet
        return None
    for key, owner in rows:
        pid = int(owner.split(":")[1])
        if pid != parent:
            return key, pid
    return None


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_worker_killed_mid_run_is_taken_over_and_the_bench_ends_with_the_clean_metrics(clean, tmp_path):
    out = tmp_path / "b"
    bench = subprocess.Popen(_command(out) + ["--no-report"], env=_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        held = None
        while held is None and bench.poll() is None:
            held = _held_by_worker(out, bench.pid)
            time.sleep(0.1)
        assert held is not None, "the worker never held a run"
        key, pid = held
        os.kill(pid, signal.SIGKILL)
        killed_at = time.time()
        stdout, stderr = bench.communicate(timeout=600)  # finishes by itself
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.communicate()
    assert bench.returncode == 0, stdout[-2000:] + stderr[-2000:]
    assert f"worker worker-1 was killed by SIGKILL; see {out / 'logs' / 'worker-1.log'}" in stderr
    assert "; 0 failed;" in stdout
    rows = _rows(out)
    assert sorted(rows) == sorted(_rows(clean[0])) and all(r["status"] == "done" for r in rows.values())
    taken = rows[key]
    parent = f":{bench.pid}:"
    assert parent in taken["owner"] and taken["attempts"] == 2  # claimed twice: by the worker, then here
    # taken over at once: within 10 s of the kill, or of the end of the run this process was
    # training when the worker died (one process trains one run at a time)
    busy_until = max([_epoch(r["finished_at"]) for k, r in rows.items() if parent in r["owner"] and k != key
                      and _epoch(r["started_at"]) <= killed_at], default=killed_at)
    free_at = max(killed_at, busy_until)
    assert _epoch(taken["started_at"]) - free_at < 10, (taken["started_at"], killed_at, busy_until)
    print(f"killed worker's run {key} taken over {_epoch(taken['started_at']) - killed_at:.1f} s after the kill "
          f"({_epoch(taken['started_at']) - free_at:.1f} s after this process was free)")
    # the same numbers as the clean bench's, run for run (each run is trained once, reproducibly)
    ref = _rows(clean[0])
    for k, row in rows.items():
        for col in ("metrics", "ood", "robustness"):
            assert row[col] == ref[k][col], (k, col)
    # every run folder holds one run: nothing was trained twice into the same key
    assert len({r["run_dir"] for r in rows.values()}) == len(rows)


def _epoch(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp).timestamp()
