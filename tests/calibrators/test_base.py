"""The protocol every registered calibrator follows (one suite over ``CALIBRATORS``)."""

import inspect
import os
import re

import numpy as np
import pytest
import torch

from calibkit import calibrators
from calibkit.calibrators import CALIBRATORS, NotFittedError, ProbabilitiesAsLogitsWarning, load, save
from calibkit.calibrators._base import Calibrator, param_names
from tests.conftest import ROOT

NAMES = list(CALIBRATORS)


def _data(seed=0, n=400, k=5, scale=2.0, sharpen=2.5):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * scale
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    return sharpen * z, y


def _documented_table() -> list[tuple[str, str]]:
    """``(name, class)`` of each row of the table of calibrators in docs/calibrators.md, in order."""
    with open(os.path.join(ROOT, "docs", "calibrators.md")) as f:
        text = f.read()
    return re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|", text, flags=re.M)


def test_registry_is_the_documented_table():
    assert _documented_table() == [(name, cls.__name__) for name, cls in CALIBRATORS.items()]
    assert {cls.__name__ for cls in CALIBRATORS.values()} <= set(calibrators.__all__)


@pytest.mark.parametrize("name", NAMES)
def test_each_calibrator_has_its_family_tests(name):
    """Each registered class is named in the test module of its family (``test_<module>.py``)."""
    cls = CALIBRATORS[name]
    family = cls.__module__.rpartition(".")[2]
    path = os.path.join(ROOT, "tests", "calibrators", f"test_{family}.py")
    assert os.path.isfile(path), f"{name}: no {path}"
    with open(path) as f:
        text = f.read()
    assert cls.__name__ in text or f'"{name}"' in text, f"{name}: {path} never names it"


@pytest.mark.parametrize("name", NAMES)
def test_hyperparameters_are_the_init_arguments(name):
    """``get_params``, ``repr`` and ``from_dict`` follow the ``__init__`` signature: every argument is
    stored under its own name and read back in signature order (the save/load round trip checks
    the saved ``params``)."""
    cls = CALIBRATORS[name]
    signature = [p for p in inspect.signature(cls.__init__).parameters.values()][1:]
    assert signature and all(p.default is not p.empty for p in signature)  # CALIBRATORS[name]() works
    marks = {p.name: f"<{p.name}>" for p in signature}  # a distinct value per argument
    cal = cls(**marks)
    assert list(cal.get_params().items()) == list(marks.items())
    assert repr(cal).startswith(f"{cls.__name__}(")
    assert [k for k in cls().get_params()] == [p.name for p in signature]
    assert {k: v for k, v in cls().get_params().items()} == {p.name: p.default for p in signature}
    back = cls.from_dict({"params": dict(marks)})  # unfitted: the hyperparameters only
    assert list(back.get_params().items()) == list(marks.items()) and not hasattr(back, "n_classes_")
    with pytest.raises(ValueError, match=r"unknown hyperparameter\(s\) nope$"):
        cls.from_dict({"params": {**marks, "nope": 1}})


def test_param_names_reads_the_signature():
    class Plain(Calibrator):
        pass

    class Two(Calibrator):
        def __init__(self, b: int = 1, *, a: float = 2.0):
            self.b, self.a = b, a

    class Loose(Calibrator):
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    assert param_names(Plain) == () and param_names(Two) == ("b", "a")
    assert Two(a=5.0).get_params() == {"b": 1, "a": 5.0}
    with pytest.raises(TypeError, match=r"^Loose.__init__ takes \*kwargs: a calibrator's hyperparameters must "
                                        r"be named$"):
        param_names(Loose)


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
    # numpy inputs are accepted and give the same result, as a numpy array
    qn = CALIBRATORS[name]().fit(z.numpy(), y.numpy()).predict_proba(zt.numpy())
    assert isinstance(qn, np.ndarray) and np.array_equal(qn, q.numpy())


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
