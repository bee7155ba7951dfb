"""``calibkit report``: rebuild a bench's tables and report from its results database."""

from __future__ import annotations

from calibkit.commands import bounded as B
from calibkit.errors import UserError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="rebuild the bench report (tables, report.md, index.html) from DIR/runs.db",
        description="Print the bench tables and write DIR/report/ (report.md, a self-contained "
        "index.html, figures/) from DIR/runs.db and the logits files its rows point to. Result files "
        "of runs executed elsewhere (--executor slurm) are imported into DIR/runs.db first.",
    )
    p.add_argument("dir", metavar="DIR", help="a bench output directory (holding runs.db)")
    p.add_argument("--preset", metavar="NAME|FILE", help="which preset's runs: a preset name or a preset file (its "
                   "name is used) (default: the most recent in the database)")
    p.add_argument("--n-boot", type=B.N_BOOT, metavar="N", help="bootstrap resamples (default: the preset's)")
    p.add_argument("--store", metavar="URL", help="the bench's postgresql:// results database, or env:NAME to "
                   "read it from that environment variable (default: DIR/runs.db)")
    p.add_argument("--alpha", type=B.ALPHA, default=0.1,
                   help="miscoverage of the conformal prediction sets, in (0, 1) (default 0.1: 90%% coverage)")
    p.add_argument("--quiet", action="store_true", help="no progress (the phases of the build and their times)")
    p.add_argument("--jobs", type=B.count(1024), metavar="N", help="processes fitting the runs' calibrators, each with "
                   "--num-threads torch threads (default: one per core when there are enough fits; 1: this process "
                   "only); the report is the same")
    from calibkit.commands import add_num_threads

    add_num_threads(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import sys
    from pathlib import Path

    from calibkit.bench.collect import collect
    from calibkit.report import build_report

    if args.store is None and Path(args.dir).is_dir():  # a scheduler's runs left result files: import them
        counts = collect(args.dir)
        if counts["imported"] or counts["selections"]:
            print(f"collect {args.dir}: {counts['imported']} new result(s) imported into {args.dir}/runs.db")
    if args.store is None and not (Path(args.dir) / "runs.db").is_file():
        raise FileNotFoundError(f"{args.dir}/runs.db not found: is {args.dir} a bench output directory?")
    from calibkit.bootstrap import MIN_RESAMPLES

    if args.n_boot is not None and args.n_boot < MIN_RESAMPLES:
        raise UserError(f"--n-boot must be >= {MIN_RESAMPLES} (fewer resamples give no interval), got {args.n_boot}")
    if not 0 < args.alpha < 1:  # also refuses NaN
        raise UserError(f"--alpha must be a number in (0, 1) (the allowed miscoverage of the sets), got {args.alpha}")
    name = args.preset
    if name is not None and (name.endswith(".toml") or Path(name).is_file()):
        from calibkit.bench.presetfile import read_preset_file

        name = read_preset_file(name).name
    from calibkit.bench.progress import Phases

    phases = Phases("report", quiet=args.quiet)
    rep = build_report(args.dir, preset=name, n_boot=args.n_boot, store=args.store, alpha=args.alpha,
                       progress=phases, num_threads=args.num_threads or 1, jobs=args.jobs)
    if not args.quiet and phases.summary():
        print(phases.summary(), file=sys.stderr, flush=True)
    print(rep["text"])
    print(f"\nreport: {rep['paths']['html']} and {rep['paths']['md']}")
    return 0
