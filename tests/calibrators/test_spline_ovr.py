"""One-vs-rest spline (OneVsRestSplineCalibration) against an independent implementation: the
least-squares natural cubic spline built from scipy's CubicSpline in the knot-value
parametrisation (not calibkit's truncated-power basis)."""

import numpy as np
import pytest
import torch

from calibkit.calibrators import OneVsRestSplineCalibration

interpolate = pytest.importorskip("scipy.interpolate")


def _map(c, a, n_knots):
    """The recalibration map of one class from its scores ``c`` and 0/1 targets ``a``."""
    order = np.argsort(c, kind="stable")
    c, a = c[order], a[order]
    n = len(c)
    s = np.arange(1, n + 1) / n
    gap = np.cumsum(a - c) / n
    knots = np.linspace(0, 1, n_knots)
    splines = [interpolate.CubicSpline(knots, e, bc_type="natural") for e in np.eye(n_knots)]
    design = np.stack([sp(s) for sp in splines], 1)
    values = np.linalg.lstsq(design, gap, rcond=None)[0]
    spline = interpolate.CubicSpline(knots, values, bc_type="natural")
    recal = c + spline(s, 1)
    ux, inv = np.unique(c, return_inverse=True)
    uy = np.bincount(inv, weights=recal) / np.bincount(inv)
    return lambda v: np.clip(np.interp(v, ux, uy), 0, 1)


@pytest.mark.parametrize("n_knots", [2, 6])
def test_matches_the_independent_spline(n_knots):
    g = torch.Generator().manual_seed(7)
    z = torch.randn(500, 4, generator=g, dtype=torch.float64) * 3
    y = torch.multinomial(torch.softmax(z / 2, 1), 1, generator=g)[:, 0]
    zt = torch.randn(100, 4, generator=g, dtype=torch.float64) * 3
    q = OneVsRestSplineCalibration(n_knots=n_knots).fit(z, y).predict_proba(zt).numpy()
    p, pt = torch.softmax(z, 1).numpy(), torch.softmax(zt, 1).numpy()
    g_ = np.stack([_map(p[:, k], (y.numpy() == k).astype(float), n_knots)(pt[:, k]) for k in range(4)], 1)
    g_ = np.maximum(g_, 1e-12)
    np.testing.assert_allclose(q, g_ / g_.sum(1, keepdims=True), rtol=0, atol=1e-9)


def test_calibrated_scores_stay_close_to_identity():
    # labels drawn from the model's own probabilities: the one-vs-rest maps are near the identity
    g = torch.Generator().manual_seed(8)
    z = torch.randn(20000, 3, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g)[:, 0]
    q = OneVsRestSplineCalibration().fit(z, y).predict_proba(z[:2000])
    assert float((q - torch.softmax(z[:2000], 1)).abs().mean()) < 0.02


def test_bad_n_knots():
    with pytest.raises(ValueError, match="n_knots"):
        OneVsRestSplineCalibration(n_knots=1).fit(torch.randn(10, 3), torch.arange(10) % 3)
