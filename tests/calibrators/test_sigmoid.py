"""Platt scaling and beta calibration against scikit-learn's unregularised logistic regression."""

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from calibkit.calibrators import BetaCalibration, PlattScaling
from calibkit.calibrators.sigmoid import fit_logistic, log_probs


def _sk(features: np.ndarray, target: np.ndarray) -> LogisticRegression:
    return LogisticRegression(C=np.inf, tol=1e-12, max_iter=100_000).fit(features, target)


def _multiclass(seed=0, n=3000, k=6):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    return 3 * z + torch.linspace(-1, 1, k, dtype=torch.float64), y  # over-confident, class-biased


def _binary(seed=0, n=3000):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, generator=g, dtype=torch.float64) * 2
    y = torch.bernoulli(torch.sigmoid(z / 2 + 0.5), generator=g).long()
    return z, y


def test_log_probs_are_accurate_near_one():
    z = torch.tensor([[0.0, 50.0, -3.0], [1.0, 2.0, 3.0]], dtype=torch.float64)
    log_p, log_q = log_probs(z)
    p = torch.softmax(z, 1)
    torch.testing.assert_close(log_p, torch.log(p))
    assert log_q[0, 1].item() == pytest.approx(np.log(np.exp(-50.0) + np.exp(-53.0)), rel=1e-12)  # 1 - p rounds to 0
    torch.testing.assert_close(log_q[1], torch.log1p(-p[1]))


def test_platt_binary_is_sklearn_logistic_regression_on_the_score():
    z, y = _binary()
    cal = PlattScaling().fit(z, y)
    zt = torch.linspace(-8, 8, 101, dtype=torch.float64)
    ref = _sk(z.numpy()[:, None], y.numpy()).predict_proba(zt.numpy()[:, None])[:, 1]
    np.testing.assert_allclose(cal.predict_proba(zt).numpy(), ref, atol=1e-6)
    assert cal.coef_.shape == (1, 2)


def test_platt_one_class_of_the_one_vs_rest_is_sklearn_on_its_logit():
    z, y = _multiclass()
    cal = PlattScaling().fit(z, y)
    p = torch.softmax(z, 1).numpy()
    k = 2
    score = np.log(p[:, k]) - np.log1p(-p[:, k])
    sk = _sk(score[:, None], (y.numpy() == k).astype(int))
    np.testing.assert_allclose(cal.coef_[k].numpy(), [sk.coef_[0, 0], sk.intercept_[0]], atol=1e-5)
    zt, _ = _multiclass(seed=1, n=500)
    pt = torch.softmax(zt, 1).numpy()
    st = np.log(pt) - np.log1p(-pt)
    g = np.stack([_sk(score_k[:, None], (y.numpy() == j).astype(int)).predict_proba(st[:, j:j + 1])[:, 1]
                  for j, score_k in enumerate((np.log(p) - np.log1p(-p)).T)], 1)
    np.testing.assert_allclose(cal.predict_proba(zt).numpy(), g / g.sum(1, keepdims=True), atol=1e-4)


def test_beta_binary_is_sklearn_on_log_features_with_a_and_b_kept_non_negative():
    z, y = _binary()
    s = torch.sigmoid(z).numpy()
    feats = np.stack([np.log(s), -np.log1p(-s)], 1)
    sk = _sk(feats, y.numpy())
    assert (sk.coef_ >= 0).all()  # this set needs no refit
    cal = BetaCalibration().fit(z, y)
    np.testing.assert_allclose(cal.coef_[0].numpy(), [*sk.coef_[0], sk.intercept_[0]], atol=1e-5)
    zt = torch.linspace(-8, 8, 101, dtype=torch.float64)
    st = torch.sigmoid(zt).numpy()
    ref = sk.predict_proba(np.stack([np.log(st), -np.log1p(-st)], 1))[:, 1]
    np.testing.assert_allclose(cal.predict_proba(zt).numpy(), ref, atol=1e-6)


def test_beta_refits_without_the_feature_whose_coefficient_is_negative():
    # labels from logit = -0.5 ln s - ln(1 - s) - 1 (a < 0): the fit drops ln s and refits on -ln(1 - s) alone
    g = torch.Generator().manual_seed(3)
    s = torch.rand(4000, generator=g, dtype=torch.float64) * 0.98 + 0.01
    y = torch.bernoulli(torch.sigmoid(-0.5 * torch.log(s) - torch.log1p(-s) - 1), generator=g).long()
    z = torch.log(s) - torch.log1p(-s)
    feats = np.stack([np.log(s.numpy()), -np.log1p(-s.numpy())], 1)
    free = _sk(feats, y.numpy())
    assert free.coef_[0, 0] < 0
    refit = _sk(feats[:, 1:], y.numpy())
    cal = BetaCalibration().fit(z, y)
    np.testing.assert_allclose(cal.coef_[0].numpy(), [0.0, refit.coef_[0, 0], refit.intercept_[0]], atol=1e-5)
    ref = refit.predict_proba(feats[:, 1:])[:, 1]
    np.testing.assert_allclose(cal.predict_proba(z).numpy(), ref, atol=1e-6)


def test_beta_drops_the_second_feature_too_when_its_refit_is_negative():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(300, 4, generator=g, dtype=torch.float64) * 3
    y = torch.randint(0, 4, (300,), generator=g)  # labels unrelated to the scores
    cal = BetaCalibration().fit(z, y)
    assert (cal.coef_[:, :2] >= 0).all()
    both = (cal.coef_[:, :2] == 0).all(1)
    assert both.any()  # this draw has a class whose map is constant
    k = int(torch.nonzero(both)[0])
    freq = (y == k).double().mean()
    assert torch.sigmoid(cal.coef_[k, 2]).item() == pytest.approx(freq.item(), abs=1e-9)  # its frequency


def test_beta_one_class_of_the_one_vs_rest_is_sklearn():
    z, y = _multiclass(k=5)
    cal = BetaCalibration().fit(z, y)
    p = torch.softmax(z, 1).numpy()
    k = 4
    feats = np.stack([np.log(p[:, k]), -np.log1p(-p[:, k])], 1)
    target = (y.numpy() == k).astype(int)
    sk = _sk(feats, target)
    if sk.coef_[0, 0] < 0:
        sk = _sk(feats[:, 1:], target)
        want = [0.0, sk.coef_[0, 0], sk.intercept_[0]]
    elif sk.coef_[0, 1] < 0:
        sk = _sk(feats[:, :1], target)
        want = [sk.coef_[0, 0], 0.0, sk.intercept_[0]]
    else:
        want = [*sk.coef_[0], sk.intercept_[0]]
    np.testing.assert_allclose(cal.coef_[k].numpy(), want, atol=1e-5)
    assert (cal.coef_[:, :2] >= 0).all()


def test_near_identity_on_calibrated_data_and_rows_sum_to_one():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(20_000, 4, generator=g, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    p = torch.softmax(z, 1)
    for cal in (PlattScaling().fit(z, y), BetaCalibration().fit(z, y)):
        q = cal.predict_proba(z)
        assert (q - p).abs().mean().item() < 0.005  # calibrated input: the map stays near q = p
        torch.testing.assert_close(q.sum(1), torch.ones(len(z), dtype=torch.float64))
    torch.testing.assert_close(PlattScaling().fit(z, y).coef_[:, 0], torch.ones(4, dtype=torch.float64), atol=0.05,
                               rtol=0)


def test_fit_logistic_masked_feature_stays_zero_and_matches_a_direct_newton():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 500, generator=g, dtype=torch.float64)
    x[:, 2] = 1.0
    t = torch.bernoulli(torch.sigmoid(x[:, 0] - 0.5 * x[:, 1]), generator=g)
    mask = torch.tensor([[True, True, True], [True, False, True]])
    w, _ = fit_logistic(x, t, mask, torch.zeros(2, 3, dtype=torch.float64), 100)
    assert w[1, 1].item() == 0.0
    for j, cols in ((0, [0, 1]), (1, [0])):  # row 2 of x is the intercept: scikit-learn adds its own
        sk = _sk(x[j, cols].T.numpy(), t[j].numpy().astype(int))
        np.testing.assert_allclose(w[j, cols].numpy(), sk.coef_[0], atol=1e-6)
        np.testing.assert_allclose(w[j, 2].item(), sk.intercept_[0], atol=1e-6)
