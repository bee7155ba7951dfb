"""Which arrays a ``--executor slurm`` submission holds (each task runs the calibkit arguments it
is given: ``bench``/``tune --out OUT --spec FILE``, reading the spec file the command wrote).

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
from calibkit.bench.producers import PRODUCERS
from calibkit.bench.resultfiles import ResultFiles
from calibkit.bench.slurm import Array, SlurmOptions, cancel_stuck, key_states, submit
from calibkit.bench.tune import Tuner
from calibkit.store import run_key

_SKIP = ("done", "queued", "running")


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


def _seeds(preset, options) -> list[int]:
    """The bench's seeds: the options' (a bench's), else the preset's; none for a tuning's options."""
    if not hasattr(options, "seeds"):
        return []
    return list(options.seeds if options.seeds is not None else preset.seeds)


def _tuner(out, preset, options) -> Tuner:
    """A tuner reading the candidates' result files (plans and states only: it trains nothing)."""
    return Tuner(preset, out, methods=_list(options.methods), seed=getattr(options, "seed", None),
                 data_dir=options.data_dir, device="cpu", num_threads=options.num_threads,
                 csm_store=options.csm_store, log=lambda *a, **k: None, store=ResultFiles(out))


def _list(values):
    return None if values is None else list(values)


def submit_tune(out, preset, options, slurm: SlurmOptions, argv: dict[str, list[str]], bench_after: bool = False,
                dry_run: bool = False) -> dict:
    """``calibkit tune --executor slurm`` (with ``bench_after``: ``bench --tune``'s tuning part).

    ``options``: the spec's options (:class:`calibkit.pipeline.TuneOptions`, or the
    :class:`~calibkit.pipeline.BenchOptions` of ``bench --tune``); ``argv``: each task's calibkit
    arguments (``"bench"``, ``"tune"``, ``"select"``; :meth:`calibkit.pipeline.spec.BenchSpec.argv`).
    """
    tuner = _tuner(out, preset, options)
    try:
        arrays, states = tune_arrays(out, tuner, slurm)
        if bench_after:
            methods, _ = grid_methods(preset, _list(options.methods))
            sel = [("afterok", "tune-select")] if any(a.stage == "tune-select" for a in arrays) else []
            more, bench_states = bench_arrays(out, preset, _seeds(preset, options), methods, slurm, after=sel)
            arrays += more
            states = {**states, **bench_states}
        cancel_stuck(states, dry_run=dry_run)
        return submit(out, arrays, argv, slurm, dry_run=dry_run) if arrays else {}
    finally:
        tuner.close()


def submit_bench(out, preset, options, slurm: SlurmOptions, argv: dict[str, list[str]], dry_run: bool = False
                 ) -> dict:
    """``calibkit bench --executor slurm``: submit the grid's missing runs; ``{stage: job id}``
    (``options``, ``argv``: as for :func:`submit_tune`)."""
    if options.tune:
        return submit_tune(out, preset, options, slurm, argv, bench_after=True, dry_run=dry_run)
    methods, _ = grid_methods(preset, _list(options.methods))
    arrays, states = bench_arrays(out, preset, _seeds(preset, options), methods, slurm)
    cancel_stuck(states, dry_run=dry_run)
    return submit(out, arrays, argv, slurm, dry_run=dry_run) if arrays else {}


def status_lines(out, preset, options) -> tuple[list[str], dict]:
    """One line per run key of the bench (and its tuning candidates with ``tune``; a tuning's
    options: the candidates only), and counts: from the result files, ``squeue`` and the bench's
    database (``OUT/runs.db`` or the options' store).

    Raises:
        FileNotFoundError, NotADirectoryError, ValueError: ``out`` is not a bench's folder.
    """
    store = options.store
    check_bench_folder(out, store)
    methods, _ = grid_methods(preset, _list(options.methods))
    keys = [run_key(preset.name, m, s) for s in _seeds(preset, options) for m in methods]
    states = key_states(out, keys, recorded=read_recorded(out, keys, store=store))
    if getattr(options, "tune", True):
        tuner = _tuner(out, preset, options)
        cands = [tuner.key(m, v) for m, v in tuner.items()]
        states = {**key_states(out, cands, "tuning", read_recorded(out, cands, "tuning", store)), **states}
        tuner.close()
    width = max(map(len, states), default=0)
    lines = [f"{k:<{width}}  {s:<13}  {d}".rstrip() for k, (s, d) in states.items()]
    counts: dict[str, int] = {}
    for s, _ in states.values():
        counts[s] = counts.get(s, 0) + 1
    return lines, counts
