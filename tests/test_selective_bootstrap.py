"""AURC / AUGRC from count vectors against the functional metrics on explicitly resampled rows."""

import numpy as np
import pytest
import torch

from calibkit.bootstrap import count_draws
from calibkit.functional.selective import augrc, aurc
from calibkit.selective_bootstrap import SelectiveRows, resampled_selective


def _model(n=300, k=4, seed=0, ties=True):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(n, k, generator=g) * 2, 1)
    if ties:  # a block of equal rows and a few rounded confidences: tied groups with mixed errors
        p[:40] = p[0]
        p[40:80] = torch.round(p[40:80] * 4) / 4 + 1e-9
        p[40:80] = p[40:80] / p[40:80].sum(1, keepdim=True)
    y = torch.randint(0, k, (n,), generator=g)
    return p, y


def _rows(p, y):
    return SelectiveRows(p.max(1).values, (p.argmax(1) != y).double())


@pytest.mark.parametrize("ties", [False, True])
def test_unit_counts_give_the_functional_values(ties):
    p, y = _model(ties=ties)
    r = _rows(p, y)
    ones = torch.ones(1, len(y), dtype=torch.float64)
    assert float(r.aurc(ones)[0]) == pytest.approx(float(aurc(p, y)), abs=1e-12)
    assert float(r.augrc(ones)[0]) == pytest.approx(float(augrc(p, y)), abs=1e-12)


@pytest.mark.parametrize("ties", [False, True])
def test_resampled_values_equal_the_metric_on_the_drawn_rows(ties):
    p, y = _model(ties=ties, seed=3)
    r = _rows(p, y)
    for idx, W in count_draws(len(y), 6, seed=5):
        got_aurc, got_augrc = r.aurc(W), r.augrc(W)
        for j, rows in enumerate(idx):
            assert float(got_aurc[j]) == pytest.approx(float(aurc(p[rows], y[rows])), abs=1e-12)
            assert float(got_augrc[j]) == pytest.approx(float(augrc(p[rows], y[rows])), abs=1e-12)


def test_hand_case_with_a_duplicated_row():
    # confidences 0.9 (correct), 0.8 (error), 0.7 (correct); resample = rows 0, 1, 1 (row 2 absent).
    # Ranked: 0.9 (ok), then the two copies of 0.8 (errors, tied): E(1) = 0, E(2) = 1, E(3) = 2.
    r = SelectiveRows(torch.tensor([0.9, 0.8, 0.7]), torch.tensor([0.0, 1.0, 0.0]))
    W = torch.tensor([[1.0, 2.0, 0.0]], dtype=torch.float64)
    assert float(r.aurc(W)[0]) == pytest.approx((0 / 1 + 1 / 2 + 2 / 3) / 3)
    assert float(r.augrc(W)[0]) == pytest.approx((0 + 1 + 2) / 9)


def test_shared_draws_pair_two_models():
    p, y = _model(seed=1)
    q = torch.softmax(torch.log(p) / 2, 1)  # same ranking of most rows, other confidences
    out = resampled_selective([_rows(p, y), _rows(q, y)], n_resamples=50, seed=2)
    assert out["aurc"].shape == (2, 50) and out["augrc"].shape == (2, 50)
    # a third call with one model reproduces its row: the draws depend on (n, R, seed) only
    again = resampled_selective([_rows(q, y)], n_resamples=50, seed=2, metrics=("aurc",))
    assert torch.equal(again["aurc"][0], out["aurc"][1])
    assert set(again) == {"aurc"}


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="one shape"):
        SelectiveRows(torch.rand(3), torch.rand(4))
    with pytest.raises(ValueError, match="same number"):
        resampled_selective([SelectiveRows(torch.rand(3), torch.zeros(3)),
                             SelectiveRows(torch.rand(4), torch.zeros(4))])
    with pytest.raises(ValueError, match="unknown metric"):
        resampled_selective([SelectiveRows(torch.rand(3), torch.zeros(3))], metrics=("auroc",))


def test_count_draws_are_the_panel_bootstrap_draws():
    """count_draws is the draw of calibkit.bootstrap: the accuracy resamples from its counts equal
    bootstrap_ci's resampled accuracies."""
    from calibkit.bootstrap import bootstrap_ci

    p, y = _model(seed=4, ties=False)
    correct = (p.argmax(1) == y).double()
    ours = torch.cat([W @ correct / len(y) for _, W in count_draws(len(y), 40, seed=9)])
    theirs = bootstrap_ci("acc", p, y, n_resamples=40, seed=9).samples
    assert np.allclose(ours.numpy(), np.asarray(theirs, dtype=np.float64), atol=1e-12)
