"""Wall and CPU time of ``calibkit calibrate`` end to end, selection included, and where it goes.

Runs the command (a fresh process each time, as a user does) with every default calibrator.
Default input (``--input from``): one synthetic file of 5,000 over-confident logits of K = 10 and
K = 100 classes, ``calibkit calibrate --from F --split 0.5`` (2,500 validation, 2,500 test rows).
``--input files``: 5,000 validation and 5,000 test rows through ``--val/--test``, from the
real-outputs test bed's WRN-16-4 CIFAR-10 and CIFAR-100 files when they are present (rows
0-4999 / 5000-9999), else synthetic. Prints the wall time against the targets (K = 10: 15 s,
K = 100: 45 s on a 2-core CPU), the CPU time of the command (user + system, its own and its
children's, as ``/usr/bin/time`` reports them), the start-up time (``calibkit --version``) and the
phases ``--timings`` reports (full fits per calibrator, cross-fitting, test metrics, bootstrap,
sets, figures).

``--jobs N`` passes ``--jobs N`` to every run of this checkout; ``--baseline-jobs N`` adds a
baseline run with ``--jobs N`` (this checkout's own, unless ``--baseline`` names another),
interleaved like ``--baseline``'s: e.g. ``--baseline-jobs 1`` against calibkit's default choice.

``--baseline DIR``: also runs the calibkit package found in ``DIR`` (e.g. an older commit exported
with ``git archive COMMIT calibkit | tar -x -C DIR``) on the same files, alternating the two runs,
and prints both wall and CPU times and the ratio of the wall times side by side (on a shared
machine only the ratio of interleaved runs means much).

Usage::

    python benchmarks/calibrate_speed.py [--input from|files] [--repeats 1] [--num-threads N] [--baseline DIR]
        [--jobs N] [--baseline-jobs N] [--sizes 10,100] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REAL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real_outputs"
FILES = {10: "cifar10_wrn16-4.npz", 100: "cifar100_wrn16-4.npz"}
TARGET_S = {10: 15.0, 100: 45.0}


def _calibkit() -> list[str]:
    exe = Path(sys.executable).with_name("calibkit")
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "calibkit"]


def _synthetic(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows of logits three times too sharp for their labels (seeded), and the labels."""
    rng = np.random.default_rng(0)
    z = rng.normal(size=(n, k)) * 2
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    labels = (p.cumsum(1) < rng.random((n, 1))).sum(1).clip(0, k - 1)
    return 3 * z, labels


def write_one(k: int, folder: Path) -> str:
    """``all.npz`` (``logits``, ``labels``) of 5,000 synthetic rows in ``folder``; returns its path."""
    logits, labels = _synthetic(5000, k)
    np.savez(folder / "all.npz", logits=logits.astype(np.float32), labels=labels)
    return str(folder / "all.npz")


def write_split(k: int, folder: Path) -> str:
    """``val.npz`` and ``test.npz`` of 5,000 rows each in ``folder``; returns where they came from."""
    path = REAL / FILES[k]
    if path.is_file():
        with np.load(path, allow_pickle=False) as f:
            probs, labels = f["probs"], f["labels"]
        source = f"{FILES[k]} (real outputs)"
    else:
        rng = np.random.default_rng(0)
        z = rng.normal(size=(10_000, k)) * 2
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        labels = np.array([rng.choice(k, p=row) for row in p])
        probs = np.exp(3 * z - (3 * z).max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
        source = "synthetic over-confident logits"
    np.savez(folder / "val.npz", probs=probs[:5000], labels=labels[:5000])
    np.savez(folder / "test.npz", probs=probs[5000:], labels=labels[5000:])
    return source


def run(cmd: list[str], pythonpath: str | None = None) -> tuple[float, str, float]:
    """``(wall s, stdout, CPU s)`` of ``cmd`` (CPU: user + system of the process and its children)."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, out, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", choices=("from", "files"), default="from",
                    help="from: one synthetic file, --from F --split 0.5 (default); files: --val/--test")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--num-threads", type=int, default=None, help="passed to calibkit (default: its own default)")
    ap.add_argument("--baseline", metavar="DIR", help="a folder holding another calibkit package to compare with")
    ap.add_argument("--sizes", default="10,100", help="the K to run, comma-separated (default 10,100)")
    ap.add_argument("--jobs", type=int, default=None, help="passed as calibrate --jobs (default: calibkit's choice)")
    ap.add_argument("--baseline-jobs", type=int, default=None, metavar="N",
                    help="the baseline runs with calibrate --jobs N (without --baseline: this checkout's own)")
    ap.add_argument("--keep", metavar="DIR", help="write the reports under DIR/k<K>/{o,b}<run> (default: a "
                    "temporary folder, removed) to compare the two codes' results")
    args = ap.parse_args(argv)
    here = str(Path(__file__).resolve().parents[1])
    threads = [] if args.num_threads is None else ["--num-threads", str(args.num_threads)]
    startup, _, _ = run(_calibkit() + ["--version"])
    print(f"start-up (calibkit --version): {startup:.2f} s; load average {os.getloadavg()[0]:.1f}")
    ok = True
    for k in (int(v) for v in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            outs = Path(args.keep) / f"k{k}" if args.keep else folder
            outs.mkdir(parents=True, exist_ok=True)
            if args.input == "from":
                source, given = "synthetic, --from F --split 0.5", ["--from", write_one(k, folder), "--split", "0.5"]
            else:
                source = write_split(k, folder)
                given = ["--val", str(folder / "val.npz"), "--test", str(folder / "test.npz")]
            for r in range(args.repeats):
                cmd = _calibkit() + ["calibrate", *given, "--timings", *threads]
                base = base_cpu = None
                if args.baseline or args.baseline_jobs:
                    base_jobs = [] if args.baseline_jobs is None else ["--jobs", str(args.baseline_jobs)]
                    base, _, base_cpu = run(cmd + base_jobs + ["--out", str(outs / f"b{r}")],
                                            pythonpath=args.baseline or here)
                jobs = [] if args.jobs is None else ["--jobs", str(args.jobs)]
                wall, out, cpu = run(cmd + jobs + ["--out", str(outs / f"o{r}")], pythonpath=here)
                phases = next((line for line in out.splitlines() if line.startswith("time (s):")), "")
                verdict = "within" if wall <= TARGET_S[k] else "ABOVE"
                ok &= wall <= TARGET_S[k]
                side = "" if base is None else (f" (baseline {base:.1f} s wall, {base_cpu:.1f} s CPU; ratio "
                                                f"{wall / base:.2f})")
                print(f"\n5,000 x {k} ({source}), run {r + 1}: {wall:.1f} s wall, {cpu:.1f} s CPU{side}, {verdict} "
                      f"the {TARGET_S[k]:g} s target; load average {os.getloadavg()[0]:.1f}\n  {phases}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
