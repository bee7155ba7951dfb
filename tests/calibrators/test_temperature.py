"""Temperature scaling's pitfalls: probabilities passed as logits; its saved state."""

import warnings

import numpy as np
import pytest
import torch

from calibkit.calibrators import ProbabilitiesAsLogitsWarning, TemperatureScaling


def _data(seed=0, n=2000, k=10):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * 2
    return 3 * z, torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)


def test_probability_rows_are_refused_instead_of_a_silent_wrong_temperature():
    z, y = _data()
    p = torch.softmax(z, 1)
    for probs in (p, p.float(), p.numpy(), p[:, None, :, None].transpose(1, 2)):  # also dense (N, K, 1, 1)
        with pytest.raises(ValueError, match=r"look like probabilities .* pass log\(probs\)"):
            TemperatureScaling().fit(probs, y if torch.as_tensor(probs).dim() == 2 else y[:, None, None])
    # the advice works: log-probabilities are logits with the same softmax (and the same T)
    assert TemperatureScaling().fit(p.log(), y).temperature_ == pytest.approx(
        TemperatureScaling().fit(z, y).temperature_, rel=1e-9)


def test_values_in_unit_interval_warn():
    z, y = _data()
    s = torch.sigmoid(z[:, 0])
    with pytest.warns(ProbabilitiesAsLogitsWarning, match=r"logit\(p\)"):
        TemperatureScaling().fit(s, (y == 0).long())  # binary probabilities as scores
    rows = torch.rand(100, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with pytest.warns(ProbabilitiesAsLogitsWarning, match=r"log\(probs\)"):
        TemperatureScaling().fit(rows, y[:100] % 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProbabilitiesAsLogitsWarning)
        TemperatureScaling().fit(z, y)  # ordinary logits: silent
        TemperatureScaling().fit(torch.zeros(5, 3), torch.tensor([0, 1, 2, 0, 1]))  # constant: no signal either way


def test_to_dict_and_from_dict():
    z, y = _data()
    ts = TemperatureScaling(objective="ece", n_bins=10).fit(z, y)
    d = ts.to_dict()
    assert d == {"params": {"objective": "ece", "n_bins": 10, "t_min": 0.01, "t_max": 100.0},
                 "state": {"temperature_": ts.temperature_, "n_iter_": 100, "n_classes_": z.shape[1], "binary_": False}}
    back = TemperatureScaling.from_dict(d)
    assert back.temperature_ == ts.temperature_ and repr(back) == repr(ts)
    with pytest.raises(ValueError, match="unknown hyperparameter"):
        TemperatureScaling.from_dict({"params": {"temp": 1}, "state": {}})
    with pytest.raises(ValueError, match="saved state lacks n_iter_, n_classes_, binary_"):
        TemperatureScaling.from_dict({"params": {}, "state": {"temperature_": 2.0}})
    with pytest.raises(ValueError, match="saved state lacks n_classes_, binary_"):  # written before K was recorded
        TemperatureScaling.from_dict({"params": {}, "state": {"temperature_": 2.0, "n_iter_": 3}})
    assert np.isclose(back.predict_proba(z).sum(1), 1).all()


def test_predictions_are_computed_in_float64_and_rounded_once():
    z, y = _data()
    z32 = z.float()
    ts = TemperatureScaling().fit(z32, y)
    t = ts.temperature_
    want = torch.softmax(z32.double() / t, 1)  # the float64 computation on the exact upcast
    assert torch.equal(ts.predict_proba(z32), want.float())
    assert torch.equal(ts.predict_proba(z32.double()), want)
    assert not torch.equal(torch.softmax(z32 / t, 1), want.float())  # float32 arithmetic differs
    assert torch.equal(ts.transform(z32), (z32.double() / t).float())
    dense = z32[:12].reshape(3, 4, 10).permute(0, 2, 1)  # (3, K = 10, 4)
    assert torch.equal(ts.predict_proba(dense), torch.softmax(dense.double() / t, 1).float())
    zb, yb = 3 * z[:, 0], (y == 0).long()
    tb = TemperatureScaling().fit(zb.float(), yb)
    assert torch.equal(tb.predict_proba(zb.float()), torch.sigmoid(zb.float().double() / tb.temperature_).float())
    assert ts.predict_proba(z32.half()).dtype == torch.float32


def test_refuses_another_k_or_layout():
    z, y = _data()
    ts = TemperatureScaling().fit(z, y)
    assert (ts.n_classes_, ts.binary_) == (10, False)
    with pytest.raises(ValueError, match="logits have K = 7 classes but this TemperatureScaling was fitted on K = 10"):
        ts.predict_proba(z[:, :7])
    with pytest.raises(ValueError, match=r"was fitted on \(N, 10\) logits; got shape \(2000,\)"):
        ts.transform(z[:, 0])
    tb = TemperatureScaling().fit(z[:, 0], (y == 0).long())
    assert (tb.n_classes_, tb.binary_) == (2, True)
    with pytest.raises(ValueError, match=r"was fitted on \(N,\) binary logits; got shape \(2000, 2\)"):
        tb.predict_proba(z[:, :2])
