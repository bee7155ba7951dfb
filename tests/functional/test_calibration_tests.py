"""spiegelhalter_z and ks_calibration_test: hand-computed statistics, the null distribution of the
KS test, false-rejection rates on calibrated data and power on over-confident data."""

import math

import numpy as np
import pytest
import torch

from calibkit.functional import ks_calibration_test, ks_error, spiegelhalter_z
from calibkit.functional.calibration_tests import sup_abs_brownian_sf

REPS, LEVEL = 400, 0.05


def rows(conf, correct, k=4):
    """(N, K) probabilities whose top label is class 0 with confidence ``conf``; label 0 when correct."""
    conf = torch.as_tensor(conf, dtype=torch.float64)
    p = ((1 - conf) / (k - 1))[:, None].repeat(1, k)
    p[:, 0] = conf
    return p, torch.where(torch.as_tensor(correct, dtype=torch.bool), 0, 1)


def binomial_interval(n, p, mass=0.99):
    """Central ``mass`` interval of Binomial(n, p) as rates: the (1-mass)/2 and (1+mass)/2 quantiles."""
    cdf, lo, hi = 0.0, None, None
    for x in range(n + 1):
        cdf += math.comb(n, x) * p ** x * (1 - p) ** (n - x)
        if lo is None and cdf >= (1 - mass) / 2:
            lo = x
        if hi is None and cdf >= (1 + mass) / 2:
            hi = x
            break
    return lo / n, hi / n


def datasets(n, seed, k=10, temperature=1.0, reps=REPS):
    """``reps`` test sets: true probabilities softmax(z), labels drawn from them, the model
    reporting softmax(z / temperature) (1: calibrated; < 1: over-confident)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(reps, n, k, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, -1).reshape(-1, k), 1, generator=g).reshape(reps, n)
    return torch.softmax(z / temperature, -1), y


def rejection_rates(probs, labels):
    pz = np.array([float(spiegelhalter_z(p, y)[1]) for p, y in zip(probs, labels)])
    pk = np.array([float(ks_calibration_test(p, y)[1]) for p, y in zip(probs, labels)])
    return float(np.mean(pz < LEVEL)), float(np.mean(pk < LEVEL))


# -- statistics by hand -------------------------------------------------------------------------

def test_spiegelhalter_by_hand():
    # c = 0.8, 0.8, 0.6, 0.9 and a = 1, 0, 1, 1; weights 1 - 2c = -0.6, -0.6, -0.2, -0.8
    # numerator: 0.2(-0.6) - 0.8(-0.6) + 0.4(-0.2) + 0.1(-0.8) = 0.20
    # variance: 0.36*0.16 + 0.36*0.16 + 0.04*0.24 + 0.64*0.09 = 0.1824
    # the four rows three times over (the tests need MIN_ROWS = 10): numerator 0.60, variance 0.5472
    p, y = rows([0.8, 0.8, 0.6, 0.9] * 3, [1, 0, 1, 1] * 3)
    z, pv = spiegelhalter_z(p, y)
    assert float(z) == pytest.approx(0.6 / math.sqrt(0.5472), abs=1e-12)
    assert float(pv) == pytest.approx(math.erfc(0.6 / math.sqrt(0.5472) / math.sqrt(2)), abs=1e-12)
    assert z.dtype == pv.dtype == torch.float64 and z.dim() == 0


def test_spiegelhalter_is_the_standardised_brier_score():
    p, y = datasets(200, 1, reps=1)
    p, y = p[0], y[0]
    c = p.max(1).values
    a = (p.argmax(1) == y).double()
    brier, mean = ((a - c) ** 2).sum(), (c * (1 - c)).sum()
    var = ((1 - 2 * c) ** 2 * c * (1 - c)).sum()
    assert float(spiegelhalter_z(p, y)[0]) == pytest.approx(float((brier - mean) / var.sqrt()), abs=1e-10)


def test_ks_by_hand_and_equal_to_ks_error():
    # sorted: 0.6 correct | 0.8 correct, 0.8 wrong | 0.9 correct
    # cumulative a - c at block ends: 0.4, 0.4 + 1 - 1.6 = -0.2, -0.2 + 0.1 = -0.1 -> KS = 0.4 / 4
    # V = 0.24 + 2 * 0.16 + 0.09 = 0.65 -> T = 0.4 / sqrt(0.65)
    # three times over: block ends 1.2, 1.2 + 3 - 4.8 = -0.6, -0.3 -> KS = 1.2 / 12; V = 1.95, T = 1.2 / sqrt(1.95)
    p, y = rows([0.8, 0.6, 0.9, 0.8] * 3, [0, 1, 1, 1] * 3)
    ks, pv = ks_calibration_test(p, y)
    assert float(ks) == pytest.approx(0.1, abs=1e-15)
    assert float(pv) == pytest.approx(sup_abs_brownian_sf(1.2 / math.sqrt(1.95)), abs=1e-14)
    p, y = datasets(300, 2, reps=1)
    assert float(ks_calibration_test(p[0], y[0])[0]) == float(ks_error(p[0], y[0]))


def test_degenerate_variance():
    p, y = rows([1.0] * 12, [1] * 12)
    for f in (spiegelhalter_z, ks_calibration_test):
        stat, pv = f(p, y)
        assert float(stat) == 0.0 and float(pv) == 1.0
    p, y = rows([1.0] * 12, [1, 0, 1] * 4)  # wrong predictions at confidence 1
    assert float(spiegelhalter_z(p, y)[0]) == math.inf and float(spiegelhalter_z(p, y)[1]) == 0.0
    assert float(ks_calibration_test(p, y)[1]) == 0.0


def test_layouts_and_validation():
    g = torch.Generator().manual_seed(3)
    p1 = torch.rand(50, generator=g, dtype=torch.float64)
    y = (torch.rand(50, generator=g, dtype=torch.float64) < p1).long()
    two = torch.stack([1 - p1, p1], 1)
    for f in (spiegelhalter_z, ks_calibration_test):
        assert [float(v) for v in f(p1, y)] == pytest.approx([float(v) for v in f(two, y)], abs=1e-14)
        y_ign = y.clone()
        y_ign[:10] = 255
        got = [float(v) for v in f(two, y_ign, ignore_index=255)]
        assert got == pytest.approx([float(v) for v in f(two[10:], y[10:])], abs=1e-14)
        with pytest.raises(ValueError, match="labels out of range"):
            f(two, y + 1)
        with pytest.raises(ValueError, match="softmax"):
            f(two * 2, y)


# -- the null distribution of the KS test -------------------------------------------------------

def test_sup_abs_brownian_motion_series():
    from statistics import NormalDist

    phi = NormalDist().cdf
    for t in np.linspace(0.3, 4.0, 38):
        # P(sup |W| < t) = sum_k (-1)^k [Phi((2k+1)t) - Phi((2k-1)t)] (both series are derived from it)
        cdf = sum((-1) ** k * (phi((2 * k + 1) * t) - phi((2 * k - 1) * t)) for k in range(-60, 61))
        assert sup_abs_brownian_sf(t) == pytest.approx(1 - cdf, abs=1e-12)
    assert sup_abs_brownian_sf(2.2414) == pytest.approx(0.05, abs=1e-5)  # the 5% critical value
    assert sup_abs_brownian_sf(0) == 1.0 and sup_abs_brownian_sf(8) < 1e-14


def test_sup_abs_brownian_motion_by_simulation_not_a_bridge():
    g = torch.Generator().manual_seed(4)
    steps, paths = 2000, 2500
    walk = torch.randn(paths, steps, generator=g, dtype=torch.float64).cumsum(1) / math.sqrt(steps)
    sup = walk.abs().amax(1)
    for t in (1.0, 1.5, 2.0):
        mc = float((sup >= t).double().mean())
        se = math.sqrt(mc * (1 - mc) / paths)
        # the discrete maximum is below the supremum by about 0.58 / sqrt(steps): a small bias down
        assert abs(mc - sup_abs_brownian_sf(t)) < 4 * se + 0.01
    # the Kolmogorov (bridge) tail at 2.0 is 6.7e-4; the motion's is 0.091: the bridge would be wrong
    bridge = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * 4.0) for k in range(1, 50))
    assert bridge < 1e-3 < 0.08 < sup_abs_brownian_sf(2.0)


# -- false rejections on calibrated data, power on over-confident data ---------------------------

def test_level_on_calibrated_data():
    lo, hi = binomial_interval(REPS, LEVEL)
    probs, labels = datasets(300, 10)
    rate_z, rate_ks = rejection_rates(probs, labels)
    assert lo <= rate_z <= hi, (rate_z, lo, hi)
    assert lo <= rate_ks <= hi, (rate_ks, lo, hi)


def _binary_null(reps=REPS):
    g = torch.Generator().manual_seed(11)
    p = torch.rand(reps, 300, generator=g, dtype=torch.float64)
    return p, (torch.rand(reps, 300, generator=g, dtype=torch.float64) < p).long()  # labels drawn from p


def test_level_on_calibrated_binary_data():
    lo, hi = binomial_interval(REPS, LEVEL)
    rate_z, rate_ks = rejection_rates(*_binary_null())
    assert lo <= rate_z <= hi, (rate_z, lo, hi)
    assert lo <= rate_ks <= hi, (rate_ks, lo, hi)


def _tied_null(reps=REPS):
    g = torch.Generator().manual_seed(12)
    c = torch.tensor([0.6, 0.7, 0.8, 0.9], dtype=torch.float64)[torch.randint(0, 4, (reps, 300), generator=g)]
    correct = torch.rand(reps, 300, generator=g, dtype=torch.float64) < c
    probs = torch.stack([c, 1 - c], -1)  # top label 0 at confidence c
    return probs, torch.where(correct, 0, 1)


def test_level_with_tied_confidences_is_not_exceeded():
    # 4 distinct confidences: the KS maximum is taken at 4 block ends only, below the supremum
    lo, hi = binomial_interval(REPS, LEVEL)
    rate_z, rate_ks = rejection_rates(*_tied_null())
    assert lo <= rate_z <= hi, (rate_z, lo, hi)
    assert rate_ks <= hi, (rate_ks, hi)


def test_power_on_over_confident_data():
    probs, labels = datasets(300, 13, temperature=0.7)  # logits sharpened by 1/0.7
    rate_z, rate_ks = rejection_rates(probs, labels)
    assert rate_z >= 0.95 and rate_ks >= 0.95, (rate_z, rate_ks)


def _print_rates(reps=REPS):  # pragma: no cover - the figures of docs/metrics.md
    """From the repository root, with PYTHONPATH=.:tests/functional:
    python -c "import test_calibration_tests as t; t._print_rates(4000)" """
    print("calibrated K=10", rejection_rates(*datasets(300, 10, reps=reps)))
    print("calibrated binary", rejection_rates(*_binary_null(reps)))
    print("calibrated, 4 tied confidences", rejection_rates(*_tied_null(reps)))
    print("over-confident", rejection_rates(*datasets(300, 13, temperature=0.7, reps=reps)))


def test_fewer_rows_than_the_minimum_are_refused():
    from calibkit.functional.calibration_tests import MIN_ROWS

    g = torch.Generator().manual_seed(0)
    p = torch.rand(MIN_ROWS, generator=g, dtype=torch.float64)
    y = (torch.rand(MIN_ROWS, generator=g, dtype=torch.float64) < p).long()
    for f in (spiegelhalter_z, ks_calibration_test):
        f(p, y)  # the minimum itself is accepted
        with pytest.raises(ValueError, match=f"^{f.__name__} needs at least {MIN_ROWS} scored rows, got 1: "):
            f(p[:1], y[:1])
