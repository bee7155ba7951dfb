"""Every interval the report renders holds the estimate printed beside it, at the printed precision.

A property test over seeded random cases (hypothesis is not a dependency): random metric values
and bootstrap samples (symmetric, skewed, piled up at a bound as ECE is near 0) go through the
producers of the report's intervals (:func:`calibkit.bootstrap.bootstrap_ci`'s rule,
:func:`calibkit.seed_bootstrap.seed_paired_interval`), then through every formatter that prints
``estimate [low, high]`` (the report's tables, the verdict, the sets, the post-hoc and paired
sections, the confirmatory lines) and the three outputs (terminal text, report.md, index.html);
each printed triple is parsed back and checked: ``low <= estimate <= high`` as printed.
"""

from __future__ import annotations

import re
from decimal import Decimal

import numpy as np
import pytest
import torch

from calibkit.bootstrap import BootstrapResult, bootstrap_interval, holding
from calibkit.report import confirm, data, paired, posthoc, sets, verdict
from calibkit.report.render import html_table
from calibkit.report.tables import Table, md_table, text_table
from calibkit.seed_bootstrap import seed_paired_interval

TRIPLE = re.compile(r"([+-]?\d+\.\d+) \[([+-]?\d+\.\d+), ([+-]?\d+\.\d+)\]")


def _samples(rng: np.random.Generator, r: int) -> np.ndarray:
    """Resampled metric values of one of four shapes."""
    kind = rng.integers(4)
    if kind == 0:  # symmetric
        return rng.normal(rng.uniform(-0.2, 0.2), rng.uniform(1e-5, 0.05), r)
    if kind == 1:  # skewed to the right (an error rate's resamples)
        return rng.exponential(rng.uniform(1e-4, 0.05), r)
    if kind == 2:  # piled up at 0, as ECE near 0 is on every resample
        return np.abs(rng.normal(0.0, rng.uniform(1e-4, 0.02), r)) + rng.uniform(0, 0.01)
    return np.round(rng.normal(0.0, 0.01, r), int(rng.integers(2, 5)))  # ties (a few distinct values)


def _cases(n: int = 300, seed: int = 20261207):
    """``(estimate, low, high)`` from the report's interval rules on random samples and estimates."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        r = int(rng.integers(10, 400))
        s = _samples(rng, r)
        # the estimate: inside the samples' range, at its edge, or outside it (a skewed bootstrap)
        estimate = float(rng.choice([np.median(s), s.min(), s.max(), s.min() - abs(rng.normal(0, 0.01)),
                                     s.max() + abs(rng.normal(0, 0.01)), rng.uniform(-0.3, 0.3)]))
        level = float(rng.choice([0.9, 0.95, 0.99]))
        if i % 2 == 0:  # one model's interval (bootstrap_ci's rule: basic, clipped, held)
            bounds = (0.0, 1.0) if rng.random() < 0.5 else (-np.inf, np.inf)
            estimate = min(max(estimate, bounds[0]), bounds[1])
            lo, hi = holding(*bootstrap_interval(torch.from_numpy(s), estimate, level, "basic", bounds), estimate)
        else:  # a seed-averaged paired difference (one or two levels)
            n_seeds = int(rng.integers(1, 6))
            est = rng.normal(estimate, 0.01, n_seeds)
            res = seed_paired_interval(est, torch.from_numpy(np.stack([_samples(rng, r) for _ in range(n_seeds)])),
                                       level, seed=i, levels=1 if n_seeds < 3 else int(rng.integers(1, 3)))
            estimate, lo, hi = res["estimate"], res["lo"], res["hi"]
        yield estimate, lo, hi


def _rendered(estimate: float, lo: float, hi: float, scale: float, digits: int) -> list[str]:
    """Every formatter of an interval, on one (estimate, low, high)."""
    ci = {"value": estimate, "lo": lo, "hi": hi}
    d = {"diff": estimate, "lo": lo, "hi": hi, "metric": "ece"}
    r = BootstrapResult(estimate, lo, hi, 0.95, torch.zeros(1))
    conf = {"metric": "ece", "alpha": 0.05, "tests": {"ls": {"calibrator": "temperature", "p": 0.04, "p_holm": 0.04,
                                                              "confirmed": None, "detectable": 0.001, **d}}}
    return [data.fmt_interval(ci), data.fmt_delta(d), data.fmt_delta(d, "acc"), verdict._ci(ci, scale, digits),
            verdict._d(d, scale, digits), sets._fmt_d(d, scale, digits), posthoc._ci(r, scale, digits),
            posthoc._diff(r, "nll", scale, digits), paired._fmt_raw_delta(d, "ece"),
            *confirm.confirmatory_lines(conf)[1:]]  # [0]: the block's heading


def _check(text: str, where: str) -> int:
    found = TRIPLE.findall(text)
    for e, lo, hi in found:
        assert Decimal(lo) <= Decimal(e) <= Decimal(hi), (where, e, lo, hi, text)
    return len(found)


def test_every_rendered_interval_holds_its_estimate():
    rng = np.random.default_rng(7)
    checked = 0
    for estimate, lo, hi in _cases():
        assert lo <= estimate <= hi  # the producers' own promise, before any rounding
        scale, digits = (100.0, 2) if rng.random() < 0.5 else (1.0, int(rng.integers(2, 6)))
        cells = _rendered(estimate, lo, hi, scale, digits)
        for cell in cells:
            assert _check(cell, "cell") == 1, cell  # each formatter prints exactly one triple
        table = Table(["Method", *(f"c{i}" for i in range(len(cells)))], [["ls", *cells]])
        for where, text in (("terminal", text_table(table)), ("report.md", md_table(table)),
                            ("index.html", html_table(table))):
            checked += _check(text, where)
    assert checked == 300 * 3 * 10


@pytest.mark.parametrize("estimate, lo, hi", [(0.0069, 0.0, 0.0067), (-0.02, -0.019, 0.01), (0.5, 0.51, 0.6)])
def test_held_intervals_widen_only(estimate, lo, hi):
    """``holding`` extends an interval to the estimate and never narrows it (hand cases, the first
    the report's old ``0.69 [0.00, 0.67]``)."""
    low, high = holding(lo, hi, estimate)
    assert low == min(lo, estimate) and high == max(hi, estimate) and low <= lo and high >= hi
    assert data.fmt_interval({"value": estimate, "lo": low, "hi": high}) == (
        f"{estimate * 100:.2f} [{min(lo, estimate) * 100:.2f}, {max(hi, estimate) * 100:.2f}]")
    assert holding(lo, hi, float("nan")) == (lo, hi)


def test_a_seed_paired_interval_that_missed_its_estimate_now_holds_it():
    """Per-seed differences all 0.01 with resamples all far above (a skewed bootstrap): the basic
    interval ``[2 e - q_hi, 2 e - q_lo]`` lies wholly below ``e``; the reported one reaches it."""
    est = np.full(3, 0.01)
    samples = torch.full((3, 50), 0.03, dtype=torch.float64) + torch.linspace(0, 0.01, 50)
    basic = bootstrap_interval(samples.mean(0), 0.01, 0.95, "basic")
    assert basic[1] < 0.01  # the raw rule misses the estimate ...
    res = seed_paired_interval(est, samples, 0.95, seed=0, levels=1)
    assert res["lo"] == pytest.approx(basic[0], abs=1e-15) and res["hi"] == 0.01  # ... the reported one holds it
