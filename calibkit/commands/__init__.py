"""The subcommands of the ``calibkit`` command line (one module each; see ``calibkit.cli``)."""

from __future__ import annotations

from calibkit.commands import bounded as B
from calibkit.errors import UserError


def add_num_threads(parser) -> None:
    """Declare ``--num-threads N`` on a subcommand's parser (``calibkit.cli.main`` applies it)."""
    parser.add_argument("--num-threads", type=B.THREADS, metavar="N",
                        help="torch CPU threads (default: torch's; one is often fastest on a shared machine)")


def check_paths_given(**paths) -> None:
    """Refuse an empty (or all-blank) path option: ``Path("")`` is ``.``, so an empty ``--out`` would
    write into the working directory and an empty input would read it as a folder.

    ``paths`` maps an option's flag, written with underscores (``out``, ``val``), to its value;
    ``None`` (an option not given) passes.

    Raises:
        ValueError: naming the first empty option, e.g. ``--out: empty path``.
    """
    for name, value in paths.items():
        if value is not None and not str(value).strip():
            flag = "--" + name.replace("_", "-")
            raise UserError(f"{flag}: empty path {value!r}; give a file or folder name")


def apply_num_threads(args) -> None:
    """``torch.set_num_threads(args.num_threads)`` when the command declared and was given it.

    Raises:
        ValueError: a thread count below 1.
    """
    threads = getattr(args, "num_threads", None)
    if threads is None:
        return
    if threads < 1:
        raise UserError(f"--num-threads must be >= 1, got {threads}")
    import torch

    torch.set_num_threads(threads)


def add_executor(parser) -> None:
    """Declare where the runs execute (``--executor``) and the SLURM options of ``bench`` and ``tune``,
    plus the hidden options of one scheduled task (``--run-key``)."""
    import argparse

    g = parser.add_argument_group("executing on a SLURM cluster (docs/cluster.md)")
    g.add_argument("--executor", choices=("local", "slurm"), default="local",
                   help="local: run here (default); slurm: write sbatch array scripts to OUT/slurm/ and submit them")
    g.add_argument("--dry-run", action="store_true", help="with --executor slurm: write the scripts and print the "
                   "sbatch commands, submit nothing")
    g.add_argument("--partition", help="sbatch --partition")
    g.add_argument("--account", help="sbatch --account")
    g.add_argument("--qos", help="sbatch --qos")
    g.add_argument("--time", help="sbatch --time of every task (e.g. 12:00:00)")
    g.add_argument("--gpus-per-run", type=B.integer(0, 1024), default=0, metavar="N",
                   help="GPUs per run (default 0); N > 1 runs torchrun --standalone --nproc_per_node N in the task")
    g.add_argument("--cpus-per-run", type=B.count(100_000), default=1, metavar="N",
                   help="sbatch --cpus-per-task (default 1)")
    g.add_argument("--mem", help="sbatch --mem of every task (e.g. 32G)")
    g.add_argument("--array-parallelism", type=B.count(10**6), metavar="N",
                   help="at most N tasks of an array at once (%%N)")
    g.add_argument("--sbatch-arg", action="append", metavar="ARG",
                   help="one more sbatch option, passed through (repeatable), e.g. --sbatch-arg=--constraint=a100")
    g.add_argument("--requeue", action="store_true", help="sbatch --requeue: a preempted task runs again")
    g.add_argument("--signal", type=B.count(65535), metavar="S", help="SIGUSR1 S seconds before the time limit "
                   "(--signal=B:USR1@S): the run checkpoints after its epoch, requeues its task and exits")
    g.add_argument("--status", action="store_true", help="print each run key's state (done, queued, running, "
                   "failed, not submitted) from the result files and squeue")
    g.add_argument("--collect", action="store_true", help="import the runs' result files into OUT/runs.db "
                   "(idempotent), then report")
    # one task of a scheduler: run exactly this key, write its result file, never open runs.db
    parser.add_argument("--run-key", help=argparse.SUPPRESS)


def check_executor(args) -> None:
    """Refuse SLURM options given to the local executor (they would be ignored silently), and,
    with ``--executor slurm``, any value a job script could not hold as given (checked again
    where the scripts are written; docs/cluster.md): an option of the wrong form for SLURM
    (``--time garbage``), or a control character in any option (``--partition $'gpu\\nx'``).

    Raises:
        ValueError: naming the first such option.
    """
    if args.executor == "slurm":
        from calibkit.bench.slurm_values import check_text

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


def slurm_options(args):
    """The validated :class:`calibkit.bench.slurm.SlurmOptions` of a command line (ValueError
    naming the first bad one)."""
    from calibkit.bench.slurm import SlurmOptions

    return SlurmOptions(partition=args.partition, account=args.account, qos=args.qos, time=args.time,
                        gpus_per_run=args.gpus_per_run, cpus_per_run=args.cpus_per_run, mem=args.mem,
                        array_parallelism=args.array_parallelism, sbatch_args=tuple(args.sbatch_arg or ()),
                        requeue=args.requeue, signal_s=args.signal).validate()


def submission_argv(spec, commands) -> dict[str, list[str]]:
    """Write the spec file of a ``--executor slurm`` submission (a ``bench --tune`` also its tuning's);
    returns the calibkit arguments of each kind of task (``commands``: of ``bench``, ``tune``,
    ``select``), each reading its spec file (the script adds ``--run-key``)."""
    from calibkit.pipeline.spec import BenchSpec

    tune = spec
    if spec.command == "bench":
        tune = BenchSpec("tune", spec.preset, spec.out, spec.options.tune_options(), changes=spec.changes)
    argv = {}
    for command in commands:
        own = spec if command == spec.command else tune
        more = ("--select-only",) if command == "select" else ()
        argv[command] = own.argv(own.write(), *more)
    return argv


def run_scheduled(args, run) -> int:
    """Run one scheduled task's ``run()`` with SIGUSR1 as a stop request; a stopped run requeues its
    SLURM task (``scontrol requeue``) and exits 0, to resume from its checkpoint."""
    import os
    import subprocess

    from calibkit.train import preempt

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
    import sys

    for line in failures:
        print(f"calibkit {command}: error: {line}; recorded in {where}; run the same command again to retry it",
              file=sys.stderr)


def worker_argv(spec) -> list[str]:
    """The calibkit arguments of an extra worker of ``--workers N``: wait to be released, then run
    ``spec`` from its file (written on release, :func:`worker_sharing`)."""
    import os

    return spec.argv(os.path.abspath(spec.path()), "--await-start")


def worker_sharing(args, spec, waiting: list, head: str, noun: str):
    """The :class:`calibkit.pipeline.Sharing` of ``bench``/``tune`` with ``--workers``: the caller's,
    writing ``spec``'s file and releasing the ``waiting`` processes before the first run and waiting
    for them after the last (``head``, ``noun``: its message's words)."""
    from calibkit.pipeline import Sharing

    if not waiting:
        return Sharing()
    from calibkit.bench.workers import reaper, release_workers, wait_workers

    workers: list = []

    def start() -> None:
        spec.write()  # every check has passed: the workers read it once released
        workers.extend(release_workers(waiting, spec.out))
        waiting.clear()
        print(f"{head}: {args.workers} processes share the {noun} (the others log to {spec.out}/logs/worker-K.log)")

    return Sharing(start=start, finish=lambda interrupted: wait_workers(workers, interrupted=interrupted),
                   reap=reaper(workers))


def await_spec(args, command: str):
    """In an extra worker of ``--workers N``: wait to be released, then read the spec file; None
    when the caller closed the input (the bench will not run: do nothing)."""
    from calibkit.bench.workers import await_start, warm_up
    from calibkit.pipeline.spec import read_spec

    if args.spec is None:
        raise UserError("--await-start: give the --spec FILE of the bench that starts this worker")
    warm_up(None)  # while the caller checks (the device, and so the CUDA context, once released)
    if await_start() is None:
        return None
    spec = read_spec(args.spec, command)
    warm_up(spec.options.device)
    return spec
