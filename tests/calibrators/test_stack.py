"""The stack of calibrators (calibkit.calibrators.stack): its weights against the optimality
conditions and an independent search, its probabilities against the mixture written out, its
cross-fitted score against the formula, saving, and the ecosystem's protocols."""

import json
import pickle

import numpy as np
import pytest
import torch

from calibkit import functional as F
from calibkit.calibrators import load, save
from calibkit.calibrators.crossfit import cross_fit_predictions, folds
from calibkit.calibrators.stack import StackedCalibration, cross_fitted_mixture, mixture_weights

SMALL = ("none", "temperature", "vector", "dirichlet")


def _data(n=1500, k=4, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    return scale * z, y  # over-confident logits of a model whose true probabilities are softmax(z)


def _log_score(p, w):
    return float((p @ w).log().mean())


@pytest.mark.parametrize("seed", range(4))
def test_weights_meet_the_optimality_conditions(seed):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(400, 6, generator=g, dtype=torch.float64) ** 3
    p[:, 5] = p[:, 4]  # two components that predict alike: the optimum is not unique, its value is
    w = mixture_weights(p)
    assert bool((w >= 0).all()) and float(w.sum()) == pytest.approx(1.0, abs=1e-12)
    grad = (p / (p @ w)[:, None]).mean(0)  # sum_j w_j grad_j = 1 by construction
    assert torch.allclose(grad[w > 1e-9], torch.ones(int((w > 1e-9).sum()), dtype=torch.float64), atol=1e-8)
    assert bool((grad[w <= 1e-9] <= 1 + 1e-8).all())
    # no simplex point of a random search does better
    cand = torch.distributions.Dirichlet(torch.ones(6, dtype=torch.float64)).sample((2000,))
    assert _log_score(p, w) >= float((p @ cand.T).log().mean(0).max()) - 1e-12


def test_two_weights_equal_a_one_dimensional_search():
    g = torch.Generator().manual_seed(7)
    p = torch.rand(300, 2, generator=g, dtype=torch.float64)
    a = torch.linspace(0, 1, 200_001, dtype=torch.float64)
    values = (p[:, :1] * a + p[:, 1:] * (1 - a)).log().mean(0)
    best = float(a[values.argmax()])
    assert float(mixture_weights(p)[0]) == pytest.approx(best, abs=1e-5)
    assert mixture_weights(p[:, :1]).tolist() == [1.0]
    dominated = torch.stack([p[:, 0], p[:, 0] / 2], 1)  # the second is worse on every row: weight 0
    assert mixture_weights(dominated).tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="matrix"):
        mixture_weights(torch.ones(3))


def test_the_cross_fitted_mixture_weights_each_fold_on_the_others():
    g = torch.Generator().manual_seed(3)
    y = torch.randint(0, 3, (90,), generator=g)
    oof = [torch.softmax(torch.randn(90, 3, generator=g, dtype=torch.float64) * s, 1) for s in (0.5, 2.0, 4.0)]
    parts = folds(90, 3, 0)
    weights, mixed = cross_fitted_mixture(oof, y, parts)
    p_true = torch.stack([o[torch.arange(90), y] for o in oof], 1)
    assert torch.equal(weights, mixture_weights(p_true))
    for held in parts:
        keep = torch.ones(90, dtype=torch.bool)
        keep[held] = False
        w = mixture_weights(p_true[keep])
        assert torch.allclose(mixed[held], sum(w[j] * oof[j][held] for j in range(3)), atol=1e-15)


def test_predictions_are_the_weighted_mixture_of_the_components():
    z, y = _data()
    st = StackedCalibration(calibrators=SMALL).fit(z, y)
    assert st.components_ == list(SMALL) and st.weights_.shape == (4,)
    parts = st._components()
    by_hand = sum(w * (torch.softmax(z, 1) if n == "none" else parts[n].predict_proba(z))
                  for n, w in zip(st.components_, st.weights_.tolist()))
    p = st.predict_proba(z)
    assert torch.allclose(p, by_hand, atol=1e-14) and torch.allclose(p.sum(1), torch.ones(len(z), dtype=p.dtype))
    # the mixture of calibrated maps beats the over-confident model it starts from
    assert float(F.nll(p, y)) < float(F.nll(torch.softmax(z, 1), y))
    assert isinstance(st.predict_proba(z.numpy()), np.ndarray)


def test_the_selection_builds_the_stack_from_the_candidates_without_fitting_again():
    z, y = _data(seed=1)
    scores, fitted, oof, yy = cross_fit_predictions(z, y, ["temperature", "vector", "dirichlet", "stack"])
    st = fitted["stack"]
    assert st.components_ == list(SMALL)
    assert all(st._components()[n] is fitted[n] for n in SMALL[1:])  # the candidates' own fits
    parts = folds(len(y), 5, 0)
    weights, mixed = cross_fitted_mixture([oof[n] for n in SMALL], yy, parts)
    assert torch.equal(st.weights_, weights) and torch.equal(oof["stack"], mixed)
    assert scores["stack"].nll == pytest.approx(float(F.nll(mixed, yy)), abs=1e-12)
    alone = StackedCalibration(calibrators=SMALL).fit(z, y)  # its own cross-fitting: the same folds and fits
    assert torch.equal(alone.weights_, st.weights_) and torch.equal(alone.predict_proba(z), st.predict_proba(z))
    # a stack of too few components is not fitted, with the reason
    few, fitted_few, _, _ = cross_fit_predictions(z, y, ["stack"])
    assert few["stack"].error.startswith("not fitted") and "stack" not in fitted_few


def test_save_and_load_give_the_same_probabilities_and_refuse_a_corrupted_file(tmp_path):
    z, y = _data(seed=2)
    st = StackedCalibration(calibrators=SMALL).fit(z, y)
    save(st, tmp_path / "st")
    back = load(tmp_path / "st")
    assert torch.equal(back.predict_proba(z), st.predict_proba(z))
    meta = json.loads((tmp_path / "st.json").read_text())
    for edit, field in ((lambda m: m["state"]["parts_"]["vector"]["tensors"]["weight_"]["data"].__setitem__(0, "x"),
                         "parts_"),
                        (lambda m: m["state"]["parts_"]["temperature"]["state"].__setitem__("temperature_", -1.0),
                         "temperature_"),
                        (lambda m: m["state"].__setitem__("components_", ["none", "temperature", "vector", "nope"]),
                         "components_")):
        bad = json.loads(json.dumps(meta))
        edit(bad)
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        (tmp_path / "bad.safetensors").write_bytes((tmp_path / "st.safetensors").read_bytes())
        with pytest.raises(ValueError, match=field):
            load(tmp_path / "bad")


def test_weights_off_the_simplex_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    z, y = _data(seed=2)
    save(StackedCalibration(calibrators=SMALL).fit(z, y), tmp_path / "st")
    t = load_file(str(tmp_path / "st.safetensors"))
    save_file({"weights_": t["weights_"] * 2}, str(tmp_path / "st.safetensors"))
    with pytest.raises(ValueError, match="weights_"):
        load(tmp_path / "st")


def test_protocols_clone_pickle_binary_and_bad_hyperparameters():
    sklearn_base = pytest.importorskip("sklearn.base")
    st = StackedCalibration(calibrators=("none", "temperature"), n_folds=3, seed=4)
    assert sklearn_base.clone(st).get_params() == st.get_params()
    assert st.set_params(seed=5).seed == 5
    z, y = _data(seed=3, k=2)
    x = z[:, 1] - z[:, 0]  # binary positive-class logits
    yb = y
    fitted = st.fit(x, yb)
    p = fitted.predict_proba(x)
    assert p.shape == (len(x),) and bool(((p > 0) & (p < 1)).all())
    again = pickle.loads(pickle.dumps(fitted))
    assert torch.equal(again.predict_proba(x), p)
    for kw in ({"calibrators": ("none", "stack")}, {"calibrators": ("temperature", "temperature")},
               {"calibrators": "temperature"}, {"n_folds": 1}):
        with pytest.raises(ValueError):
            StackedCalibration(**kw).fit(z, y)


def test_extreme_logits_give_finite_rows_that_sum_to_one():
    z, y = _data(seed=4)
    z = z.clone()
    z[:50] *= 1e4  # probabilities of exactly 0 and 1 in float64
    z[50:60] = 0.0  # ties
    st = StackedCalibration(calibrators=SMALL).fit(z, y)
    p = st.predict_proba(z)
    assert bool(torch.isfinite(p).all()) and torch.allclose(p.sum(1), torch.ones(len(z), dtype=p.dtype))
    assert bool((p >= 0).all())
