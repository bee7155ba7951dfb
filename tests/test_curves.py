"""The smooth reliability curve and the risk-coverage plot (calibkit.curves)."""

import math

import numpy as np
import pytest
import torch

from calibkit.curves import risk_coverage_plot, smooth_reliability_curve, smooth_reliability_diagram
from calibkit.functional import aurc, smooth_ece


def _data(n=3000, seed=0, sharp=3.0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, 5, generator=g)
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    return torch.softmax(sharp * z, 1), y


@pytest.mark.parametrize("sharp", [1.0, 3.0])
def test_the_curve_integrates_to_smooth_ece_at_its_bandwidth(sharp):
    p, y = _data(sharp=sharp)
    c = smooth_reliability_curve(p, y, n_points=2001)
    ref, sigma = smooth_ece(p, y, return_sigma=True)
    assert c.sigma == pytest.approx(sigma)
    # int density |conf - acc| dt = smECE (the grid-based reference is accurate to ~1e-3 relative)
    assert c.smece == pytest.approx(float(ref), rel=3e-3)
    # the density is a probability density on [0, 1]; the trapezoid rule gives 1 closely
    area = float(np.sum((c.density[1:] + c.density[:-1]) / 2) * (c.t[1] - c.t[0]))
    assert area == pytest.approx(1.0, abs=1e-3)


def test_kernel_weighted_means_by_hand_on_two_rows():
    # two rows, confidences 0.8 (right) and 0.6 (wrong), sigma 0.1, at t = 0.7: each row's weight is
    # its Gaussian plus its mirror images at -c and 2 - c (farther images weigh below 1e-30)
    p = torch.tensor([[0.8, 0.2], [0.4, 0.6]], dtype=torch.float64)
    y = torch.tensor([0, 0])
    c = smooth_reliability_curve(p, y, sigma=0.1, n_points=11)
    i = 7
    assert c.t[i] == pytest.approx(0.7)

    def phi(d):
        return math.exp(-0.5 * (d / 0.1) ** 2) / (0.1 * math.sqrt(2 * math.pi))

    w1 = phi(0.7 - 0.8) + phi(0.7 + 0.8) + phi(2 - 0.8 - 0.7)
    w2 = phi(0.7 - 0.6) + phi(0.7 + 0.6) + phi(2 - 0.6 - 0.7)
    assert c.confidence[i] == pytest.approx((0.8 * w1 + 0.6 * w2) / (w1 + w2), rel=1e-12)
    assert c.accuracy[i] == pytest.approx(w1 / (w1 + w2), rel=1e-12)
    assert c.density[i] == pytest.approx((w1 + w2) / 2, rel=1e-12)


def test_a_perfectly_calibrated_constant_confidence_has_no_gap():
    # confidence 0.75 everywhere, right on exactly 3 of 4 rows
    p = torch.tensor([[0.75, 0.25]] * 400, dtype=torch.float64)
    y = torch.tensor([0, 0, 0, 1] * 100)
    c = smooth_reliability_curve(p, y, sigma=0.05)
    assert np.allclose(c.accuracy, 0.75) and np.allclose(c.confidence, 0.75) and c.smece == pytest.approx(0, abs=1e-12)


def test_the_drawings_name_each_curve_with_its_numbers():
    p, y = _data()
    ax = smooth_reliability_diagram({"model": (p, y)})
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert texts[1] == f"model: smECE {100 * float(smooth_ece(p, y)):.2f}% (sigma " \
                       f"{smooth_ece(p, y, return_sigma=True)[1]:.3f})"
    ax = risk_coverage_plot({"model": (p, y)})
    assert ax.get_legend().get_texts()[0].get_text() == f"model: AURC x100 {100 * float(aurc(p, y)):.2f}"
    x, risk = ax.lines[0].get_data()
    assert x[-1] == pytest.approx(1.0)
    assert risk[-1] == pytest.approx(100 * float((p.argmax(1) != y).double().mean()))


@pytest.mark.parametrize("sigma", [0.02, 0.0249, 0.025, 0.05, 0.3, 1.7])
def test_the_reflected_kernel_equals_its_formula_bit_for_bit(sigma):
    """The in-place kernel is the sum of reflected Gaussians written plainly, to the last bit: also
    where it skips the images farther than 40 sigma from the grid (at sigma 0.02 and 0.0249 those
    at distance 1 too, at 0.025 and above not), whose terms are exactly 0."""
    from calibkit.curves import _reflected_kernel

    rng = np.random.default_rng(0)
    t, c = np.linspace(0.0, 1.0, 57), np.concatenate([[0.0, 1.0], rng.random(300)])
    reach = math.ceil(2.5 * sigma) + 1
    want = np.zeros((len(t), len(c)))
    for k in range(-reach, reach + 1):
        for image in (c + 2 * k, -c + 2 * k):
            want += np.exp(-0.5 * ((t[:, None] - image[None, :]) / sigma) ** 2)
    want = want / (sigma * math.sqrt(2 * math.pi))
    assert np.array_equal(_reflected_kernel(t, c, sigma), want)
