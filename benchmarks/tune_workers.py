"""``calibkit tune --workers N`` against ``calibkit bench --workers N``: wall time per candidate and per run.

Runs, one after the other (close together, so that the load of a shared machine is as alike as
it can be), into temporary folders:

    calibkit tune  --preset P --methods M... --workers N --out TMP/tune
    calibkit bench --preset P --methods M... --workers N --seeds S... --out TMP/bench --no-report

and prints, side by side, from the two databases: the command's wall time divided by its
candidates (runs), the span from the first claim to the last finish divided likewise, the mean
wall time of one candidate (run) and the mean training time of one. Target: tune's wall time per
candidate <= 1.1x bench's per run (a run also pays its test-set evaluation, a candidate only its
validation metrics; both train the same budget).

    python benchmarks/tune_workers.py                      # default preset, ls focal, 2 workers, seeds 0 1
    python benchmarks/tune_workers.py --preset smoke --methods ls
"""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path


def _t(s: str) -> float:
    return datetime.fromisoformat(s).timestamp()


def _rows(db: Path, table: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return list(con.execute(f"SELECT started_at, finished_at, train_time_s FROM {table} WHERE status = 'done'"))
    finally:
        con.close()


def _timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "calibkit", *argv], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _figures(wall: float, rows: list[tuple]) -> dict:
    n = len(rows)
    span = max(_t(f) for _, f, _ in rows) - min(_t(s) for s, _, _ in rows)
    return {"n": n, "wall/item": wall / n, "span/item": span / n,
            "mean item wall": sum(_t(f) - _t(s) for s, f, _ in rows) / n,
            "mean item train": sum(r[2] for r in rows) / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="default")
    ap.add_argument("--methods", nargs="+", default=["ls", "focal"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seeds", nargs="+", default=["0", "1"])
    args = ap.parse_args()
    common = ["--preset", args.preset, "--methods", *args.methods, "--workers", str(args.workers)]
    with tempfile.TemporaryDirectory() as tmp:
        tune_wall = _timed(["tune", *common, "--out", f"{tmp}/tune"])
        bench_wall = _timed(["bench", *common, "--seeds", *args.seeds, "--out", f"{tmp}/bench", "--no-report"])
        tune = _figures(tune_wall, _rows(Path(tmp) / "tune" / "runs.db", "tuning"))
        bench = _figures(bench_wall, _rows(Path(tmp) / "bench" / "runs.db", "runs"))
    print(f"{'':18}{'tune':>10}{'bench':>10}{'ratio':>8}")
    for key in tune:
        ratio = "" if key == "n" else f"{tune[key] / bench[key]:8.3f}"
        print(f"{key:18}{tune[key]:10.1f}{bench[key]:10.1f}{ratio}")


if __name__ == "__main__":
    main()
