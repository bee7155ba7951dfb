"""Which arrays a ``--executor slurm`` submission holds, and the command line of their tasks.

A key is left out when its result file says ``done`` or a task of an earlier submission still
has it queued or running (:func:`calibkit.bench.slurm.key_states`); a two-stage array whose CE
run is queued or running in an earlier submission waits for that task (``afterok``). A task stuck
on a dependency that failed is cancelled first (:func:`calibkit.bench.slurm.cancel_stuck`) and its
key submitted again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from calibkit.bench.collect import check_bench_folder, read_recorded
from calibkit.bench.grid import METHODS, REFERENCE, grid_methods
from calibkit.bench.presetargv import preset_argv
from calibkit.bench.producers import PRODUCERS
from calibkit.bench.slurm import Array, SlurmOptions, cancel_stuck, key_states, submit
from calibkit.bench.slurm_values import check_argv
from calibkit.bench.tune import Tuner
from calibkit.store import run_key
from calibkit.store.files import ResultFiles

_SKIP = ("done", "queued", "running")


def task_argv(args, command: str) -> list[str]:
    """The calibkit arguments of a task of ``command`` (``bench``, ``tune`` or ``select``), from
    the submitting command's ``args`` (without ``--run-key``, which the script adds).

    Raises:
        ValueError: a value that cannot go into a job script (a control character, a password),
            naming its option (:func:`calibkit.bench.slurm_values.check_argv`).
    """
    argv = ["tune" if command in ("tune", "select") else "bench", *preset_argv(args), "--out", str(args.out),
            "--device", args.device]
    if command == "bench":
        argv += ["--no-report", "--workers", "1"] + (["--tune"] if getattr(args, "tune", False) else [])
        if getattr(args, "seeds", None) is not None:
            argv += ["--seeds", *map(str, args.seeds)]
    if command == "select":
        argv.append("--select-only")
    if args.methods is not None:
        argv += ["--methods", *args.methods]
    seed = getattr(args, "seed", None)
    if command != "bench" and seed is not None:
        argv += ["--seed", str(seed)]
    for flag, value in (("--data-dir", args.data_dir), ("--csm-store", args.csm_store), ("--keep", args.keep),
                        ("--num-threads", args.num_threads)):
        if value is not None:
            argv += [flag, str(value)]
    return check_argv(argv)


def options(args) -> SlurmOptions:
    """The validated SLURM options of a command line (ValueError naming the first bad one)."""
    return SlurmOptions(partition=args.partition, account=args.account, qos=args.qos, time=args.time,
                        gpus_per_run=args.gpus_per_run, cpus_per_run=args.cpus_per_run, mem=args.mem,
                        array_parallelism=args.array_parallelism, sbatch_args=tuple(args.sbatch_arg or ()),
                        requeue=args.requeue, signal_s=args.signal).validate()


def _shape(kind: str, opts: SlurmOptions) -> dict:
    """GPUs and torchrun processes of a task: a kind made by one process (MaC-Cal's stage 2;
    ``Producer.single_process``) gets one GPU."""
    gpus = min(opts.gpus_per_run, 1) if PRODUCERS[kind].single_process else opts.gpus_per_run
    return {"gpus": gpus, "torchrun": gpus if gpus > 1 else 0}


def _active_task(state: tuple[str, str]) -> str | None:
    """The ``JOB_TASK`` holding a queued or running key."""
    if state[0] in ("queued", "running"):
        return state[1].split()[1]
    return None


def _built_on_ce(kind: str) -> Callable[[str], bool]:
    """Whether a method is of ``kind`` and built on another run (CE's)."""
    return lambda m: bool(METHODS[m].needs) and METHODS[m].kind == kind


def bench_arrays(out, preset, seeds: list[int], methods: list[str], opts: SlurmOptions, prefix: str = "",
                 command: str = "bench", after: Sequence[tuple[str, str]] = (), key_of=None, table: str = "runs"):
    """The arrays of one bench (or, with ``key_of``/``table``, of a tuning's candidates)."""
    key_of = key_of or (lambda method, seed, values=None: run_key(preset.name, method, seed))
    states = key_states(out, [key_of(m, s) for s in seeds for m in methods], table)
    pending = lambda k: states[k][0] not in _SKIP  # noqa: E731
    ce = {i: key_of(REFERENCE, s) for i, s in enumerate(seeds) if REFERENCE in methods
          and pending(key_of(REFERENCE, s))}
    arrays = []
    if ce:
        arrays.append(Array(f"{prefix}ce", command, ce, after=list(after), **_shape("train", opts)))
    one_stage = [(s, m) for s in seeds for m in methods if m != REFERENCE and not METHODS[m].needs]
    tasks = {i: key_of(m, s) for i, (s, m) in enumerate(one_stage) if pending(key_of(m, s))}
    if tasks:
        arrays.append(Array(f"{prefix}train", command, tasks, after=list(after), **_shape("train", opts)))
    for m in methods:
        if not METHODS[m].needs:  # built on the CE run of its seed: an array of its own, after CE's
            continue
        tasks = {i: key_of(m, s) for i, s in enumerate(seeds) if pending(key_of(m, s))}
        if not tasks:
            continue
        deps = [("aftercorr", f"{prefix}ce")] if ce else []
        jobs = [t for i in tasks if (t := _active_task(states[key_of(REFERENCE, seeds[i])]))]
        arrays.append(Array(f"{prefix}{m}", command, tasks, after=deps + list(after), after_jobs=jobs,
                            **_shape(METHODS[m].kind, opts)))
    return arrays, states


def tune_arrays(out, tuner, opts: SlurmOptions):
    """The candidate arrays of ``tuner`` and its selection job (when some selection is missing)."""
    items = tuner.items()
    keys = [tuner.key(m, v) for m, v in items]
    states = key_states(out, keys, "tuning")
    arrays = []
    ce_key = tuner.key(REFERENCE, {})
    # CE, the one-stage methods, then one array per kind of the methods built on CE's run
    groups: list[tuple[str, str, Callable[[str], bool]]] = [("tune-ce", "train", lambda m: m == REFERENCE),
              ("tune-train", "train", lambda m: m != REFERENCE and not METHODS[m].needs)]
    groups += [(f"tune-{kind}", kind, _built_on_ce(kind)) for kind in PRODUCERS if kind != "train"]
    for stage, kind, member in groups:
        tasks = {i: k for i, ((m, _), k) in enumerate(zip(items, keys)) if member(m) and states[k][0] not in _SKIP}
        if not tasks:
            continue
        after, jobs = [], []
        if stage not in ("tune-ce", "tune-train"):  # built on CE: after its candidate
            after = [("afterok", "tune-ce")]
            jobs = [t for t in [_active_task(states[ce_key])] if t]
        arrays.append(Array(stage, "tune", tasks, after=after, after_jobs=jobs, **_shape(kind, opts)))
    selected = tuner.selection()
    if arrays or any(m not in selected for m in tuner.methods):
        jobs = [t for k in keys if (t := _active_task(states[k]))]
        arrays.append(Array("tune-select", "tune", {}, after=[("afterok", a.stage) for a in arrays],
                            after_jobs=jobs, single=True))
    return arrays, states


def submit_tune(args, preset, bench_after: bool = False, dry_run: bool = False) -> dict:
    """``calibkit tune --executor slurm`` (with ``bench_after``: ``bench --tune``'s tuning part)."""
    tuner = Tuner(preset, args.out, methods=args.methods, seed=getattr(args, "seed", None), data_dir=args.data_dir,
                  device="cpu", num_threads=args.num_threads, csm_store=args.csm_store, log=lambda *a, **k: None,
                  store=ResultFiles(args.out))
    try:
        opts = options(args)
        argv = {command: task_argv(args, command) for command in ("bench", "tune", "select")}
        arrays, states = tune_arrays(args.out, tuner, opts)
        if bench_after:
            seeds = list(args.seeds if args.seeds is not None else preset.seeds)
            methods, _ = grid_methods(preset, args.methods)
            sel = [("afterok", "tune-select")] if any(a.stage == "tune-select" for a in arrays) else []
            more, bench_states = bench_arrays(args.out, preset, seeds, methods, opts, after=sel)
            arrays += more
            states = {**states, **bench_states}
        cancel_stuck(states, dry_run=dry_run)
        return submit(args.out, arrays, argv, opts, dry_run=dry_run) if arrays else {}
    finally:
        tuner.close()


def submit_bench(args, preset, dry_run: bool = False) -> dict:
    """``calibkit bench --executor slurm``: submit the grid's missing runs; ``{stage: job id}``."""
    if getattr(args, "tune", False):
        return submit_tune(args, preset, bench_after=True, dry_run=dry_run)

    seeds = list(args.seeds if args.seeds is not None else preset.seeds)
    methods, _ = grid_methods(preset, args.methods)
    opts = options(args)
    argv = {"bench": task_argv(args, "bench")}
    arrays, states = bench_arrays(args.out, preset, seeds, methods, opts)
    cancel_stuck(states, dry_run=dry_run)
    return submit(args.out, arrays, argv, opts, dry_run=dry_run) if arrays else {}


def status_lines(args, preset) -> tuple[list[str], dict]:
    """One line per run key of the bench (and its tuning candidates with ``--tune``), and counts:
    from the result files, ``squeue`` and the bench's database (``OUT/runs.db`` or ``--store``).

    Raises:
        FileNotFoundError, NotADirectoryError, ValueError: ``--out`` is not a bench's folder.
    """
    store = getattr(args, "store", None)
    check_bench_folder(args.out, store)
    seeds = list(args.seeds if args.seeds is not None else preset.seeds)
    methods, _ = grid_methods(preset, args.methods)
    keys = [run_key(preset.name, m, s) for s in seeds for m in methods]
    states = key_states(args.out, keys, recorded=read_recorded(args.out, keys, store=store))
    if getattr(args, "tune", False):
        tuner = Tuner(preset, args.out, methods=args.methods, seed=getattr(args, "seed", None), data_dir=args.data_dir,
                      device="cpu",
                      log=lambda *a, **k: None, store=ResultFiles(args.out))
        cands = [tuner.key(m, v) for m, v in tuner.items()]
        states = {**key_states(args.out, cands, "tuning", read_recorded(args.out, cands, "tuning", store)), **states}
        tuner.close()
    width = max(map(len, states), default=0)
    lines = [f"{k:<{width}}  {s:<13}  {d}".rstrip() for k, (s, d) in states.items()]
    counts: dict[str, int] = {}
    for s, _ in states.values():
        counts[s] = counts.get(s, 0) + 1
    return lines, counts
