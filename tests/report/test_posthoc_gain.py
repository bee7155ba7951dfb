"""The post-hoc improvement of the proper scores in calibrate's test table (calibkit.report.posthoc)."""

import math

import pytest
import torch

from calibkit.metrics import evaluate
from calibkit.report import posthoc
from calibkit.report.posthoc import gain


def test_gain_is_the_relative_decrease_from_the_uncalibrated_score():
    assert gain(0.40, 0.30) == pytest.approx(0.25)
    assert gain(0.40, 0.50) == pytest.approx(-0.25)  # worse than uncalibrated: negative
    assert math.isnan(gain(0.0, 0.0))


def test_the_test_table_prints_each_calibrators_nll_and_brier_gain():
    from calibkit.bootstrap import bootstrap_cis

    g = torch.Generator().manual_seed(0)
    z = torch.randn(400, 3, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    probs = {"none": torch.softmax(3 * z, 1), "temperature": torch.softmax(z, 1)}
    panels = {n: evaluate(p, y) for n, p in probs.items()}
    cis, diffs = bootstrap_cis("ece", probs, y, reference="temperature", n_resamples=20, seed=0)
    rows = posthoc.test_rows(probs, y, cis, diffs, panels, {})
    by = {r["calibrator"]: r for r in rows}
    nll0, nll1 = float(panels["none"]["nll"]), float(panels["temperature"]["nll"])
    b0, b1 = float(panels["none"]["brier"]), float(panels["temperature"]["brier"])
    assert by["temperature"]["nll_gain"] == pytest.approx((nll0 - nll1) / nll0)
    assert by["temperature"]["brier_gain"] == pytest.approx((b0 - b1) / b0)
    assert by["none"]["nll_gain"] == 0.0
    text = posthoc.test_table(rows, "temperature")
    assert "| NLL / Brier gain % |" in text.splitlines()[2]
    assert f"| {100 * (nll0 - nll1) / nll0:+.1f} / {100 * (b0 - b1) / b0:+.1f} |" in text
    assert "NLL / Brier gain %: the post-hoc improvement of each proper score" in text
