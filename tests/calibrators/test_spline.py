"""Spline calibration against a second construction of the natural cubic spline (scipy) and a known
miscalibration."""

import numpy as np
import pytest
import torch

from calibkit.calibrators import SplineCalibration


def _reference(conf, correct, n_knots, test_conf):
    """Gupta et al.'s recalibration of ``test_conf``, with the spline space built from scipy's
    natural CubicSpline through knot values (the reference code's parametrisation)."""
    from scipy.interpolate import CubicSpline

    order = np.argsort(conf, kind="stable")
    c, a = conf[order], correct[order]
    n = len(c)
    s = np.arange(1, n + 1) / n
    gap = (np.cumsum(a) - np.cumsum(c)) / n
    knots = np.linspace(0, 1, n_knots)
    basis = [CubicSpline(knots, np.eye(n_knots)[j], bc_type="natural") for j in range(n_knots)]
    design = np.stack([b(s) for b in basis], 1)
    coef = np.linalg.lstsq(design, gap, rcond=None)[0]
    value = c + sum(cj * b.derivative()(s) for cj, b in zip(coef, basis))
    ux, inv = np.unique(c, return_inverse=True)
    uy = np.bincount(inv, weights=value) / np.bincount(inv)
    return np.clip(np.interp(test_conf, ux, uy), 0, 1)


def test_top_label_recalibration_matches_a_second_construction():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3000, 8, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    z = 2.5 * z  # over-confident
    z[:30] = z[30:60]  # tied confidences
    cal = SplineCalibration().fit(z, y)
    conf, pred = torch.softmax(z, 1).max(1)
    zt = 2.5 * torch.randn(1000, 8, generator=g, dtype=torch.float64) * 2
    pt = torch.softmax(zt, 1)
    top2 = pt.topk(2, 1).values
    ref = _reference(conf.numpy(), (pred == y).double().numpy(), 6, top2[:, 0].numpy())
    bound = (top2[:, 1] / (1 - top2[:, 0] + top2[:, 1])).numpy() * (1 + 1e-6)
    q = cal.predict_proba(zt)
    np.testing.assert_allclose(q.max(1).values.numpy(), np.maximum(ref, bound), rtol=0, atol=1e-9)
    assert torch.equal(q.argmax(1), zt.argmax(1))  # the prediction never changes
    # the other classes keep their proportions
    rest = q.scatter(1, pt.argmax(1, keepdim=True), 0.0)
    prop = pt.scatter(1, pt.argmax(1, keepdim=True), 0.0)
    torch.testing.assert_close(rest / rest.sum(1, keepdim=True), prop / prop.sum(1, keepdim=True))


def test_recovers_a_known_accuracy_curve():
    # binary scores whose top-label accuracy is conf**2 (over-confident): the recalibrated top
    # confidence approaches conf**2
    g = torch.Generator().manual_seed(1)
    n = 40_000
    conf = 0.75 + 0.25 * torch.rand(n, generator=g, dtype=torch.float64)  # accuracy conf**2 > 0.5
    correct = torch.bernoulli(conf**2, generator=g)
    s = torch.logit(conf)  # positive class predicted with confidence conf
    y = correct.long()  # correct <=> label 1
    cal = SplineCalibration().fit(s, y)
    grid = torch.linspace(0.78, 0.97, 8, dtype=torch.float64)
    got = cal.predict_proba(torch.logit(grid))
    np.testing.assert_allclose(got.numpy(), (grid**2).numpy(), atol=0.02)


def test_bad_knots():
    with pytest.raises(ValueError, match="n_knots must be an integer >= 2"):
        SplineCalibration(n_knots=1).fit(torch.randn(10, 3), torch.zeros(10, dtype=torch.long))
