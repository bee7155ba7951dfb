"""``calibkit compare DIR A B``: the paired bootstrap difference of two methods of a bench."""

from __future__ import annotations

import argparse

from calibkit.commands import bounded as B
from calibkit.errors import UserError

EPILOG = """\
Both methods' saved test predictions are compared seed by seed (the seeds they share), on the same
bootstrap resamples of the test set; every panel metric gets A - B with its 95% basic interval.
--after fits a post-hoc calibrator on each run's validation logits first (both A and B).
A finished run of A or B that cannot be used (its logits file missing, a damaged field) is named in
a warning and left out, as `calibkit report` does; when none of a method's runs is left, the error
names them.

examples:
  calibkit compare runs/default ls ce
  calibkit compare runs/default mbls ce --after temperature
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "compare", help="paired bootstrap difference of two methods of a bench (optionally after a calibrator)",
        description="Print the paired bootstrap difference A - B of every panel metric of two methods of the "
        "bench in DIR, over the seeds they share, optionally after a post-hoc calibrator.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dir", metavar="DIR", help="a bench output directory (holding runs.db)")
    p.add_argument("a", metavar="A", help="a method of the bench (e.g. ls)")
    p.add_argument("b", metavar="B", help="the method it is compared with (e.g. ce)")
    p.add_argument("--after", metavar="CALIBRATOR",
                   help="fit this calibrator of calibkit.calibrators.CALIBRATORS on each run's validation logits "
                   "first (e.g. temperature)")
    p.add_argument("--preset", help="which preset's runs (default: the most recent in the database)")
    p.add_argument("--n-boot", type=B.N_BOOT, metavar="N", help="bootstrap resamples (default: the preset's)")
    p.add_argument("--store", metavar="URL", help="the bench's postgresql:// results database, or env:NAME to "
                   "read it from that environment variable (default: DIR/runs.db)")
    from calibkit.commands import add_num_threads

    add_num_threads(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    _check_names(args)
    out = Path(args.dir)
    if args.store is None and not (out / "runs.db").is_file():
        raise FileNotFoundError(f"{args.dir}/runs.db not found: is {args.dir} a bench output directory?")
    from calibkit.bootstrap import MIN_RESAMPLES

    if args.n_boot is not None and args.n_boot < MIN_RESAMPLES:
        raise UserError(f"--n-boot must be >= {MIN_RESAMPLES} (fewer resamples give no interval), got {args.n_boot}")
    from calibkit.report.calibrated import CalibratedProbs
    from calibkit.report.data import label, summarize, usable_rows
    from calibkit.report.paired import compare_methods, compare_text
    from calibkit.report.tuning import load_current_runs

    preset, rows = load_current_runs(out, args.preset, args.store)
    from calibkit.report.preset import recorded_preset

    recorded = recorded_preset(out, preset)  # the directory's own preset file, else a shipped one
    n_boot = args.n_boot or (recorded.n_boot if recorded is not None else 1000)
    _left_out(rows, (args.a, args.b))
    rows, _ = usable_rows(rows)  # rows the report leaves out (undecodable fields) are left out here too
    summary = summarize([r for r in rows if r["status"] == "done"])
    res = compare_methods(summary, args.a, args.b, CalibratedProbs(out / "cache" / "calibrated"), args.after,
                          n_boot=n_boot)
    print(compare_text(res, label, n_boot))
    return 0


def _left_out(rows, methods) -> None:
    """Name the finished runs of ``methods`` that cannot be used (a missing logits file, a damaged
    field: :func:`calibkit.report.data.row_problem`): refused when none of a method's runs is left,
    else one warning per run, as ``calibkit report`` does; without this a method whose logits
    files are gone read as a method that never ran."""
    import warnings

    from calibkit.report.data import row_problem

    lines: dict = {}
    usable: set = set()
    for row in rows:
        if row.get("status") != "done" or row.get("method") not in methods:
            continue
        problem = row_problem(row)
        if problem:
            lines.setdefault(row["method"], []).append(f"{row.get('run_key')}: {problem}")
        else:
            usable.add(row["method"])
    for method in methods:
        if method in lines and method not in usable:
            raise UserError(f"no usable finished runs of method {method!r}: {'; '.join(lines[method])}")
    for method in methods:
        for line in lines.get(method, []):
            warnings.warn(f"{line}; left out of the comparison", stacklevel=2)


def _check_names(args) -> None:
    """Two different methods, and a calibrator that exists, before anything is read."""
    if args.a == args.b:
        raise UserError(f"A and B are both {args.a!r}: a method compared with itself differs by 0 everywhere; "
                         "name two different methods (e.g. ls ce)")
    from calibkit.report.calibrated import calibrator_names

    if args.after is not None and args.after not in calibrator_names():
        raise UserError(f"--after: unknown calibrator {args.after!r}; expected one of "
                         f"{', '.join(calibrator_names()[1:])}")
