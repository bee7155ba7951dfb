"""Histogram binning, isotonic calibration and scaling-binning against hand computations,
scikit-learn's IsotonicRegression and identities."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from calibkit.calibrators import (
    HistogramBinning,
    IsotonicCalibration,
    ScalingBinning,
    TemperatureScaling,
    UniformHistogramBinning,
)
from calibkit.calibrators.binning import fit_bins, pav_tables


def _data(seed, n, k, scale=2.0, sharpen=2.0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * scale
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    return sharpen * z, y


def _floored(q, floor=1e-6):
    """The documented floor written in numpy: max(q, floor) renormalised."""
    q = np.maximum(q, floor)
    return q / q.sum(1, keepdims=True)


def _sklearn_isotonic(p_val, y_val, p_test, irm=False):
    """q_k = g_k(p_k) / sum_j g_j(p_j) with g_k from scikit-learn (numpy); an all-zero row keeps
    ``p_test`` (calibkit's rule; scikit-learn's CalibratedClassifierCV makes it uniform)."""
    from sklearn.isotonic import IsotonicRegression

    n, k = p_val.shape
    onehot = np.eye(k)[y_val]
    if irm:
        iso = IsotonicRegression(out_of_bounds="clip").fit(p_val.ravel(), onehot.ravel())
        g = iso.predict(p_test.ravel()).reshape(p_test.shape)
    else:
        g = np.stack([IsotonicRegression(out_of_bounds="clip").fit(p_val[:, j], onehot[:, j]).predict(p_test[:, j])
                      for j in range(k)], 1)
    s = g.sum(1, keepdims=True)
    return np.where(s > 0, g / np.where(s > 0, s, 1), p_test), g


@pytest.mark.parametrize("irm", [False, True])
def test_isotonic_matches_scikit_learn(irm):
    z, y = _data(0, 600, 6)
    z[:40] = z[40:80]  # tied validation probabilities (merged like scikit-learn does)
    zt, _ = _data(1, 500, 6, sharpen=3.0)  # test rows outside the fitted range too
    cal = IsotonicCalibration(irm=irm, floor=0.0).fit(z, y)
    p_val, p_test = torch.softmax(z, 1).numpy(), torch.softmax(zt, 1).numpy()
    ref, _ = _sklearn_isotonic(p_val, y.numpy(), p_test, irm)
    np.testing.assert_allclose(cal.predict_proba(zt).numpy(), ref, rtol=0, atol=1e-6)
    floored = IsotonicCalibration(irm=irm).fit(z, y).predict_proba(zt).numpy()  # the default floor 1e-6
    np.testing.assert_allclose(floored, _floored(ref), rtol=0, atol=1e-6)
    assert floored.min() > 0
    assert cal.knots_x_.shape[0] == (1 if irm else 6)


def test_pav_tables_fit_each_group_like_scikit_learn():
    from sklearn.isotonic import IsotonicRegression

    g = torch.Generator().manual_seed(2)
    x = torch.rand(300, generator=g, dtype=torch.float64).round(decimals=2)  # many ties
    y = torch.rand(300, generator=g, dtype=torch.float64)
    group = torch.randint(0, 3, (300,), generator=g)
    xs, ys, length = pav_tables(x, y, group, 3)
    for j in range(3):
        m = group == j
        iso = IsotonicRegression().fit(x[m].numpy(), y[m].numpy())
        knots = xs[j, :length[j]].numpy()
        np.testing.assert_allclose(ys[j, :length[j]].numpy(), iso.predict(knots), rtol=0, atol=1e-12)
        assert bool((np.diff(knots) > 0).all())
        assert bool((torch.diff(ys[j, :length[j]]) >= 0).all())


def test_isotonic_small_validation_set_at_k100_never_gives_nan():
    # 1,000 validation samples at K = 100; class 99 never occurs there, so g_99 = 0, and test
    # rows confident in class 99 have g_j(p_j) = 0 for every class: 0 / 0 without a rule for them
    # (calibkit keeps the model's probabilities there, then floors; it used to give 1/K)
    z, y = _data(0, 1100, 100)
    z, y = z[y != 99][:1000], y[y != 99][:1000]
    zt, _ = _data(5, 2000, 100)
    zt[:50, 99] += 40
    cal = IsotonicCalibration().fit(z, y)
    q = cal.predict_proba(zt)
    assert not bool(q.isnan().any())
    torch.testing.assert_close(q.sum(1), torch.ones(2000, dtype=torch.float64), rtol=0, atol=1e-12)
    _, g = _sklearn_isotonic(torch.softmax(z, 1).numpy(), y.numpy(), torch.softmax(zt, 1).numpy())
    zero = g.sum(1) == 0
    assert zero.sum() > 0  # the case exists in this data ...
    keep = torch.from_numpy(_floored(torch.softmax(zt, 1).numpy()[zero]))
    torch.testing.assert_close(q[torch.from_numpy(zero)], keep, rtol=0, atol=1e-12)
    assert bool((q[torch.from_numpy(zero)].argmax(1) == 99).all())  # confident in class 99, not uniform


def test_fit_bins_by_hand():
    v = torch.tensor([[0.1], [0.5], [0.3], [0.9], [0.7], [0.2]], dtype=torch.float64)
    t = torch.tensor([[0.0], [1.0], [0.0], [1.0], [1.0], [1.0]], dtype=torch.float64)
    edges, means = fit_bins(v, t, 2)  # edge s_(3) = 0.3: bins {0.1, 0.2, 0.3} and {0.5, 0.7, 0.9}
    assert edges.tolist() == [[0.3]] and means.tolist() == [[1 / 3, 1.0]]
    edges, means = fit_bins(v, t, 4)  # edges s_(2), s_(3), s_(5): {0.1, 0.2} {0.3} {0.5, 0.7} {0.9}
    assert edges.tolist() == [[0.2, 0.3, 0.7]] and means.tolist() == [[0.5, 0.0, 1.0, 1.0]]
    tied = torch.tensor([[0.4], [0.4], [0.4], [0.8]], dtype=torch.float64)
    edges, means = fit_bins(tied, torch.tensor([[1.0], [0.0], [0.0], [1.0]]), 4)
    # edges 0.4, 0.4, 0.4: bins 1 and 2 hold nothing and take bin 0's mean; the last bin holds 0.8
    assert edges.tolist() == [[0.4, 0.4, 0.4]] and means.tolist() == [[1 / 3, 1 / 3, 1 / 3, 1.0]]


def test_histogram_binning_by_hand():
    # K = 2 with chosen probabilities: p_1 = sigmoid(s), p_0 = 1 - p_1
    p1 = torch.tensor([0.1, 0.2, 0.3, 0.6, 0.7, 0.8], dtype=torch.float64)
    y = torch.tensor([0, 1, 0, 1, 1, 0])
    z = torch.stack([torch.zeros(6, dtype=torch.float64), torch.logit(p1)], 1)
    cal = HistogramBinning(n_bins=2, multiclass="ovr", floor=0.0).fit(z, y)
    # class 1: bins {0.1, 0.2, 0.3} (1 of 3 labelled 1) and {0.6, 0.7, 0.8} (2 of 3)
    # class 0: p_0 = 0.9 .. 0.2; bins {0.2, 0.3, 0.4} (labels 0 at p_0 0.2, 0.4: y=0 for p1 0.8 and 0.6? no:)
    # p_0 = 0.2 (y=0), 0.3 (y=1), 0.4 (y=1) -> 1/3 labelled 0; p_0 = 0.7 (y=0), 0.8 (y=1), 0.9 (y=0) -> 2/3
    torch.testing.assert_close(cal.values_, torch.tensor([[1 / 3, 2 / 3], [1 / 3, 2 / 3]], dtype=torch.float64))
    test = torch.tensor([0.05, 0.25, 0.5, 0.95], dtype=torch.float64)
    q = cal.predict_proba(torch.stack([torch.zeros(4, dtype=torch.float64), torch.logit(test)], 1))
    # p1 = 0.05: g1 = 1/3, p0 = 0.95: g0 = 2/3 -> (2/3, 1/3); p1 = 0.5 > 0.3 -> g1 = 2/3, p0 = 0.5 > 0.4 -> 2/3
    expected = torch.tensor([[2 / 3, 1 / 3], [2 / 3, 1 / 3], [0.5, 0.5], [1 / 3, 2 / 3]], dtype=torch.float64)
    torch.testing.assert_close(q, expected)


def test_scaling_binning_identities():
    z, y = _data(3, 200, 4)
    t = TemperatureScaling().fit(z, y).temperature_
    # one sample per bin, fitted on every row: the bin means are the scaled values themselves
    sb = ScalingBinning(n_bins=200, fit_fraction=1.0).fit(z, y)
    assert sb.temperature_ == t
    torch.testing.assert_close(sb.predict_proba(z), torch.softmax(z / t, 1), rtol=0, atol=1e-12)
    # one bin: every row gets the mean scaled probabilities
    one = ScalingBinning(n_bins=1, fit_fraction=1.0).fit(z, y)
    torch.testing.assert_close(one.predict_proba(z[:5]), torch.softmax(z / t, 1).mean(0).expand(5, 4))


def test_scaling_binning_splits_the_validation_set():
    z, y = _data(4, 300, 3)
    sb = ScalingBinning(n_bins=5).fit(z, y)
    perm = torch.randperm(300, generator=torch.Generator().manual_seed(0))
    first, second = perm[:150].sort().values, perm[150:].sort().values
    t = TemperatureScaling().fit(z[first], y[first]).temperature_
    assert sb.temperature_ == t
    s = torch.softmax(z[second] / t, 1)
    for k in range(3):  # bin means of the scaled values, computed by sorting each column
        col = s[:, k].sort().values
        sizes = [math.ceil((b + 1) * 150 / 5) - math.ceil(b * 150 / 5) for b in range(5)]
        expected = [float(c.mean()) for c in col.split(sizes)]
        np.testing.assert_allclose(sb.values_[k].numpy(), expected, rtol=1e-12)
    with pytest.raises(ValueError, match="fit_fraction must be in"):
        ScalingBinning(fit_fraction=0).fit(z, y)
    with pytest.raises(ValueError, match="leaves a part empty"):
        ScalingBinning(fit_fraction=0.999).fit(z[:10], y[:10])


@pytest.mark.parametrize("n,n_bins", [(600, 15), (600, 4), (601, 15), (37, 5), (10, 15)])
def test_fit_bins_use_the_equal_mass_definition(n, n_bins):
    # every column: the sample of rank r is in bin floor(r B / N), so each edge is the largest
    # value of the ranks below it and, with B | N, every bin holds N / B samples
    g = torch.Generator().manual_seed(n)
    v = torch.rand(n, 3, generator=g, dtype=torch.float64)
    edges, means = fit_bins(v, v, n_bins)
    rank_bin = torch.arange(n) * n_bins // n
    for k in range(3):
        s = v[:, k].sort().values
        want = [float(s[rank_bin < b].max()) for b in range(1, n_bins)]
        assert edges[k].tolist() == want
        counts = torch.bincount(torch.searchsorted(edges[k].contiguous(), v[:, k].contiguous()), minlength=n_bins)
        assert counts.tolist() == torch.bincount(rank_bin, minlength=n_bins).tolist()
        if n % n_bins == 0:
            assert counts.tolist() == [n // n_bins] * n_bins


# ---------------------------------------------------------------------------------- conventions, floor
_REAL = Path(__file__).resolve().parents[3] / "shared" / "data" / "real_outputs" / "cifar10_wrn16-4.npz"


def test_top_label_histogram_by_hand():
    # confidences 0.5 .. 0.95 of K = 3 rows, 2 equal-mass bins: {0.5, 0.6, 0.7} 1 of 3 right, {0.8, 0.9, 0.95} 3 of 3
    conf = torch.tensor([0.5, 0.6, 0.7, 0.8, 0.9, 0.95], dtype=torch.float64)
    p = torch.stack([conf, (1 - conf) * 0.75, (1 - conf) * 0.25], 1)
    y = torch.tensor([0, 1, 2, 0, 0, 0])
    cal = HistogramBinning(n_bins=2, floor=0.0).fit(torch.log(p), y)
    torch.testing.assert_close(cal.edges_, torch.tensor([[0.7]], dtype=torch.float64))
    torch.testing.assert_close(cal.values_, torch.tensor([[1 / 3, 1.0]], dtype=torch.float64))
    q = cal.predict_proba(torch.log(p[[0, 4]]))
    # row 0.5: top gets 1/3, below the least value that keeps it first at K = 3 (1 / (1 + 2 / (1 + 1e-6))),
    # so it is raised to that value and the other two share the rest (uniform mix to stay below it)
    top = 1 / (1 + 2 / (1 + 1e-6))
    assert q[0, 0].item() == pytest.approx(top) and bool((q[0, 1:] <= top / (1 + 1e-6) + 1e-15).all())
    # row 0.9: top gets 1.0, the others 0 without a floor ...
    assert q[1].tolist() == [1.0, 0.0, 0.0]
    # ... and with the default floor 1e-6 they get 1e-6 / (1 + 2e-6), the top 1 / (1 + 2e-6)
    qf = HistogramBinning(n_bins=2).fit(torch.log(p), y).predict_proba(torch.log(p[[4]]))
    torch.testing.assert_close(qf[0], torch.tensor([1.0, 1e-6, 1e-6], dtype=torch.float64) / (1 + 2e-6))


def test_uniform_histogram_by_hand():
    p1 = torch.tensor([0.1, 0.15, 0.3, 0.6, 0.7, 0.8], dtype=torch.float64)
    y = torch.tensor([0, 1, 0, 1, 1, 0])
    z = torch.stack([torch.zeros(6, dtype=torch.float64), torch.logit(p1)], 1)
    cal = UniformHistogramBinning(n_bins=4, multiclass="ovr", floor=0.0).fit(z, y)
    # class 1, bins (0, .25], (.25, .5], (.5, .75], (.75, 1]: {.1, .15} 1/2, {.3} 0, {.6, .7} 1, {.8} 0
    torch.testing.assert_close(cal.values_[1], torch.tensor([0.5, 0.0, 1.0, 0.0], dtype=torch.float64))
    # class 0 (p_0 = .9, .85, .7, .4, .3, .2), each bin's share of y = 0, counted directly
    expected0 = torch.zeros(4, dtype=torch.float64)
    labels0 = (y == 0).double()
    p0 = 1 - p1
    for b, (lo, hi) in enumerate(((0, .25), (.25, .5), (.5, .75), (.75, 1))):
        inside = (p0 > lo) & (p0 <= hi)
        expected0[b] = labels0[inside].mean() if inside.any() else (b + 0.5) / 4  # empty: the midpoint
    torch.testing.assert_close(cal.values_[0], expected0)
    assert UniformHistogramBinning().get_params() == {"n_bins": 15, "multiclass": "top_label", "floor": 1e-6}


def test_top_label_histogram_never_changes_a_prediction_and_ovr_does():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3000, 10, generator=g, dtype=torch.float64) * 4
    y = torch.where(torch.rand(3000, generator=g) < 0.7, z.argmax(1), torch.randint(0, 10, (3000,), generator=g))
    top = HistogramBinning().fit(z[:2000], y[:2000]).predict_proba(z[2000:])
    ovr = HistogramBinning(multiclass="ovr").fit(z[:2000], y[:2000]).predict_proba(z[2000:])
    assert bool((top.argmax(1) == z[2000:].argmax(1)).all())
    assert float((ovr.argmax(1) != z[2000:].argmax(1)).double().mean()) > 0.01  # the convention the default avoids


@pytest.mark.skipif(not _REAL.exists(), reason=f"real outputs not present at {_REAL}")
def test_histogram_on_real_outputs_keeps_predictions_and_gives_no_zeros():
    d = np.load(_REAL)
    z = torch.log(torch.from_numpy(d["probs"]).double().clamp(min=float(np.finfo(np.float32).tiny)))
    y = torch.from_numpy(d["labels"]).long()
    for cls in (HistogramBinning, UniformHistogramBinning):
        q = cls().fit(z[:5000], y[:5000]).predict_proba(z[5000:])
        assert float((q.argmax(1) != z[5000:].argmax(1)).double().mean()) < 0.005  # OvR moves 11.0%
        assert bool((q > 0).all())
    ovr = HistogramBinning(multiclass="ovr", floor=0.0).fit(z[:5000], y[:5000]).predict_proba(z[5000:])
    assert float((ovr.argmax(1) != z[5000:].argmax(1)).double().mean()) > 0.1 and bool((ovr == 0).any())


def test_saved_histogram_round_trips_and_old_files_load_as_one_vs_rest(tmp_path):
    from calibkit.calibrators import load, save

    z, y = _data(4, 300, 5)
    for cal in (HistogramBinning(), UniformHistogramBinning(multiclass="ovr"), HistogramBinning(floor=0.0)):
        cal.fit(z, y)
        save(cal, tmp_path / "h")
        back = load(tmp_path / "h")
        assert type(back) is type(cal) and back.get_params() == cal.get_params()
        assert torch.equal(back.predict_proba(z), cal.predict_proba(z))
    old = HistogramBinning(multiclass="ovr").fit(z, y).to_dict()
    del old["params"]["multiclass"]  # a file written before the option
    assert HistogramBinning.from_dict(old).multiclass == "ovr"
    with pytest.raises(ValueError, match="multiclass"):
        HistogramBinning(multiclass="top").fit(z, y)
    with pytest.raises(ValueError, match="floor"):
        HistogramBinning(floor=0.5).fit(z, y)
