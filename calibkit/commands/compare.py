"""``calibkit compare DIR A B``: the paired bootstrap difference of two methods of a bench."""

from __future__ import annotations

import warnings
from pathlib import Path

from calibkit.bootstrap import MIN_RESAMPLES
from calibkit.errors import UserError
from calibkit.report.calibrated import CalibratedProbs, calibrator_names
from calibkit.report.data import label, row_problem, summarize, usable_rows
from calibkit.report.paired import compare_methods, compare_text
from calibkit.report.preset import recorded_preset
from calibkit.report.tuning import load_current_runs


def run(args) -> int:
    _check_names(args)
    out = Path(args.dir)
    if args.store is None and not (out / "runs.db").is_file():
        raise FileNotFoundError(f"{args.dir}/runs.db not found: is {args.dir} a bench output directory?")

    if args.n_boot is not None and args.n_boot < MIN_RESAMPLES:
        raise UserError(f"--n-boot must be >= {MIN_RESAMPLES} (fewer resamples give no interval), got {args.n_boot}")

    preset, rows = load_current_runs(out, args.preset, args.store)

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

    if args.after is not None and args.after not in calibrator_names():
        raise UserError(f"--after: unknown calibrator {args.after!r}; expected one of "
                         f"{', '.join(calibrator_names()[1:])}")
