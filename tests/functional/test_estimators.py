"""smooth_ece, ece_sweep, ks_error: hand-computed cases, a second implementation of each, and
their entries in the evaluate panel."""

import math

import numpy as np
import pytest
import torch

from calibkit.functional import adaptive_ece, ece_sweep, ks_error, smooth_ece
from calibkit.functional.binning import bin_sums, equal_mass_bins, weighted_equal_mass_bins
from calibkit.functional.estimators import _mass_cuts, tie_blocks
from calibkit.metrics import CalibrationAccumulator, evaluate


def rows(conf, correct, k=10):
    """(N, K) probabilities whose top label is class 0 with confidence ``conf``; label 0 when correct."""
    conf = torch.as_tensor(conf, dtype=torch.float64)
    p = ((1 - conf) / (k - 1))[:, None].repeat(1, k)
    p[:, 0] = conf
    return p, torch.where(torch.as_tensor(correct, dtype=torch.bool), 0, 1)


def random_set(n, seed, k=5, scale=2.0, temp=1.4):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * scale
    y = torch.multinomial(torch.softmax(z / temp, 1), 1, generator=g).squeeze(1)
    return torch.softmax(z, 1), y


# -- smooth ECE ---------------------------------------------------------------------------------

def smece_direct(c, a, sigma, grid=4001):
    """smECE_sigma by the definition: the reflected kernel summed over its images, evaluated at
    every sample (no discretisation), integrated over [0, 1] by Simpson's rule."""
    t = np.linspace(0, 1, grid)
    r = c - a
    s = np.zeros_like(t)
    for k in range(-3, 4):  # images beyond 6 kernel widths are below 1e-8 for sigma <= 1
        for x in (t[:, None] - c[None, :] + 2 * k, t[:, None] + c[None, :] + 2 * k):
            s += (np.exp(-0.5 * (x / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))) @ r
    f = np.abs(s) / len(c)
    h = t[1] - t[0]
    return h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())


def smece_reference(c, a):
    """Fixed point of sigma -> smECE_sigma by the secant-safeguarded bisection of scipy's brentq."""
    from scipy.optimize import brentq

    sigma = brentq(lambda s: smece_direct(c, a, s) - s, 1e-2, 1.0, xtol=1e-9)
    return smece_direct(c, a, sigma), sigma


def test_smece_one_block_is_the_gap():
    p, y = rows([0.8] * 5, [1, 1, 1, 0, 0])  # accuracy 0.6 at confidence 0.8
    value, sigma = smooth_ece(p, y, return_sigma=True)
    assert float(value) == pytest.approx(0.2, abs=1e-6) and sigma == pytest.approx(0.2, abs=1e-6)


def test_smece_residuals_of_one_sign_give_their_mean():
    # every prediction wrong: every residual c - 0 > 0, so |sum K r| = sum K |r| and smECE = mean c
    c = torch.tensor([0.3, 0.45, 0.5, 0.62, 0.9, 0.97, 0.99])
    p, y = rows(c, [0] * 7)
    assert float(smooth_ece(p, y)) == pytest.approx(float(c.double().mean()), rel=1e-6)


@pytest.mark.parametrize("seed,temp", [(0, 1.4), (1, 0.7), (2, 1.0)])
def test_smece_matches_the_direct_definition(seed, temp):
    p, y = random_set(200, seed, temp=temp)
    conf, pred = p.max(1)
    want, want_sigma = smece_reference(conf.numpy(), (pred == y).double().numpy())
    got, sigma = smooth_ece(p, y, return_sigma=True)
    assert float(got) == pytest.approx(want, rel=2e-3)
    assert sigma == pytest.approx(want_sigma, rel=2e-3)


def test_smece_is_invariant_to_row_order_and_binary_layout():
    p, y = random_set(400, 3, k=2)
    perm = torch.randperm(400, generator=torch.Generator().manual_seed(1))
    assert float(smooth_ece(p[perm], y[perm])) == pytest.approx(float(smooth_ece(p, y)), abs=1e-12)
    assert float(smooth_ece(p[:, 1], y)) == pytest.approx(float(smooth_ece(p, y)), abs=1e-12)


# -- ECE sweep ----------------------------------------------------------------------------------

HAND_CONF = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
HAND_CORRECT = [0, 1, 0, 1, 1, 1]


def test_sweep_hand_case():
    # N = 6; rank r in bin floor(r b / 6). b = 2: {.1,.2,.3} {.4,.5,.6} (accuracies 1/3, 1);
    # b = 3: {.1,.2} {.3,.4} {.5,.6} (1/2, 1/2, 1); b = 4: {.1,.2} {.3} {.4,.5} {.6} puts 0.3
    # (wrong) alone after accuracy 1/2, so b* = 3, with gaps 0.35, 0.15 and 0.45.
    p, y = rows(HAND_CONF, HAND_CORRECT)
    value, n = ece_sweep(p, y, return_bins=True)
    assert n == 3
    assert float(value) == pytest.approx((2 * 0.35 + 2 * 0.15 + 2 * 0.45) / 6, abs=1e-12)
    l2 = ece_sweep(p, y, p=2)
    assert float(l2) == pytest.approx(math.sqrt((2 * 0.35 ** 2 + 2 * 0.15 ** 2 + 2 * 0.45 ** 2) / 6), abs=1e-12)


def test_sweep_splits_four_samples_into_two_bins_of_two():
    # binary probabilities 0.6 .. 0.9 (predicted 1), labels 1, 0, 1, 0: b = 2 gives {.6,.7} and
    # {.8,.9}, both of accuracy 1/2 (non-decreasing); b = 3 gives {.6,.7} {.8} {.9} with accuracies
    # 1/2, 1, 0, so b* = 2. (Three samples below the edge would give accuracies 2/3, 0: b* = 1.)
    p, y = torch.tensor([0.6, 0.7, 0.8, 0.9], dtype=torch.float64), torch.tensor([1, 0, 1, 0])
    value, n = ece_sweep(p, y, p=2, return_bins=True)
    assert n == 2
    assert float(value) == pytest.approx(math.sqrt((2 * 0.15 ** 2 + 2 * 0.35 ** 2) / 4), abs=1e-12)


def sweep_reference(p, y, power=1):
    """The sweep with calibkit's equal-mass bins (sorting every sample again for every b)."""
    conf, pred = p.max(1)
    correct = (pred == y).double()
    best = None
    for b in range(1, len(y) + 1):
        s = bin_sums(equal_mass_bins(conf, b), conf, correct, b)
        keep = s.count > 0
        cnt, acc, cf = s.count[keep], s.correct[keep] / s.count[keep], s.conf[keep] / s.count[keep]
        if bool((acc[1:] < acc[:-1]).any()):
            break
        best = float(((cnt / cnt.sum()) * (acc - cf).abs() ** power).sum() ** (1 / power))
    return best


@pytest.mark.parametrize("seed", [0, 4, 5])
@pytest.mark.parametrize("power", [1, 2])
def test_sweep_matches_reference(seed, power):
    p, y = random_set(500, seed)
    assert float(ece_sweep(p, y, p=power)) == pytest.approx(sweep_reference(p, y, power), abs=1e-12)


def test_sweep_bins_are_the_equal_mass_bins_under_ties():
    g = torch.Generator().manual_seed(0)
    values = torch.randint(0, 40, (700,), generator=g).double() / 40  # many ties
    vals, count, _ = tie_blocks(values, torch.zeros(700))
    cum = np.cumsum(count)
    for b in (2, 3, 7, 15, 60):
        cuts = _mass_cuts(vals, cum, float(count.sum()), b)
        ours = np.searchsorted(cuts, np.arange(len(vals)), side="right")  # bin of each block
        theirs = weighted_equal_mass_bins(torch.from_numpy(vals), torch.from_numpy(count)[None], b)[0].numpy()
        assert np.array_equal(ours, theirs)


def test_sweep_on_a_monotone_set_reaches_one_bin_per_block():
    # on a perfectly monotone set the sweep runs to one bin per block; its value is then the
    # mean |acc - conf| per distinct confidence, and with exactly 15 bins it would equal AECE
    conf = torch.linspace(0.5, 0.99, 15).repeat_interleave(20)
    correct = torch.cat([torch.arange(20) < i + 3 for i in range(15)])
    p, y = rows(conf, correct)
    value, n = ece_sweep(p, y, return_bins=True)
    assert n == 15
    assert float(value) == pytest.approx(float(adaptive_ece(p, y, n_bins=15)), abs=1e-12)


# -- KS -----------------------------------------------------------------------------------------

def test_ks_hand_case():
    # a - c per sample: -.1, .8, -.3, .6, .5, .4 -> cumulative sums peak at 1.9 (the end)
    p, y = rows(HAND_CONF, HAND_CORRECT)
    assert float(ks_error(p, y)) == pytest.approx(1.9 / 6, abs=1e-12)
    # over-confident start: conf .9 wrong twice, then .95 right: cums -.9, -1.8, -1.75
    p, y = rows([0.9, 0.9, 0.95], [0, 0, 1])
    assert float(ks_error(p, y)) == pytest.approx(1.8 / 3, abs=1e-12)


def test_ks_ties_enter_together():
    # two samples at 0.7, the wrong one first or last: only the block end counts (|0.6 - 1.4| / 3 ...)
    p, y = rows([0.7, 0.7, 0.9], [0, 1, 1])
    q, z = rows([0.7, 0.7, 0.9], [1, 0, 1])
    want = max(abs(1 - 1.4), abs(2 - 2.3)) / 3
    assert float(ks_error(p, y)) == pytest.approx(want, abs=1e-12) == float(ks_error(q, z))


def test_ks_matches_a_loop():
    p, y = random_set(600, 7)
    conf, pred = p.max(1)
    order = np.argsort(conf.numpy(), kind="stable")
    c, a = conf.numpy()[order], (pred == y).double().numpy()[order]
    run, best = 0.0, 0.0
    for i in range(len(c)):  # continuous confidences: no ties, every prefix counts
        run += a[i] - c[i]
        best = max(best, abs(run))
    assert float(ks_error(p, y)) == pytest.approx(best / len(c), abs=1e-12)


# -- in the panel -------------------------------------------------------------------------------

def test_panel_entries_equal_the_functions_and_stream():
    p, y = random_set(900, 8)
    out = evaluate(p, y)
    assert out["smece"] == pytest.approx(float(smooth_ece(p, y)), abs=1e-15)
    assert out["ece_sweep"] == pytest.approx(float(ece_sweep(p, y)), abs=1e-15)
    assert out["ks"] == pytest.approx(float(ks_error(p, y)), abs=1e-15)
    acc = CalibrationAccumulator(state="exact")
    for i in range(0, 900, 250):
        acc.update(p[i : i + 250], y[i : i + 250])
    got = acc.compute()
    for key in ("smece", "ece_sweep", "ks"):
        assert got[key] == pytest.approx(out[key], abs=1e-12)


def test_fixed_state_uses_fine_bins_as_blocks():
    # confidences on a coarse lattice: every fine bin holds one value, so the fixed state is exact
    g = torch.Generator().manual_seed(2)
    conf = 0.5 + torch.randint(0, 50, (3000,), generator=g).double() / 100
    p, y = rows(conf, torch.rand(3000, generator=g) < conf)
    exact = evaluate(p, y)
    fixed = CalibrationAccumulator(state="fixed").update(p, y).compute()
    for key in ("smece", "ece_sweep", "ks"):
        assert fixed[key] == pytest.approx(exact[key], abs=1e-12)


def test_bad_input_is_refused():
    p, y = random_set(20, 0)
    with pytest.raises(ValueError, match="softmax"):
        smooth_ece(torch.log(p), y)
    with pytest.raises(ValueError, match="out of range"):
        ks_error(p, y + 10)
    with pytest.raises(ValueError, match="p must be 1 or 2"):
        ece_sweep(p, y, p=3)


def test_smece_of_many_blocks_goes_through_the_finest_grid_with_the_same_value(monkeypatch):
    """More blocks than grid intervals: the masses are split once onto the finest grid and the
    coarser grids are split from it; both the grids and the result equal the direct split's."""
    import calibkit.functional.estimators as E

    vals, count, correct = tie_blocks(*_top(*random_set(3000, 9)))
    resid = vals * count - correct
    fine = E._on_grid(vals, resid, 1 << 13)
    for g in (1 << 10, 1 << 11, 1 << 12):
        assert np.allclose(E._coarser(fine, g), E._on_grid(vals, resid, g), rtol=0, atol=1e-12)
    direct = E._smece(vals, count, correct)
    assert direct[1] > 40 / (1 << 11)  # a bandwidth that a grid of 2048 intervals still resolves
    monkeypatch.setattr(E, "_GRID_MAX", 1 << 11)  # 3000 blocks > 2048 intervals: the two-step split
    two_step = E._smece(vals, count, correct)
    assert two_step[0] == pytest.approx(direct[0], abs=1e-12) and two_step[1] == pytest.approx(direct[1], abs=1e-12)


@pytest.mark.parametrize("sigma", [1e-4, 7e-4, 3e-3, 0.02, 0.1, 0.6])
def test_the_narrow_kernel_is_the_wrapped_gaussian_float_for_float(sigma):
    """Narrow bandwidths compute the kernel only within 40 bandwidths of 0: the same floats as the
    sum over every wrapped image of the Gaussian at every grid point (the definition)."""
    import calibkit.functional.estimators as E

    g = E._grid_size(sigma)
    period, h = 2 * g, 1.0 / g
    d = np.minimum(np.arange(period), period - np.arange(period)) * h
    shifts = 2.0 * np.arange(-math.ceil(2.5 * sigma) - 1, math.ceil(2.5 * sigma) + 2)
    full = np.exp(-0.5 * ((d[:, None] + shifts[None, :]) / sigma) ** 2).sum(1) / (sigma * math.sqrt(2 * math.pi))
    assert np.array_equal(E._kernel(period, h, sigma), full)


def test_smece_of_a_nearly_perfect_set_takes_the_narrowest_bandwidth():
    """Every prediction right at confidence 1 - 1e-6: smECE is about 1e-6, its fixed point the
    smallest bandwidth, reached through the finest grids (the case the narrow kernel speeds up)."""
    probs = torch.tensor([[1 - 1e-6, 1e-6]], dtype=torch.float64).repeat(40, 1)
    value, sigma = smooth_ece(probs, torch.zeros(40, dtype=torch.long), return_sigma=True)
    # all the residual mass (-1e-6 per row) sits at one point; reflected smoothing keeps its total
    assert float(value) == pytest.approx(1e-6, rel=1e-3) and sigma == pytest.approx(1e-4, rel=1e-3)


def _top(p, y):
    conf, pred = p.max(1)
    return conf, pred == y


def _blocks_by_loop(conf, correct, weight=None):
    """Tie blocks with a dictionary: distinct confidence -> (count, correct)."""
    seen = {}
    for i, (c, a) in enumerate(zip(conf.tolist(), correct.tolist())):
        if weight is not None and weight[i] == 0:
            continue
        n, s = seen.get(c, (0, 0))
        seen[c] = (n + 1, s + int(a))
    values = sorted(seen)
    return (np.array(values), np.array([seen[v][0] for v in values], float),
            np.array([seen[v][1] for v in values], float))


@pytest.mark.parametrize("kind", ["float32", "float64", "ties"])
def test_tie_blocks_integer_keys_equal_a_loop_for_any_thread_count(kind):
    g = torch.Generator().manual_seed(4)
    conf = torch.rand(200_000, generator=g, dtype=torch.float64)
    if kind == "float32":
        conf = conf.float().double()
    if kind == "ties":
        conf = torch.round(conf * 30) / 30
        conf[:5] = -0.0  # equal to 0.0: one block
    correct = torch.rand(200_000, generator=g) < 0.6
    weight = (torch.rand(200_000, generator=g) < 0.9).double()
    before = torch.get_num_threads()
    for w in (None, weight):
        want = _blocks_by_loop(conf, correct, None if w is None else w.tolist())
        # the argsort path (non-boolean correctness) gives the same blocks
        assert all(np.array_equal(a, b) for a, b in zip(tie_blocks(conf, correct.double(), w), want))
        try:
            for threads in (1, 2, 5):  # the keys are sorted on torch's threads
                torch.set_num_threads(threads)
                assert all(np.array_equal(a, b) for a, b in zip(tie_blocks(conf, correct, w), want)), threads
        finally:
            torch.set_num_threads(before)
