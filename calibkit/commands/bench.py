"""``calibkit bench``: train and evaluate a grid of methods x seeds, record it, report it."""

from __future__ import annotations

import argparse
import sys
import textwrap

from calibkit.commands import bounded as B
from calibkit.errors import UserError

EPILOG = """\
examples:
  calibkit bench --preset smoke --out runs/smoke            # every method in ~30 s: checks the set-up
  calibkit bench --preset default --out runs/default        # the main job, one process
  calibkit bench --preset default --out runs/default --workers 2   # two processes share the runs (make bench)
  calibkit bench --preset default --out runs/default --methods ls mbls --seeds 0
  calibkit bench --preset default --out runs/tuned --tune   # select on validation first (calibkit tune)
  calibkit bench --preset default --out runs/last --keep last
  calibkit bench --preset mine.toml --out runs/mine --csm-build     # CSM on data without a shipped set
  torchrun --nproc_per_node 4 -m calibkit bench --preset cifar10 --data-dir ~/data --out runs/c10
  calibkit bench --preset cifar10 --data-dir /shared/data --out /shared/c10 --executor slurm \
      --gpus-per-run 4 --time 24:00:00 --requeue --signal 600     # job arrays (docs/cluster.md)
  calibkit bench --preset cifar10 --out /shared/c10 --status      # then --collect for the table

Times are wall times on a 2-core CPU (smoke: 15 runs of ~1-2 s plus the report; default: 30 runs
of 27-60 s). Everything a preset needs (data, extra packages, CSM set) is checked before anything
is written. Running the same command again skips finished runs and resumes interrupted ones; a
second process running the same command shares the work (each process trains different runs).
The report is written to OUT/report/ (index.html, report.md, figures/); rebuild it with
`calibkit report OUT`.
"""


def register(subparsers) -> None:
    from calibkit.bench.grid import METHODS, PRESETS

    p = subparsers.add_parser(
        "bench", help="compare every calibration method side by side (results database + report)",
        description="Train and evaluate a grid of methods x seeds; record every run in OUT/runs.db and\n"
        "write a report to OUT/report/.\n\npresets:\n" + "\n".join(
            textwrap.fill(v.note, 100, initial_indent=f"  {k:<13} ", subsequent_indent=" " * 16)
            for k, v in PRESETS.items()),
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from calibkit.commands.presetargs import add_preset_options

    add_preset_options(p, PRESETS)
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (runs.db, runs/, report/)")
    p.add_argument("--seeds", type=B.SEED, nargs="+", metavar="S", help="seeds (default: the preset's)")
    p.add_argument("--methods", nargs="+", metavar="M",
                   help=f"methods to run (default: the preset's list, else all): {', '.join(METHODS)}; CE is "
                        "always included; text presets skip mixup, regmixup and csm")
    p.add_argument("--data-dir", metavar="DIR", help="folder with the data set's files")
    p.add_argument("--csm-store", metavar="DIR", help="CSM generated set, an existing folder even without csm "
                   "in --methods (default: the one shipped for "
                   "Fashion-MNIST; other data sets: make one with `calibkit csm generate`)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    p.add_argument("--tune", action="store_true",
                   help="first select every method's hyperparameters on validation (calibkit tune, into the same "
                   "DIR), then run the grid at the selected values")
    from calibkit.commands import add_executor, add_num_threads
    from calibkit.commands.tune import add_shared

    add_shared(p)
    add_num_threads(p)
    add_executor(p)
    p.add_argument("--workers", type=B.count(256), default=1, metavar="N",
                   help="processes on this machine sharing the runs (default 1; one per core is usually fastest)")
    p.add_argument("--no-report", action="store_true", help="record the runs only; no table or report")
    p.add_argument("--quiet", action="store_true",
                   help="no progress: neither a line per run nor the report's phases (the tables are still printed)")
    # an extra worker of --workers: start up, then wait for the caller's go (calibkit.bench.workers)
    p.add_argument("--await-start", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args) -> int:
    from calibkit.commands import check_executor
    from calibkit.commands.tune import check_shared

    check_executor(args)
    check_shared(args)
    if args.await_start:  # an extra worker of --workers N
        return _worker(args)
    from calibkit.commands.presetargs import spec_from_args

    spec = spec_from_args(args, "bench", lambda: options_from_args(args))
    if args.run_key or args.status or args.collect or args.executor != "local":
        return _elsewhere(args, spec)
    from calibkit.bench.workers import run_with_workers
    from calibkit.commands import worker_argv

    return run_with_workers(args.workers, lambda waiting: _run(args, spec, waiting), worker_argv(spec),
                            spec.options.store)


def options_from_args(args):
    """The :class:`calibkit.pipeline.BenchOptions` of a parsed ``calibkit bench`` command line."""
    from calibkit.bench.presetcheck import check_seeds
    from calibkit.pipeline import BenchOptions

    if args.seeds is not None:
        check_seeds(args.seeds, "--seeds")  # named as the flag, before the options name the field
    return BenchOptions(seeds=args.seeds, methods=args.methods, data_dir=args.data_dir, device=args.device,
                        num_threads=args.num_threads, csm_store=args.csm_store, csm_build=args.csm_build,
                        store=args.store, keep=args.keep, tune=args.tune, max_extensions=args.max_extensions,
                        report=False,  # written below, once the summary is out
                        **({"log": lambda *a, **k: None} if getattr(args, "quiet", False) else {}))


def _worker(args) -> int:
    """An extra worker of ``--workers N``: released once its caller's checks pass, it runs the
    bench of the spec file, records no preset and writes no report (its caller does)."""
    from calibkit.commands import await_spec
    from calibkit.pipeline import Sharing, run_spec

    spec = await_spec(args, "bench")
    if spec is None:
        return 0
    result = run_spec(spec, sharing=Sharing(released=True))
    if not result.main:
        return 0
    counts = result.counts
    print(f"bench {result.preset.name}: {counts.done} run(s) done, {counts.skipped} skipped (finished "
          f"earlier), {counts.failed} failed; database {result.store}")
    from calibkit.commands import print_failures

    sys.stdout.flush()
    print_failures("bench", result.failures, result.store)
    return 1 if counts.failed else 0


def _run(args, spec, waiting: list) -> int:
    from calibkit.commands import worker_sharing
    from calibkit.pipeline import run_spec, write_report

    preset = spec.load()
    result = run_spec(spec, sharing=worker_sharing(args, spec, waiting, f"bench {preset.name}", "runs"))
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
    from calibkit.commands import print_failures

    sys.stdout.flush()  # the summary first, then the lines on stderr
    print_failures("bench", result.failures, result.store)
    if not args.no_report:
        from calibkit.bench.progress import Phases

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
        from calibkit.commands import run_scheduled

        return run_scheduled(args, lambda: _run_key(args.run_key, spec, preset))
    if args.status and args.collect:
        raise UserError("--status and --collect: give one of them (--status shows each run's state and changes "
                         "nothing; --collect imports the result files into runs.db, then reports)")
    if args.status:
        from calibkit.bench.slurm_plan import status_lines

        lines, counts = status_lines(spec.out, preset, spec.options)
        print("\n".join(lines))
        print(f"bench {preset.name}: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
        return 0
    if args.collect:
        return _collect(args, spec, preset)
    from calibkit.bench.preflight import check_bench
    from calibkit.bench.slurm_plan import submit_bench
    from calibkit.commands import slurm_options, submission_argv

    opts = spec.options
    check_bench(preset, spec.out, seeds=_seq(opts.seeds), methods=_seq(opts.methods), data_dir=opts.data_dir,
                csm_store=opts.csm_store)
    argv = submission_argv(spec, ("bench", "tune", "select") if opts.tune else ("bench",))
    ids = submit_bench(spec.out, preset, opts, slurm_options(args), argv, dry_run=args.dry_run)
    if not ids:
        print(f"bench {preset.name}: nothing to submit (every run is done, queued or running; see --status)")
    elif not args.dry_run:
        print(f"bench {preset.name}: submitted; follow it with --status, then --collect for the table")
    from calibkit.commands.tune import print_no_extension

    print_no_extension(preset.name, ids, "bench")
    return 0


def _seq(values) -> list | None:
    return None if values is None else list(values)


def _run_key(key: str, spec, preset) -> int:
    """Run the one run ``key`` of ``spec`` and write its result file (a scheduler's task)."""
    from calibkit import distributed as D
    from calibkit.bench.runner import Bench
    from calibkit.store.files import ResultFiles, split_run_key

    name, method, seed = split_run_key(key)
    if name != preset.name:
        raise UserError(f"--run-key {key} is not a run of preset {preset.name}")
    opts = spec.options
    group = D.setup(opts.device)  # one process group for the tuner's and the bench's views
    try:
        if opts.tune:
            from calibkit.bench.tune import Tuner

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
    from calibkit.bench.collect import LIVE, check_bench_folder, collect, collect_line, read_recorded, unfinished
    from calibkit.bench.grid import grid_methods
    from calibkit.store import run_key

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
        from calibkit.report import build_report

        rep = build_report(out, preset=preset.name)
        print()
        print(rep["text"])
        print(f"\nreport: {rep['paths']['html']} and {rep['paths']['md']}")
    return 1 if missing else 0
