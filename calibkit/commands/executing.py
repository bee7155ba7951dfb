"""What ``bench`` and ``tune`` share when they run: the SLURM options' checks, one scheduled task's
run, the failures' lines and the sharing of the runs with ``--workers`` processes."""

from __future__ import annotations

import os
import subprocess
import sys

from calibkit.bench.slurm_plan import options
from calibkit.bench.slurm_values import check_text
from calibkit.bench.workers import reaper, release_workers, wait_workers
from calibkit.errors import UserError
from calibkit.pipeline import Sharing
from calibkit.train import preempt


def check_executor(args) -> None:
    """Refuse SLURM options given to the local executor (they would be ignored silently), and,
    with ``--executor slurm``, any value a job script could not hold as given (checked again
    where the scripts are written; docs/cluster.md): an option of the wrong form for SLURM
    (``--time garbage``), or a control character in any option (``--partition $'gpu\\nx'``).

    Raises:
        ValueError: naming the first such option.
    """
    if args.executor == "slurm":
        for name, value in sorted(vars(args).items()):
            for item in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(item, str):
                    check_text("--" + name.replace("_", "-"), item)
        options(args)
        return
    given = [flag for flag, value in (("--dry-run", args.dry_run), ("--partition", args.partition),
                                      ("--account", args.account), ("--qos", args.qos), ("--time", args.time),
                                      ("--gpus-per-run", args.gpus_per_run), ("--cpus-per-run", args.cpus_per_run != 1),
                                      ("--mem", args.mem), ("--array-parallelism", args.array_parallelism),
                                      ("--sbatch-arg", args.sbatch_arg), ("--requeue", args.requeue),
                                      ("--signal", args.signal)) if value]
    if given:
        raise UserError(f"{given[0]} is an option of --executor slurm")


def run_scheduled(args, run) -> int:
    """Run one scheduled task's ``run()`` with SIGUSR1 as a stop request; a stopped run requeues its
    SLURM task (``scontrol requeue``) and exits 0, to resume from its checkpoint."""
    preempt.install()
    try:
        return run()
    except preempt.Preempted as stop:
        rank0 = int(os.environ.get("RANK", "0")) == 0
        job = os.environ.get("SLURM_JOB_ID")
        if not job:
            print(f"{args.run_key}: {stop}; not under SLURM, nothing requeued (run the same command to resume)")
            return 1
        if "SLURM_ARRAY_JOB_ID" in os.environ:
            job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
        if rank0:
            proc = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"{args.run_key}: {stop}; scontrol requeue {job} failed: {proc.stderr.strip()}", flush=True)
                return 1
            print(f"{args.run_key}: {stop}; task {job} requeued", flush=True)
        return 0


def print_failures(command: str, failures: list[str], where: str) -> None:
    """Each run or candidate that failed in this process, one line on stderr with its reason (the
    progress line on stdout may scroll away or go to a log), and how to retry it."""
    for line in failures:
        print(f"calibkit {command}: error: {line}; recorded in {where}; run the same command again to retry it",
              file=sys.stderr)


def worker_sharing(args, waiting: list, head: str, noun: str):
    """The :class:`calibkit.pipeline.Sharing` of ``bench``/``tune`` with ``--workers``: an extra
    worker's (released by its caller), or the caller's, releasing the ``waiting`` processes before
    the first run and waiting for them after the last (``head``, ``noun``: its message's words)."""
    if args.await_start:
        return Sharing(released=True)
    if not waiting:
        return Sharing()

    workers: list = []

    def start() -> None:
        workers.extend(release_workers(waiting, args.out))
        waiting.clear()
        print(f"{head}: {args.workers} processes share the {noun} (the others log to {args.out}/logs/worker-K.log)")

    return Sharing(start=start, finish=lambda interrupted: wait_workers(workers, interrupted=interrupted),
                   reap=reaper(workers))

