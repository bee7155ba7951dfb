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
                 "state": {"temperature_": ts.temperature_, "n_iter_": 100}}
    back = TemperatureScaling.from_dict(d)
    assert back.temperature_ == ts.temperature_ and repr(back) == repr(ts)
    with pytest.raises(ValueError, match="unknown hyperparameter"):
        TemperatureScaling.from_dict({"params": {"temp": 1}, "state": {}})
    with pytest.raises(ValueError, match="saved state lacks n_iter_"):
        TemperatureScaling.from_dict({"params": {}, "state": {"temperature_": 2.0}})
    assert np.isclose(back.predict_proba(z).sum(1), 1).all()
