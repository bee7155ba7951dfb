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
    probs = torch.softmax(torch.randn(2000, 10, generator=gen) * 3, 1)
    labels = torch.randint(0, 10, (2000,), generator=gen)
    ax = reliability_diagram(probs, labels, n_bins=15, title="model")
    curve = reliability_curve(probs, labels, 15)
    nonempty = int((curve.count > 0).sum())
    assert len(ax.patches) == 2 * nonempty  # one accuracy bar and one gap band per non-empty bin
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
