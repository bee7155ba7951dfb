"""The fine confidence histogram, the weighted equal-mass bins, the weighted AECE sums and the
device placement of the binning helpers.

Bins are checked against hand computations and against an independent numpy reference built
from the documented definition (sort; rank ``r`` of ``N`` in bin ``floor(r B / N)``; an edge is
the largest value of the bins below it; ``(lo, hi]`` membership, so ties stay whole).
The meta device stands in for an accelerator: every output must stay on the input's device, and
a helper that builds a tensor on the CPU (or hands a tensor to numpy) fails there.
"""

import numpy as np
import pytest
import torch

from calibkit.functional import binning
from calibkit.functional.binning import (
    FINE_BINS,
    bin_indices,
    equal_mass_sums,
    equal_width_edges,
    fine_bin_index,
    scatter_sums,
    weighted_equal_mass_bins,
)

META = torch.device("meta")
TOP = FINE_BINS - 1  # 31 * 256 + 1 bins: the last one holds d = 1 - conf < 2^-30


# ---------- fine_bin_index ----------
# With d = 1 - conf = mant * 2^e (mant in [0.5, 1)), binade a = 1 - e and sub-bin
# j = floor((2 mant - 1) * 256), the bin is 256 a + 255 - j (docstring of fine_bin_index).
HAND = [
    (0.0, 255),               # d = 1 = 0.5 * 2^1: a = 0, j = 0
    (0.5, 511),               # d = 0.5 * 2^0: a = 1, j = 0
    (0.25, 383),              # d = 0.75 * 2^0: a = 1, j = floor(0.5 * 256) = 128 -> 256 + 127
    (2.0**-9, 256),           # d = 1 - 2^-9 = (1 - 2^-9) * 2^0: j = floor((1 - 2^-8) 256) = 255
    (0.75, 767),              # d = 0.25 = 0.5 * 2^-1: a = 2, j = 0
    (1 - 1.5 * 2.0**-30, 7807),  # d = 0.75 * 2^-29: a = 30 (the last binade), j = 128
    (1 - 2.0**-30, 7935),     # d = 0.5 * 2^-29: a = 30, j = 0: the last bin below the top one
    (1 - 2.0**-31, TOP),      # d = 2^-31 < 2^-30
    (1.0, TOP),               # d = 0
]


def test_fine_bin_index_hand_values():
    conf = torch.tensor([c for c, _ in HAND], dtype=torch.float64)
    got = fine_bin_index(conf)
    assert got.dtype == torch.int64
    assert got.tolist() == [b for _, b in HAND]
    # float32 confidences are upcast exactly: 0.5, 0.25 and 0.75 keep their bins
    assert fine_bin_index(torch.tensor([0.5, 0.25, 0.75, 1.0])).tolist() == [511, 383, 767, TOP]


def test_fine_bin_index_every_binade_and_sub_bin():
    # d at the centre of sub-bin i of binade a: d = (256 + i + 0.5) / 512 * 2^(1 - a), so that
    # mant = (256 + i + 0.5) / 512 and j = floor(i + 0.5) = i. conf = 1 - d is exact in float64
    # (d has 10 significant bits and d >= 2^-30).
    a = torch.arange(1, 31).repeat_interleave(256)
    i = torch.arange(256).repeat(30)
    d = (256 + i + 0.5).double() / 512 * torch.pow(2.0, (1 - a).double())
    conf = 1 - d
    assert torch.equal(1 - conf, d)
    got = fine_bin_index(conf)
    assert torch.equal(got, 256 * a + 255 - i)
    assert got.unique().numel() == 30 * 256 and int(got.min()) == 256 and int(got.max()) == TOP - 1


def test_fine_bin_index_keeps_the_device():
    assert fine_bin_index(torch.rand(7, device=META)).device.type == "meta"


# ---------- weighted_equal_mass_bins ----------
def rank_bins(n, n_bins):
    """The definition: the sample of rank ``r`` (0-based) of ``n`` is in bin ``floor(r B / n)``."""
    return np.array([r * n_bins // n for r in range(n)], dtype=np.int64)


def reference_weighted_bins(values, weights, n_bins):
    """(lo, hi] bins of ``values`` under the equal-mass edges of the multiset holding values[m]
    weights[m] times: edge ``b`` = the largest multiset value among the ranks that the definition
    puts in bins ``0 .. b - 1`` (:func:`rank_bins`)."""
    multiset = np.repeat(values, weights.astype(np.int64))
    ranks = rank_bins(len(multiset), n_bins)
    edges = np.array([multiset[ranks < b].max() for b in range(1, n_bins)])
    return (values[:, None] > edges[None, :]).sum(1)


@pytest.mark.parametrize("n_bins", [2, 3, 4, 7, 9])
def test_weighted_equal_mass_bins_equal_the_multiset_reference(gen, n_bins):
    m = 7
    values = (torch.randperm(40, generator=gen)[:m].sort().values.double() + 1) / 41  # distinct, ascending
    weights = torch.randint(0, 4, (60, m), generator=gen).double()
    weights[:5, -2:] = 0        # trailing values of weight 0
    weights[5:10, :-1] = 0      # all the mass on the last value
    weights[10:15, -1] = 9      # a heavy last value: inner edges fall on it
    weights[15:20, 0] = 9       # a heavy first value
    weights[weights.sum(1) == 0, 2] = 1
    got = weighted_equal_mass_bins(values, weights, n_bins)
    assert got.shape == (60, m) and got.dtype == torch.int64
    v = values.numpy()
    for r in range(60):
        want = reference_weighted_bins(v, weights[r].numpy(), n_bins)
        assert got[r].tolist() == want.tolist(), (r, weights[r].tolist())


def test_weighted_equal_mass_bins_by_hand():
    values = torch.tensor([0.1, 0.2, 0.9], dtype=torch.float64)
    # Multiset {0.1, 0.2, 0.9 x 10}, N = 12, 3 bins of 4: {0.1, 0.2, 0.9, 0.9}, {0.9 x 4}, {0.9 x 4}.
    # The ten tied 0.9 stay together, in the bin of their lowest rank: all three values in bin 0.
    assert weighted_equal_mass_bins(values, torch.tensor([[1.0, 1.0, 10.0]]), 3).tolist() == [[0, 0, 0]]
    # Multiset {0.1 x 2, 0.2, 0.9}, N = 4, 2 bins of exactly 2: {0.1, 0.1} and {0.2, 0.9}
    # (interpolating the edge at position 2 would put 0.2 below it: 3 and 1).
    assert weighted_equal_mass_bins(values, torch.tensor([[2.0, 1.0, 1.0]]), 2).tolist() == [[0, 1, 1]]
    # Multiset {0.1, 0.2}, 0.9 of weight 0, N = 2, 4 bins: rank r in bin floor(4 r / 2) = 2 r, so
    # 0.1 -> bin 0 and 0.2 -> bin 2 (bins 1 and 3 hold nothing); edges 0.1, 0.1, 0.2, and 0.9,
    # which carries no mass, lies above every edge -> bin 3.
    assert weighted_equal_mass_bins(values, torch.tensor([[1.0, 1.0, 0.0]]), 4).tolist() == [[0, 2, 3]]


@pytest.mark.parametrize("n,n_bins", [(5000, 2), (12, 4), (12, 12), (10, 3), (7, 5), (3, 5), (1, 4), (1001, 15)])
def test_equal_mass_bins_hold_the_ranks_of_the_definition(gen, n, n_bins):
    # distinct confidences: bin of every sample = floor(rank B / N); with B | N every bin holds N / B
    conf = torch.randperm(10 * n, generator=gen)[:n].double() / (10 * n)
    rank = torch.argsort(torch.argsort(conf))
    want = torch.from_numpy(rank_bins(n, n_bins))[rank]
    assert binning.equal_mass_bins(conf, n_bins).tolist() == want.tolist()
    counts = torch.bincount(binning.equal_mass_bins(conf, n_bins), minlength=n_bins)
    assert counts.max() - counts.min() <= 1 and int(counts.sum()) == n
    if n % n_bins == 0:
        assert counts.tolist() == [n // n_bins] * n_bins
    # the weighted version with all weights 1 (and with 0/1 weights over padding) gives the same bins
    s, order = conf.sort()
    ones = weighted_equal_mass_bins(s, torch.ones(1, n, dtype=torch.float64), n_bins)[0]
    assert ones.tolist() == want[order].tolist()
    padded = torch.cat([s, torch.tensor([2.0], dtype=torch.float64)])
    w = torch.cat([torch.ones(n), torch.zeros(1)]).double()[None]
    assert weighted_equal_mass_bins(padded, w, n_bins)[0, :n].tolist() == want[order].tolist()


def test_equal_mass_bins_of_5000_samples_in_2_bins_are_2500_and_2500(gen):
    conf = torch.rand(5000, generator=gen, dtype=torch.float64)
    assert torch.bincount(binning.equal_mass_bins(conf, 2)).tolist() == [2500, 2500]
    assert torch.bincount(binning.equal_mass_bins(conf.float(), 2)).tolist() == [2500, 2500]


def test_equal_mass_ties_stay_whole_in_the_bin_of_their_lowest_rank():
    # sorted: 0.2 x2 (ranks 0-1), 0.5 x5 (ranks 2-6), 0.7 (7), 0.8 x4 (8-11); N = 12, B = 4:
    # without ties ranks 0-2, 3-5, 6-8, 9-11. The 0.5 block starts in bin 0 (rank 2) and goes
    # whole there; 0.7 (rank 7) is in bin 2; the 0.8 block starts at rank 8, in bin 2: bins 1 and 3
    # stay empty.
    conf = torch.tensor([0.5, 0.8, 0.2, 0.5, 0.8, 0.7, 0.5, 0.2, 0.8, 0.5, 0.8, 0.5], dtype=torch.float64)
    want = {0.2: 0, 0.5: 0, 0.7: 2, 0.8: 2}
    assert binning.equal_mass_bins(conf, 4).tolist() == [want[float(c)] for c in conf]
    assert binning.equal_mass_edges(conf, 4).tolist() == [0.2, 0.5, 0.5, 0.8, 0.8]
    vals, counts = conf.unique(return_counts=True)
    got = weighted_equal_mass_bins(vals, counts.double()[None], 4)[0]
    assert got.tolist() == [want[float(v)] for v in vals]
    # sorted 0.2 x2, 0.5 x3, 0.7, 0.8 x2; N = 8, B = 4: ranks 0-1, 2-3, 4-5, 6-7. The 0.5 block
    # (ranks 2-4) starts in bin 1 and goes whole there: counts 2, 3, 1, 2.
    conf = torch.tensor([0.8, 0.5, 0.2, 0.7, 0.5, 0.2, 0.8, 0.5], dtype=torch.float64)
    want = {0.2: 0, 0.5: 1, 0.7: 2, 0.8: 3}
    assert binning.equal_mass_bins(conf, 4).tolist() == [want[float(c)] for c in conf]
    assert torch.bincount(binning.equal_mass_bins(conf, 4)).tolist() == [2, 3, 1, 2]
    vals, counts = conf.unique(return_counts=True)
    assert weighted_equal_mass_bins(vals, counts.double()[None], 4)[0].tolist() == [0, 1, 2, 3]


def test_equal_mass_ranks():
    # ceil(b N / B) - 1 for b = 1..B-1, checked against the exact fraction
    import math
    from fractions import Fraction
    for n in (1, 2, 5, 12, 5000, 10**12 + 7):
        for b_count in (1, 2, 3, 7, 15):
            want = [math.ceil(Fraction(b * n, b_count)) - 1 for b in range(1, b_count)]
            assert binning.equal_mass_ranks(n, b_count).tolist() == want
            totals = torch.tensor([[float(n)], [float(n)]], dtype=torch.float64)
            assert binning.equal_mass_ranks(totals, b_count).tolist() == [want, want]


def test_weighted_equal_mass_bins_one_bin():
    values = torch.tensor([0.2, 0.5, 0.7], dtype=torch.float64)
    got = weighted_equal_mass_bins(values, torch.tensor([[1.0, 2.0, 0.0], [0.0, 1.0, 1.0]]), 1)
    assert got.dtype == torch.int64 and got.shape == (2, 3) and not got.any()
    meta = weighted_equal_mass_bins(values.to(META), torch.ones(2, 3, dtype=torch.float64, device=META), 1)
    assert meta.device.type == "meta" and meta.shape == (2, 3) and meta.dtype == torch.int64


def test_weighted_equal_mass_bins_keep_the_device():
    values = torch.rand(9, dtype=torch.float64, device=META)
    got = weighted_equal_mass_bins(values, torch.ones(3, 9, dtype=torch.float64, device=META), 4)
    assert got.device.type == "meta" and got.shape == (3, 9)


# ---------- equal_mass_sums with 0/1 weights ----------
def reference_sums(conf, correct, n_bins):
    """Per-bin count, confidence sum and correct sum of the unweighted equal-mass bins."""
    bins = reference_weighted_bins(np.sort(conf), np.ones(len(conf)), n_bins)
    bins = bins[np.argsort(np.argsort(conf, kind="stable"), kind="stable")]
    return (np.bincount(bins, minlength=n_bins), np.bincount(bins, conf, n_bins),
            np.bincount(bins, correct.astype(np.float64), n_bins))


@pytest.mark.parametrize("n_bins", [3, 5])
def test_weighted_equal_mass_sums_drop_the_zero_weight_rows(gen, n_bins):
    n = 41
    conf = torch.rand(n, generator=gen, dtype=torch.float64) * 0.5 + 0.5
    correct = torch.rand(n, generator=gen) < 0.7
    keep = torch.rand(n, generator=gen) < 0.6
    keep[0], keep[1] = True, False
    want = reference_sums(conf[keep].numpy(), correct[keep].numpy(), n_bins)
    for weight in (keep, keep.double()):
        got = equal_mass_sums(conf, correct, n_bins, weight)
        assert torch.equal(got.count, torch.from_numpy(want[0]).double())
        np.testing.assert_allclose(got.conf.numpy(), want[1], rtol=1e-13, atol=0)
        np.testing.assert_allclose(got.correct.numpy(), want[2], rtol=0, atol=1e-12)
    # the same sums as the unweighted call on the kept rows (the CPU introselect path)
    sub = equal_mass_sums(conf[keep], correct[keep], n_bins)
    assert torch.equal(got.count, sub.count) and torch.equal(got.correct, sub.correct)
    torch.testing.assert_close(got.conf, sub.conf, rtol=1e-13, atol=0)
    # all weights 1: the unweighted sums
    full = equal_mass_sums(conf, correct, n_bins, torch.ones(n))
    plain = equal_mass_sums(conf, correct, n_bins)
    assert torch.equal(full.count, plain.count) and torch.equal(full.correct, plain.correct)
    torch.testing.assert_close(full.conf, plain.conf, rtol=1e-13, atol=0)


def test_equal_mass_sums_keep_the_device():
    conf = torch.rand(30, dtype=torch.float64, device=META)
    correct = torch.ones(30, dtype=torch.bool, device=META)
    for weight in (None, torch.ones(30, device=META)):
        out = equal_mass_sums(conf, correct, 4, weight)
        for part in (out.count, out.conf, out.correct):
            assert part.device.type == "meta" and part.shape == (4,) and part.dtype == torch.float64


# ---------- device placement of the other helpers ----------
def test_scatter_sums_keep_the_device():
    slot = torch.zeros(20, dtype=torch.long, device=META)
    src = torch.ones(20, 3, device=META)
    for lanes in (None, 1, 4):
        out = scatter_sums(slot, src, 5, lanes=lanes)
        assert out.device.type == "meta" and out.shape == (5, 3) and out.dtype == torch.float32


def test_edges_and_bin_indices_keep_the_device():
    edges = equal_width_edges(10, torch.float32, META)
    assert edges.device.type == "meta" and edges.dtype == torch.float32 and edges.shape == (11,)
    values = torch.rand(12, device=META)
    for n_bins in (1, 10):  # one bin: the all-zero shortcut; ten: the torch branch off the CPU
        got = bin_indices(values, equal_width_edges(n_bins, torch.float32, META))
        assert got.device.type == "meta" and got.dtype == torch.int64 and got.shape == (12,)
    assert binning.equal_width_bins(values, 10).device.type == "meta"


@pytest.mark.parametrize("decimals", [None, 2])
def test_equal_mass_sums_from_sorted_blocks_equal_the_selection(decimals):
    from calibkit.functional.binning import equal_mass_sums
    from calibkit.functional.estimators import tie_blocks

    g = torch.Generator().manual_seed(11)
    conf = torch.rand(5003, generator=g, dtype=torch.float64)
    if decimals is not None:  # tie blocks straddling the edges
        conf = torch.round(conf * 10 ** decimals) / 10 ** decimals
    correct = torch.rand(5003, generator=g) < 0.7
    blocks = tie_blocks(conf, correct)
    for n_bins in (1, 2, 15, 40):
        want = equal_mass_sums(conf, correct, n_bins)
        got = equal_mass_sums(conf, correct, n_bins, blocks=blocks)
        for field in ("count", "conf", "correct"):
            assert torch.equal(getattr(got, field), getattr(want, field)), (n_bins, field)
