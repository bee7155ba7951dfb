"""Every registered calibrator follows scikit-learn's estimator protocol and the numpy/torch rule.

Loops over the registry, so a calibrator added to it later is covered without a new test:
``sklearn.base.clone``, ``get_params(deep=...)`` / ``set_params``, pickling (fitted and unfitted),
numpy in -> numpy out, torch in -> torch out.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from sklearn.base import clone

from calibkit.calibrators import CALIBRATORS
from calibkit.calibrators._base import param_names
from calibkit.errors import UserError

NAMES = list(CALIBRATORS)
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny fits: OpenMP threads cost more than they give


def _data(n: int = 400, k: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    return 1.5 * z, y


@pytest.mark.parametrize("name", NAMES)
def test_clone_gives_an_unfitted_copy_with_the_same_hyperparameters(name):
    cal = CALIBRATORS[name]()
    z, y = _data()
    cal.fit(z, y)
    twin = clone(cal)  # sklearn checks that every get_params value passes through __init__ unchanged
    assert type(twin) is type(cal) and twin is not cal
    assert twin.get_params(deep=False) == cal.get_params(deep=False)
    assert not hasattr(twin, "n_classes_")  # clone copies hyperparameters, never the fit
    # the clone refits to the same predictions (every calibrator is deterministic)
    torch.testing.assert_close(twin.fit(z, y).predict_proba(z), cal.predict_proba(z), rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_get_params_and_set_params_round_trip(name):
    cls = CALIBRATORS[name]
    cal = cls()
    params = cal.get_params(deep=True)
    assert list(params) == list(param_names(cls)) == list(cal.get_params(deep=False))
    assert cal.set_params(**params) is cal
    assert cal.get_params() == params
    other = cls().set_params(**params)
    assert other.get_params() == params
    if params:  # a changed value is read back, and its __init__ form matches
        key, value = next(iter(params.items()))
        marker = object()
        assert cls().set_params(**{key: marker}).get_params()[key] is marker
        assert cls(**{key: value}).get_params()[key] == value
    with pytest.raises(UserError, match="no hyperparameter 'not_a_parameter'"):
        cal.set_params(not_a_parameter=1)


@pytest.mark.parametrize("name", NAMES)
def test_set_params_changes_the_fit(name):
    """A hyperparameter set by ``set_params`` is the one ``fit`` uses: the fit equals one made
    by passing the same value to ``__init__``."""
    cls = CALIBRATORS[name]
    params = cls().get_params()
    if not params:
        pytest.skip(f"{name} has no hyperparameters")
    z, y = _data()
    via_init = cls(**params).fit(z, y).predict_proba(z)
    via_set = cls().set_params(**params).fit(z, y).predict_proba(z)
    torch.testing.assert_close(via_set, via_init, rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_pickle_round_trips_fitted_and_unfitted(name):
    cls = CALIBRATORS[name]
    unfitted = pickle.loads(pickle.dumps(cls()))
    assert type(unfitted) is cls and unfitted.get_params() == cls().get_params()
    z, y = _data()
    cal = cls().fit(z, y)
    back = pickle.loads(pickle.dumps(cal))
    zt, _ = _data(seed=1, n=200)
    torch.testing.assert_close(back.predict_proba(zt), cal.predict_proba(zt), rtol=0, atol=0)
    # the unfitted copy fits like a fresh one
    torch.testing.assert_close(unfitted.fit(z, y).predict_proba(zt), cal.predict_proba(zt), rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_numpy_in_numpy_out_torch_in_torch_out(name, dtype):
    z, y = _data()
    zn, yn = z.numpy().astype(dtype), y.numpy()
    cal = CALIBRATORS[name]().fit(zn, yn)
    p_np = cal.predict_proba(zn)
    p_t = cal.predict_proba(torch.from_numpy(zn))
    assert isinstance(p_np, np.ndarray) and isinstance(p_t, torch.Tensor)
    assert p_np.dtype == dtype and p_np.shape == zn.shape
    np.testing.assert_array_equal(p_np, p_t.numpy())
    # lists are numpy's side too
    np.testing.assert_array_equal(cal.predict_proba(zn[:3].tolist()), cal.predict_proba(zn[:3].astype(np.float32)))
    if hasattr(cal, "transform"):
        t_np = cal.transform(zn)
        assert isinstance(t_np, np.ndarray)
        np.testing.assert_array_equal(t_np, cal.transform(torch.from_numpy(zn)).numpy())


@pytest.mark.parametrize("name", NAMES)
def test_binary_layout_numpy_in_numpy_out(name):
    z, y = _data(k=2)
    s, yb = (z[:, 1] - z[:, 0]).numpy(), y.numpy()
    p = CALIBRATORS[name]().fit(s, yb).predict_proba(s)
    assert isinstance(p, np.ndarray) and p.shape == s.shape
