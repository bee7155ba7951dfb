"""Candidates fitted in several processes (:mod:`calibkit.calibrators.pool`): the same numbers as one process."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from calibkit.calibrators import pool
from calibkit.calibrators.crossfit import SelectionRule, cross_fit_predictions


def square_or_fail(i: int) -> int:
    if i == 3:
        raise ValueError("task 3 refused")
    return i * i


def die_outside(parent: int, marker: str, i: int) -> int:
    """``i + 1`` in the calling process, once a started process has died holding a task (it marks
    ``marker`` and exits without a result)."""
    if os.getpid() != parent:
        Path(marker).touch()
        os._exit(3)
    deadline = time.monotonic() + 120
    while not Path(marker).exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the started process never took a task")
        time.sleep(0.05)
    return i + 1


def test_run_returns_the_results_in_task_order():
    tasks = [(i,) for i in range(7) if i != 3]
    assert pool.run(square_or_fail, tasks, jobs=2) == [i * i for i in range(7) if i != 3]


def test_run_raises_what_a_task_raised_in_either_process():
    for jobs in (1, 2):
        with pytest.raises(ValueError, match="task 3 refused"):
            pool.run(square_or_fail, [(i,) for i in range(6)], jobs=jobs)


def test_a_task_held_by_a_process_that_died_is_computed_here(tmp_path):
    # this process holds task 0 until the started one has taken task 1 and died with it
    marker = tmp_path / "died"
    tasks = [(os.getpid(), str(marker), i) for i in range(4)]
    assert pool.run(die_outside, tasks, jobs=2) == [1, 2, 3, 4]
    assert marker.exists()


def test_order_puts_the_slow_maps_first_and_keeps_the_rest():
    assert pool.order(["temperature", "histogram", "sms", "dirichlet", "isotonic"]) == [
        "dirichlet", "sms", "temperature", "histogram", "isotonic"]


def test_cross_fitting_in_two_processes_gives_the_same_numbers():
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 5, (600,), generator=g)
    z = torch.randn(600, 5, generator=g) + 2.5 * torch.nn.functional.one_hot(y, 5)
    names = ["temperature", "vector", "histogram", "dirichlet", "isotonic"]
    one = cross_fit_predictions(z * 3, y, names, SelectionRule(), jobs=1)
    two = cross_fit_predictions(z * 3, y, names, SelectionRule(), jobs=2)
    assert list(one[0]) == list(two[0])  # "none" first, then the order of names
    for name in one[0]:
        a, b = one[0][name], two[0][name]
        assert (a.acc, a.ece, a.nll, a.brier, a.changed, a.error) == (b.acc, b.ece, b.nll, b.brier, b.changed, b.error)
        assert torch.equal(one[2][name], two[2][name])
    for name in names:
        assert torch.equal(one[1][name].predict_proba(z), two[1][name].predict_proba(z))


def test_auto_jobs_is_one_for_small_fits_and_one_per_core_up_to_the_cap_for_long_ones(monkeypatch):
    monkeypatch.setattr(pool, "cores", lambda: 2)
    limit = pool.MIN_PARALLEL_WORK
    assert pool.auto_jobs(limit // 100 - 1, 10) == 1  # rows x K^2 just below the threshold
    assert pool.auto_jobs(limit // 100, 10) == 2
    assert pool.auto_jobs(5000, 100, threads=2) == 1  # two threads each fill both cores
    assert pool.auto_jobs(5000, 2) == 1  # binary: 20,000
    monkeypatch.setattr(pool, "cores", lambda: 64)
    assert pool.auto_jobs(5000, 100) == pool.MAX_JOBS
    monkeypatch.setattr(pool, "cores", lambda: 1)
    assert pool.auto_jobs(5000, 100) == 1
