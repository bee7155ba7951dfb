"""Time of ``calibkit report DIR`` on a smoke bench, cold and warm, phase by phase, and the newcomer's path.

Takes a finished bench directory (default: runs ``calibkit bench --preset smoke --no-report`` into a
temporary folder first, and prints its wall time), copies it without its report and without the
report's caches (``cache/calibrated``, ``cache/selection``, ``cache/sets``, ``cache/crossfit``), and
runs ``calibkit report COPY`` twice in fresh processes:

* **cold**: nothing cached, as the first ``calibkit bench`` builds it;
* **warm**: the same command again on the same copy (a rebuild: every cache in place).

Each build prints its phases on stderr (``report: TOTAL s (phase S s, ...)``, the line ``calibkit
report`` ends with); the script reads that line and prints the phases side by side with the
process's wall and CPU time (start-up and imports included, and the CPU of the processes a build
starts, ``--jobs``; on a shared machine the CPU time is the comparable figure). ``--before DIR``
does the same with the calibkit package found under ``DIR`` (another checkout: ``PYTHONPATH=DIR``)
on its own cold copy, so the two codes are measured in one run of the script on the same logits.
Every build's terminal text (stdout: every table the report prints) must be identical, else the
script exits 1. ``--serial`` adds a cold build of this checkout with ``--jobs 1`` (no processes
started), which separates the parallel fits from the rest.

``--shipped`` removes the recorded preset (``DIR/presets/``) from every copy, so each code reads
its *own* shipped preset of that name: the smoke report as each code ships it (this checkout's
``smoke`` preset fits fewer calibrators, ``report_calibrators``). The texts of two codes then
differ by design; each code's cold and warm texts must still be identical. Without ``--shipped``
both codes build the report the recorded preset describes (a directory recorded by an older
calibkit: every calibrator). Without ``--dir`` and with ``--before``, the smoke bench is trained by
the ``--before`` code, whose recorded preset both codes can read.

``--newcomer`` also times the newcomer's path: ``calibkit bench --preset smoke`` (training and
report, into a fresh folder), ``calibkit calibrate --from F.npz --split 0.5 --save`` on a synthetic
10,000 x 5 file of logits and labels, and ``calibkit apply`` of the saved calibrator to that file.

Usage::

    python benchmarks/report_speed.py [--dir DIR] [--before /path/to/other/checkout] [--serial] [--shipped]
                                      [--newcomer]
    python -m cProfile -o report.prof -m calibkit report DIR   # then pstats, for the top costs
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CACHES = ("calibrated", "selection", "sets", "crossfit")
SUMMARY = re.compile(r"^report: ([\d.]+) s \((.*)\)$")
PHASE = re.compile(r"(.+?) ([\d.]+) s(?:, |$)")


def calibkit(args: list, pythonpath: Path, cwd: Path | None = None) -> tuple[float, subprocess.CompletedProcess]:
    """Run ``python -m calibkit ARGS`` with ``pythonpath``'s calibkit; ``(wall seconds, result)``."""
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "calibkit", *map(str, args)], env=env, cwd=cwd,
                         capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out.cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)  # type: ignore[attr-defined]
    if out.returncode != 0:
        sys.exit(f"calibkit {' '.join(map(str, args))} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return wall, out


def cold_copy(src: Path, dst: Path, shipped: bool = False) -> Path:
    """``src`` without its report and the report's caches (the training caches stay); ``shipped``:
    without its recorded preset too."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("report", *(("presets",) if shipped else ())))
    for name in CACHES:
        shutil.rmtree(dst / "cache" / name, ignore_errors=True)
    return dst


def report(bench: Path, pythonpath: Path, extra: tuple = ()) -> dict:
    """``calibkit report BENCH`` in a fresh process: its wall time, phases and terminal text."""
    wall, out = calibkit(["report", bench, *extra], pythonpath)
    lines = [ln for ln in out.stderr.splitlines() if SUMMARY.match(ln)]
    if not lines:
        sys.exit(f"no phase summary on stderr of calibkit report {bench}:\n{out.stderr[-3000:]}")
    m = SUMMARY.match(lines[-1])
    phases = {name: float(sec) for name, sec in PHASE.findall(m.group(2))}
    # the last line names the report's files, under this copy's own folder: compared as DIR
    return {"wall": wall, "cpu": out.cpu, "total": float(m.group(1)), "phases": phases,
            "text": out.stdout.replace(str(bench), "DIR")}


def table(builds: dict) -> None:
    names: list = []
    for b in builds.values():
        names += [n for n in b["phases"] if n not in names]
    keys = list(builds)
    print(f"{'phase (wall s, under the load below)':<60}" + "".join(f"{k:>14}" for k in keys))
    for n in names:
        cells = "".join(f"{builds[k]['phases'][n]:14.2f}" if n in builds[k]["phases"] else f"{'-':>14}" for k in keys)
        print(f"{n[:59]:<60}{cells}")
    print(f"{'all phases':<60}" + "".join(f"{builds[k]['total']:14.2f}" for k in keys))
    print(f"{'process wall (start-up and imports included)':<60}" + "".join(f"{builds[k]['wall']:14.2f}" for k in keys))
    print(f"{'process CPU (user + system; the comparable figure)':<60}"
          + "".join(f"{builds[k]['cpu']:14.2f}" for k in keys))


def synthetic(path: Path, n: int = 10_000, k: int = 5, seed: int = 0) -> Path:
    """``n`` x ``k`` over-confident logits of a model ~75% accurate, with their labels, as an .npz."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n)
    logits = rng.normal(0.0, 1.0, (n, k))
    logits[np.arange(n), labels] += 1.5
    np.savez(path, logits=(3.0 * logits).astype(np.float32), labels=labels)
    return path


def newcomer(tmp: Path) -> None:
    """Wall seconds of the newcomer's three commands (this checkout)."""
    rows = []
    wall, _ = calibkit(["bench", "--preset", "smoke", "--out", tmp / "newcomer", "--quiet"], ROOT)
    rows.append(("calibkit bench --preset smoke (training + report)", wall))
    f = synthetic(tmp / "synthetic.npz")
    wall, _ = calibkit(["calibrate", "--from", f, "--split", "0.5", "--save", "--out", tmp / "cal"], ROOT)
    rows.append(("calibkit calibrate --from F.npz --split 0.5 --save (10,000 x 5)", wall))
    wall, _ = calibkit(["apply", "--calibrator", tmp / "cal", "--input", f, "--out", tmp / "applied.npz"], ROOT)
    rows.append(("calibkit apply (10,000 x 5)", wall))
    print(f"\n{'newcomer command (this checkout)':<68}{'wall s':>10}")
    for name, sec in rows:
        print(f"{name:<68}{sec:10.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, help="a finished bench directory (default: a fresh smoke bench)")
    ap.add_argument("--before", type=Path, metavar="DIR", help="also build with the calibkit package under DIR")
    ap.add_argument("--serial", action="store_true", help="also a cold build of this checkout with --jobs 1")
    ap.add_argument("--shipped", action="store_true", help="each code reads its own shipped preset (no DIR/presets)")
    ap.add_argument("--newcomer", action="store_true", help="also time bench, calibrate --save and apply")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="calibkit-report-speed-"))
    try:
        src = args.dir
        if src is None:
            src = tmp / "smoke"
            wall, _ = calibkit(["bench", "--preset", "smoke", "--out", src, "--no-report", "--quiet"],
                               args.before or ROOT)
            print(f"smoke bench, training only (--no-report): {wall:.1f} s wall\n", flush=True)
        builds = measure(src, tmp, args)
        table(builds)
        print(f"load average after measuring: {' '.join(f'{x:.1f}' for x in os.getloadavg())} "
              f"on {os.cpu_count()} cores")
        same = compare(builds, by_code=args.shipped)
        if args.newcomer:
            newcomer(tmp)
        return 0 if same else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def measure(src: Path, tmp: Path, args) -> dict:
    """Every build: each code's cold then warm build on its own cold copy (and ``now serial``)."""
    builds = {}
    codes = {"before": args.before, "now": ROOT} if args.before else {"now": ROOT}
    runs = [(code, path, kind, ()) for code, path in codes.items() for kind in ("cold", "warm")]
    if args.serial:
        runs.append(("now serial", ROOT, "cold", ("--jobs", "1")))
    for code, path, kind, extra in runs:
        if kind == "cold":
            copy = cold_copy(src, tmp / code.replace(" ", "-"), args.shipped)
        key = f"{code} {kind}"
        builds[key] = report(copy, path, extra)
        print(f"{key}: {builds[key]['wall']:.1f} s wall, {builds[key]['cpu']:.1f} s CPU", file=sys.stderr, flush=True)
    return builds


def compare(builds: dict, by_code: bool) -> bool:
    """Whether the terminal texts are identical: between all builds, or (``by_code``) within each
    code's builds (``before`` and ``now``, ``now serial`` among the latter); the first differences."""
    groups: dict = {}
    for key, b in builds.items():
        groups.setdefault(key.split()[0] if by_code else "all", []).append((key, b["text"]))
    same = True
    for name, texts in groups.items():
        first_key, first = texts[0]
        ok = all(t == first for _, t in texts)
        same &= ok
        what = f"{name}'s builds" if by_code else "the builds"
        print(f"printed report text identical between {what}: {'yes' if ok else 'NO'}")
        for key, text in texts[1:]:
            if text != first:
                print("\n".join(list(difflib.unified_diff(first.splitlines(), text.splitlines(), first_key, key,
                                                          n=0))[:40]))
    return same


if __name__ == "__main__":
    sys.exit(main())
