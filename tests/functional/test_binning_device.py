"""The whole-tensor torch path of the binning (taken for tensors on CUDA and other devices),
driven directly on the CPU and compared with the CPU path and with a naive per-entry count."""

import numpy as np
import pytest
import torch

from calibkit.functional import binning, panel
from calibkit.functional.binning import bin_indices
from calibkit.functional.panel import classwise_bin_sums, panel_sums, raise_for_check


def _panel_sums_torch(probs, labels, n_bins, full, exact=False):
    """The device (whole-tensor torch) path of ``panel_sums`` on CPU tensors, values checked as the
    device path's callers do (from its ``check`` vector)."""
    old, panel._FORCE_TORCH_PATH = panel._FORCE_TORCH_PATH, True
    try:
        out = panel_sums(probs, labels, n_bins, full, exact=exact)
    finally:
        panel._FORCE_TORCH_PATH = old
    assert out.check is not None  # the device path leaves its value checks to the caller
    raise_for_check(out.check, probs.dtype, probs.shape[1])
    return out


def _edges64(n_bins, dtype):
    """Edges j/B rounded to ``dtype``, as exact float64 numbers."""
    return np.array([float(torch.tensor(j / n_bins, dtype=dtype)) for j in range(n_bins + 1)])


def naive_bins(values, n_bins, dtype):
    """(lo, hi] bin of each value: the number of inner edges strictly below it."""
    inner = _edges64(n_bins, dtype)[1:-1]
    v = np.asarray(values, dtype=np.float64)
    return (v[..., None] > inner).sum(-1)


def naive_panel(probs, labels, n_bins):
    """Top-label and classwise sums, NLL and Brier by explicit loops over float64 upcasts."""
    p = probs.double().numpy()
    y = labels.numpy()
    n, k = p.shape
    pred = p.argmax(1)
    conf = p[np.arange(n), pred]
    tb = naive_bins(conf, n_bins, probs.dtype)
    top = np.zeros((3, n_bins))
    cw = np.zeros((3, k, n_bins))
    for i in range(n):
        top[:, tb[i]] += (1, conf[i], pred[i] == y[i])
        for c in range(k):
            b = naive_bins(p[i, c], n_bins, probs.dtype)
            cw[:, c, b] += (1, p[i, c], c == y[i])
    p_y = p[np.arange(n), y]
    nll = -np.log(np.maximum(p_y, torch.finfo(probs.dtype).tiny)).sum()
    brier = ((p - np.eye(k)[y]) ** 2).sum()
    return top, cw, nll, brier


def _probs(gen, n, k, sharp, dtype):
    x = torch.randn(n, k, generator=gen, dtype=torch.float64) * sharp
    return x.softmax(1).to(dtype)


def _with_edge_values(probs, n_bins):
    """Rows whose top probability equals an edge exactly (ties at (lo, hi] boundaries)."""
    out = probs.clone()
    for i, j in enumerate(range(1, n_bins)):
        e = j / n_bins
        if e <= 0.5 or i >= len(out):
            continue
        row = torch.full((out.shape[1],), (1 - e) / (out.shape[1] - 1), dtype=torch.float64)
        row[i % out.shape[1]] = e
        out[i] = row.to(out.dtype)
    return out


CASES = [  # sharpness 8: mostly confident rows (the "single" branch); 0.5: diffuse rows
    (torch.float64, 8.0, 15), (torch.float64, 0.5, 15), (torch.float32, 8.0, 10),
    (torch.float32, 0.5, 7), (torch.float16, 8.0, 10), (torch.float16, 0.5, 5), (torch.float32, 2.0, 1),
]


@pytest.mark.parametrize("exact", [False, True], ids=["fixed-size-gather", "exact-size-gather"])
@pytest.mark.parametrize("dtype, sharp, n_bins", CASES)
def test_torch_path_equals_naive_counts_and_cpu_path(gen, dtype, sharp, n_bins, exact):
    probs = _with_edge_values(_probs(gen, 203, 6, sharp, dtype), n_bins)  # 203: not a multiple of 16
    labels = torch.randint(0, 6, (203,), generator=gen)
    dev = _panel_sums_torch(probs, labels, n_bins, True, exact=exact)
    top, cw, nll, brier = naive_panel(probs, labels, n_bins)
    tol = dict(rtol=0, atol=1e-9 if dtype == torch.float64 else 2e-5)
    for j, name in enumerate(("count", "conf", "correct")):
        np.testing.assert_allclose(getattr(dev.top, name).numpy(), top[j], **tol, err_msg=name)
        np.testing.assert_allclose(getattr(dev.classwise, name).numpy(), cw[j], **tol, err_msg=name)
    assert torch.equal(dev.top.count, torch.from_numpy(top[0]))  # counts are exact
    assert torch.equal(dev.classwise.count, torch.from_numpy(cw[0]))
    assert float(dev.nll) == pytest.approx(nll, rel=1e-6)
    assert float(dev.brier) == pytest.approx(brier, rel=1e-5)
    pv = probs.double()
    assert torch.equal(dev.conf, pv.max(1).values) and torch.equal(dev.correct, pv.argmax(1) == labels)
    # The CPU path gives the same numbers (counts exactly).
    cpu = panel_sums(probs, labels, n_bins, True)
    for part in ("top", "classwise"):
        a, b = getattr(dev, part), getattr(cpu, part)
        assert torch.equal(a.count, b.count) and torch.equal(a.correct, b.correct)
        torch.testing.assert_close(a.conf, b.conf, rtol=0, atol=1e-9 if dtype == torch.float64 else 2e-5)
    assert float(dev.nll) == pytest.approx(float(cpu.nll), rel=1e-9)
    assert float(dev.brier) == pytest.approx(float(cpu.brier), rel=1e-6)


def test_torch_path_top_only_and_validation(gen):
    probs, labels = _probs(gen, 40, 3, 1.0, torch.float32), torch.randint(0, 3, (40,), generator=gen)
    out = _panel_sums_torch(probs, labels, 10, False)
    assert out.classwise is None and out.nll is None and out.brier is None
    assert torch.equal(out.top.count, panel_sums(probs, labels, 10, False).top.count)
    bad = probs.clone()
    bad[0, 0] += 0.5
    with pytest.raises(ValueError, match="sum to 1"):
        _panel_sums_torch(bad, labels, 10, True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_bin_indices_bucketize_path_is_lo_hi_membership(dtype):
    # Half-precision tensors on the CPU take the torch.bucketize branch of bin_indices.
    n_bins = 10
    edges = torch.tensor(_edges64(n_bins, dtype), dtype=dtype)
    values = torch.cat([edges, torch.linspace(0, 1, 97, dtype=torch.float64).to(dtype)])
    got = bin_indices(values, edges)
    assert got.dtype == torch.long
    assert got.tolist() == naive_bins(values.double().numpy(), n_bins, dtype).tolist()
    # An edge value belongs to the bin below it; 0 is in bin 0 and 1 in the last bin.
    assert got[:n_bins + 1].tolist() == [0] + list(range(n_bins))


def test_classwise_branches_agree(gen):
    # The same matrix once mostly confident and once mostly diffuse takes both search branches
    # of classwise_bin_sums; each is compared with the naive count.
    for sharp in (12.0, 0.3):
        probs = _probs(gen, 64, 5, sharp, torch.float32)
        labels = torch.randint(0, 5, (64,), generator=gen)
        single = probs.max(1).values.double() >= 1 - 0.1 + 2e-3
        assert (int(single.sum()) > 32) == (sharp > 1)
        got = classwise_bin_sums(probs, labels, 10)
        _, cw, _, _ = naive_panel(probs, labels, 10)
        assert torch.equal(got.count, torch.from_numpy(cw[0]))
        assert torch.equal(got.correct, torch.from_numpy(cw[2]))
        np.testing.assert_allclose(got.conf.numpy(), cw[1], rtol=0, atol=2e-6)


def test_accumulator_on_the_torch_path_equals_cpu(gen, monkeypatch):
    import calibkit.metrics as metrics

    batches = []
    for n, sharp in ((50, 4.0), (33, 0.7), (70, 9.0)):
        batches.append((_probs(gen, n, 4, sharp, torch.float32), torch.randint(0, 4, (n,), generator=gen)))
    cpu = metrics.CalibrationAccumulator(12)
    for p, y in batches:
        cpu.update(p, y)
    monkeypatch.setattr(panel, "_FORCE_TORCH_PATH", True)
    dev = metrics.CalibrationAccumulator(12)
    for p, y in batches:
        dev.update(p, y)
    a, b = dev.compute(), cpu.compute()
    assert a.keys() == b.keys()
    for key in a:
        assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9), key


def test_order_statistics_and_equal_mass_edges(gen):
    values = torch.rand(101, generator=gen, dtype=torch.float64)
    ranks = torch.tensor([0, 50, 100, 7, 7])
    got = binning._order_statistics(values, ranks)
    assert torch.equal(got, values.sort().values[ranks])
    edges = binning.equal_mass_edges(values, 4)
    # N = 101, B = 4: inner edges at ranks ceil(101 b / 4) - 1 = 25, 50, 75 (bins of 26, 25, 25, 25)
    assert torch.equal(edges, values.sort().values[[0, 25, 50, 75, 100]])


@pytest.mark.parametrize("threads,defer", [(1, False), (2, False), (2, True), (3, True)])
def test_cpu_path_over_many_blocks_equals_the_torch_path(gen, threads, defer):
    # 120,000 x 10 float32 rows span three blocks of the CPU path (about 2 MiB, 52,416 rows each):
    # every per-block sum must accumulate, not overwrite, whether the full part runs with the top
    # label, or deferred on helper threads (panel_sums(defer=True)) and settled afterwards.
    from calibkit.functional import panel_cpu

    probs = _probs(gen, 120_000, 10, 3.0, torch.float32)
    labels = torch.randint(0, 10, (120_000,), generator=gen)
    assert 120_000 > 2 * panel_cpu._BLOCK_BYTES // (10 * 4)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        cpu = panel_sums(probs, labels, 15, True, defer=defer)
    finally:
        torch.set_num_threads(before)
    assert (cpu.pending is not None) == defer  # 3 blocks: enough for 2 and 3 threads
    assert cpu.settle().pending is None
    dev = _panel_sums_torch(probs, labels, 15, True)
    for part in ("top", "classwise"):
        a, b = getattr(cpu, part), getattr(dev, part)
        assert torch.equal(a.count, b.count) and torch.equal(a.correct, b.correct)
        torch.testing.assert_close(a.conf, b.conf, rtol=1e-6, atol=1e-6)  # float32 row groups
    assert float(cpu.nll) == pytest.approx(float(dev.nll), rel=1e-9)
    assert float(cpu.brier) == pytest.approx(float(dev.brier), rel=1e-6)
    assert cpu.classwise.count.sum() == 120_000 * 10


def test_many_bins_take_the_binary_search(gen):
    values = torch.rand(500, generator=gen, dtype=torch.float64)
    for n_bins in (255, 256, 300):  # 254, 255, 299 inner edges
        edges = binning.equal_width_edges(n_bins)
        assert edges.shape == (n_bins + 1,) and edges[-1] == 1
        got = bin_indices(torch.cat([values, edges]), edges)
        assert got.tolist() == naive_bins(torch.cat([values, edges]).numpy(), n_bins, torch.float64).tolist()


def test_binned_errors_single_and_pair_bins():
    # Bin 0: one sample (conf 0.2, correct); bin 1: two samples (conf 0.6 and 0.8, one correct);
    # bin 2: empty.
    sums = binning.BinSums(count=torch.tensor([1.0, 2.0, 0.0], dtype=torch.float64),
                           conf=torch.tensor([0.2, 1.4, 0.0], dtype=torch.float64),
                           correct=torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64))
    out = binning.binned_errors(sums)
    gaps = [1.0 - 0.2, 0.5 - 0.7]
    assert float(out["mce"]) == pytest.approx(0.8, abs=1e-12)
    assert float(out["ece"]) == pytest.approx((1 * 0.8 + 2 * 0.2) / 3, abs=1e-12)
    assert float(out["rmsce"]) == pytest.approx(np.sqrt((0.8**2 + 2 * 0.2**2) / 3), abs=1e-12)
    assert float(out["o_ece"]) == pytest.approx(2 * 0.2 / 3, abs=1e-12)
    assert float(out["u_ece"]) == pytest.approx(0.8 / 3, abs=1e-12)
    # Debiased: the 2-sample bin loses acc (1 - acc) / (n - 1) = 0.25 per sample; the single-sample
    # bin is not corrected.
    deb = binning.binned_errors(sums, debias=True)
    want = max(0.0, (gaps[0] ** 2 + 2 * (gaps[1] ** 2 - 0.25)) / 3)
    assert float(deb["rmsce"]) == pytest.approx(np.sqrt(want), abs=1e-12)


def test_cpu_panel_is_the_same_on_any_number_of_threads(gen, monkeypatch):
    from calibkit.metrics import evaluate

    probs = torch.softmax(torch.randn(30000, 40, generator=gen) * 3, 1)  # 30000 x 40 float32: 5 blocks of 1 MiB
    labels = torch.randint(0, 40, (30000,), generator=gen)
    # The CPU panel spreads its blocks over torch.get_num_threads() Python threads. The count is
    # patched rather than set with torch.set_num_threads, which would also start an OpenMP team:
    # a process forked after that (as mutation testing forks one per mutant) hangs in its next
    # multithreaded torch operation.
    one = evaluate(probs, labels)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    three = evaluate(probs, labels)
    bad = probs.clone()
    bad[29000, 0] += 0.5  # a row of the last block does not sum to 1: the error names it as before
    with pytest.raises(ValueError, match="sum to 1"):
        evaluate(bad, labels)
    assert one == three  # partial sums added in block order: bit-identical
