"""AdaFocal's validation bins and gamma updates against the rule, written out here.

The rule (the AdaFocal authors' code, with calibkit's documented departures): edges = the
largest sorted validation confidence of the ranks that the equal-mass definition puts below
them (rank ``r`` of ``N`` in bin ``floor(r B / N)``; the authors interpolate at positions
``j N / B`` instead, one sample too many below an edge at an integer position), a sample in bin
``b`` when ``edges[b] < c <= edges[b + 1]``, ``gap_b = conf_b - acc_b`` (0 for an empty bin),
then the multiplicative gamma rule with the sign flip and the clip. The smallest confidence (and
those tied with it) is in bin 0, where the authors' first bin, open at the minimum, leaves it out
(``keep_min``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from calibkit.functional.binning import equal_mass_edges
from calibkit.functional.metrics import adaptive_ece
from calibkit.losses import AdaFocal


def _ref_edges(conf: np.ndarray, n_bins: int) -> np.ndarray:
    s = np.sort(conf)
    n = len(s)
    below = np.array([r * n_bins // n for r in range(n)])  # bin of each rank, ties aside
    return np.array([s[0]] + [s[below < j].max() for j in range(1, n_bins)] + [s[-1]])


def _ref_bins(values: np.ndarray, edges: np.ndarray, keep_min: bool = True) -> list[np.ndarray]:
    """Boolean membership of each value in each bin, (lo, hi], one loop per bin as the reference has it."""
    out = []
    for b in range(len(edges) - 1):
        lo, hi = edges[b], edges[b + 1]
        inside = (values > lo) & (values <= hi)
        if b == 0 and keep_min:
            inside |= values <= hi
        if b == len(edges) - 2:
            inside |= values > hi  # training values above the validation maximum
        out.append(inside)
    return out


def _ref_gammas(gammas: list[float], conf, correct, n_bins, lam=1.0, th=0.2, gmin=-2.0, gmax=20.0):
    edges = _ref_edges(conf, n_bins)
    new = []
    for b, inside in enumerate(_ref_bins(conf, edges)):
        gap = float(conf[inside].mean() - correct[inside].mean()) if inside.any() else 0.0
        g = gammas[b]
        g = g * math.exp(lam * gap) if g > 0 else g * math.exp(-lam * gap)
        if abs(g) < th:
            g = -th if g > 0 else th
        new.append(max(min(g, gmax), gmin))
    return new, edges


def _two_class_logits(x: torch.Tensor) -> torch.Tensor:
    # rows [0, x]: confidence 1 / (1 + exp(-|x|)); equal x give exactly equal confidences
    return torch.stack([torch.zeros_like(x), x], 1).double()


def _conf(logits: torch.Tensor) -> np.ndarray:
    return torch.softmax(logits.double(), 1).max(1).values.numpy()


def _counts(loss: AdaFocal, conf: np.ndarray) -> list[int]:
    return torch.bincount(loss._bin_of(torch.from_numpy(conf)), minlength=loss.n_bins).tolist()


def test_sixteen_distinct_samples_fill_every_bin_the_first_with_two():
    # N = 16, B = 15: rank r in bin floor(15 r / 16), so bin 0 holds ranks 0 and 1 and bin j the
    # rank j + 1 alone (edge j is the sample of rank ceil(16 j / 15) - 1 = j).
    x = torch.linspace(0.1, 3.0, 16)
    logits = _two_class_logits(x)
    loss = AdaFocal(2)
    loss.update(logits, logits.argmax(1))
    conf = _conf(logits)
    assert _counts(loss, conf) == [2] + [1] * 14
    assert _counts(loss, conf) == [int(m.sum()) for m in _ref_bins(conf, _ref_edges(conf, 15))]


def test_samples_exactly_on_edges_go_to_the_lower_bin():
    # N = 30, B = 15: bins of exactly 2; edge j is the sample of rank 2 j - 1, the largest of bin
    # j - 1, so 14 samples lie exactly on an interior edge; each stays in the bin below it. The
    # float64 edges matter: rounded to float32, an edge below its sample would push that sample up
    # one bin.
    x = torch.linspace(0.05, 4.0, 30)
    logits = _two_class_logits(x)
    loss = AdaFocal(2)
    loss.update(logits, logits.argmax(1))
    conf = _conf(logits)
    np.testing.assert_array_equal(loss.edges[1:-1].numpy(), np.sort(conf)[1:28:2])
    assert loss.edges.dtype == torch.float64
    assert _counts(loss, conf) == [2] * 15
    # training samples whose p_y equals those confidences take the same bins
    g = torch.arange(15, dtype=torch.float64) + 1.0
    loss.gammas.copy_(g)
    want = [int(np.flatnonzero([m[i] for m in _ref_bins(conf, _ref_edges(conf, 15))])[0]) + 1 for i in range(30)]
    assert loss.sample_gammas(logits, logits.argmax(1)).tolist() == want


def test_ties_share_a_bin_and_leave_bins_empty():
    x = torch.tensor([0.5] * 7 + [1.0] * 5 + [1.5, 2.0, 2.5] + [3.0] * 5)
    logits = _two_class_logits(x)
    loss = AdaFocal(2, n_bins=6)
    gap = loss.update(logits, torch.tensor([1, 0] * 10))
    conf = _conf(logits)
    ref = _ref_bins(conf, _ref_edges(conf, 6))
    assert _counts(loss, conf) == [int(m.sum()) for m in ref] == [7, 0, 5, 2, 6, 0]
    correct = (np.array([1, 0] * 10) == 1).astype(float)
    want = [conf[m].mean() - correct[m].mean() if m.any() else 0.0 for m in ref]
    np.testing.assert_allclose(gap.double().numpy(), want, rtol=0, atol=1e-7)  # gaps are logged in float32


def test_gammas_follow_the_reference_rule_over_epochs():
    gen = torch.Generator().manual_seed(3)
    loss = AdaFocal(5)
    gammas = [1.0] * 15
    for epoch in range(8):
        # rows (x, 0, 0, 0, 0) with x from 12 levels: blocks of exactly tied confidences, edges on samples
        logits = torch.zeros(400, 5, dtype=torch.float64)
        logits[:, 0] = torch.randint(0, 12, (400,), generator=gen) * 0.4 * (1 + epoch / 4)
        labels = torch.randint(0, 5, (400,), generator=gen)
        labels[: 150 + 25 * epoch] = 0
        conf = _conf(logits)
        correct = (logits.argmax(1) == labels).double().numpy()
        assert len(np.unique(conf)) == 12
        loss.update(logits, labels)
        gammas, edges = _ref_gammas(gammas, conf, correct, 15)
        gammas = [float(np.float32(g)) for g in gammas]  # the gammas buffer is float32
        # one float32 ulp: the gaps agree to float64 rounding, then both round to float32
        np.testing.assert_allclose(loss.gammas.double().numpy(), gammas, rtol=2.0**-23, atol=0)
        np.testing.assert_array_equal(loss.edges[1:-1].numpy(), edges[1:-1])  # edges are samples: exact
        assert _counts(loss, conf) == [int(m.sum()) for m in _ref_bins(conf, edges)]
    assert len(set(gammas)) > 3  # the bins really moved apart


def test_the_bins_are_adaptive_ece_s_bins():
    gen = torch.Generator().manual_seed(5)
    logits = (torch.randn(301, 4, generator=gen, dtype=torch.float64) * 2).round(decimals=1)
    labels = torch.randint(0, 4, (301,), generator=gen)
    loss = AdaFocal(4)
    gap = loss.update(logits, labels).double()
    conf = torch.from_numpy(_conf(logits))
    torch.testing.assert_close(loss.edges[1:-1], equal_mass_edges(conf, 15)[1:-1], rtol=0, atol=0)
    counts = torch.tensor(_counts(loss, conf.numpy()), dtype=torch.float64)
    # adaptive_ece = sum_b n_b |gap_b| / N over the same bins
    aece = float(adaptive_ece(torch.softmax(logits, 1), labels, n_bins=15))
    assert float((counts * gap.abs()).sum() / 301) == pytest.approx(aece, abs=1e-6)


def test_dense_update_bins_every_valid_pixel():
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(2, 3, 5, 6, generator=gen, dtype=torch.float64) * 3
    labels = torch.randint(0, 3, (2, 5, 6), generator=gen)
    labels[0, 0] = 255
    loss = AdaFocal(3, n_bins=4)
    loss.update(logits, labels)
    keep = (labels != 255).reshape(-1)
    conf = _conf(logits.permute(0, 2, 3, 1).reshape(-1, 3))[keep.numpy()]
    np.testing.assert_array_equal(loss.edges[1:-1].numpy(), _ref_edges(conf, 4)[1:-1])
