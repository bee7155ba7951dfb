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
