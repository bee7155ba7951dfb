"""``calibkit.cli``: file-system, database, Ctrl-C and SIGTERM failures end in one line with the right
exit status and say what was kept; extra bench workers end when their parent dies.

Every CLI case runs the real command in a subprocess. A folder that refuses writes is made as the
user running the tests can: ``chmod`` for an ordinary user; as root (who ignores the mode bits)
``chattr +i`` or a read-only tmpfs mount; the tests skip, saying why, where none of them works.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from calibkit.cli import KEPT, Terminated, main
from tests.conftest import PYTHON

TRAIN = ["train", "--data", "digits", "--model", "mlp", "--train-subset", "300", "--val-size", "50",
         "--num-threads", "1", "--no-progress"]


def _refuses_writes(folder: Path) -> bool:
    try:
        (folder / ".probe").write_text("x")
    except OSError:
        return True
    (folder / ".probe").unlink()
    return False


@pytest.fixture
def make_readonly(tmp_path):
    """``make_readonly(fill=None)``: a folder in which creating anything fails, for whoever runs the
    tests, holding what ``fill(folder)`` wrote first."""
    undo = []

    def make(fill=None, name="ro"):
        folder = tmp_path / name
        folder.mkdir()
        if os.geteuid() != 0:
            if fill:
                fill(folder)
            folder.chmod(0o555)
            undo.append(lambda: folder.chmod(0o755))
        else:
            steps = ((None, ["chattr", "+i", str(folder)], ["chattr", "-i", str(folder)]),
                     (["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)],
                      ["mount", "-o", "remount,ro", str(folder)], ["umount", str(folder)]))
            for mount, lock, unlock in steps:
                try:
                    if mount and subprocess.run(mount, capture_output=True).returncode != 0:
                        continue
                    if fill:
                        fill(folder)
                    done = subprocess.run(lock, capture_output=True).returncode == 0
                except OSError:
                    done = False
                if done or mount:
                    undo.append(lambda cmd=unlock: subprocess.run(cmd, capture_output=True))
                if done:
                    break
        if not _refuses_writes(folder):
            pytest.skip("no way to make a folder refuse writes here (root without chattr +i or mount)")
        return folder

    yield make
    for step in reversed(undo):
        step()


@pytest.fixture
def readonly_dir(make_readonly):
    """An empty folder in which creating anything fails."""
    return make_readonly()


def test_a_report_in_a_read_only_bench_folder(make_readonly, cli_env):
    from tests.report.test_report import make_bench

    bench = make_readonly(make_bench, name="bench")
    res = _cli(["report", str(bench), "--n-boot", "20"], cli_env)
    assert res.returncode == 1
    line = _one_error_line(res, "report")
    # not "a corrupt database": SQLite cannot open a WAL database in a folder it may not write to
    assert line == (f"calibkit report: error: {bench}/runs.db cannot be opened (unable to open database file); "
                    f"SQLite also writes beside it (runs.db-wal, -shm): check that you may write to {bench}")


def _cli(args, cli_env, **kw):
    return subprocess.run([PYTHON, "-m", "calibkit", *args], capture_output=True, text=True, env=cli_env,
                          timeout=300, **kw)


def _one_error_line(res, command: str) -> str:
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"calibkit {command}: error: ") and "Traceback" not in res.stderr
    return lines[0]


@pytest.mark.parametrize("where", ["out", "parent"])
def test_train_into_a_read_only_folder(where, readonly_dir, cli_env):
    out = readonly_dir if where == "out" else readonly_dir / "run"
    res = _cli([*TRAIN, "--epochs", "1", "--out", str(out)], cli_env)
    assert res.returncode == 1
    line = _one_error_line(res, "train")
    named = out / "config.json" if where == "out" else out
    assert line.startswith(f"calibkit train: error: {named}: ")
    assert line.endswith(f"nothing was written to {out}; run the same command again once the cause is fixed")
    assert list(readonly_dir.iterdir()) == []


@pytest.mark.parametrize("command", ["bench", "tune"])
def test_bench_and_tune_under_a_read_only_parent(command, readonly_dir, cli_env):
    out = readonly_dir / "bench"
    res = _cli([command, "--preset", "smoke", "--methods", "ce", "ls", "--out", str(out)], cli_env)
    assert res.returncode == 1
    line = _one_error_line(res, command)
    assert line.startswith(f"calibkit {command}: error: {out}: ") and f"nothing was written to {out};" in line


def test_bench_into_a_read_only_folder(readonly_dir, cli_env):
    res = _cli(["bench", "--preset", "smoke", "--methods", "ce", "--out", str(readonly_dir)], cli_env)
    assert res.returncode == 1
    assert "results database: unable to open database file" in _one_error_line(res, "bench")


def test_sqlite_and_os_errors_from_main(tmp_path, capsys, monkeypatch):
    import calibkit.report as report

    (tmp_path / "runs.db").write_bytes(b"")
    cases = [(sqlite3.OperationalError("attempt to write a readonly database"),
              f"results database: attempt to write a readonly database; the runs and {tmp_path}/runs.db are "
              "untouched; run the same command again to rebuild the report"),
             (OSError(28, "No space left on device", str(tmp_path / "report" / "index.html")),
              f"{tmp_path / 'report' / 'index.html'}: No space left on device; the runs and {tmp_path}/runs.db "
              "are untouched; run the same command again to rebuild the report")]
    for exc, message in cases:
        def fail(*a, exc=exc, **k):
            raise exc

        monkeypatch.setattr(report, "build_report", fail)
        assert main(["report", str(tmp_path)]) == 1
        assert capsys.readouterr().err == f"calibkit report: error: {message}\n"


def test_a_database_drivers_error_is_one_line_without_its_password(tmp_path, capsys, monkeypatch):
    psycopg = pytest.importorskip("psycopg")
    import calibkit.commands.bench as bench_cmd

    def lost(args):  # what a server store lets through (calibkit.store.postgres retries connection losses)
        raise psycopg.errors.DiskFull("could not extend file of user u, password s3cretpw: No space left on device"
                                      "\nHINT: free some space")

    monkeypatch.setattr(bench_cmd, "run", lost)
    assert main(["bench", "--out", str(tmp_path), "--store", "postgresql://u:s3cretpw@db.lab/calib"]) == 1
    assert capsys.readouterr().err == ("calibkit bench: error: results database: could not extend file of user u, "
                                       "password ***: No space left on device; finished runs are kept in "
                                       "postgresql://u:***@db.lab/calib; run the "
                                       "same command again to continue (it skips them)\n")


@pytest.mark.parametrize("command", ["tune", "report", "bench"])
@pytest.mark.parametrize("exc,status,word", [(KeyboardInterrupt, 130, "interrupted"),
                                             (Terminated, 143, "terminated (SIGTERM)")])
def test_interrupts_of_every_command(command, exc, status, word, tmp_path, capsys, monkeypatch):
    import calibkit.commands.bench as bench_cmd
    import calibkit.commands.report as report_cmd
    import calibkit.commands.tune as tune_cmd

    def stopped(args):
        raise exc

    module = {"tune": tune_cmd, "report": report_cmd, "bench": bench_cmd}[command]
    monkeypatch.setattr(module, "run", stopped)
    argv = [command, str(tmp_path)] if command == "report" else [command, "--out", str(tmp_path)]
    (tmp_path / "runs.db").write_bytes(b"")  # something was kept
    assert main(argv) == status
    err = capsys.readouterr().err.strip()
    assert err == f"calibkit {command}: error: {word}; {KEPT[command][1].format(out=tmp_path, db=tmp_path / 'runs.db')}"
    assert f"kept in {tmp_path / 'runs.db'};" in err or f"the runs and {tmp_path / 'runs.db'} are untouched" in err


@pytest.mark.parametrize("command", ["bench", "tune"])
def test_an_interrupt_with_a_server_store_names_the_server_not_runs_db(command, tmp_path, capsys, monkeypatch):
    import calibkit.commands.bench as bench_cmd
    import calibkit.commands.tune as tune_cmd

    def stopped(args):
        raise KeyboardInterrupt

    monkeypatch.setattr({"tune": tune_cmd, "bench": bench_cmd}[command], "run", stopped)
    assert main([command, "--out", str(tmp_path / "o"), "--store", "postgresql://u:secret@db.lab:5432/calib"]) == 130
    err = capsys.readouterr().err.strip()
    word = "runs" if command == "bench" else "candidates"
    assert err == (f"calibkit {command}: error: interrupted; finished {word} are kept in "
                   "postgresql://u:***@db.lab:5432/calib; run the same command again to continue (it skips them)")


def _wait_for(path: Path, proc, seconds: float) -> None:
    deadline = time.time() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, f"{path} did not appear in {seconds} s"
        time.sleep(0.2)


@pytest.mark.parametrize("sig,status,word", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                             (signal.SIGINT, 130, "interrupted")])
def test_a_signalled_training_says_how_to_resume_and_resumes(sig, status, word, tmp_path, cli_env):
    out = tmp_path / "run"
    cmd = [PYTHON, "-m", "calibkit", *TRAIN, "--batch-size", "32", "--epochs", "200", "--out", str(out)]
    # As from a terminal: SIGINT at its default. A test run started in the background by a
    # non-interactive shell ignores SIGINT, and a child inherits that (it would never see Ctrl-C).
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        _wait_for(out / "checkpoint.pt", proc, 120)  # one epoch is on disk
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == status, err
    assert err.strip().splitlines()[-1] == (f"calibkit train: error: {word}; every epoch completed up to the last "
                                            f"checkpoint is kept; run the same command again to resume {out}")
    assert "Traceback" not in err
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]  # no half-written file left
    from calibkit import rundir

    assert rundir.read_checkpoint(out / "checkpoint.pt")["epoch"] >= 1  # what the same command resumes from
    assert rundir.read_json(out / "config.json")["status"] == "running"


@pytest.mark.slow  # the message and status are covered in-process above (test_interrupts_of_every_command)
def test_a_terminated_bench_marks_its_run_interrupted(tmp_path, cli_env):
    from calibkit.store import Store

    out = tmp_path / "bench"
    cmd = [PYTHON, "-m", "calibkit", "bench", "--preset", "smoke", "--methods", "ce", "ls", "focal", "--out", str(out),
           "--no-report"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env)
    try:
        _wait_for(out / "runs" / "smoke" / "ce" / "seed0" / "config.json", proc, 120)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert (err.strip().splitlines()[-1]
            == f"calibkit bench: error: terminated (SIGTERM); {KEPT['bench'][1].format(out=out, db=out / 'runs.db')}")
    rows = Store(str(out / "runs.db"), readonly=True).runs("smoke", status=None)
    assert [r["status"] for r in rows if r["method"] == "ce"] in (["failed"], ["done"])  # interrupted, or just done
    assert not [r for r in rows if r["status"] == "running"]  # nothing left claimed by a dead process


def test_watch_parent_ends_the_process_when_the_pipe_ends(cli_env):
    # The worker side on its own: a process watching its stdin gets SIGTERM when the writer goes away.
    code = ("import signal, sys, time; import calibkit.bench.workers as w\n"
            "def stop(*a): raise SystemExit(143)\n"
            "signal.signal(signal.SIGTERM, stop); w.watch_parent(sys.stdin); print('ready', flush=True)\n"
            "time.sleep(60); sys.exit(0)\n")
    proc = subprocess.Popen([PYTHON, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=cli_env)
    try:
        assert proc.stdout.readline() == b"ready\n"
        proc.stdin.write(b"anything\n")
        proc.stdin.flush()
        time.sleep(0.3)
        assert proc.poll() is None  # data on the pipe is not its end
        t0 = time.time()
        proc.stdin.close()
        assert proc.wait(timeout=20) == 143 and time.time() - t0 < 20
    finally:
        proc.kill()


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the worker through /proc (Linux)")
def test_kill_9_of_the_bench_ends_its_workers(tmp_path, cli_env):
    out = tmp_path / "bench"
    cmd = [PYTHON, "-m", "calibkit", "bench", "--preset", "smoke", "--out", str(out), "--workers", "2", "--no-report"]
    main_proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=cli_env)
    workers = []
    try:
        log = out / "logs" / "worker-1.log"
        deadline = time.time() + 180
        while not (log.exists() and "running" in log.read_text()):
            assert main_proc.poll() is None and time.time() < deadline, "the worker never started a run"
            time.sleep(0.2)
        workers = _children(main_proc.pid)
        assert len(workers) == 1
        os.kill(main_proc.pid, signal.SIGKILL)
        main_proc.wait()
        deadline = time.time() + 30
        while (Path(f"/proc/{workers[0]}").exists()
               and "Z" not in Path(f"/proc/{workers[0]}/stat").read_text().split()[2]):
            assert time.time() < deadline, "the worker outlived its parent by 30 s"
            time.sleep(0.2)
        assert "terminated (SIGTERM)" in log.read_text()
    finally:
        main_proc.kill()
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
