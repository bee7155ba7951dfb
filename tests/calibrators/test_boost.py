"""LightGBMCalibration: the same model as LightGBM trained directly here, its folds, and a clear
error without the extra."""

import numpy as np
import pytest
import torch

from calibkit.calibrators import LightGBMCalibration, boost
from calibkit.errors import UserError


def _data(n=400, k=4, seed=9):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * 3
    y = torch.multinomial(torch.softmax(z / 2, 1), 1, generator=g)[:, 0]
    return z, y


def test_one_model_is_lightgbm_on_the_log_probabilities():
    lgb = pytest.importorskip("lightgbm")
    z, y = _data()
    q = LightGBMCalibration(n_folds=0, n_rounds=20).fit(z, y).predict_proba(z).numpy()
    x = np.maximum(torch.log_softmax(z, 1).numpy(), np.log(np.finfo(np.float32).tiny))
    params = {"objective": "multiclass", "num_class": 4, "max_depth": 3, "num_leaves": 8, "learning_rate": 0.1,
              "verbose": -1, "seed": 0, "deterministic": True, "force_row_wise": True, "num_threads": 1}
    ref = lgb.train(params, lgb.Dataset(x, label=y.numpy()), num_boost_round=20).predict(x)
    ref = np.maximum(ref, 1e-12)
    np.testing.assert_allclose(q, ref / ref.sum(1, keepdims=True), rtol=0, atol=1e-12)


def test_fold_models_are_averaged():
    pytest.importorskip("lightgbm")
    z, y = _data()
    cal = LightGBMCalibration(n_folds=3, n_rounds=10).fit(z, y)
    assert len(cal.models_) == 3
    singles = []
    for m in cal.models_:
        one = LightGBMCalibration(n_folds=0)
        one.models_, one.n_classes_, one.binary_ = [m], 4, False
        singles.append(one.predict_proba(z).numpy())
    # each single model's rows are floored and renormalised; their mean is the averaged model's
    # rows up to that renormalisation (no entry of these rows is near the floor)
    np.testing.assert_allclose(cal.predict_proba(z).numpy(), np.mean(singles, 0), rtol=0, atol=1e-9)


def test_stratified_folds_deal_each_class_evenly():
    y = np.array([0] * 10 + [1] * 7 + [2] * 3)
    fold = boost.stratified_folds(y, 3, seed=1)
    for c in range(3):
        counts = np.bincount(fold[y == c], minlength=3)
        assert counts.max() - counts.min() <= 1
    assert np.array_equal(fold, boost.stratified_folds(y, 3, seed=1))


def test_missing_extra_is_a_user_error(monkeypatch):
    monkeypatch.setattr(boost, "available", lambda name: False)
    z, y = _data(50)
    with pytest.raises(UserError, match=r"calibkit\[boost\]"):
        LightGBMCalibration().fit(z, y)


def test_bad_hyperparameters():
    z, y = _data(50)
    for kw in ({"n_folds": 1}, {"n_rounds": 0}, {"num_leaves": 1}):
        with pytest.raises(UserError):
            LightGBMCalibration(**kw).fit(z, y)
