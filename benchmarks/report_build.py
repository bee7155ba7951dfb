"""Time of building a bench report from cold, phase by phase, now against a previous commit.

Takes a finished bench directory (default: runs a fresh ``calibkit bench --preset smoke
--no-report`` into a temporary folder first), and builds its report from a copy without the
report caches (``cache/calibrated``, ``cache/selection``, ``cache/sets``), as ``calibkit bench``
does the first time:

* **now**: this checkout's :func:`calibkit.report.build_report`, in a fresh process, with its
  phases (:class:`calibkit.bench.progress.Phases`): wall and CPU seconds per phase;
* **before** (``--before REV``): the same build by the calibkit of commit ``REV`` (``git archive``
  into a temporary folder), in a fresh process: wall and CPU in all. A recorded preset's top-level
  keys that ``REV``'s ``Preset`` does not have (settings added since, e.g. ``report_figures``) are
  left out of its copy, and named: ``REV`` would refuse the file, and builds as it did without them;
* **threads** (``--threads``): this checkout again with torch's default thread count
  (``num_threads=None``), the report's behaviour before it pinned one thread.

Each build's time is printed whole and split in two: ``imports`` (torch, matplotlib and
calibkit's report modules, read by the fresh process) and ``after imports`` (the build itself:
what ``calibkit bench`` waits for at its end, having imported all of that to train).

Prints the phases side by side and the totals with their ratios, and checks that every printed
number is the same: the terminal text of the report (every table the report prints) must be
identical between the builds, else the script exits 1.

Usage::

    python benchmarks/report_build.py [--dir runs/smoke] [--before REV] [--threads]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHES = ("calibrated", "selection", "sets")

BUILD = """
import json, sys, time
t0, c0 = time.monotonic(), time.process_time()
from calibkit.bench.progress import Phases
from calibkit.report import build_report
t_imports = time.monotonic() - t0
kw = json.loads(sys.argv[2])
phases = Phases("report", quiet=True)
try:
    rep = build_report(sys.argv[1], width=0, progress=phases, **kw)
except TypeError:  # a calibkit from before the phases
    phases = None
    rep = build_report(sys.argv[1], width=0)
print(json.dumps({"wall": time.monotonic() - t0, "cpu": time.process_time() - c0, "text": rep["text"],
                  "imports": t_imports,
                  "times": phases.times if phases else {}, "phase_cpu": phases.cpu if phases else {}}))
"""


def cold_copy(src: Path, dst: Path) -> Path:
    """``src`` without the report and its caches (the training caches stay: CSM, corrupted sets)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("report"))
    for name in CACHES:
        shutil.rmtree(dst / "cache" / name, ignore_errors=True)
    return dst


def build(bench: Path, pythonpath: Path, kwargs: dict) -> dict:
    """Build the report in a fresh process whose ``calibkit`` comes from ``pythonpath``."""
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", BUILD, str(bench), json.dumps(kwargs)], env=env, cwd=bench,
                         capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["process_wall"] = time.monotonic() - t0  # start-up and imports included
    res["process_cpu"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return res


def preset_keys(pkg: Path) -> set[str]:
    """The fields of the ``Preset`` dataclass of the calibkit under ``pkg`` (read from its source)."""
    tree = ast.parse((pkg / "calibkit" / "bench" / "grid.py").read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Preset")
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def drop_unknown_keys(bench: Path, known: set[str]) -> list[str]:
    """Remove from ``bench/presets/*.toml`` the top-level keys not in ``known``; ``["file: key", ...]``."""
    dropped = []
    for path in sorted((bench / "presets").glob("*.toml")):
        kept, top = [], True
        for line in path.read_text().splitlines(keepends=True):
            top = top and not line.lstrip().startswith("[")
            key = line.split("=", 1)[0].strip()
            if top and "=" in line and key not in known:
                dropped.append(f"{path.name}: {key}")
                continue
            kept.append(line)
        path.write_text("".join(kept))
    return dropped


def checkout(rev: str, dst: Path) -> Path:
    """The ``calibkit`` package of commit ``rev`` under ``dst``."""
    dst.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "calibkit"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dst)], input=archive.stdout, check=True)
    return dst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, help="a finished bench directory (default: a fresh smoke bench)")
    ap.add_argument("--before", metavar="REV", help="also build with the calibkit of this commit")
    ap.add_argument("--threads", action="store_true", help="also build with torch's default thread count")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="calibkit-report-build-"))
    try:
        src = args.dir
        if src is None:
            src = tmp / "smoke"
            subprocess.run([sys.executable, "-m", "calibkit", "bench", "--preset", "smoke", "--out", str(src),
                            "--no-report", "--quiet"], check=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        builds = {"now": build(cold_copy(src, tmp / "now"), ROOT, {})}
        phases(builds["now"])
        if args.threads:
            builds["threads"] = build(cold_copy(src, tmp / "threads"), ROOT, {"num_threads": None})
        if args.before:
            old = checkout(args.before, tmp / "old")
            dropped = drop_unknown_keys(cold_copy(src, tmp / "before"), preset_keys(old))
            if dropped:
                print(f"left out of the recorded preset for {args.before} (unknown to it): {', '.join(dropped)}")
            builds["before"] = build(tmp / "before", old, {})
        report(builds)
        same = all(b["text"] == builds["now"]["text"] for b in builds.values())
        print(f"\nprinted numbers identical between the builds: {'yes' if same else 'NO'}")
        return 0 if same else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def phases(now: dict) -> None:
    """This checkout's phases (printed as soon as its build ends: the others can take minutes)."""
    print(f"{'phase (this checkout)':<62} {'wall s':>8} {'CPU s':>8}")
    for name, sec in now["times"].items():
        print(f"{name:<62} {sec:8.2f} {now['phase_cpu'][name]:8.2f}")
    print(flush=True)


def report(builds: dict) -> None:
    now = builds["now"]
    print(f"{'build':<10} {'imports s':>10} {'after imports s':>16} {'build wall s':>13} {'build CPU s':>12} "
          f"{'process wall s':>15} {'process CPU s':>14} {'CPU / now':>10}")
    for key, b in builds.items():
        imports = b.get("imports", float("nan"))
        print(f"{key:<10} {imports:10.2f} {b['wall'] - imports:16.2f} {b['wall']:13.2f} {b['cpu']:12.2f} "
              f"{b['process_wall']:15.2f} {b['process_cpu']:14.2f} {b['process_cpu'] / now['process_cpu']:10.2f}")
    print(f"load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    sys.exit(main())
