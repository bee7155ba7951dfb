"""``calibkit bench``: train and evaluate a grid of methods x seeds, record it, report it."""

from __future__ import annotations

import sys

import calibkit.report
from calibkit import distributed as D
from calibkit.bench.collect import LIVE, check_bench_folder, collect, collect_line, read_recorded, unfinished
from calibkit.bench.grid import grid_methods
from calibkit.bench.presetcheck import check_seeds
from calibkit.bench.progress import Phases
from calibkit.bench.resultfiles import ResultFiles, split_run_key
from calibkit.bench.runner import Bench
from calibkit.bench.slurm_plan import status_lines
from calibkit.bench.tune import Tuner
from calibkit.commands.executing import await_spec, check_executor, executor_from_args, print_failures, run_scheduled
from calibkit.commands.presetargs import spec_from_args
from calibkit.commands.tune import check_shared, print_no_extension
from calibkit.errors import UserError
from calibkit.pipeline import BenchOptions, BenchResult, Inline, Submission, write_report
from calibkit.store import run_key


def run(args) -> int:
    check_executor(args)
    check_shared(args)
    if args.await_start:  # an extra worker of --workers N
        return _worker(args)

    spec = spec_from_args(args, "bench", lambda: options_from_args(args))
    if args.run_key or args.status or args.collect or args.executor != "local":
        return _elsewhere(args, spec)

    return _summary(args, spec, executor_from_args(args).execute(spec))


def options_from_args(args):
    """The :class:`calibkit.pipeline.BenchOptions` of a parsed ``calibkit bench`` command line."""
    if args.seeds is not None:
        check_seeds(args.seeds, "--seeds")  # named as the flag, before the options name the field
    return BenchOptions(seeds=args.seeds, methods=args.methods, data_dir=args.data_dir, device=args.device,
                        num_threads=args.num_threads, csm_store=args.csm_store, csm_build=args.csm_build,
                        store=args.store, keep=args.keep, tune=args.tune, max_extensions=args.max_extensions,
                        report=False, all_figures=args.all_figures,  # written below, once the summary is out
                        **({"log": lambda *a, **k: None} if getattr(args, "quiet", False) else {}))


def _worker(args) -> int:
    """An extra worker of ``--workers N`` (or of :class:`calibkit.pipeline.LocalProcesses`): released
    once its caller's checks pass, it runs the bench of the spec file (writing the same effective
    preset as its caller) and writes no report, whatever the spec's options say: its caller does."""
    spec = await_spec(args, "bench")
    if spec is None:
        return 0
    # the checks, the preset's record and the runs, as in its caller; never the report
    result = Inline().execute(spec.with_options(report=False))
    assert isinstance(result, BenchResult)
    if not result.main:
        return 0
    counts = result.counts
    print(f"bench {result.preset.name}: {counts.done} run(s) done, {counts.skipped} skipped (finished "
          f"earlier), {counts.failed} failed; database {result.store}")

    sys.stdout.flush()
    print_failures("bench", result.failures, result.store)
    return 1 if counts.failed else 0


def _summary(args, spec, result) -> int:
    """Print what the local executor did: the counts, the failures, then the report (written here)."""
    assert isinstance(result, BenchResult)
    if not result.main:
        return 0
    counts = result.counts
    if args.workers > 1:
        for line in result.worker_failures:
            print(line, file=sys.stderr)
        print(f"bench {result.preset.name}: this process ran {counts.done} run(s), {args.workers - 1} other "
              f"worker(s) the rest; {counts.failed} failed; database {result.store}")
    else:
        print(f"bench {result.preset.name}: {counts.done} run(s) done, {counts.skipped} skipped (finished "
              f"earlier), {counts.failed} failed; database {result.store}")

    sys.stdout.flush()  # the summary first, then the lines on stderr
    print_failures("bench", result.failures, result.store)
    if not args.no_report:
        phases = Phases("report", quiet=args.quiet)
        rep = write_report(spec.out, result.preset.name, spec.options, progress=phases)
        if not args.quiet and phases.summary():
            print(phases.summary(), file=sys.stderr, flush=True)
        print()
        print(rep["text"])
        print(f"\nreport: {rep['paths']['html']} and {rep['paths']['md']}")
    return 1 if counts.failed else 0


def _elsewhere(args, spec) -> int:
    """The bench's other entry points: one scheduled task (``--run-key``), ``--status``,
    ``--collect``, and submitting to SLURM (``--executor slurm``)."""
    preset = spec.load()
    if args.workers != 1:
        raise UserError("--workers is for --executor local; on SLURM every run is its own task")
    if args.run_key:
        return run_scheduled(args, lambda: _run_key(args.run_key, spec, preset))
    if args.status and args.collect:
        raise UserError("--status and --collect: give one of them (--status shows each run's state and changes "
                         "nothing; --collect imports the result files into runs.db, then reports)")
    if args.status:
        lines, counts = status_lines(spec.out, preset, spec.options)
        print("\n".join(lines))
        print(f"bench {preset.name}: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
        return 0
    if args.collect:
        return _collect(args, spec, preset)

    done = executor_from_args(args).execute(spec)  # SLURM arrays
    assert isinstance(done, Submission)
    if not done.jobs:
        print(f"bench {preset.name}: nothing to submit (every run is done, queued or running; see --status)")
    elif not done.dry_run:
        print(f"bench {preset.name}: submitted; follow it with --status, then --collect for the table")

    print_no_extension(preset.name, done.jobs, "bench")
    return 0


def _seq(values) -> list | None:
    return None if values is None else list(values)


def _run_key(key: str, spec, preset) -> int:
    """Run the one run ``key`` of ``spec`` and write its result file (a scheduler's task)."""
    name, method, seed = split_run_key(key)
    if name != preset.name:
        raise UserError(f"--run-key {key} is not a run of preset {preset.name}")
    opts = spec.options
    group = D.setup(opts.device)  # one process group for the tuner's and the bench's views
    try:
        if opts.tune:
            tuner = Tuner(preset, spec.out, methods=_seq(opts.methods), data_dir=opts.data_dir, device=opts.device,
                          num_threads=opts.num_threads, csm_store=opts.csm_store, store=ResultFiles(spec.out))
            try:
                preset = tuner.tuned_preset()
            finally:
                tuner.close()
        bench = Bench(preset, spec.out, seeds=[seed], methods=[method], data_dir=opts.data_dir, device=opts.device,
                      num_threads=opts.num_threads, csm_store=opts.csm_store, store=ResultFiles(spec.out))
        try:
            counts = bench.run_one(seed, method)
        finally:
            bench.close()
    finally:
        D.teardown(group)
    return 1 if counts.failed else 0


def _collect(args, spec, preset) -> int:
    """Import the result files, name every run of the grid without a finished result (one line each
    on stderr), then the table and report; exit 1 when a run is missing (no result and no live task:
    submit the same command again), 0 when every run is finished or still queued or running."""
    out, opts = spec.out, spec.options
    check_bench_folder(out)
    counts = collect(out)
    print(collect_line(out, counts))
    seeds = list(opts.seeds if opts.seeds is not None else preset.seeds)
    methods, _ = grid_methods(preset, _seq(opts.methods))
    keys = [run_key(preset.name, m, s) for s in seeds for m in methods]
    left = unfinished(out, keys, read_recorded(out, keys))
    missing = [key for key, state, _ in left if state not in LIVE]
    for key, state, detail in left:
        print(f"collect {out}: {key}: {state}" + (f" ({detail})" if detail else ""), file=sys.stderr)
    if missing:
        print(f"collect {out}: {len(missing)} run(s) missing ({', '.join(missing)}); run the same submission "
              "command again to submit them", file=sys.stderr)
    if not args.no_report and counts["files"]:
        rep = calibkit.report.build_report(out, preset=preset.name, all_figures=opts.all_figures)
        print()
        print(rep["text"])
        print(f"\nreport: {rep['paths']['html']} and {rep['paths']['md']}")
    return 1 if missing else 0
