"""Pins of the tuning rule (calibkit.bench.selection_rule): several winners, ties, a non-default
metric and criterion, and the printed description."""

from calibkit.bench.grid import Axis
from calibkit.bench.selection_rule import Criterion, eligible, select

SPACE = {"loss.alpha": Axis((0.0, 0.1, 0.2, 0.3, 0.4), 0.2)}


def _c(alpha, acc, n=5000, **metrics):
    return {"hparams": {"loss.alpha": alpha}, "metrics": {"acc": acc, "n": n, **metrics}}


def test_of_several_candidates_in_the_window_the_lowest_metric_wins_wherever_it_sits():
    for order in ((0, 1, 2, 3), (3, 2, 1, 0), (1, 3, 0, 2)):
        base = [_c(0.0, 0.90, ece=0.030), _c(0.1, 0.899, ece=0.010), _c(0.3, 0.898, ece=0.020),
                _c(0.4, 0.897, ece=0.040)]
        cands = [base[i] for i in order]
        assert cands[select(cands, SPACE)]["hparams"]["loss.alpha"] == 0.1, order


def test_ties_go_to_the_published_value_then_to_grid_order():
    tied = [_c(0.0, 0.90, ece=0.0200), _c(0.2, 0.90, ece=0.02009), _c(0.4, 0.90, ece=0.0201)]
    assert select(tied, SPACE) == 1  # within tie (1e-4) of the best, nearest the published 0.2
    quarters = {"loss.alpha": Axis((0.0, 0.25, 0.5, 0.75, 1.0), 0.5)}  # exact in binary: equal distances
    equal_distance = [_c(0.25, 0.90, ece=0.02), _c(0.75, 0.90, ece=0.02)]
    assert select(equal_distance, quarters) == 0  # equally far from 0.5: the first in grid order
    assert select(equal_distance[::-1], quarters) == 0
    just_outside = [_c(0.0, 0.90, ece=0.0200), _c(0.2, 0.90, ece=0.02011)]
    assert select(just_outside, SPACE) == 0  # 1.1e-4 above the best: not tied


def test_a_non_default_metric_and_window_choose_differently():
    cands = [_c(0.0, 0.90, ece=0.010, nll=0.40), _c(0.1, 0.90, ece=0.020, nll=0.30),
             _c(0.3, 0.87, ece=0.005, nll=0.20)]
    assert select(cands, SPACE) == 0  # 3 points below on 5,000 images: out (window 1.2 points)
    assert select(cands, SPACE, Criterion(metric="nll")) == 1
    assert select(cands, SPACE, Criterion(max_acc_drop=0.05)) == 2  # a 5-point floor lets it in
    assert eligible(cands, Criterion(max_acc_drop=0.05, metric="nll")) == [0, 1, 2]
    assert select(cands, SPACE, Criterion(metric="nll", max_acc_drop=0.05, n_bins=30)) == 2
    assert Criterion().describe() == ("candidates below the best by > 1 accuracy point and > 1.96 standard errors of "
                                      "the accuracy difference excluded")
    assert Criterion(acc_z=0.0, max_acc_drop=0.05).describe() == "candidates > 5 accuracy point below the best excluded"


def test_the_window_and_tie_boundaries_are_inclusive():
    # floor alone (acc_z = 0): a candidate exactly at best - floor (within float rounding) stays eligible
    crit = Criterion(max_acc_drop=0.25, acc_z=0.0)
    at_edge = [_c(0.0, 0.5, ece=0.03), _c(0.1, 0.5 - 0.25 - 1e-12, ece=0.01), _c(0.3, 0.5 - 0.25 - 5e-12, ece=0.0)]
    assert eligible(at_edge, crit) == [0, 1]
    assert select(at_edge, SPACE, crit) == 1
    # a metric exactly best + tie is tied: the published value wins
    edge_tie = [_c(0.0, 0.9, ece=0.02), _c(0.2, 0.9, ece=0.02 + 1e-4)]
    assert select(edge_tie, SPACE) == 1


def test_distances_from_the_published_values_are_summed_in_units_of_each_axis_range():
    import pytest

    space = {"a": Axis((2.0, 12.0), 7.0), "b": Axis((1.0, 2.0), 1.5)}
    # candidate 0 is 1.5 / 10 = 0.15 from the published values, candidate 1 is 0.2 / 1 = 0.2: 0 wins the tie
    cands = [{"hparams": {"a": 8.5, "b": 1.5}, "metrics": {"acc": 0.9, "ece": 0.02}},
             {"hparams": {"a": 7.0, "b": 1.7}, "metrics": {"acc": 0.9, "ece": 0.02}}]
    assert select(cands, space) == 0
    assert select(cands[::-1], space) == 1
    both = [{"hparams": {"a": 8.0, "b": 1.6}, "metrics": {"acc": 0.9, "ece": 0.02}},   # 0.1 + 0.1
            {"hparams": {"a": 7.0, "b": 1.65}, "metrics": {"acc": 0.9, "ece": 0.02}}]  # 0 + 0.15
    assert select(both, space) == 1  # the sum over axes, not the last axis alone
    with pytest.raises(ValueError) as refused:
        select([], space)
    assert str(refused.value) == "no finished candidates to select from"
