"""The numbers of a report that cost its time: the runs' calibrator fits (spread over processes by
:mod:`calibkit.report.prefetch`), the paired comparisons, the cross-fitted choices and the
recommendation, each a phase of :class:`calibkit.bench.progress.Phases`; and the torch thread
count of the build.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

from calibkit.bench.progress import Phases
from calibkit.report import prefetch
from calibkit.report.calibrated import CalibratedProbs, NoValidationLogits, calibrator_grid
from calibkit.report.paired import comparisons
from calibkit.report.verdict import method_selections, recommendation


@contextmanager
def torch_threads(n: int | None):
    """``torch.set_num_threads(n)`` inside the block, the previous count restored after (None: unchanged)."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def prefetch_tasks(out_dir: Path, summary: dict, probs: CalibratedProbs, alpha: float, phases: Phases,
                   parallel: tuple[int | None, int | None], figdir: Path | None, methods=None) -> set:
    """The runs' fits and the per-method figures of ``methods`` (None: every method's; ``figdir``:
    where; None: no figures) in ``parallel = (jobs, threads)`` processes
    (:mod:`calibkit.report.prefetch`); the figures drawn."""
    runs = [r for e in summary.values() for r in e["runs"]]
    methods = list(summary) if methods is None else methods
    figs = {} if figdir is None else {figdir / f"reliability_{m}.png": summary[m]["runs"][0] for m in methods}
    tasks, jobs = prefetch.plan(runs, probs, out_dir, alpha, *parallel, figures=figs)
    if jobs < 2:
        return set()
    fits = sum(t[0] == "fit" for t in tasks)
    with phases.phase(f"fitting the calibrators of {fits} runs and drawing {len(tasks) - fits} figures in {jobs} "
                      "processes"):
        return prefetch.prefetch(tasks, out_dir, jobs, probs.names[1:], alpha, parallel[1])


def calibrated(summary: dict, probs: CalibratedProbs, n_boot: int, seed: int, phases: Phases,
               cache_dir: Path) -> tuple:
    """``(grid, comps, selections, verdict)``, all None when a run has no validation logits."""
    runs = [r for e in summary.values() for r in e["runs"]]
    try:
        with phases.phase(f"fitting {len(probs.names) - 1} post-hoc calibrators on {len(runs)} runs"):
            grid = calibrator_grid(summary, probs)
        with phases.phase("paired comparisons with CE and CE + temperature scaling"):
            comps = comparisons(summary, probs, n_boot=n_boot, seed=seed)
        with phases.phase("cross-fitting each method's choice of calibrator"):
            selections = method_selections(summary, probs, cache_dir=cache_dir)
        with phases.phase("the recommendation's test evidence"):
            verdict = recommendation(summary, probs, selections, n_boot=n_boot, seed=seed)
    except NoValidationLogits:  # logits files without validation logits: the tables without calibrators
        return None, None, None, None
    return grid, comps, selections, verdict
