"""CalibratedModel: calibrated outputs equal the calibrator applied to the model's logits, and both
ways of saving (state_dict, save/load directory) give identical outputs after loading."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from calibkit.calibrators import CALIBRATORS, HistogramBinning, TemperatureScaling, VectorScaling
from calibkit.errors import UserError
from calibkit.integrations.model import CalibratedModel

pytestmark = pytest.mark.usefixtures("one_thread")


def _net(seed=0, k=4):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, k))


def _fitted(cal, net, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(300, 6, generator=g)
    with torch.no_grad():
        z = 3 * net(x)  # over-confident logits
    y = torch.multinomial(torch.softmax(z / 3, 1), 1, generator=g).squeeze(1)
    net[2].weight.data *= 3
    net[2].bias.data *= 3
    return cal.fit(z.double(), y), x


def test_outputs_are_the_calibrator_applied_to_the_logits():
    net = _net()
    ts, x = _fitted(TemperatureScaling(), net)
    cm = CalibratedModel(net, ts).eval()
    with torch.no_grad():
        z = net(x)
        p = cm(x)
        torch.testing.assert_close(p, torch.softmax(z.double() / ts.temperature_, 1).float())
        torch.testing.assert_close(cm.logits(x), z / ts.temperature_)
    vs, _ = _fitted(VectorScaling(), _net())
    cm = CalibratedModel(net, vs).eval()
    with torch.no_grad():
        q = cm(x)
        torch.testing.assert_close(q, vs.predict_proba(net(x)), rtol=0, atol=0)
        # log p as logits: their softmax gives the calibrated probabilities back
        torch.testing.assert_close(torch.softmax(cm.logits(x), 1), q, rtol=1e-6, atol=1e-7)


def test_model_returning_a_tuple_and_bad_arguments():
    class WithFeatures(nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net(x), x

    net = _net()
    ts, x = _fitted(TemperatureScaling(), net)
    with torch.no_grad():
        torch.testing.assert_close(CalibratedModel(WithFeatures(net), ts)(x), CalibratedModel(net, ts)(x))
    with pytest.raises(UserError, match="takes an nn.Module"):
        CalibratedModel(lambda x: x, ts)
    with pytest.raises(UserError, match="not a registered calibrator"):
        CalibratedModel(net, object())


@pytest.mark.parametrize("name", ["temperature", "vector", "histogram", "dirichlet"])
def test_state_dict_round_trip_gives_identical_outputs(name):
    net = _net()
    cal, x = _fitted(CALIBRATORS[name](), net)
    cm = CalibratedModel(net, cal).eval()
    buf = io.BytesIO()
    torch.save(cm.state_dict(), buf)
    buf.seek(0)
    # a fresh wrapper: other weights and an unfitted calibrator of another kind
    other = CalibratedModel(_net(seed=5), HistogramBinning()).eval()
    other.load_state_dict(torch.load(buf))  # weights_only loading: plain tensors and python values
    assert type(other.calibrator) is type(cal)
    with torch.no_grad():
        assert torch.equal(other(x), cm(x))


def test_save_and_load_a_directory(tmp_path):
    net = _net()
    cal, x = _fitted(VectorScaling(), net)
    cm = CalibratedModel(net, cal).eval()
    out = cm.save(tmp_path / "served")
    assert sorted(p.name for p in out.iterdir()) == ["calibrator.json", "calibrator.safetensors", "model.safetensors"]
    back = CalibratedModel.load(out, _net(seed=9)).eval()
    with torch.no_grad():
        assert torch.equal(back(x), cm(x))
    with pytest.raises(UserError, match="model.safetensors not found"):
        CalibratedModel.load(tmp_path, _net())
    with pytest.raises(ValueError, match="not fitted"):
        CalibratedModel(net, VectorScaling()).save(tmp_path / "unfitted")


def test_unfitted_calibrator_travels_in_the_state_dict_and_a_bad_one_is_refused():
    cm = CalibratedModel(_net(), VectorScaling(max_iter=7))
    other = CalibratedModel(_net(), TemperatureScaling())
    other.load_state_dict(cm.state_dict())
    assert isinstance(other.calibrator, VectorScaling) and other.calibrator.max_iter == 7
    net = _net()
    cal, _ = _fitted(VectorScaling(), net)
    state = CalibratedModel(net, cal).state_dict()
    state["_extra_state"]["state"]["weight_"] = torch.full((4,), float("nan"), dtype=torch.float64)
    with pytest.raises(UserError, match="weight_"):
        CalibratedModel(_net(), TemperatureScaling()).load_state_dict(state)
    state["_extra_state"]["calibrator"] = "nope"
    with pytest.raises(UserError, match="'nope' is not one of"):
        CalibratedModel(_net(), TemperatureScaling()).load_state_dict(state)
