"""``calibkit tune``: select each method's hyperparameters on the validation split."""

from __future__ import annotations

import argparse

from calibkit.commands import bounded as B
from calibkit.errors import UserError, UserRuntimeError

EPILOG = """\
examples:
  calibkit tune --preset default --out runs/tune-default            # every method with a search space
  calibkit tune --preset default --out runs/tune-default --methods mbls fedlas_mbls
  calibkit tune --preset default --out runs/tune-default --workers 2   # two processes share the candidates
  calibkit bench --preset default --out runs/tuned --tune           # select, then bench at the selection
  torchrun --nproc_per_node 4 -m calibkit tune --preset cifar10 --data-dir ~/data --out runs/tune-c10
  calibkit tune --preset cifar10 --data-dir /shared/data --out /shared/tune-c10 --executor slurm --gpus-per-run 4

Every candidate is trained on the preset's selection seed and scored on the validation split only
(ECE of the deployed predictor before temperature scaling; candidates more than 1 accuracy point
below the method's best are excluded). A selection on the edge of its grid extends that axis (at
most twice, never past its bound) and tuning goes on. Everything is checked before anything is
written. Running the same command again never retrains a finished candidate; two processes on one
DIR share the candidates. Search spaces and the extension rule: docs/bench.md.
"""


def add_shared(p) -> None:
    """Options shared by ``tune`` and ``bench``."""
    from calibkit.bench.grid import KEEP_POLICIES

    p.add_argument("--csm-build", action="store_true",
                   help="with csm in the methods and no generated set: build one in DIR first (train the generator "
                   "on the training images outside every seed's validation split, then generate; resumable)")
    p.add_argument("--max-extensions", type=B.integer(0, 100), default=2, metavar="K",
                   help="times each grid axis may be extended when a selection lands on its edge (default 2; 0: "
                   "never)")
    p.add_argument("--keep", choices=KEEP_POLICIES,
                   help="checkpoint policy of every run (default: the preset's); one policy per output directory")
    p.add_argument("--store", metavar="URL",
                   help="results database: a postgresql:// URL shared by benches on several hosts (needs "
                   "calibkit[postgres]; one database per output directory; docs/store.md), or env:NAME to read "
                   "it from that environment variable (no password on the command line); default DIR/runs.db")


def check_shared(args) -> None:
    """The options of :func:`add_shared` that argparse does not check (before anything is read)."""
    if args.max_extensions < 0:
        raise UserError(f"--max-extensions must be >= 0 (0: never extend a grid), got {args.max_extensions}")


def register(subparsers) -> None:
    from calibkit.bench.grid import METHODS, PRESETS
    from calibkit.commands import add_num_threads

    p = subparsers.add_parser(
        "tune", help="select each method's hyperparameters on the validation split (never the test split)",
        description="Train every candidate of each method's search space on the preset's selection seed, "
        "score it on the validation split and record all of them, and the selection, in the tuning table "
        "of DIR/runs.db.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from calibkit.commands.presetargs import add_preset_options

    add_preset_options(p, PRESETS)
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (runs.db, tune/, runs/)")
    p.add_argument("--methods", nargs="+", metavar="M",
                   help="methods to tune (default: all with a search space): "
                   f"{', '.join(m for m, s in METHODS.items() if s.space)}")
    p.add_argument("--seed", type=B.SEED, metavar="S", help="selection seed (default: the preset's tune_seed)")
    p.add_argument("--data-dir", metavar="DIR", help="folder with the data set's files")
    p.add_argument("--csm-store", metavar="DIR", help="CSM generated set (default: the one shipped)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    add_shared(p)
    add_num_threads(p)
    p.add_argument("--workers", type=B.count(256), default=1, metavar="N",
                   help="processes on this machine sharing the candidates (default 1; one per core is usually fastest)")
    # an extra worker of --workers: start up, then wait for the caller's go (calibkit.bench.workers)
    p.add_argument("--await-start", action="store_true", help=argparse.SUPPRESS)
    from calibkit.commands import add_executor

    add_executor(p)
    # the selection job of --executor slurm: select from the candidates' result files
    p.add_argument("--select-only", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args) -> int:
    from calibkit.commands import check_executor

    check_executor(args)
    check_shared(args)
    if args.workers > 1 and args.executor != "local":
        raise UserError("--workers shares the candidates between local processes; with --executor slurm use "
                         "--workers 1")
    if args.await_start:  # an extra worker of --workers N
        return _worker(args)
    from calibkit.bench.workers import run_with_workers
    from calibkit.commands import worker_argv
    from calibkit.commands.presetargs import spec_from_args

    spec = spec_from_args(args, "tune", lambda: options_from_args(args))
    return run_with_workers(args.workers, lambda waiting: _run(args, spec, waiting), worker_argv(spec),
                            spec.options.store)


def options_from_args(args):
    """The :class:`calibkit.pipeline.TuneOptions` of a parsed ``calibkit tune`` command line."""
    from calibkit.bench.presetcheck import check_seeds
    from calibkit.pipeline import TuneOptions

    if args.seed is not None:
        check_seeds([args.seed], "--seed")  # named as the flag, before the options name the field
    return TuneOptions(methods=args.methods, seed=args.seed, data_dir=args.data_dir, device=args.device,
                       num_threads=args.num_threads, csm_store=args.csm_store, csm_build=args.csm_build,
                       store=args.store, keep=args.keep, max_extensions=args.max_extensions)


def _worker(args) -> int:
    """An extra worker of ``tune --workers N``: released once its caller's checks pass, it tunes
    from the spec file and prints no table (its caller does)."""
    from calibkit.commands import await_spec
    from calibkit.pipeline import Sharing, run_spec

    spec = await_spec(args, "tune")
    if spec is None:
        return 0
    result = run_spec(spec.with_options(report=False), sharing=Sharing(released=True))
    return 1 if result.counts.failed else 0


def _run(args, spec, waiting: list) -> int:
    from calibkit.bench.preflight import check_out

    preset = spec.load()
    check_out(spec.out)  # before the database is created: not into a training run's directory
    if args.status and args.collect:
        raise UserError("--status and --collect: give one of them (--status shows each candidate's state and "
                         "changes nothing; --collect imports the result files into runs.db, then prints the tuning)")
    if args.run_key or args.select_only or args.status or args.executor != "local":
        return _elsewhere(args, spec, preset)
    if args.collect:
        from calibkit.bench.collect import check_bench_folder, collect, collect_line

        check_bench_folder(spec.out)
        print(collect_line(spec.out, collect(spec.out)))
        return _print_tuning(spec, preset)
    from calibkit.commands import worker_sharing
    from calibkit.pipeline import run_spec

    sharing = worker_sharing(args, spec, waiting, f"tune {preset.name}", "candidates")
    result = run_spec(spec, sharing=sharing)
    if not result.main:
        return 1 if result.counts.failed else 0
    import sys

    for line in result.worker_failures:
        print(line, file=sys.stderr)
    counts = result.counts
    print(f"tune {preset.name}: {counts.done} candidate(s) done here, {counts.skipped} skipped (finished "
          f"earlier or by another worker), {counts.failed} failed; database {result.store}")
    _print_report(result.report)
    from calibkit.commands import print_failures

    sys.stdout.flush()  # the table first, then the lines on stderr
    print_failures("tune", result.failures, result.store)
    return 1 if counts.failed else 0


def _print_report(report) -> None:
    print(report.text)
    if report.figure is not None:
        print(f"validation curves: {report.figure}; every candidate: {report.json}")


def _print_tuning(spec, preset) -> int:
    from calibkit.pipeline import tune_report

    _print_report(tune_report(spec.out, preset.name, spec.options.store))
    return 0


def print_no_extension(name: str, ids: dict, command: str) -> None:
    """Say, when a selection job was submitted, that it selects within the grids as given."""
    if "tune-select" in ids:
        print(f"{command} {name}: on SLURM the grids are not extended: a selection on a grid edge is kept "
              "(docs/cluster.md, Tuning first)")


def _elsewhere(args, spec, preset) -> int:
    """One scheduled candidate (``--run-key``), the selection job (``--select-only``), ``--status``
    and submitting (``--executor slurm``); see :mod:`calibkit.bench.slurm`."""
    opts = spec.options
    if args.status:
        from calibkit.bench.slurm_plan import status_lines

        lines, counts = status_lines(spec.out, preset, opts)
        print("\n".join(lines))
        print(f"tune {preset.name}: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
        return 0
    if args.executor == "slurm" and not (args.run_key or args.select_only):
        from calibkit.bench.slurm_plan import submit_tune
        from calibkit.commands import slurm_options, submission_argv

        ids = submit_tune(spec.out, preset, opts, slurm_options(args), submission_argv(spec, ("tune", "select")),
                          dry_run=args.dry_run)
        if not ids:
            print(f"tune {preset.name}: nothing to submit (every candidate is done, queued or running)")
        print_no_extension(preset.name, ids, "tune")
        return 0
    from calibkit.bench.tune import Tuner
    from calibkit.commands import run_scheduled
    from calibkit.store.files import ResultFiles

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
