"""The protocol every registered calibrator follows (one suite over ``CALIBRATORS``)."""

import numpy as np
import pytest
import torch

from calibkit.calibrators import CALIBRATORS, NotFittedError, ProbabilitiesAsLogitsWarning, load, save

NAMES = list(CALIBRATORS)


def _data(seed=0, n=400, k=5, scale=2.0, sharpen=2.5):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * scale
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    return sharpen * z, y


def test_registry_is_the_documented_table():
    assert NAMES == ["temperature", "vector", "matrix", "dirichlet", "ets", "histogram", "isotonic", "spline",
                     "scaling_binning", "platt", "beta", "bbq", "svs", "sms"]


@pytest.mark.parametrize("name", NAMES)
def test_protocol(name):
    cal = CALIBRATORS[name]()
    assert not any(k.endswith("_") for k in vars(cal))  # __init__ stores hyperparameters only
    before = set(vars(cal))
    assert repr(cal).startswith(type(cal).__name__ + "(")
    with pytest.raises(NotFittedError, match="not fitted yet"):
        cal.predict_proba(torch.zeros(3, 5))
    with pytest.raises(NotFittedError):
        cal.to_dict()
    z, y = _data()
    assert cal.fit(z, y) is cal
    added = set(vars(cal)) - before
    assert added and all(k.endswith("_") for k in added)  # learned state only in _-suffixed attributes
    assert set(vars(cal)) - added == before
    zt, _ = _data(seed=1, n=300)
    q = cal.predict_proba(zt)
    assert q.shape == zt.shape and q.dtype == torch.float64
    assert bool((q >= 0).all()) and not bool(q.isnan().any())
    torch.testing.assert_close(q.sum(1), torch.ones(300, dtype=torch.float64), rtol=0, atol=1e-12)
    # deterministic: a second fit gives bit-identical predictions
    assert torch.equal(CALIBRATORS[name]().fit(z, y).predict_proba(zt), q)
    # numpy inputs are accepted and give the same result
    assert torch.equal(CALIBRATORS[name]().fit(z.numpy(), y.numpy()).predict_proba(zt.numpy()), q)


@pytest.mark.parametrize("name", NAMES)
def test_output_dtype_follows_the_logits(name):
    z, y = _data()
    cal = CALIBRATORS[name]().fit(z.float(), y)
    assert cal.predict_proba(z.float()).dtype == torch.float32
    assert cal.predict_proba(z.half()).dtype == torch.float32  # half precision upcast
    ref = cal.predict_proba(z.float().double())
    torch.testing.assert_close(cal.predict_proba(z.float()), ref.float())  # computed in float64, rounded once


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", NAMES)
def test_cuda_matches_cpu(name):
    z, y = _data()
    cpu = CALIBRATORS[name]().fit(z, y)
    gpu = CALIBRATORS[name]().fit(z.cuda(), y.cuda())
    q = gpu.predict_proba(z.cuda())
    assert q.device.type == "cuda"
    torch.testing.assert_close(q.cpu(), cpu.predict_proba(z), rtol=0, atol=1e-6)
    torch.testing.assert_close(cpu.predict_proba(z.cuda()).cpu(), cpu.predict_proba(z), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_binary_scores_are_the_two_class_fit_on_0_z(name):
    g = torch.Generator().manual_seed(3)
    s = torch.randn(500, generator=g, dtype=torch.float64) * 2
    y = torch.bernoulli(torch.sigmoid(s), generator=g).long()
    one = CALIBRATORS[name]().fit(3 * s, y)
    pair = torch.stack([torch.zeros_like(s), 3 * s], 1)
    two = CALIBRATORS[name]().fit(pair, y)
    p = one.predict_proba(3 * s)
    assert p.shape == (500,) and bool(((p >= 0) & (p <= 1)).all())
    torch.testing.assert_close(p, two.predict_proba(pair)[:, 1], rtol=0, atol=1e-12)
    if name != "temperature":  # one scalar T applies to any layout
        with pytest.raises(ValueError, match=r"fitted on \(N,\) binary logits"):
            one.predict_proba(pair)
        with pytest.raises(ValueError, match=r"fitted on \(N, 2\) logits"):
            two.predict_proba(3 * s)
    with pytest.raises(ValueError, match="out of range"):
        CALIBRATORS[name]().fit(3 * s, y + 1)


@pytest.mark.parametrize("name", NAMES)
def test_two_classes(name):
    z, y = _data(k=2)
    q = CALIBRATORS[name]().fit(z, y).predict_proba(z)
    assert q.shape == z.shape
    torch.testing.assert_close(q.sum(1), torch.ones(len(z), dtype=torch.float64), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_save_load_round_trip_is_exact(name, tmp_path):
    z, y = _data()
    cal = CALIBRATORS[name]().fit(z, y)
    st, js = save(cal, tmp_path / "cal")
    assert st.name == "cal.safetensors" and js.name == "cal.json"
    for path in (tmp_path / "cal", js, st):
        back = load(path)
        assert type(back) is type(cal) and repr(back) == repr(cal)
        assert torch.equal(back.predict_proba(z), cal.predict_proba(z))
    d = cal.to_dict()
    assert torch.equal(type(cal).from_dict(d).predict_proba(z), cal.predict_proba(z))
    assert type(cal).from_dict({"params": d["params"]}).get_params() == cal.get_params()  # unfitted copy


@pytest.mark.parametrize("name", NAMES)
def test_bad_inputs(name):
    z, y = _data()
    cal = CALIBRATORS[name]()
    bad = z.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        cal.fit(bad, y)
    with pytest.raises(ValueError, match=r"out of range: found 5, expected values in \[0, 4\]"):
        cal.fit(z, torch.where(y == 0, 5, y))
    with pytest.raises(ValueError, match="out of range: found -1"):
        cal.fit(z, torch.where(y == 0, -1, y))
    with pytest.raises(ValueError, match="entries but the predictions have"):
        cal.fit(z, y[:-1])
    with pytest.raises(ValueError, match="look like probabilities"):
        cal.fit(torch.softmax(z, 1), y)
    with pytest.warns(ProbabilitiesAsLogitsWarning, match="every logit lies in"):
        CALIBRATORS[name]().fit(torch.sigmoid(z[:, 0]), (y == 0).long())
    assert not hasattr(cal, "n_classes_") and not any(k.endswith("_") for k in vars(cal))  # nothing half-fitted
    cal.fit(z, y)
    with pytest.raises(ValueError, match="NaN"):
        cal.predict_proba(bad)
    with pytest.raises(ValueError, match="K = 4 classes but this .* was fitted on K = 5"):
        cal.predict_proba(z[:, :4])
    with pytest.raises(ValueError, match=r"this .* was fitted on \(N, 5\) logits; got shape \(100,\)"):
        cal.predict_proba(z[:100, 0])
    with pytest.raises(ValueError, match="floating-point"):
        cal.predict_proba(z.long())


@pytest.mark.parametrize("name", NAMES)
def test_float32_logits_give_the_float64_prediction_rounded_once(name):
    z, y = _data()
    z32 = z.float()
    cal = CALIBRATORS[name]().fit(z32, y)
    q64 = cal.predict_proba(z32.double())
    assert q64.dtype == torch.float64
    assert torch.equal(cal.predict_proba(z32), q64.float())


def test_numpy_float32_probabilities_refused_for_every_calibrator():
    z, y = _data()
    p = np.asarray(torch.softmax(z, 1).float())
    for name in NAMES:
        with pytest.raises(ValueError, match=r"pass log\(probs\)"):
            CALIBRATORS[name]().fit(p, y.numpy())
        CALIBRATORS[name]().fit(np.log(p), y.numpy())  # log-probabilities are logits
