"""``calibkit bench --workers N``: extra processes share the runs; every run is trained once."""

import argparse
import subprocess

from calibkit.bench.workers import worker_argv
from calibkit.commands import bench as bench_cmd
from calibkit.store import Store
from tests.conftest import PYTHON, ROOT


def _parser():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    bench_cmd.register(sub)
    return p


def test_worker_arguments_are_the_same_bench_with_one_worker_and_no_report():
    p = _parser()
    args = p.parse_args(["bench", "--preset", "smoke", "--out", "o", "--seeds", "0", "3", "--methods", "ls", "mbls",
                         "--data-dir", "d", "--keep", "last", "--num-threads", "1", "--tune", "--workers", "4"])
    child = p.parse_args(worker_argv(args))
    for name in ("preset", "out", "seeds", "methods", "data_dir", "csm_store", "device", "keep", "num_threads",
                 "tune"):
        assert getattr(child, name) == getattr(args, name), name
    assert child.workers == 1 and child.no_report and not args.no_report
    assert child.await_start and not args.await_start  # it waits for the caller's checks
    # defaults stay defaults (None is not turned into a value)
    bare = p.parse_args(["bench", "--out", "o", "--workers", "2"])
    child = p.parse_args(worker_argv(bare))
    assert child.seeds is None and child.methods is None and child.keep is None and child.data_dir is None


def test_two_workers_share_the_smoke_runs(tmp_path, cli_env):
    out = tmp_path / "b"
    methods = ["ls", "mbls", "focal", "flsd", "dfl"]
    res = subprocess.run([PYTHON, "-m", "calibkit", "bench", "--preset", "smoke", "--out", str(out), "--seeds", "0",
                          "--methods", *methods, "--workers", "2", "--num-threads", "1"],
                         env=cli_env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = Store(out / "runs.db", readonly=True).runs("smoke", status=None)
    assert sorted(r["method"] for r in rows) == sorted(["ce", *methods])
    assert all(r["status"] == "done" for r in rows)
    # two processes trained them: two owners (host:pid:token), each run claimed by exactly one
    owners = {r["owner"].rsplit(":", 1)[0] for r in rows}
    assert len(owners) == 2, owners
    log = (out / "logs" / "worker-1.log").read_text()
    assert "bench smoke:" in log and "report" not in log.lower().split("bench smoke:")[-1]
    assert "Ranking by test ECE" in res.stdout  # the report is written once, by the calling process


def test_a_bench_that_fails_its_checks_leaves_no_trace_and_no_worker(tmp_path, cli_env):
    out = tmp_path / "b"
    res = subprocess.run([PYTHON, "-m", "calibkit", "bench", "--preset", "smoke", "--out", str(out), "--methods",
                          "nosuch", "--workers", "3"], env=cli_env, capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert res.returncode == 1 and "nosuch" in res.stderr
    assert not out.exists()  # the waiting workers were told to stop before writing anything
    assert "Traceback" not in res.stderr  # they exit quietly


def test_run_with_workers_checks_the_count_and_cancels_the_unreleased(monkeypatch):
    import pytest

    from calibkit.bench import workers

    started, cancelled = [], []
    monkeypatch.setattr(workers, "start_workers", lambda args, n, argv=None: started.append((n, argv)) or ["w"] * n)
    monkeypatch.setattr(workers, "cancel_workers", lambda procs: cancelled.append(list(procs)))
    args = argparse.Namespace(workers=3)

    def fails(waiting):
        raise ValueError("checks failed")

    with pytest.raises(ValueError, match="checks failed"):
        workers.run_with_workers(args, fails, ["tune"])
    assert started == [(2, ["tune"])] and cancelled == [["w", "w"]]

    def releases(waiting):  # a body that released its workers: none left to cancel
        waiting.clear()
        return 7

    assert workers.run_with_workers(args, releases) == 7 and len(cancelled) == 1
    assert workers.run_with_workers(argparse.Namespace(workers=1), lambda w: w) == [] and len(started) == 2
    with pytest.raises(ValueError, match="--workers must be >= 1, got 0"):
        workers.run_with_workers(argparse.Namespace(workers=0), releases)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="under torchrun use --workers 1"):
        workers.run_with_workers(args, releases)
    assert len(started) == 2  # refused before any worker started


def test_every_option_reaches_a_worker_of_bench_and_of_tune():
    from calibkit.bench.workers import tune_worker_argv
    from calibkit.commands import tune as tune_cmd

    p = _parser()
    opts = ["--data-dir", "d", "--csm-store", "c", "--keep", "last", "--num-threads", "2", "--store", "sqlite:///x.db",
            "--max-extensions", "3", "--csm-build"]
    args = p.parse_args(["bench", "--preset", "smoke", "--out", "o", "--device", "cpu", "--workers", "3", *opts])
    assert worker_argv(args) == ["bench", "--preset", "smoke", "--out", "o", "--device", "cpu", "--no-report",
                                 "--workers", "1", "--await-start", *opts]
    t = argparse.ArgumentParser()
    tune_cmd.register(t.add_subparsers())
    args = t.parse_args(["tune", "--preset", "smoke", "--out", "o", "--device", "cpu", "--methods", "ls", "--seed", "0",
                         "--workers", "3", *opts])
    assert tune_worker_argv(args) == ["tune", "--preset", "smoke", "--out", "o", "--device", "cpu", "--workers", "1",
                                      "--await-start", "--methods", "ls", "--seed", "0", *opts]
    bare = t.parse_args(["tune", "--preset", "smoke", "--out", "o", "--workers", "2"])
    assert tune_worker_argv(bare) == ["tune", "--preset", "smoke", "--out", "o", "--device", bare.device, "--workers",
                                      "1", "--await-start", "--max-extensions", str(bare.max_extensions)]
    child = t.parse_args(tune_worker_argv(args))
    assert (child.seed, child.methods, child.store, child.max_extensions) == (0, ["ls"], "sqlite:///x.db", 3)
