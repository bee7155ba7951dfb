"""Pins of the calibrator choice: several eligible winners, ties, non-default rules and bins, and the
printed sentence (calibkit.calibrators.selection, calibkit.report.posthoc)."""

from dataclasses import replace

import pytest
import torch

import calibkit.functional as F
from calibkit.calibrators.crossfit import cross_fit_predictions, with_samples
from calibkit.calibrators.selection import NONE, CrossFitScore, SelectionRule, choose, cross_fit
from calibkit.report.posthoc import validation_table

BASE = dict(acc=0.90, ece=0.06, nll=0.50, brier=0.20, changed=0.0)

#: The mechanisms pinned here, with temperature scaling as the default (the library's anchors are
#: tested in test_selection.py): the lowest metric, and the significance step.
LOWEST = SelectionRule(default="temperature", significance=False)
TS_STEP = SelectionRule(default="temperature", significance=True)


def _noise(seed=0, n=400):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _scored(values: dict, metric="nll", sd=0.001):
    """Scores whose resampled ``metric`` is the value plus one shared noise (paired differences
    have no spread: every difference of values is significant)."""
    e = _noise()
    out = {}
    for name, v in values.items():
        s = CrossFitScore(**dict(BASE, **{metric: v}))
        out[name] = replace(s, samples=v + sd * e)
    return out


def test_of_several_significant_winners_the_lowest_metric_wins_not_the_last():
    scores = _scored({NONE: 0.50, "temperature": 0.40, "vector": 0.35, "sms": 0.30, "spline": 0.33})
    sel = choose(scores, LOWEST)
    assert sel.chosen == "sms"
    assert sel.ranking == ["sms", "spline", "vector", "temperature", NONE]
    assert list(sel.notes) == [NONE]  # every challenger but the uncalibrated model beat the default
    text = validation_table(sel)
    assert "| sms | 6.00 | 0.3000 | 0.2000 | 90.00 | 0.00 | **chosen** |" in text
    assert "| spline | 6.00 | 0.3300 | 0.2000 | 90.00 | 0.00 | eligible, #2 |" in text
    assert "| temperature | 6.00 | 0.4000 | 0.2000 | 90.00 | 0.00 | eligible, #4 (the default) |" in text


def test_a_tie_between_winners_goes_to_the_first_in_registry_order_and_a_tie_with_the_default_to_the_default():
    tied = _scored({NONE: 0.50, "temperature": 0.40, "vector": 0.30, "matrix": 0.30})
    sel = choose(tied, LOWEST)
    assert sel.chosen == "vector" and sel.ranking[:2] == ["vector", "matrix"]
    swapped = {k: tied[k] for k in (NONE, "temperature", "matrix", "vector")}
    assert choose(swapped, LOWEST).chosen == "matrix"  # the order of the candidates decides a tie, nothing else
    # a challenger equal to the default (to float rounding) never displaces it, with or without significance
    equal = _scored({NONE: 0.50, "temperature": 0.40, "vector": 0.40 - 1e-16})
    for rule in (TS_STEP, LOWEST):
        got = choose(equal, rule)
        assert got.chosen == "temperature" and got.ranking[0] == "temperature", rule


def test_a_non_default_rule_ranks_by_its_own_metric():
    e = _noise()
    # SMS lowest in Brier, spline lowest in NLL; both significantly below TS in either
    vals = {NONE: (0.50, 0.20), "temperature": (0.40, 0.18), "spline": (0.30, 0.17), "sms": (0.33, 0.15)}
    scores = {n: CrossFitScore(**dict(BASE, nll=a, brier=b)) for n, (a, b) in vals.items()}
    nll = {n: replace(s, samples=s.nll + 0.001 * e) for n, s in scores.items()}
    brier = {n: replace(s, samples=s.brier + 0.001 * e) for n, s in scores.items()}
    assert choose(nll, LOWEST).chosen == "spline"
    sel = choose(brier, replace(LOWEST, select_by="brier"))
    assert sel.chosen == "sms" and sel.ranking == ["sms", "spline", "temperature", NONE]
    assert sel.rule.describe().startswith("the lowest 5-fold cross-fitted BRIER")
    assert SelectionRule(select_by="ece").describe().startswith("temperature unless another calibrator")
    # without the significance step the lowest point estimate wins even inside the noise
    noisy = {n: replace(s, samples=s.nll + 0.2 * _noise(i)) for i, (n, s) in enumerate(scores.items())}
    assert choose(noisy, TS_STEP).chosen == "temperature"
    lowest = choose(noisy, LOWEST)
    assert lowest.chosen == "spline"
    assert lowest.rule.describe().startswith("the lowest 5-fold cross-fitted NLL")


def test_an_insignificant_challenger_is_named_with_its_interval_in_the_printed_table():
    e = _noise()
    scores = {NONE: CrossFitScore(**BASE), "temperature": CrossFitScore(**dict(BASE, nll=0.40)),
              "sms": CrossFitScore(**dict(BASE, nll=0.39))}
    scores = {n: replace(s, samples=s.nll + 0.05 * _noise(i)) for i, (n, s) in enumerate(scores.items())}
    del e
    sel = choose(scores, TS_STEP)
    assert sel.chosen == "temperature"
    assert sel.notes["sms"].startswith("not significantly below temperature: NLL difference -0.0100 [")
    assert f"| sms | 6.00 | 0.3900 | 0.2000 | 90.00 | 0.00 | {sel.notes['sms']} |" in validation_table(sel)


def _data(n=900, k=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    return 3 * z, y


@pytest.mark.parametrize("n_bins", [7, 30])
def test_cross_fitting_scores_the_ece_with_the_rules_bins(n_bins):
    z, y = _data()
    rule = SelectionRule(select_by="ece", n_bins=n_bins, n_folds=3, n_boot=50)
    scores, _ = cross_fit(z, y, ["temperature"], rule)
    _, _, oof, _ = cross_fit_predictions(z, y, ["temperature"], rule)
    for name in (NONE, "temperature"):
        want = float(F.ece(oof[name], y, n_bins=n_bins))
        assert scores[name].ece == pytest.approx(want, abs=1e-12)
        assert abs(want - float(F.ece(oof[name], y, n_bins=15))) > 1e-6  # the bins matter for these data
    from calibkit.bootstrap import bootstrap_ci

    direct = bootstrap_ci("ece", oof[NONE], y, n_resamples=50, seed=0, n_bins=n_bins).samples
    assert torch.allclose(scores[NONE].samples, direct, atol=1e-12)  # the resamples use the rule's bins too


def test_one_cross_fitting_serves_every_rule():
    z, y = _data(n=600)
    scores, fitted, oof, yy = cross_fit_predictions(z, y, ["temperature", "vector"], SelectionRule(n_folds=3))
    for metric in ("ece", "nll", "brier"):
        rule = SelectionRule(select_by=metric, n_folds=3, n_boot=40)
        direct, _ = cross_fit(z, y, ["temperature", "vector"], rule)
        again = with_samples(scores, oof, yy, rule)
        for name in direct:
            assert torch.allclose(again[name].samples, direct[name].samples, atol=1e-12)
            assert again[name].nll == pytest.approx(direct[name].nll, abs=1e-12)
    assert set(fitted) == {"temperature", "vector"}
