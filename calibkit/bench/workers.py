"""``calibkit bench --workers N``: N processes on one machine share a bench's runs.

A bench already lets several processes running the same command share its runs: each claims a
pending run in ``DIR/runs.db`` before training it, and one that depends on a run still being
produced elsewhere waits for it (:mod:`calibkit.bench.runner`). ``--workers N`` starts N - 1 such
processes itself (``python -m calibkit bench`` with the same options, no report, one worker each),
runs the bench in the calling process too, waits for the others and writes the report once. Each
extra worker's output goes to ``DIR/logs/worker-K.log``.

On a machine with C cores, N = C processes of one thread each is usually fastest (the default
preset's runs are single-threaded by design: two OpenMP threads per process were measured much
slower than one on a busy 2-core machine).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def worker_argv(args) -> list[str]:
    """The ``calibkit bench`` arguments of an extra worker: the same bench, one worker, no report."""
    argv = ["bench", "--preset", args.preset, "--out", str(args.out), "--device", args.device, "--no-report",
            "--workers", "1"]
    if args.seeds is not None:
        argv += ["--seeds", *map(str, args.seeds)]
    if args.methods is not None:
        argv += ["--methods", *args.methods]
    for flag, value in (("--data-dir", args.data_dir), ("--csm-store", args.csm_store), ("--keep", args.keep),
                        ("--num-threads", args.num_threads)):
        if value is not None:
            argv += [flag, str(value)]
    if args.tune:
        argv.append("--tune")  # resumes the finished selection: the worker trains at the selected values
    return argv


def start_workers(args, n: int) -> list[tuple[subprocess.Popen, Path]]:
    """Start ``n`` extra bench processes; returns them with their log files."""
    logs = Path(args.out) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    procs = []
    for k in range(1, n + 1):
        log = logs / f"worker-{k}.log"
        with open(log, "w") as fh:
            procs.append((subprocess.Popen([sys.executable, "-m", "calibkit", *worker_argv(args)], stdout=fh,
                                           stderr=subprocess.STDOUT, env=env), log))
    return procs


def wait_workers(procs, interrupted: bool = False) -> list[str]:
    """Wait for the extra workers (terminate them first when the caller was interrupted); returns
    one line per worker that failed."""
    failed = []
    for proc, log in procs:
        if interrupted and proc.poll() is None:
            proc.terminate()
        rc = proc.wait()
        if rc != 0 and not interrupted:
            failed.append(f"worker {log.stem} exited with status {rc}; see {log}")
    return failed
