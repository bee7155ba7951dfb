"""The runs' calibrator fits in parallel processes give the report of one process, byte for byte."""

import json

import pytest

from calibkit.bench.progress import Phases
from calibkit.errors import UserError
from calibkit.report import build_report, prefetch
from calibkit.report.calibrated import CalibratedProbs
from tests.report.test_report import make_bench

CACHES = ("calibrated", "selection", "sets")


def _caches(out) -> dict:
    """Every cache file's bytes; the cross-fitted scores without their fit times (wall clock)."""
    files = {}
    for name in CACHES:
        for path in sorted((out / "cache" / name).iterdir()):
            if path.suffix == ".json":
                scores = json.loads(path.read_text())
                files[f"{name}/{path.name}"] = {k: {f: v for f, v in s.items() if f != "seconds"}
                                                for k, s in scores.items()}
            else:
                files[f"{name}/{path.name}"] = path.read_bytes()
    return files


def test_parallel_fits_equal_the_serial_build(tmp_path, one_thread):
    """Two processes (this one and a spawned one) against one: the same terminal text, report.md
    and cache files (the cached values the build reads are the ones it would have computed)."""
    for d in ("serial", "parallel"):  # the same logits, written twice (the database holds absolute paths)
        make_bench(tmp_path / d, methods=("ce", "ls", "focal"), seeds=(0, 1))
    serial = build_report(tmp_path / "serial", n_boot=20, width=0, jobs=1)
    phases = Phases("report", quiet=True)
    parallel = build_report(tmp_path / "parallel", n_boot=20, width=0, jobs=2, progress=phases)
    assert [p for p in phases.times if "processes" in p] == [
        "fitting the calibrators of 6 runs and drawing 3 figures in 2 processes"]
    assert parallel["text"].replace(str(tmp_path / "parallel"), "DIR") == serial["text"].replace(
        str(tmp_path / "serial"), "DIR")
    md = {d: (tmp_path / d / "report" / "report.md").read_text().replace(str(tmp_path / d), "DIR")
          for d in ("serial", "parallel")}
    assert md["parallel"] == md["serial"]
    assert _caches(tmp_path / "parallel") == _caches(tmp_path / "serial")
    pngs = {d: {f.name: f.read_bytes() for f in (tmp_path / d / "report" / "figures").iterdir()}
            for d in ("serial", "parallel")}
    assert len(pngs["serial"]) > 3 and pngs["parallel"] == pngs["serial"]  # the method figures among them

    # warm: every cache hit, nothing left to fit, no process started
    runs = [r for e in parallel["summary"].values() for r in e["runs"]]
    probs = CalibratedProbs(tmp_path / "parallel" / "cache" / "calibrated")
    assert prefetch.plan(runs, probs, tmp_path / "parallel", 0.1, 2) == ([], 1)
    (next((tmp_path / "parallel" / "cache" / "sets").iterdir())).unlink()  # one run's sets of one calibrator
    todo, jobs = prefetch.plan(runs, CalibratedProbs(probs.cache_dir), tmp_path / "parallel", 0.1, 2)
    assert len(todo) == 1 and jobs == 1  # no more processes than runs to fit


def test_auto_jobs_spares_small_reports(monkeypatch):
    monkeypatch.setattr(prefetch, "cores", lambda: 4)  # the cores this process may use (pool.cores)
    assert prefetch.auto_jobs(1, 500, 1) == 1  # one task: nothing to share
    assert prefetch.auto_jobs(8, 8 * 18, 1) == 1  # 144 fits: a process's start costs more than it saves
    assert prefetch.auto_jobs(9, 9 * 18, 1) == 4  # one process per core
    assert prefetch.auto_jobs(9, 9 * 18, 2) == 2  # each with two threads
    assert prefetch.auto_jobs(3, 180, 1) == 3  # no more processes than tasks


@pytest.mark.parametrize("jobs", [0, -1, 1.5, True, "2"])
def test_bad_jobs_are_refused(tmp_path, jobs):
    with pytest.raises(UserError, match="jobs must be an integer >= 1"):
        build_report(tmp_path, jobs=jobs)
