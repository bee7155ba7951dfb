"""Reliability curve (numbers) and the two drawings (Agg, no display)."""

import math

import numpy as np
import pytest
import torch

import calibkit.functional as F
from calibkit.plots import confidence_histogram, reliability_curve, reliability_diagram


def test_reliability_curve_by_hand():
    probs = torch.tensor([[1.0, 0.0]] * 5 + [[0.95, 0.05]] * 5 + [[0.3, 0.7]] * 2)
    labels = torch.tensor([0, 0, 0, 0, 1] + [0] * 5 + [1, 0])
    c = reliability_curve(probs, labels, n_bins=10)
    # 1.0 and 0.95 share the last bin (9/10 right, mean conf 0.975); 0.7 x2 in (0.6, 0.7], one right
    assert c.count.tolist() == [0] * 6 + [2, 0, 0, 10]
    assert c.accuracy[9] == pytest.approx(0.9) and c.confidence[9] == pytest.approx(0.975)
    assert c.accuracy[6] == pytest.approx(0.5) and c.confidence[6] == pytest.approx(0.7)
    assert np.isnan(c.accuracy[0]) and np.isnan(c.confidence[0])
    assert c.ece == pytest.approx((10 * 0.075 + 2 * 0.2) / 12)
    assert c.edges.tolist() == pytest.approx([i / 10 for i in range(11)])


def test_reliability_diagram_draws_bars_counts_and_ece(gen, tmp_path):
    # sharp probabilities with random labels (over-confident) and soft ones whose argmax is always
    # right (under-confident): both kinds of gap appear
    sharp = torch.softmax(torch.randn(1000, 10, generator=gen) * 3, 1)
    soft = torch.softmax(torch.randn(1000, 10, generator=gen) * 0.5, 1)
    probs = torch.cat([sharp, soft])
    labels = torch.cat([torch.randint(0, 10, (1000,), generator=gen), soft.argmax(1)])
    ax = reliability_diagram(probs, labels, n_bins=15, title="model")
    curve = reliability_curve(probs, labels, 15)
    nonempty = int((curve.count > 0).sum())
    full = curve.count > 0
    over = int((full & (curve.confidence > curve.accuracy)).sum())
    under = int((full & (curve.accuracy > curve.confidence)).sum())
    assert over > 0 and under > 0  # this input has both kinds of bins
    # one accuracy bar per non-empty bin, then one gap band per miscalibrated bin
    assert len(ax.patches) == nonempty + over + under
    # both kinds of gap are named in the legend
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("over-confident" in t for t in legend) and any("under-confident" in t for t in legend)
    heights = sorted(p.get_height() for p in ax.patches[:nonempty])
    assert heights == pytest.approx(sorted(curve.accuracy[curve.count > 0]))
    texts = {t.get_text() for t in ax.texts}
    assert {str(int(n)) for n in curve.count[curve.count > 0]} <= texts
    ece = F.ece(probs, labels).item()
    assert f"ECE = {100 * ece:.2f}%" in ax.get_title() and ax.get_title().startswith("model")
    path = tmp_path / "rel.png"
    ax.figure.savefig(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_confidence_histogram(gen, tmp_path):
    probs = torch.softmax(torch.randn(500, 4, generator=gen), 1)
    labels = torch.randint(0, 4, (500,), generator=gen)
    ax = confidence_histogram(probs, labels, n_bins=10)
    assert len(ax.patches) == 10
    assert sum(p.get_height() for p in ax.patches) == pytest.approx(1.0)
    xs = sorted(line.get_xdata()[0] for line in ax.lines)
    acc, conf = F.accuracy(probs, labels).item(), probs.max(1).values.double().mean().item()
    assert xs == pytest.approx(sorted([acc, conf]))
    ax2 = confidence_histogram(probs)  # labels optional: only the mean-confidence line
    assert len(ax2.lines) == 1
    ax2.figure.savefig(tmp_path / "hist.png")


def test_draws_on_a_given_axes(gen):
    from matplotlib.figure import Figure

    fig = Figure()
    ax = fig.add_subplot(1, 2, 1)
    probs = torch.tensor([[0.8, 0.2], [0.4, 0.6]])
    assert reliability_diagram(probs, torch.tensor([0, 0]), ax=ax) is ax


def test_plots_reject_bad_input():
    with pytest.raises(ValueError, match="sum to 1"):
        reliability_diagram(torch.tensor([[0.5, 0.1]]), torch.tensor([0]))
    with pytest.raises(ValueError, match="n_bins"):
        confidence_histogram(torch.tensor([[0.5, 0.5]]), n_bins=0)
    with pytest.raises(ValueError, match="out of range"):
        reliability_curve(torch.tensor([[0.5, 0.5]]), torch.tensor([2]))
    assert math.isfinite(reliability_curve(torch.tensor([[0.5, 0.5]]), torch.tensor([1])).ece)


@pytest.mark.parametrize("draw", [reliability_diagram, confidence_histogram])
def test_legend_lies_outside_the_axes(gen, draw):
    """The legend covers no bar, count or line: its box is entirely below the plotting area."""
    probs = torch.softmax(torch.randn(1000, 10, generator=gen) * 3, 1)
    labels = torch.randint(0, 10, (1000,), generator=gen)
    ax = draw(probs, labels)
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = ax.get_legend().get_window_extent(renderer)
    axes = ax.get_window_extent(renderer)
    assert legend.y1 < axes.y0  # pixel coordinates grow upwards
    assert min(t.get_fontsize() for t in ax.get_legend().get_texts()) >= 8


# -- bootstrap band -------------------------------------------------------------------------------

def _model(gen, n, k=5):
    """Over-confident predictions: the argmax is right 60% of the time, confidences spread wide."""
    probs = torch.softmax(torch.randn(n, k, generator=gen, dtype=torch.float64) * 2, 1)
    labels = torch.where(torch.rand(n, generator=gen) < 0.6, probs.argmax(1), torch.randint(0, k, (n,), generator=gen))
    return probs, labels


def _bootstrap_by_hand(conf, correct, n_bins, level, n_boot, seed):
    """The documented band, written with loops: cells (bin, correct) counted row by row, one
    multinomial draw of their counts per resample, per-bin accuracies of the resamples where the
    bin is not empty, then their percentile interval."""
    cells = np.zeros(2 * n_bins)
    for c, a in zip(conf, correct):
        b = min(max(math.ceil(c * n_bins) - 1, 0), n_bins - 1)  # (lo, hi] bins
        cells[2 * b + int(a)] += 1
    n = int(cells.sum())
    draws = np.random.default_rng(seed).multinomial(n, cells / n, size=n_boot)
    lo, hi = np.full(n_bins, np.nan), np.full(n_bins, np.nan)
    for b in range(n_bins):
        if cells[2 * b] + cells[2 * b + 1] == 0:
            continue
        accs = [d[2 * b + 1] / (d[2 * b] + d[2 * b + 1]) for d in draws if d[2 * b] + d[2 * b + 1] > 0]
        lo[b], hi[b] = np.quantile(accs, (1 - level) / 2), np.quantile(accs, (1 + level) / 2)
    return lo, hi


def test_band_equals_an_independent_bootstrap_for_a_fixed_seed(gen):
    probs, labels = _model(gen, 600)
    conf, pred = probs.max(1)
    assert not np.any(np.isclose((conf * 10).numpy() % 1, 0))  # no confidence on an edge j / 10
    for level, seed in ((0.9, 0), (0.95, 7)):
        c = reliability_curve(probs, labels, n_bins=10, band=True, level=level, n_boot=300, seed=seed)
        lo, hi = _bootstrap_by_hand(conf.tolist(), (pred == labels).tolist(), 10, level, 300, seed)
        assert np.array_equal(np.isnan(c.band_lo), np.isnan(lo))
        assert np.allclose(c.band_lo, lo, rtol=0, atol=1e-12, equal_nan=True)
        assert np.allclose(c.band_hi, hi, rtol=0, atol=1e-12, equal_nan=True)
        assert c.band_level == level


def test_band_brackets_the_curve_and_is_empty_where_the_bins_are(gen):
    probs, labels = _model(gen, 3000)
    c = reliability_curve(probs, labels, n_bins=15, band=True)
    full = c.count > 0
    assert (~full).any() and full.sum() >= 8  # both kinds of bins in this set
    assert np.all(c.band_lo[full] <= c.accuracy[full]) and np.all(c.accuracy[full] <= c.band_hi[full])
    assert np.all(c.band_lo[full] < c.band_hi[full])  # bins of a few hundred rows: a real spread
    assert np.all(np.isnan(c.band_lo[~full])) and np.all(np.isnan(c.band_hi[~full]))
    assert np.all((c.band_lo[full] >= 0) & (c.band_hi[full] <= 1))
    assert reliability_curve(probs, labels).band_lo is None  # no band unless asked


@pytest.mark.parametrize("seed", range(5))
def test_band_shrinks_as_n_grows(seed):
    g = torch.Generator().manual_seed(seed)
    small, big = (reliability_curve(*_model(g, n), n_bins=10, band=True, n_boot=400, seed=seed)
                  for n in (400, 40_000))
    both = (small.count >= 20) & (big.count > 0)
    assert both.sum() >= 3
    width_small = small.band_hi[both] - small.band_lo[both]
    width_big = big.band_hi[both] - big.band_lo[both]
    assert np.all(width_big < width_small)
    # 100 times the rows: widths about 10 times smaller (binomial spread), never under 3 times
    assert np.mean(width_big) < np.mean(width_small) / 3


def test_band_is_reproducible_and_depends_on_the_seed(gen):
    probs, labels = _model(gen, 800)
    a, b, c = (reliability_curve(probs, labels, band=True, n_boot=200, seed=s) for s in (3, 3, 4))
    assert np.array_equal(a.band_lo, b.band_lo, equal_nan=True) and np.array_equal(a.band_hi, b.band_hi, equal_nan=True)
    assert not np.array_equal(a.band_lo, c.band_lo, equal_nan=True)


def test_diagram_draws_the_band_as_one_fill_over_the_bins(gen):
    from matplotlib.collections import PolyCollection

    probs, labels = _model(gen, 2000)
    plain = reliability_diagram(probs, labels, n_bins=10)
    ax = reliability_diagram(probs, labels, n_bins=10, band=True, n_boot=300)
    assert len(ax.patches) == len(plain.patches)  # the bars and gaps are unchanged
    fills = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(fills) == 1 and not any(isinstance(c, PolyCollection) for c in plain.collections)
    curve = reliability_curve(probs, labels, n_bins=10, band=True, n_boot=300)
    ys = np.concatenate([p.vertices[:, 1] for p in fills[0].get_paths()])
    full = curve.count > 0
    assert ys.min() == pytest.approx(np.min(curve.band_lo[full]))
    assert ys.max() == pytest.approx(np.max(curve.band_hi[full]))
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "90% bootstrap band of the accuracy (300 resamples)" in legend


@pytest.mark.parametrize("kwargs,match", [
    ({"level": 0}, "level"), ({"level": 1.0}, "level"), ({"level": True}, "level"), ({"level": "0.9"}, "level"),
    ({"n_boot": 1}, "n_boot"), ({"n_boot": 10.0}, "n_boot"), ({"n_boot": True}, "n_boot"),
    ({"seed": -1}, "seed"), ({"seed": 0.5}, "seed"),
])
def test_band_refuses_bad_arguments(kwargs, match):
    probs, labels = torch.tensor([[0.8, 0.2], [0.3, 0.7]]), torch.tensor([0, 0])
    with pytest.raises(ValueError, match=match):
        reliability_curve(probs, labels, band=True, **kwargs)
    with pytest.raises(ValueError, match=match):
        reliability_diagram(probs, labels, band=True, **kwargs)


def _binomial_quantiles_by_hand(n, c, tail):
    """Quantiles of Bin(n, c) from math.comb: the least k with P(X <= k) >= t and >= 1 - t."""
    cdf, lo, hi = 0.0, None, None
    for k in range(n + 1):
        cdf += math.comb(n, k) * c**k * (1 - c) ** (n - k)
        if lo is None and cdf >= tail - 1e-12:
            lo = k
        if hi is None and cdf >= 1 - tail - 1e-12:
            hi = k
    return lo, hi


def test_consistency_band_is_the_binomial_quantile_interval():
    from calibkit.plots import consistency_band

    count = np.array([40.0, 0.0, 7.0, 120.0])
    conf_sum = np.array([40 * 0.35, 0.0, 7 * 0.8, 120 * 0.93])
    for simultaneous, tail in ((False, 0.05), (True, 0.1 / 6)):  # Bonferroni over the 3 non-empty bins
        lo, hi = consistency_band(count, conf_sum, 0.9, simultaneous)
        assert np.isnan(lo[1]) and np.isnan(hi[1])
        for b in (0, 2, 3):
            n = int(count[b])
            k_lo, k_hi = _binomial_quantiles_by_hand(n, conf_sum[b] / n, tail)
            assert lo[b] == pytest.approx(k_lo / n) and hi[b] == pytest.approx(k_hi / n)
    # the band is around the diagonal (the mean confidence), not around the bar
    lo, hi = consistency_band(count, conf_sum, 0.9)
    assert np.all(lo[[0, 2, 3]] <= conf_sum[[0, 2, 3]] / count[[0, 2, 3]])
    assert np.all(conf_sum[[0, 2, 3]] / count[[0, 2, 3]] <= hi[[0, 2, 3]])


def test_consistency_band_covers_a_calibrated_model():
    """Labels drawn from the confidences themselves: most bars fall inside the pointwise band, and
    all bars inside the simultaneous one in most draws (the figures of docs/metrics.md come from
    benchmarks/reliability_band_coverage.py; here a quick check with 40 draws)."""
    rng = np.random.default_rng(0)
    inside, joint = [], []
    for _ in range(40):
        n, k = 2000, 5
        c = 1 - 0.75 * rng.beta(1, 4, size=n)
        pred = rng.integers(0, k, size=n)
        labels = np.where(rng.random(n) < c, pred, (pred + rng.integers(1, k, size=n)) % k)
        probs = np.repeat(((1 - c) / (k - 1))[:, None], k, axis=1)
        probs[np.arange(n), pred] = c
        cur = reliability_curve(torch.from_numpy(probs), torch.from_numpy(labels), 10, band=True,
                                band_kind="consistency")
        full = cur.count > 0
        inside.extend(((cur.band_lo <= cur.accuracy) & (cur.accuracy <= cur.band_hi))[full].tolist())
        sim = reliability_curve(torch.from_numpy(probs), torch.from_numpy(labels), 10, band=True,
                                band_kind="consistency", simultaneous=True)
        joint.append(bool(((sim.band_lo <= sim.accuracy) & (sim.accuracy <= sim.band_hi))[full].all()))
        assert cur.band_kind == "consistency" and sim.band_simultaneous
    assert np.mean(inside) >= 0.85 and np.mean(joint) >= 0.8


def test_the_diagram_names_its_band():
    probs, labels = _model(torch.Generator().manual_seed(0), 500)
    texts = {}
    for kind in ("bootstrap", "consistency"):
        ax = reliability_diagram(probs, labels, band=True, band_kind=kind, n_boot=50)
        texts[kind] = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("bootstrap band of the accuracy" in t for t in texts["bootstrap"])
    assert any("consistency band of a calibrated model (per bin)" in t for t in texts["consistency"])
    with pytest.raises(ValueError, match="band_kind"):
        reliability_curve(probs, labels, band=True, band_kind="percentile")
    with pytest.raises(ValueError, match="simultaneous"):
        reliability_curve(probs, labels, band=True, simultaneous=True)
