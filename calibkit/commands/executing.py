"""What ``bench`` and ``tune`` share when they run: the SLURM options' checks, the executor the
command line chooses (:mod:`calibkit.pipeline.executor`), one scheduled task's run, the failures'
lines, and an extra ``--workers`` process's wait for its release and its spec file."""

from __future__ import annotations

import os
import subprocess
import sys

from calibkit.bench.slurm import SlurmOptions
from calibkit.bench.slurm_values import check_text
from calibkit.bench.workers import await_start, warm_up
from calibkit.errors import UserError
from calibkit.pipeline.executor import Executor, Inline, LocalProcesses, SlurmArrays
from calibkit.pipeline.spec import read_spec
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
        slurm_options(args)
        return
    given = [flag for flag, value in (("--dry-run", args.dry_run), ("--partition", args.partition),
                                      ("--account", args.account), ("--qos", args.qos), ("--time", args.time),
                                      ("--gpus-per-run", args.gpus_per_run), ("--cpus-per-run", args.cpus_per_run != 1),
                                      ("--mem", args.mem), ("--array-parallelism", args.array_parallelism),
                                      ("--sbatch-arg", args.sbatch_arg), ("--requeue", args.requeue),
                                      ("--signal", args.signal)) if value]
    if given:
        raise UserError(f"{given[0]} is an option of --executor slurm")


def slurm_options(args) -> SlurmOptions:
    """The validated :class:`calibkit.bench.slurm.SlurmOptions` of a command line (ValueError
    naming the first bad one)."""
    return SlurmOptions(partition=args.partition, account=args.account, qos=args.qos, time=args.time,
                        gpus_per_run=args.gpus_per_run, cpus_per_run=args.cpus_per_run, mem=args.mem,
                        array_parallelism=args.array_parallelism, sbatch_args=tuple(args.sbatch_arg or ()),
                        requeue=args.requeue, signal_s=args.signal).validate()


def executor_from_args(args) -> Executor:
    """The executor ``--executor`` and ``--workers`` choose: SLURM arrays, N local processes, or
    this process alone (the counts and the SLURM options checked)."""
    if args.executor == "slurm":
        return SlurmArrays(slurm_options(args), dry_run=args.dry_run)
    return Inline() if args.workers == 1 else LocalProcesses(args.workers)


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


def await_spec(args, command: str):
    """In an extra worker of ``--workers N``: wait to be released, then read the spec file; None
    when the caller closed the input (the bench will not run: do nothing)."""
    if args.spec is None:
        raise UserError("--await-start: give the --spec FILE of the bench that starts this worker")
    warm_up(None)  # while the caller checks (the device, and so the CUDA context, once released)
    if await_start() is None:
        return None
    spec = read_spec(args.spec, command)
    warm_up(spec.options.device)
    return spec
