"""The status texts of the calibrator choice: values that read as different, where the interval lies, the rule."""

import pytest
import torch

from calibkit.calibrators.crossfit import NONE, CrossFitScore
from calibkit.calibrators.selection import SelectionRule, choose
from calibkit.calibrators.wording import accuracy_below, comparison_note, distinct, nll_above


@pytest.mark.parametrize("a, b", [(0.278741, 0.278692), (0.2787, 0.27870000001), (1.0, 1.0 + 2**-40),
                                  (123.45678, 0.5), (0.3, 0.3 + 1e-14)])
def test_distinct_prints_two_different_values_differently_at_the_fewest_digits(a, b):
    ta, tb = distinct(a, b)
    assert ta != tb
    assert float(ta) == pytest.approx(a, abs=10 ** -(len(ta.split(".")[1]) if "." in ta else 0) / 2 + 1e-15)
    # one decimal fewer (but never below the floor of 4) would print them equal
    decimals = len(ta.split(".")[1])
    if "e" not in ta and 4 < decimals <= 12:
        assert f"{a:.{decimals - 1}f}" == f"{b:.{decimals - 1}f}"
    assert distinct(a, a) == (f"{a:.4f}", f"{a:.4f}")


def test_the_nll_guard_names_both_values_the_reference_and_the_rule():
    text = nll_above(0.278741, 0.278692, "temperature")
    assert text == ("cross-fitted NLL 0.27874 is above temperature's 0.27869 (rule: under the ECE rule, a "
                    "calibrator whose NLL is above temperature's is not trusted on its ECE)")


def test_the_accuracy_guard_prints_the_drop_and_tolerance_apart():
    # a drop of 0.5004 points against a tolerance of 0.5: "0.50 ... (at most 0.50)" would read as no breach
    text = accuracy_below(0.894996, 0.9, 0.005)
    assert text == "accuracy 89.50% is 0.5004 points below the uncalibrated 90.00% (rule: at most 0.5000 points below)"


def test_comparison_notes_say_where_the_interval_lies():
    assert comparison_note("temperature", "ECE x100", 4.17, 3.9, 4.5) == (
        "significantly above temperature (worse): ECE x100 difference +4.1700 [+3.9000, +4.5000]; it replaces "
        "temperature only when the whole 95% interval is below 0")
    assert comparison_note("temperature", "ECE x100", -0.1, -0.3, 0.1) == (
        "not significantly below temperature: ECE x100 difference -0.1000 [-0.3000, +0.1000], the interval "
        "reaches 0; it replaces temperature only when the whole 95% interval is below 0")
    assert comparison_note("temperature", "NLL", -0.2, -0.3, -0.1).startswith("significantly below temperature")
    assert comparison_note("t", "NLL", 0.1) == "not below t on point estimates (no resamples): NLL difference +0.1000"


def test_the_uncalibrated_row_far_above_temperature_reads_as_significantly_worse():
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(300, generator=g, dtype=torch.float64) * 0.002

    def score(ece, nll, samples):
        return CrossFitScore(acc=0.9, ece=ece, nll=nll, brier=0.1, changed=0.0, samples=samples)

    sel = choose({NONE: score(0.0517, 0.40, 0.0517 + noise), "temperature": score(0.0100, 0.30, 0.0100 + noise),
                  "histogram": score(0.0090, 0.300004, 0.0090 + noise)}, SelectionRule(select_by="ece"))
    assert sel.chosen == "temperature"
    assert sel.notes[NONE].startswith("significantly above temperature (worse): ECE x100 difference +4.1700 [")
    # the NLL guard: 0.300004 vs 0.3 would both print 0.3000
    assert sel.excluded["histogram"].startswith("cross-fitted NLL 0.300004 is above temperature's 0.300000")
