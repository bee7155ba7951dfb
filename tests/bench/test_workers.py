"""``calibkit bench --workers N``: extra processes share the runs; every run is trained once."""

import argparse
import subprocess

import pytest

from calibkit.commands.parsers import bench as bench_cmd
from tests.conftest import PYTHON, ROOT


def _parser():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    bench_cmd.register(sub)
    return p


def _spec(argv, command="bench"):
    from calibkit.commands import bench as bench_body
    from calibkit.commands import tune as tune_body
    from calibkit.commands.parsers import bench as bench_parser
    from calibkit.commands.parsers import tune as tune_parser
    from calibkit.commands.presetargs import spec_from_args

    p = argparse.ArgumentParser()
    (bench_parser if command == "bench" else tune_parser).register(p.add_subparsers())
    args = p.parse_args([command, *argv])
    mod = bench_body if command == "bench" else tune_body
    return args, spec_from_args(args, command, lambda: mod.options_from_args(args))


def test_a_worker_is_given_the_spec_file_of_its_bench_and_waits_for_the_callers_checks(tmp_path):
    from calibkit.pipeline.executor import worker_argv

    p = _parser()
    out = tmp_path / "o"
    args, spec = _spec(["--preset", "smoke", "--out", str(out), "--seeds", "0", "3", "--methods", "ls", "mbls",
                        "--data-dir", "d", "--keep", "last", "--num-threads", "1", "--tune", "--workers", "4"])
    argv = worker_argv(spec)
    child = p.parse_args(argv)
    assert argv[:2] == ["bench", "--out"] and child.out == str(out)
    assert child.await_start and not args.await_start  # it waits for the caller's checks
    assert child.spec == str(spec.path().resolve()) and child.spec.startswith(str(out / "specs" / "bench-"))
    assert not out.exists()  # named before the checks, written only once they pass
    spec.write()
    _, again = _spec(["--out", str(out), "--spec", child.spec])
    assert again == spec  # every option, the preset's name and its changes
    assert (again.options.seeds, again.options.methods, again.options.keep) == ((0, 3), ("ls", "mbls"), "last")


def test_a_bench_that_fails_its_checks_leaves_no_trace_and_no_worker(tmp_path, cli_env):
    out = tmp_path / "b"
    res = subprocess.run([PYTHON, "-m", "calibkit", "bench", "--preset", "smoke", "--out", str(out), "--methods",
                          "nosuch", "--workers", "3"], env=cli_env, capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert res.returncode == 1 and "nosuch" in res.stderr
    assert not out.exists()  # the waiting workers were told to stop before writing anything
    assert "Traceback" not in res.stderr  # they exit quietly


def test_local_processes_check_the_count_and_cancel_the_unreleased(monkeypatch, tmp_path):
    import pytest

    from calibkit.pipeline import BenchOptions, BenchSpec, LocalProcesses
    from calibkit.pipeline import executor as ex

    started, cancelled, ran = [], [], []
    monkeypatch.setattr(ex, "start_workers", lambda argv, n, store=None: started.append((n, argv, store)) or ["w"] * n)
    monkeypatch.setattr(ex, "cancel_workers", lambda procs: cancelled.append(list(procs)))
    spec = BenchSpec("bench", "smoke", tmp_path / "o", BenchOptions(store="postgresql://db/x"))

    def fails(spec, peers=None):
        ran.append(peers)
        raise ValueError("checks failed")

    monkeypatch.setattr(ex, "run_spec", fails)
    with pytest.raises(ValueError, match="checks failed"):
        LocalProcesses(3).execute(spec)
    assert started == [(2, ex.worker_argv(spec), "postgresql://db/x")] and cancelled == [["w", "w"]]

    def releases(spec, peers=None):  # the checks passed, the workers released: none left to cancel
        peers.waiting = []
        return 7

    monkeypatch.setattr(ex, "run_spec", releases)
    assert LocalProcesses(3).execute(spec) == 7 and len(cancelled) == 1
    monkeypatch.setattr(ex, "run_spec", lambda spec, peers=None: ran.append(peers) or "alone")
    assert LocalProcesses(1).execute(spec) == "alone" and ran[-1] is None and len(started) == 2
    with pytest.raises(ValueError, match="--workers must be >= 1, got 0"):
        LocalProcesses(0)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert LocalProcesses(1).workers == 1  # one: fine under torchrun
    with pytest.raises(ValueError) as err:
        LocalProcesses(3)
    assert str(err.value) == "--workers starts processes itself; under torchrun use --workers 1"
    assert len(started) == 2  # refused before any worker started


def test_the_command_line_chooses_the_executor(tmp_path):
    from calibkit.commands.executing import executor_from_args
    from calibkit.pipeline import Inline, LocalProcesses, SlurmArrays

    out = str(tmp_path / "o")
    for command in ("bench", "tune"):
        assert isinstance(executor_from_args(_spec(["--preset", "smoke", "--out", out], command)[0]), Inline)
        chosen = executor_from_args(_spec(["--preset", "smoke", "--out", out, "--workers", "3"], command)[0])
        assert isinstance(chosen, LocalProcesses) and chosen.workers == 3
        args = _spec(["--preset", "smoke", "--out", out, "--executor", "slurm", "--dry-run", "--partition", "gpu"],
                     command)[0]
        chosen = executor_from_args(args)
        assert isinstance(chosen, SlurmArrays) and chosen.dry_run and chosen.options.partition == "gpu"


def test_every_option_reaches_a_worker_of_bench_and_of_tune(tmp_path):
    from calibkit.pipeline.executor import worker_argv
    from calibkit.pipeline.spec import read_spec

    opts = ["--data-dir", "d", "--csm-store", "c", "--keep", "last", "--num-threads", "2", "--store",
            "postgresql://db/x", "--max-extensions", "3", "--csm-build", "--lr", "0.003", "--no-augment"]
    out = str(tmp_path / "o")
    for command, more in (("bench", ["--seeds", "1", "--tune"]), ("tune", ["--methods", "ls", "--seed", "0"])):
        args, spec = _spec(["--preset", "smoke", "--out", out, "--device", "cpu", "--workers", "3", *opts, *more],
                           command)
        path = spec.write()
        assert worker_argv(spec) == [command, "--out", out, "--spec", str(path), "--await-start"]
        again = read_spec(path, command)
        # the URL itself goes in the workers' environment, never into the file
        assert again.options.store == "env:CALIBKIT_WORKER_STORE" and "db/x" not in path.read_text()
        assert again == spec.with_options(store="env:CALIBKIT_WORKER_STORE")
        assert again.changes == {"lr": 0.003, "augment": False} and again.load() == spec.load()
    assert (again.options.seed, again.options.methods, again.options.max_extensions) == (0, ("ls",), 3)


def test_a_store_password_reaches_the_workers_in_their_environment_not_their_command_line(monkeypatch):
    from calibkit.bench import workers

    url = "postgresql://calib:s3cretpw@db/c10?sslpassword=k3ypass"
    made = []
    monkeypatch.setattr(workers.subprocess, "Popen", lambda cmd, **kw: made.append(_Proc(cmd, **kw)) or made[-1])
    monkeypatch.setenv(workers.STORE_ENV, "postgresql://left@over/x")  # the caller's own: replaced
    (proc,) = workers.start_workers(["bench", "--out", "o", "--spec", "s.json"], 1, url)
    assert "s3cretpw" not in " ".join(proc.cmd) and proc.env[workers.STORE_ENV] == url
    monkeypatch.setenv("MY_STORE", url)  # env:NAME: the URL it names
    (proc,) = workers.start_workers(["bench"], 1, "env:MY_STORE")
    assert proc.env[workers.STORE_ENV] == url
    # no --store: nothing put in the environment, none inherited either
    monkeypatch.setenv(workers.STORE_ENV, "postgresql://left@over/x")
    (proc,) = workers.start_workers(["bench"], 1)
    assert workers.STORE_ENV not in proc.env and "--store" not in proc.cmd


def test_store_env_name_is_read_by_the_command_line_and_an_unset_one_is_one_line(monkeypatch, tmp_path, capsys):
    from calibkit.cli import main
    from calibkit.store import resolve_store

    monkeypatch.setenv("CALIBKIT_WORKER_STORE", "postgresql://calib:s3cretpw@db/c10")
    assert resolve_store("env:CALIBKIT_WORKER_STORE") == "postgresql://calib:s3cretpw@db/c10"
    assert resolve_store("postgresql://db/x") == "postgresql://db/x" and resolve_store(None) is None
    with pytest.raises(ValueError, match=r"^--store env:1x: expected env:NAME"):
        resolve_store("env:1x")
    monkeypatch.delenv("CALIBKIT_NO_SUCH_STORE", raising=False)
    assert main(["report", str(tmp_path), "--store", "env:CALIBKIT_NO_SUCH_STORE"]) == 1
    assert capsys.readouterr().err == ("calibkit report: error: --store env:CALIBKIT_NO_SUCH_STORE: the environment "
                                       "variable CALIBKIT_NO_SUCH_STORE is not set (it should hold the postgresql:// "
                                       "URL)\n")


# ---------------------------------------------------------------- the caller's side, in-process


class _Pipe:
    """A worker's stdin as the caller sees it; ``broken``: the worker has ended."""

    def __init__(self, broken=False):
        self.lines, self.closed, self.broken = [], False, broken

    def write(self, data):
        if self.broken:
            raise BrokenPipeError(32, "Broken pipe")
        self.lines.append(data)

    def flush(self):
        pass

    def close(self):
        if self.broken:
            raise OSError(32, "Broken pipe")
        self.closed = True


class _Proc:
    def __init__(self, cmd=None, stdin=None, stdout=None, env=None, rc=0, running=False, broken=False):
        self.cmd, self.stdin_arg, self.stdout_arg, self.env = cmd, stdin, stdout, env
        self.stdin, self.rc, self.running, self.events = _Pipe(broken), rc, running, []

    def poll(self):
        return None if self.running else self.rc

    def terminate(self):
        self.events.append("terminate")
        self.running = False

    def wait(self):
        self.events.append("wait" if not self.stdin.closed else "wait after close")
        return self.rc


def test_start_workers_runs_calibkit_without_the_torchrun_rank(monkeypatch):
    import sys

    from calibkit.bench import workers

    made = []
    monkeypatch.setattr(workers.subprocess, "Popen", lambda cmd, **kw: made.append(_Proc(cmd, **kw)) or made[-1])
    for name, value in (("WORLD_SIZE", "1"), ("RANK", "0"), ("LOCAL_RANK", "0"), ("CALIBKIT_X", "kept")):
        monkeypatch.setenv(name, value)
    procs = workers.start_workers(["tune", "--out", "o"], 3)
    assert procs == made and len(made) == 3
    for p in made:
        assert p.cmd == [sys.executable, "-m", "calibkit", "tune", "--out", "o"]
        assert p.stdin_arg == subprocess.PIPE and p.stdout_arg == subprocess.DEVNULL
        assert not {"WORLD_SIZE", "RANK", "LOCAL_RANK"} & set(p.env) and p.env["CALIBKIT_X"] == "kept"
    assert workers.start_workers(["bench"], 0) == []


def test_release_cancel_and_wait_speak_to_the_waiting_workers(tmp_path):
    from calibkit.bench import workers

    procs = [_Proc(), _Proc()]
    released = workers.release_workers(procs, tmp_path / "out")
    logs = [tmp_path / "out" / "logs" / f"worker-{k}.log" for k in (1, 2)]
    assert released == list(zip(procs, logs))
    for p, log in zip(procs, logs):
        assert log.read_text().startswith("==== ") and log.read_text().count("\n") == 1  # its header only
        assert p.stdin.lines == [f"go {log.resolve()}\n".encode()] and not p.stdin.closed
    # a worker that failed is reported with its log; the pipe closes only after the wait
    procs[1].rc = 3
    assert workers.wait_workers(released) == [f"worker worker-2 exited with status 3; see {logs[1]}"]
    assert all(p.events == ["wait"] and p.stdin.closed for p in procs)
    # interrupted: a running worker is terminated first, and nothing is reported as failed
    live, done = _Proc(running=True, rc=-15), _Proc(rc=1)
    assert workers.wait_workers([(live, logs[0]), (done, logs[1])], interrupted=True) == []
    assert live.events == ["terminate", "wait"] and done.events == ["wait"]
    # cancelled: every input is closed before the caller waits for any of them
    waiting = [_Proc(), _Proc()]
    workers.cancel_workers(waiting)
    assert all(p.stdin.closed and p.events == ["wait after close"] for p in waiting)


def test_a_worker_that_already_ended_is_not_an_error(tmp_path):
    from calibkit.bench import workers

    gone = _Proc(broken=True, rc=1)
    released = workers.release_workers([gone], tmp_path)  # BrokenPipeError on write: ignored
    workers.cancel_workers([gone])  # OSError on close: ignored
    assert (workers.wait_workers(released)
            == [f"worker worker-1 exited with status 1; see {tmp_path / 'logs' / 'worker-1.log'}"])


def test_the_watcher_signals_this_process_when_the_caller_goes(monkeypatch):
    import io
    import os
    import signal

    from calibkit.bench import workers

    kills = []
    monkeypatch.setattr(workers.os, "kill", lambda pid, sig: kills.append((pid, sig)))
    r, w = os.pipe()
    with os.fdopen(r, "rb") as stream:
        thread = workers.watch_parent(stream)
        assert thread.daemon and thread.name == "calibkit-watch-parent"
        os.write(w, b"anything the caller says is ignored\n")
        thread.join(0.2)
        assert thread.is_alive() and kills == []  # the pipe is open: the caller lives
        os.close(w)
        thread.join(10)
    assert not thread.is_alive() and kills == [(os.getpid(), signal.SIGTERM)]

    class Closed(io.RawIOBase):
        def read(self, n=-1):
            raise ValueError("I/O operation on closed file")

    workers.watch_parent(Closed()).join(10)  # a stream closed under it counts as the caller's end
    assert kills[-1] == (os.getpid(), signal.SIGTERM) and len(kills) == 2


def test_await_start_without_a_go_does_nothing(monkeypatch):
    import io

    from calibkit.bench import workers

    watched = []
    monkeypatch.setattr(workers, "watch_parent", watched.append)
    monkeypatch.setattr(workers.sys, "stdin", io.StringIO(""))  # the caller closed the pipe
    assert workers.await_start() is None
    monkeypatch.setattr(workers.sys, "stdin", io.StringIO("stop\n"))
    assert workers.await_start() is None and watched == []  # nothing redirected, nothing watched


def test_await_start_sends_this_process_output_to_its_log(monkeypatch, tmp_path):
    import io

    from calibkit.bench import workers

    calls, watched = [], []
    monkeypatch.setattr(workers.sys, "stdin", io.StringIO(f"go {tmp_path / 'w 1.log'}\nrest\n"))
    monkeypatch.setattr(workers, "watch_parent", watched.append)
    monkeypatch.setattr(workers.os, "open", lambda path, flags: calls.append(("open", path, flags)) or 42)
    monkeypatch.setattr(workers.os, "dup2", lambda fd, to: calls.append(("dup2", fd, to)))
    monkeypatch.setattr(workers.os, "close", lambda fd: calls.append(("close", fd)))
    flushed = []
    monkeypatch.setattr(workers.sys, "stdout", SimpleFlush("out", flushed))
    monkeypatch.setattr(workers.sys, "stderr", SimpleFlush("err", flushed))
    assert workers.await_start() == tmp_path / "w 1.log"  # a path with a space is read whole
    assert watched == [workers.sys.stdin]  # the pipe is watched from now on
    assert calls == [("open", tmp_path / "w 1.log", workers.os.O_WRONLY | workers.os.O_APPEND),
                     ("dup2", 42, 1), ("dup2", 42, 2), ("close", 42)]
    assert flushed == ["out", "err"]  # what was printed before goes where it was meant to


class SimpleFlush:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def flush(self):
        self.log.append(self.name)


def test_warm_up_makes_the_first_optimizer_and_the_cuda_context_only_on_a_gpu(monkeypatch):
    import torch

    from calibkit.bench import workers

    made, inits = [], []
    monkeypatch.setattr(torch.optim, "SGD", lambda params, lr: made.append((params, lr)))
    monkeypatch.setattr(torch.cuda, "init", lambda: inits.append(1))
    initialised = []
    for available in (False, True):
        monkeypatch.setattr(torch.cuda, "is_available", lambda a=available: a)
        for device in ("cpu", "auto", "cuda", "cuda:1", "mps"):
            before = len(inits)
            workers.warm_up(device)
            if len(inits) > before:
                initialised.append((available, device))
        workers.warm_up(None)  # the device not known yet: no CUDA context
    assert initialised == [(True, "auto"), (True, "cuda"), (True, "cuda:1")]
    (params, lr), *_ = made
    assert len(made) == 12 and lr == 0.1 and len(params) == 1 and params[0].requires_grad
    assert params[0].shape == (1,)


def test_release_twice_into_the_same_log_folder_keeps_the_first_benchs_lines(tmp_path, monkeypatch):
    import re

    from calibkit.bench import workers

    monkeypatch.setattr(workers.sys, "argv", ["calibkit", "bench", "--out", "o", "--workers", "2"])
    workers.release_workers([_Proc()], tmp_path)
    log = tmp_path / "logs" / "worker-1.log"
    with open(log, "a") as f:
        f.write("FAILED: OSError: the first bench's error\n")
    workers.release_workers([_Proc()], tmp_path, ["bench", "--store", "postgresql://u:secret@db/x"])
    lines = log.read_text().splitlines()
    assert len(lines) == 3 and lines[1] == "FAILED: OSError: the first bench's error"
    head = r"==== \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d: "
    assert re.fullmatch(head + r"calibkit bench --out o --workers 2 \(worker 1; 2 processes\) ====", lines[0])
    # each start is one header line with its own command, passwords masked
    assert re.fullmatch(head + r"calibkit bench --store postgresql://u:\*\*\*@db/x \(worker 1; 2 processes\) ====",
                        lines[2]), lines[2]


def test_reaper_reaps_ended_workers_and_names_each_bad_ending_once(tmp_path):
    import signal
    import sys
    import time

    from calibkit.bench.workers import reaper

    procs = [subprocess.Popen([sys.executable, "-c", code]) for code in
             ("import time; time.sleep(60)", "raise SystemExit(0)", "raise SystemExit(3)")]
    released = [(p, tmp_path / f"worker-{k}.log") for k, p in enumerate(procs, start=1)]
    reap = reaper(released)
    try:
        for p in procs[1:]:
            p.wait()
        assert reap() == [f"worker-3 (pid {procs[2].pid}) exited with status 3; the runs it held are taken over "
                          f"(its log: {tmp_path / 'worker-3.log'})"]
        assert reap() == []  # told once
        procs[0].send_signal(signal.SIGKILL)
        t0 = time.time()
        while not (lines := reap()):
            assert time.time() - t0 < 10
            time.sleep(0.05)
        assert lines == [f"worker-1 (pid {procs[0].pid}) was killed by SIGKILL; the runs it held are taken over "
                         f"(its log: {tmp_path / 'worker-1.log'})"]
        assert procs[0].returncode == -signal.SIGKILL  # reaped: no zombie left
    finally:
        for p in procs:
            p.kill()
            p.wait()
