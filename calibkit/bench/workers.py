"""``calibkit bench --workers N`` (and ``calibkit tune --workers N``): N processes on one machine
share a bench's runs (a tuning's candidates).

A bench already lets several processes running the same command share its runs: each claims a
pending run in ``DIR/runs.db`` before training it, and one that depends on a run still being
produced elsewhere waits for it (:mod:`calibkit.bench.runner`). ``--workers N`` starts N - 1 such
processes itself (``python -m calibkit bench --spec FILE``: the bench's spec file, written once its
checks have passed, :mod:`calibkit.pipeline.spec`; ``--store``'s URL, which may hold a password, in
their environment rather than in the file or on their command lines),
runs the bench in the calling process too, waits for the others and writes the report once
(:class:`calibkit.pipeline.executor.LocalProcesses`; the process mechanics are here). Each
extra worker's output is appended to ``DIR/logs/worker-K.log``, after a header line naming the date
and the command: the log of an interrupted bench (its worker's error) is still there after the
same command is run again to continue it.

The extra workers are started before the calling process checks the bench, and spend the seconds
of their own start-up (imports, the first optimizer's lazy imports, the CUDA context) while it
does. They then wait on their standard input: the caller releases them (``go LOGFILE``) once every
check has passed, or closes it, and they exit without having written anything (a bench that cannot
run leaves no trace). A released worker runs the bench as any process does, the same checks first.

A released worker keeps watching its standard input (:func:`watch_parent`): the caller holds the
pipe open until the worker has exited, so its end means that the caller is gone (killed, even by
``kill -9``, which runs no clean-up). The worker then stops as on SIGTERM: its run is marked
interrupted in ``runs.db`` and the next ``calibkit bench`` resumes it. The pipe works on every
platform, unlike Linux's ``PR_SET_PDEATHSIG``, and cannot miss a parent that died first.

The caller also watches its workers (:func:`reaper`): while it waits for a run a worker holds, it
polls them every half second, and one that has ended, whatever ended it (an error, SIGTERM,
SIGKILL from the OOM killer), is reaped at once. A reaped process no longer exists, so the claims it
held are dead (:func:`calibkit.store.common.owner_alive`, which also calls a zombie dead) and the
caller takes its runs over at its next look. The summary counts runs by their final state: a
worker that died while the others finished its runs is reported, not counted as a failed run.

On a machine with C cores, N = C processes of one thread each is usually fastest (the default
preset's runs are single-threaded by design: two OpenMP threads per process were measured much
slower than one on a busy 2-core machine).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import torch

from calibkit.store import resolve_store
from calibkit.store.secrets import redact

# Carries ``--store``'s URL to the extra workers, whose command lines say ``--store env:NAME``: a
# command line (``ps``) is visible to every user of the machine, a process's environment only to
# its owner, and the URL may hold a password.
STORE_ENV = "CALIBKIT_WORKER_STORE"


def start_workers(argv: list[str], n: int, store: str | None = None) -> list[subprocess.Popen]:
    """Start ``n`` extra processes ``python -m calibkit ARGV`` (a bench's or a tuning's, reading
    its spec file once released), waiting to be released (:func:`release_workers`); ``store``,
    ``--store``'s URL, reaches them in :data:`STORE_ENV`."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", STORE_ENV)}
    url = resolve_store(store)  # env:NAME: the URL it names (the workers' own variable holds it)
    if url is not None:
        env[STORE_ENV] = url
    return [subprocess.Popen([sys.executable, "-m", "calibkit", *argv], stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, env=env) for _ in range(n)]


def _tell(proc: subprocess.Popen, line: str | None) -> None:
    """Write ``line`` to a waiting worker and keep its input open (None: close it)."""
    assert proc.stdin is not None  # start_workers opens every worker with stdin=PIPE
    try:
        if line is not None:
            proc.stdin.write(line.encode() + b"\n")
            proc.stdin.flush()
        else:
            proc.stdin.close()
    except (BrokenPipeError, OSError):  # it ended already; wait_workers reports its status
        pass


def release_workers(procs: list[subprocess.Popen], out, command: list[str] | None = None
                    ) -> list[tuple[subprocess.Popen, Path]]:
    """Let the waiting workers run, each appending to ``OUT/logs/worker-K.log`` after a header line
    with the date and ``command`` (default: this process's arguments; passwords masked)."""
    logs = Path(out) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    words = sys.argv[1:] if command is None else command
    stamp = datetime.now().astimezone().isoformat(timespec="seconds")
    released = []
    line = redact(shlex.join(["calibkit", *words]))
    for k, proc in enumerate(procs, start=1):
        log = logs / f"worker-{k}.log"
        with open(log, "a") as f:
            f.write(f"==== {stamp}: {line} (worker {k}; {len(procs) + 1} processes) ====\n")
        _tell(proc, f"go {log.resolve()}")
        released.append((proc, log))
    return released


def cancel_workers(procs: list[subprocess.Popen]) -> None:
    """Tell waiting workers that the bench will not run; they exit having written nothing."""
    for proc in procs:
        _tell(proc, None)
    for proc in procs:
        proc.wait()


def await_start() -> Path | None:
    """In a waiting worker: block until released; then send this process's output to the log file
    it was given and return its path. ``None``: the caller closed the input (do nothing)."""
    line = sys.stdin.readline().strip()
    if not line.startswith("go "):
        return None
    log = Path(line[3:])
    watch_parent(sys.stdin)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return log


def watch_parent(stream) -> threading.Thread:
    """Send this process SIGTERM when ``stream`` (the pipe from the caller) ends; returns the watcher.

    Whatever arrives on the stream is ignored; only its end counts. Under ``calibkit.cli`` SIGTERM
    raises :class:`calibkit.cli.Terminated` in the main thread, so the work stops as on Ctrl-C.
    """
    def watch() -> None:
        try:
            while stream.read(4096):
                pass
        except (OSError, ValueError):  # closed under us: the same as its end
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="calibkit-watch-parent", daemon=True)
    thread.start()
    return thread


def warm_up(device: str | None) -> None:
    """What a worker's first run would otherwise pay for while the others already train: the lazy
    imports of the first ``torch.optim`` optimizer and, on a GPU (``device``; None: not yet known),
    the CUDA context."""
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    if device is not None and (device == "auto" or device.startswith("cuda")) and torch.cuda.is_available():
        torch.cuda.init()


def _ending(rc: int) -> str:
    """How a process ended, from its return code (negative: the signal that killed it)."""
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with status {rc}"


def reaper(procs: list) -> Callable[[], list[str]]:
    """A watcher of the released ``procs`` (``(Popen, log)`` pairs, filled by the caller): each call
    reaps those that have ended (``Popen.poll``) and returns one line per worker that ended badly
    since the last call, naming it, how it ended and its log."""
    told: set[int] = set()

    def reap() -> list[str]:
        lines = []
        for proc, log in procs:
            rc = proc.poll()
            if rc is None or proc.pid in told:
                continue
            told.add(proc.pid)
            if rc != 0:
                lines.append(f"{log.stem} (pid {proc.pid}) {_ending(rc)}; the runs it held are taken over "
                             f"(its log: {log})")
        return lines

    return reap


def wait_workers(procs, interrupted: bool = False) -> list[str]:
    """Wait for the extra workers (terminate them first when the caller was interrupted); returns
    one line per worker that failed."""
    failed = []
    for proc, log in procs:
        if interrupted and proc.poll() is None:
            proc.terminate()
        rc = proc.wait()
        _tell(proc, None)  # only now: the open pipe tells the worker that this process lives
        if rc != 0 and not interrupted:
            failed.append(f"worker {log.stem} {_ending(rc)}; see {log}")
    return failed
