"""The runs' calibrator fits and the per-method figures in parallel processes, before the build reads them.

Most of a cold report's time goes to fitting post-hoc calibrators, run by run: every calibrator of
the report on the whole validation split (:mod:`calibkit.report.calibrated`), its cross-fitting
(:mod:`calibkit.report.verdict`) and its fit on half the validation split for the conformal sets
(:mod:`calibkit.report.sets`). What one run gives depends only on that run's saved tensors and
fixed seeds (no random state is shared between runs), and each result is written to the report's
content-keyed caches under ``DIR/cache/``. The per-method figures (reliability diagrams of one run
per method, :func:`calibkit.report.figures.method_figure`) depend only on their run too.

:func:`prefetch` therefore runs those tasks (:func:`plan`: the runs whose caches miss, and the
figures) in ``jobs`` processes: this one and ``jobs - 1`` started by ``spawn`` (fresh interpreters,
each with ``threads`` torch threads), which take the tasks one at a time from a shared counter.
Each process runs the very functions of the report's build (:func:`fit_run`, ``method_figure``);
the build then reads the fits from the caches as a rebuild does (float64 tensors read back bit for
bit, scores through JSON, whose floats read back exactly) and keeps the figures drawn. So the
report is identical to one built in a single process (``tests/report/test_prefetch.py`` compares
the text, ``report.md``, every cache file and every figure's bytes).

Nothing depends on the prefetch succeeding: a task a process failed on (or a process that died)
is done by the build as usual, which also names the calibrators that fail.

Decisions of calibkit (nothing in the method specifications covers them): by default
(:func:`auto_jobs`) the tasks run in parallel only when they hold at least
:data:`MIN_PARALLEL_FITS` calibrator fits (runs to fit x calibrators of the report, a figure
counting :data:`FIGURE_FITS`), one process per available core divided by ``threads``; below that
a process's start (importing torch, one or two seconds of CPU) costs more than it saves, and the
many small reports of the tests stay in one process.
"""

from __future__ import annotations

import multiprocessing
import warnings
from pathlib import Path

import torch

from calibkit.calibrators.pool import cores, started
from calibkit.report.calibrated import CalibratedProbs
from calibkit.report.figures import method_figure
from calibkit.report.sets import SetRows
from calibkit.report.verdict import DEFAULT_RULE, _cache_file, run_scores

#: Calibrator fits (runs to fit x calibrators of the report) from which :func:`auto_jobs` uses
#: several processes: 9 runs of the default list of 18 calibrators.
MIN_PARALLEL_FITS = 160
#: What one per-method figure counts as, in calibrator fits of one run, for :func:`auto_jobs`: with
#: it a report of 15 runs of 2 calibrators and every method's figure (195; a rebuild, its figures
#: alone: 165) uses both cores of a 2-core machine, and the tests' reports of 6 runs of 3 methods
#: with figures (141, or 153 with two calibrators added to the registry) stay in one process, as
#: does the smoke report, which draws CE's figure and the recommended method's (30 + 11: 41; the
#: recommended one is drawn by the build, once it is known).
FIGURE_FITS = 11


def cache_dirs(out_dir: Path) -> dict:
    """The report's cache folders under ``out_dir/cache``."""
    return {k: Path(out_dir) / "cache" / k for k in ("calibrated", "selection", "sets")}


def fit_run(row: dict, out_dir: Path, names, alpha: float) -> None:
    """Everything of one run that the report fits, written to its caches: the calibrated test
    probabilities of every calibrator, the cross-fitted scores and the conformal rows. A fit that
    fails is left to the build, which meets it again and names it."""
    dirs = cache_dirs(out_dir)
    probs = CalibratedProbs(dirs["calibrated"], names)
    t = probs.logits(row)
    if not {"val_logits", "val_labels"} <= set(t):
        return
    for name in probs.names[1:]:
        try:
            probs(row, name)
        except (ValueError, RuntimeError):
            pass
    try:
        run_scores(row, probs, DEFAULT_RULE, dirs["selection"])
    except (ValueError, RuntimeError):
        pass
    if "test_image" in t:  # segmentation runs have no conformal sets
        return
    sets = SetRows(probs, alpha, dirs["sets"])
    for name in probs.names:
        try:
            sets.conformal(row, name)
        except (ValueError, RuntimeError):
            pass


def missing(row: dict, probs: CalibratedProbs, out_dir: Path, alpha: float) -> bool:
    """Whether the run has validation logits and some of its results are not cached yet (``probs``:
    the build's, which keeps the tensors it reads here)."""
    dirs = cache_dirs(out_dir)
    try:
        t = probs.logits(row)
    except (ValueError, OSError):
        return False  # the build names it
    if not {"val_logits", "val_labels"} <= set(t):
        return False
    paths = [probs._cache_path(row, n) for n in probs.names[1:]] + [_cache_file(dirs["selection"], row,
                                                                                  DEFAULT_RULE, probs)]
    if "test_image" not in t:
        sets = SetRows(probs, alpha, dirs["sets"])
        paths += [sets._cache_path(row, n) for n in probs.names]
    return not all(p is not None and p.is_file() for p in paths)


def auto_jobs(n_tasks: int, work: int, threads: int | None) -> int:
    """The processes :func:`prefetch` uses by default for ``n_tasks`` tasks of ``work`` calibrator
    fits in all (a figure counts :data:`FIGURE_FITS`; module docstring)."""
    if n_tasks < 2 or work < MIN_PARALLEL_FITS:
        return 1
    return max(1, min(n_tasks, cores() // max(1, threads or 1)))


def _run(task: tuple, out_dir: Path, names, alpha: float) -> None:
    if task[0] == "fit":
        fit_run(task[1], out_dir, names, alpha)
    else:
        method_figure(task[1], task[2])


def _work(tasks: list, counter, done, out_dir: Path, names, alpha: float, threads: int | None, quiet: bool) -> None:
    """Take tasks from the shared ``counter`` until none is left (in a started process and in this
    one); ``done[i]`` = 1 once task ``i`` succeeded."""
    if threads is not None:
        torch.set_num_threads(threads)
    while True:
        with counter.get_lock():
            i = counter.value
            counter.value += 1
        if i >= len(tasks):
            return
        try:
            with warnings.catch_warnings():
                if quiet:  # a started process: its warnings would interleave with this one's output
                    warnings.simplefilter("ignore")
                _run(tasks[i], out_dir, names, alpha)
            done[i] = 1
        except Exception:  # noqa: BLE001 - the build computes (and names) whatever this left undone
            pass


def plan(runs: list[dict], probs: CalibratedProbs, out_dir, alpha: float = 0.1, jobs: int | None = None,
         threads: int | None = 1, figures: dict | None = None) -> tuple[list[tuple], int]:
    """``(tasks, processes)``: ``("fit", run)`` for each run of ``runs`` whose caches miss (``probs``:
    the build's, whose calibrators are fitted), ``("figure", run, path)`` for each of ``figures``
    (``{path: run}``, the per-method figures), and ``jobs`` (None: :func:`auto_jobs`) no larger than
    their number. Nothing is looked up when one process will do whatever the caches hold."""
    n_cal, figures = len(probs.names) - 1, figures or {}
    drawn = [("figure", row, path) for path, row in figures.items()]
    if jobs == 1 or (jobs is None and auto_jobs(len(runs) + len(drawn), len(runs) * n_cal + FIGURE_FITS * len(drawn),
                                                threads) == 1):
        return [], 1
    tasks = [("fit", r) for r in runs if r.get("logits_path") and missing(r, probs, Path(out_dir), alpha)] + drawn
    if jobs is None:
        jobs = auto_jobs(len(tasks), (len(tasks) - len(drawn)) * n_cal + FIGURE_FITS * len(drawn), threads)
    return tasks, max(1, min(jobs, len(tasks)))


def prefetch(tasks: list[tuple], out_dir, jobs: int, names=None, alpha: float = 0.1,
             threads: int | None = 1) -> set:
    """Run the :func:`plan`'s ``tasks`` in ``jobs`` processes: this one (its torch threads unchanged)
    and ``jobs - 1`` started ones with ``threads`` torch threads each. Fits go to the caches; returns
    the paths of the figures drawn."""
    ctx = multiprocessing.get_context("spawn")  # never fork a process whose torch holds threads
    counter, done = ctx.Value("i", 0), ctx.Array("b", len(tasks))
    args = (tasks, counter, done, Path(out_dir), names, alpha)
    for task in tasks:
        if task[0] == "figure":
            Path(task[2]).parent.mkdir(parents=True, exist_ok=True)
    procs = [ctx.Process(target=_work, args=(*args, threads, True), daemon=True) for _ in range(jobs - 1)]
    with started(procs):
        _work(*args, None, False)
    return {task[2] for task, ok in zip(tasks, done[:]) if ok and task[0] == "figure"}
