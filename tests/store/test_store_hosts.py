"""Benches on several hosts sharing one store: every run once, and a killed host's claim taken over
after the lease's grace period. The second host is a process under another hostname
(``unshare --uts``: same machine, so the pid check cannot see it; only the heartbeat can), which
needs root; both backends where available (SQLite here shares one local file, which is safe on one
machine; PostgreSQL is what several machines share)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from calibkit.store import open_store

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--uts", "hostname", "calibkit-probe"], capture_output=True).returncode == 0


needs_unshare = pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare --uts (another hostname)")

# The fake work loop over the store API, with the bench's rule (calibkit.bench.runner: a run held
# by another live process is retried later, never counted as finished; torch is not imported).
WORKER = """
import json, socket, sys, time
from calibkit.store import open_store
root, url, keys, hold = sys.argv[1], sys.argv[2] or None, json.loads(sys.argv[3]), float(sys.argv[4])
db = open_store(root, url, heartbeat_s=0.2, grace_s=1.5)
done = []
pending = list(keys)
while pending:
    later = []
    for key in pending:
        preset, method, seed = key.split("/")
        if db.claim(key, preset=preset, method=method, seed=int(seed)):
            print("claimed " + key, flush=True)
            time.sleep(hold)
            db.finish(key, metrics={"host": socket.gethostname()})
            done.append(key)
        elif db.status(key) != "done":
            later.append(key)
    if later:
        time.sleep(0.1)
    pending = later
db.close()
print(json.dumps(done), flush=True)
"""


def _worker(cli_env, host, root, url, keys, hold=0.02):
    argv = [sys.executable, "-c", WORKER, str(root), url or "", json.dumps(keys), str(hold)]
    if host is not None:
        argv = ["unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$0" "$@"', *argv]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env)


@pytest.fixture(params=BACKENDS)
def url(request):
    return request.getfixturevalue("pg_url") if request.param == "postgres" else None


@needs_unshare
def test_two_hosts_run_every_run_once(tmp_path, cli_env, url):
    keys = [f"p/m{i}/{s}" for i in range(12) for s in range(2)]
    open_store(tmp_path, url).close()
    procs = [_worker(cli_env, "calibkit-node2", tmp_path, url, keys), _worker(cli_env, None, tmp_path, url, keys[::-1])]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    done = [json.loads(o[0].strip().splitlines()[-1]) for o in outs]
    assert sorted(done[0] + done[1]) == sorted(keys) and not set(done[0]) & set(done[1])
    db = open_store(tmp_path, url, readonly=True)
    rows = db.runs("p")
    assert len(rows) == len(keys) and all(r["attempts"] == 1 for r in rows)
    hosts = {r["run_key"]: r["metrics"]["host"] for r in rows}
    assert {hosts[k] for k in done[0]} <= {"calibkit-node2"} and "calibkit-node2" not in {hosts[k] for k in done[1]}
    db.close()


@needs_unshare
def test_killed_hosts_claim_is_taken_over_after_the_grace_period(tmp_path, cli_env, url):
    open_store(tmp_path, url).close()
    node2 = _worker(cli_env, "calibkit-node2", tmp_path, url, ["p/ce/0"], hold=600)
    try:
        assert node2.stdout.readline().strip() == "claimed p/ce/0"
        db = open_store(tmp_path, url, heartbeat_s=0.5, grace_s=1.5)
        # Alive for longer than the grace period: its heartbeat keeps the claim.
        time.sleep(2.5)
        assert db.busy_elsewhere("p/ce/0") and not db.claim("p/ce/0", preset="p", method="ce", seed=0)
    finally:
        node2.send_signal(signal.SIGKILL)
        node2.wait()
    killed = time.time()
    assert db.status("p/ce/0") == "running"
    # The work loop on this host waits (never "finished earlier"), then takes the run over.
    here = _worker(cli_env, None, tmp_path, url, ["p/ce/0"])
    out, err = here.communicate(timeout=60)
    assert here.returncode == 0, err[-2000:]
    assert json.loads(out.strip().splitlines()[-1]) == ["p/ce/0"]
    assert time.time() - killed >= 1.5 - 0.2 - 0.05  # not before the last heartbeat was grace_s old
    row = db.get("p/ce/0")
    assert row["status"] == "done" and row["attempts"] == 2 and row["metrics"]["host"] != "calibkit-node2"
    db.close()


@pytest.mark.slow
@pytest.mark.postgres
@needs_unshare
def test_smoke_bench_on_two_hosts_sharing_postgres(tmp_path, cli_env, pg_url):
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "calibkit", "bench", "--preset", "smoke", "--methods", "ce", "ls", "--out", str(out),
           "--store", pg_url]
    node2 = ["unshare", "--uts", "sh", "-c", 'hostname calibkit-node2 && exec "$0" "$@"', *cmd, "--no-report"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env)
             for argv in (node2, [*cmd, "--no-report"])]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-3000:] for o in outs]
    done = [int(o[0].split(" run(s) done")[0].rsplit(" ", 1)[-1]) for o in outs]
    assert sum(done) == 2, outs
    db = open_store(out, pg_url, readonly=True)
    rows = db.runs("smoke")
    assert sorted(r["method"] for r in rows) == ["ce", "ls"] and all(r["attempts"] == 1 for r in rows)
    assert (sorted(db._sql("SELECT run_dir FROM runs").fetchall())
            == [("runs/smoke/ce/seed0",), ("runs/smoke/ls/seed0",)])
    db.close()
    assert not (out / "runs.db").exists()  # the runs live in PostgreSQL only
    # Report from another directory, then the same bench again: nothing rerun.
    res = subprocess.run([sys.executable, "-m", "calibkit", "report", str(out), "--store", pg_url], cwd=tmp_path,
                         env=cli_env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and "2 finished runs" in res.stdout, res.stderr[-3000:]
    res = subprocess.run(cmd, env=cli_env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "0 run(s) done, 2 skipped (finished earlier), 0 failed" in res.stdout
