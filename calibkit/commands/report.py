"""``calibkit report``: rebuild a bench's tables and report from its results database."""

from __future__ import annotations

import sys
from pathlib import Path

import calibkit.report
from calibkit.bench.collect import collect
from calibkit.bench.presetfile import read_preset_file
from calibkit.bench.progress import Phases
from calibkit.bootstrap import MIN_RESAMPLES
from calibkit.errors import UserError


def run(args) -> int:
    if args.store is None and Path(args.dir).is_dir():  # a scheduler's runs left result files: import them
        counts = collect(args.dir)
        if counts["imported"] or counts["selections"]:
            print(f"collect {args.dir}: {counts['imported']} new result(s) imported into {args.dir}/runs.db")
    if args.store is None and not (Path(args.dir) / "runs.db").is_file():
        raise FileNotFoundError(f"{args.dir}/runs.db not found: is {args.dir} a bench output directory?")

    if args.n_boot is not None and args.n_boot < MIN_RESAMPLES:
        raise UserError(f"--n-boot must be >= {MIN_RESAMPLES} (fewer resamples give no interval), got {args.n_boot}")
    if not 0 < args.alpha < 1:  # also refuses NaN
        raise UserError(f"--alpha must be a number in (0, 1) (the allowed miscoverage of the sets), got {args.alpha}")
    name = args.preset
    if name is not None and (name.endswith(".toml") or Path(name).is_file()):
        name = read_preset_file(name).name

    phases = Phases("report", quiet=args.quiet)
    rep = calibkit.report.build_report(args.dir, preset=name, n_boot=args.n_boot, store=args.store, alpha=args.alpha,
                       progress=phases, num_threads=args.num_threads or 1, jobs=args.jobs,
                       all_figures=args.all_figures)
    if not args.quiet and phases.summary():
        print(phases.summary(), file=sys.stderr, flush=True)
    print(rep["text"])
    print(f"\nreport: {rep['paths']['html']} and {rep['paths']['md']}")
    return 0
