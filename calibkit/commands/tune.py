"""``calibkit tune``: select each method's hyperparameters on the validation split."""

from __future__ import annotations

import sys

from calibkit.bench.collect import check_bench_folder, collect, collect_line
from calibkit.bench.preflight import check_out
from calibkit.bench.presetcheck import check_seeds
from calibkit.bench.resultfiles import ResultFiles
from calibkit.bench.slurm_plan import status_lines
from calibkit.bench.tune import Tuner
from calibkit.commands.executing import await_spec, check_executor, executor_from_args, print_failures, run_scheduled
from calibkit.commands.presetargs import spec_from_args
from calibkit.errors import UserError, UserRuntimeError
from calibkit.pipeline import Inline, Submission, TuneOptions, TuneResult, tune_report


def check_shared(args) -> None:
    """The options of :func:`calibkit.commands.parsers.tune.add_shared` that argparse does not check
    (before anything is read)."""
    if args.max_extensions < 0:
        raise UserError(f"--max-extensions must be >= 0 (0: never extend a grid), got {args.max_extensions}")


def run(args) -> int:
    check_executor(args)
    check_shared(args)
    if args.workers > 1 and args.executor != "local":
        raise UserError("--workers shares the candidates between local processes; with --executor slurm use "
                         "--workers 1")
    if args.await_start:  # an extra worker of --workers N
        return _worker(args)

    spec = spec_from_args(args, "tune", lambda: options_from_args(args))
    return _run(args, spec)


def options_from_args(args):
    """The :class:`calibkit.pipeline.TuneOptions` of a parsed ``calibkit tune`` command line."""
    if args.seed is not None:
        check_seeds([args.seed], "--seed")  # named as the flag, before the options name the field
    return TuneOptions(methods=args.methods, seed=args.seed, data_dir=args.data_dir, device=args.device,
                       num_threads=args.num_threads, csm_store=args.csm_store, csm_build=args.csm_build,
                       store=args.store, keep=args.keep, max_extensions=args.max_extensions)


def _worker(args) -> int:
    """An extra worker of ``tune --workers N``: released once its caller's checks pass, it tunes
    from the spec file and prints no table (its caller does)."""
    spec = await_spec(args, "tune")
    if spec is None:
        return 0
    result = Inline().execute(spec.with_options(report=False))  # the checks and the candidates, as in its caller
    return 1 if result.counts.failed else 0


def _run(args, spec) -> int:
    preset = spec.load()
    check_out(spec.out)  # before the database is created: not into a training run's directory
    if args.status and args.collect:
        raise UserError("--status and --collect: give one of them (--status shows each candidate's state and "
                         "changes nothing; --collect imports the result files into runs.db, then prints the tuning)")
    if args.run_key or args.select_only or args.status:
        return _elsewhere(args, spec, preset)
    if args.collect:
        check_bench_folder(spec.out)
        print(collect_line(spec.out, collect(spec.out)))
        return _print_tuning(spec, preset)

    result = executor_from_args(args).execute(spec)
    if isinstance(result, Submission):  # SLURM arrays
        if not result.jobs:
            print(f"tune {preset.name}: nothing to submit (every candidate is done, queued or running)")
        print_no_extension(preset.name, result.jobs, "tune")
        return 0
    assert isinstance(result, TuneResult)
    if not result.main:
        return 1 if result.counts.failed else 0

    for line in result.worker_failures:
        print(line, file=sys.stderr)
    counts = result.counts
    print(f"tune {preset.name}: {counts.done} candidate(s) done here, {counts.skipped} skipped (finished "
          f"earlier or by another worker), {counts.failed} failed; database {result.store}")
    _print_report(result.report)

    sys.stdout.flush()  # the table first, then the lines on stderr
    print_failures("tune", result.failures, result.store)
    return 1 if counts.failed else 0


def _print_report(report) -> None:
    print(report.text)
    if report.figure is not None:
        print(f"validation curves: {report.figure}; every candidate: {report.json}")


def _print_tuning(spec, preset) -> int:
    _print_report(tune_report(spec.out, preset.name, spec.options.store))
    return 0


def print_no_extension(name: str, ids: dict, command: str) -> None:
    """Say, when a selection job was submitted, that it selects within the grids as given."""
    if "tune-select" in ids:
        print(f"{command} {name}: on SLURM the grids are not extended: a selection on a grid edge is kept "
              "(docs/cluster.md, Tuning first)")


def _elsewhere(args, spec, preset) -> int:
    """One scheduled candidate (``--run-key``), the selection job (``--select-only``) and ``--status``;
    see :mod:`calibkit.bench.slurm`."""
    opts = spec.options
    if args.status:
        lines, counts = status_lines(spec.out, preset, opts)
        print("\n".join(lines))
        print(f"tune {preset.name}: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
        return 0

    def one() -> int:
        tuner = Tuner(preset, spec.out, methods=None if opts.methods is None else list(opts.methods), seed=opts.seed,
                      data_dir=opts.data_dir, device=opts.device, num_threads=opts.num_threads,
                      csm_store=opts.csm_store, store=ResultFiles(spec.out))
        try:
            if args.select_only:
                chosen = tuner.select_all() if tuner.dd.is_main else {}
                missing = [m for m in tuner.methods if m not in chosen]
                if missing:
                    raise UserRuntimeError(f"no selection for {', '.join(missing)}: some candidates did not finish "
                                       f"(calibkit tune ... --status)")
                print(f"tune {preset.name}: selected " + "; ".join(f"{m} {v}" for m, v in chosen.items()))
                return 0
            counts = tuner.run_one(args.run_key)
        finally:
            tuner.close()
        return 1 if counts.failed else 0

    return run_scheduled(args, one)
