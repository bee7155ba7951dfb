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
    cal = SplineCalibration(floor=0.0).fit(z, y)  # the construction itself; the default floor below
    conf, pred = torch.softmax(z, 1).max(1)
    zt = 2.5 * torch.randn(1000, 8, generator=g, dtype=torch.float64) * 2
    pt = torch.softmax(zt, 1)
    top2 = pt.topk(2, 1).values
    ref = _reference(conf.numpy(), (pred == y).double().numpy(), 6, top2[:, 0].numpy())
    q = cal.predict_proba(zt)
    # the top class keeps the spline's estimate, except where it is below the least value that can
    # stay first (1 / (1 + 7 / (1 + 1e-6)), just above 1 / K)
    floor = 1 / (1 + 7 / (1 + 1e-6))
    np.testing.assert_allclose(q.max(1).values.numpy(), np.maximum(ref, floor), rtol=0, atol=1e-9)
    assert torch.equal(q.argmax(1), zt.argmax(1))  # the prediction never changes
    torch.testing.assert_close(q.sum(1), torch.ones(1000, dtype=torch.float64), rtol=0, atol=1e-12)
    # the other classes: (1 - q_top) times a mixture of their proportional shares and the uniform
    # 1/7, the mixing weight the least that keeps every one at or below q_top / (1 + 1e-6)
    top = pt.argmax(1, keepdim=True)
    qt = q.gather(1, top)[:, 0]
    rest = q.scatter(1, top, 0.0) / (1 - qt)[:, None]
    prop = pt.scatter(1, top, 0.0)
    prop = prop / prop.sum(1, keepdim=True)
    runner = prop.scatter(1, top, -1.0).argmax(1, keepdim=True)  # the runner-up, proportionally largest
    alpha = ((rest - prop).gather(1, runner) / (1 / 7 - prop.gather(1, runner)))[:, 0]
    mix = (1 - alpha)[:, None] * prop + alpha[:, None] / 7
    torch.testing.assert_close(rest.scatter(1, top, 0.0), mix.scatter(1, top, 0.0), rtol=0, atol=1e-12)
    # the default floor 1e-6: max(q, 1e-6) renormalised, row by row
    floored = q.clamp(min=1e-6)
    floored = floored / floored.sum(1, keepdim=True)
    torch.testing.assert_close(SplineCalibration().fit(z, y).predict_proba(zt), floored, rtol=0, atol=1e-15)
    cap = qt / (1 + 1e-6)
    second = q.scatter(1, top, -1.0).max(1).values
    assert bool((alpha > -1e-12).all()) and bool((second <= cap * (1 + 1e-12)).all())
    mixed = alpha > 1e-12
    torch.testing.assert_close(second[mixed], cap[mixed], rtol=1e-12, atol=0)  # no more mixing than needed
    assert 0.2 < float(mixed.double().mean()) < 0.8  # the case this guards is common here
    # the proportional shares alone would have handed the argmax to the runner-up on those rows
    naive = (1 - qt) * pt.topk(2, 1).values[:, 1] / (1 - pt.max(1).values)
    assert torch.equal(naive > cap, mixed)


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
