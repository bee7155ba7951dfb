"""The fused metric panel (``functional/panel.py``, CPU path, and ``functional/panel_device.py``,
the whole-tensor torch path that accelerators take, driven here on CPU tensors): every statistic
against a hand computation or an independent per-entry formula, the deferred value checks and
the layout errors with their exact messages."""

import math

import numpy as np
import pytest
import torch

from calibkit.functional import panel as P
from calibkit.functional import panel_device as D
from calibkit.functional.panel import classwise_bin_sums, panel_sums, raise_for_check


def _forced(probs, labels, n_bins=10, **kw):
    """``panel_sums`` on the device (torch) path with CPU tensors."""
    old, P._FORCE_TORCH_PATH = P._FORCE_TORCH_PATH, True
    try:
        return panel_sums(probs, labels, n_bins, **kw)
    finally:
        P._FORCE_TORCH_PATH = old


def _edges64(n_bins, dtype):
    return np.array([float(torch.tensor(j / n_bins, dtype=dtype)) for j in range(n_bins + 1)])


def reference(probs, labels, n_bins, valid=None):
    """Every statistic of the panel by explicit per-entry loops over float64 upcasts: a dict of
    top-label (3, B) and classwise (3, K, B) count/conf/correct sums, NLL and Brier sums."""
    p = probs.double().numpy()
    y = labels.numpy()
    n, k = p.shape
    inner = _edges64(n_bins, probs.dtype)[1:-1]
    tiny = torch.finfo(probs.dtype).tiny
    top, cw = np.zeros((3, n_bins)), np.zeros((3, k, n_bins))
    nll = brier = 0.0
    for i in range(n):
        if valid is not None and not valid[i]:
            continue
        pred = int(np.argmax(p[i]))
        b = int((p[i, pred] > inner).sum())
        top[:, b] += (1, p[i, pred], pred == y[i])
        for c in range(k):
            cb = int((p[i, c] > inner).sum())
            cw[:, c, cb] += (1, p[i, c], c == y[i])
        nll += -math.log(max(p[i, y[i]], tiny))
        brier += sum((p[i, c] - (c == y[i])) ** 2 for c in range(k))
    return {"top": top, "cw": cw, "nll": nll, "brier": brier}


def assert_matches(out, ref, tol=1e-12):
    for j, name in enumerate(("count", "conf", "correct")):
        np.testing.assert_allclose(getattr(out.top, name).numpy(), ref["top"][j], rtol=0, atol=tol, err_msg=name)
        np.testing.assert_allclose(getattr(out.classwise, name).numpy(), ref["cw"][j], rtol=0, atol=tol,
                                   err_msg=name)
    assert float(out.nll) == pytest.approx(ref["nll"], rel=1e-12, abs=tol)
    assert float(out.brier) == pytest.approx(ref["brier"], rel=1e-9, abs=tol)


# ---------- raise_for_check: the deferred checks of the device path ----------
def _check(lo=0.0, hi=1.0, dev=0.0, y_lo=0, y_hi=2):
    return torch.tensor([lo, hi, dev, y_lo, y_hi], dtype=torch.float64)


def test_raise_for_check_label_range_and_messages():
    raise_for_check(_check(y_lo=0, y_hi=2), torch.float32, 3)  # labels 0..2 of K = 3: fine
    with pytest.raises(ValueError, match=r"^labels out of range: found 3, expected values in \[0, 2\]$"):
        raise_for_check(_check(y_hi=3), torch.float32, 3)  # y_hi == K is out of range
    with pytest.raises(ValueError, match=r"^labels out of range: found -1, expected values in \[0, 2\]$"):
        raise_for_check(_check(y_lo=-1, y_hi=1), torch.float32, 3)
    with pytest.raises(ValueError, match=r"^labels out of range: found -2, expected values in \[0, 4\]$"):
        raise_for_check(_check(y_lo=-2, y_hi=9), torch.float32, 5)  # both bad: the low one is named


def test_raise_for_check_names_the_probabilities():
    with pytest.raises(ValueError, match=r"^probs has entries outside \[0, 1\]"):
        raise_for_check(_check(hi=1.5), torch.float32, 3)
    with pytest.raises(ValueError, match=r"^scores rows must sum to 1 \(largest deviation 0.2 > 0.001"):
        raise_for_check(_check(dev=0.2), torch.float32, 3, name="scores")
    with pytest.raises(ValueError, match=r"^probs contains NaN"):
        raise_for_check(_check(lo=float("nan")), torch.float32, 3)
    # the tolerance is the dtype's: 0.005 passes for bfloat16 (tol 2^-6), not for float32
    raise_for_check(_check(dev=0.005), torch.bfloat16, 3)
    with pytest.raises(ValueError, match="sum to 1"):
        raise_for_check(_check(dev=0.005), torch.float32, 3)


# ---------- layout errors of the device path (no value is read) ----------
def test_device_path_layout_errors():
    p = torch.tensor([[0.7, 0.3], [0.4, 0.6], [0.5, 0.5]])
    with pytest.raises(ValueError, match=r"^labels must have shape \(N,\), got \(3, 1\)$"):
        _forced(p, torch.zeros(3, 1, dtype=torch.long))
    for bad in (torch.zeros(3), torch.zeros(3, dtype=torch.bool), torch.zeros(3, dtype=torch.complex64)):
        with pytest.raises(ValueError, match=rf"^labels must hold integer class indices, got dtype {bad.dtype}$"):
            _forced(p, bad)
    with pytest.raises(ValueError, match=r"^labels has 2 entries but the predictions have 3 rows$"):
        _forced(p, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"^probs must be a floating-point tensor"):
        _forced(torch.tensor([[1, 0], [0, 1]]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"^probs must have at least 2 classes"):
        _forced(torch.ones(2, 1), torch.tensor([0, 0]))
    # int32 labels are accepted and widened
    out = _forced(p, torch.tensor([0, 1, 1], dtype=torch.int32))
    assert out.labels.dtype == torch.int64 and out.labels.tolist() == [0, 1, 1]


# ---------- panel_sums: layout fields, empty input ----------
def test_panel_sums_layout_fields_and_all_ignored():
    p = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]], dtype=torch.float64)
    y = torch.tensor([0, 2])
    for out in (panel_sums(p, y, 5), _forced(p, y, 5)):
        assert (out.k, out.dtype, out.dense, out.binary) == (3, torch.float64, False, False)
        assert float(out.n) == 2
    b = panel_sums(torch.tensor([0.2, 0.9]), torch.tensor([0, 1]), 5)
    assert (b.k, b.dtype, b.binary, b.dense) == (2, torch.float32, True, False)
    d = panel_sums(torch.full((1, 2, 3), 0.5), torch.tensor([[0, 1, 255]]), 5, ignore_index=255)
    assert (d.k, d.dense, d.binary, d.n) == (2, True, False, 2)
    void = torch.full((2,), -100)
    assert panel_sums(p, void, 5, ignore_index=-100, allow_empty=True) is None
    with pytest.raises(ValueError, match=r"^no samples to evaluate: every label equals ignore_index=-100$"):
        panel_sums(p, void, 5, ignore_index=-100)


def test_top_only_leaves_the_full_statistics_out():
    p = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.5, 0.5, 0.0]])
    y = torch.tensor([0, 1, 1])
    for out in (panel_sums(p, y, 4, full=False), _forced(p, y, 4, full=False)):
        assert out.classwise is None and out.nll is None and out.brier is None
        # confidences 0.7, 0.6, 0.5 (tie -> class 0): bins (0.5, 0.75] twice and (0.25, 0.5] once
        assert out.top.count.tolist() == [0, 1, 2, 0] and out.pred.tolist() == [0, 2, 0]
        assert out.top.correct.tolist() == [0, 0, 1, 0] and out.correct.tolist() == [True, False, False]
        torch.testing.assert_close(out.top.conf, torch.tensor([0, 0.5, 1.3, 0], dtype=torch.float64))


# ---------- every statistic against the per-entry reference ----------
def _probs(gen, n, k, sharp, dtype):
    return (torch.randn(n, k, generator=gen, dtype=torch.float64) * sharp).softmax(1).to(dtype)


def test_hand_computed_panel_with_a_zero_label_probability():
    # K = 3, B = 4 (edges 0.25, 0.5, 0.75). Row 0: p_y = 0 -> NLL term -log(tiny).
    p = torch.tensor([[1.0, 0.0, 0.0], [0.2, 0.3, 0.5], [0.25, 0.75, 0.0]], dtype=torch.float64)
    y = torch.tensor([1, 2, 1])
    tiny = torch.finfo(torch.float64).tiny
    nll = -math.log(tiny) - math.log(0.5) - math.log(0.75)
    brier = (1 + 1) + (0.04 + 0.09 + 0.25) + (0.0625 + 0.0625)
    # bins (lo, hi]: [0, .25], (.25, .5], (.5, .75], (.75, 1]; an entry equal to an edge is in the bin below
    count = [[2, 0, 0, 1],  # class 0: 0.2 and 0.25 | 1.0
             [1, 1, 1, 0],  # class 1: 0.0 | 0.3 | 0.75
             [2, 1, 0, 0]]  # class 2: 0.0, 0.0 | 0.5
    conf = [[0.45, 0, 0, 1.0], [0.0, 0.3, 0.75, 0], [0.0, 0.5, 0, 0]]
    correct = [[0, 0, 0, 0],  # no label 0
               [1, 0, 1, 0],  # label 1 on rows 0 (p 0.0, bin 0) and 2 (p 0.75, bin 2)
               [0, 1, 0, 0]]  # label 2 on row 1 (p 0.5, bin 1)
    for out in (panel_sums(p, y, 4), _forced(p, y, 4)):
        assert out.classwise.count.tolist() == count
        assert out.classwise.correct.tolist() == correct
        torch.testing.assert_close(out.classwise.conf, torch.tensor(conf, dtype=torch.float64))
        assert float(out.nll) == pytest.approx(nll, rel=1e-14)
        assert float(out.brier) == pytest.approx(brier, rel=1e-14)
        # top label: 1.0 (bin 3, wrong), 0.5 (bin 1, right), 0.75 (bin 2, right)
        assert out.top.count.tolist() == [0, 1, 1, 1] and out.top.correct.tolist() == [0, 1, 1, 0]


@pytest.mark.parametrize("n_bins", [2, 10])
@pytest.mark.parametrize("dtype, tol", [(torch.float16, 2e-3), (torch.bfloat16, 2e-2), (torch.float32, 1e-5),
                                        (torch.float64, 1e-12)])
def test_cpu_and_device_paths_equal_the_reference(gen, dtype, tol, n_bins):
    probs = _probs(gen, 150, 5, 2.0, dtype)
    probs[0] = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0]).to(dtype)  # p_y = 0 with label 0
    labels = torch.randint(0, 5, (150,), generator=gen)
    labels[0] = 0
    ref = reference(probs, labels, n_bins)
    for out in (panel_sums(probs, labels, n_bins), _forced(probs, labels, n_bins),
                _forced(probs, labels, n_bins, exact=True)):
        assert torch.equal(out.top.count, torch.from_numpy(ref["top"][0]))
        assert torch.equal(out.classwise.count, torch.from_numpy(ref["cw"][0]))
        assert torch.equal(out.classwise.correct, torch.from_numpy(ref["cw"][2]))
        np.testing.assert_allclose(out.classwise.conf.numpy(), ref["cw"][1], rtol=0, atol=tol * 10)
        np.testing.assert_allclose(out.top.conf.numpy(), ref["top"][1], rtol=0, atol=1e-12)
        # NLL of the float64 upcasts, -log(tiny of the input dtype) for p_y = 0
        assert float(out.nll) == pytest.approx(ref["nll"], rel=1e-12)
        # Brier: the sum of squares per row is formed in the input precision (float32 for half)
        assert float(out.brier) == pytest.approx(ref["brier"], rel=tol)
        assert out.conf.dtype == torch.float64 and out.pred.dtype == torch.int64
        assert out.correct.dtype == torch.bool
        assert float(out.n) == 150
        if isinstance(out.n, torch.Tensor):  # device path: a 0-dim float64 tensor
            assert out.n.dtype == torch.float64


def test_cpu_path_over_several_blocks_of_half_precision(gen):
    # 70,000 x 6 float16 rows: the float32 work copy gives blocks of 43,680 rows (1 MiB / 24 bytes,
    # a multiple of 16); two blocks, the second partial.
    probs = _probs(gen, 70_000, 6, 3.0, torch.float16)
    labels = torch.randint(0, 6, (70_000,), generator=gen)
    cpu = panel_sums(probs, labels, 12)
    dev = _forced(probs, labels, 12)
    for part in ("top", "classwise"):
        a, b = getattr(cpu, part), getattr(dev, part)
        assert torch.equal(a.count, b.count) and torch.equal(a.correct, b.correct)
        torch.testing.assert_close(a.conf, b.conf, rtol=1e-6, atol=1e-6)
    x = probs.double()
    assert cpu.classwise.count.sum() == 70_000 * 6
    torch.testing.assert_close(cpu.classwise.conf.sum(1), x.sum(0), rtol=1e-9, atol=1e-6)
    p_y = x.gather(1, labels[:, None]).squeeze(1)
    assert float(cpu.nll) == pytest.approx(float(-p_y.clamp(min=torch.finfo(torch.float16).tiny).log().sum()),
                                           rel=1e-12)
    assert float(cpu.nll) == pytest.approx(float(dev.nll), rel=1e-12)
    assert float(cpu.brier) == pytest.approx(float(((x - torch.eye(6, dtype=torch.float64)[labels]) ** 2).sum()),
                                             rel=1e-6)
    assert torch.equal(cpu.conf, x.max(1).values) and torch.equal(cpu.pred, x.argmax(1))


# ---------- the device path: masks, deferred checks, chunked gathers ----------
def test_device_check_vector_reads_only_the_valid_rows():
    p = torch.tensor([[0.6, 0.4], [2.0, -1.0], [0.1, 0.89], [3.0, 0.5]], dtype=torch.float64)
    y = torch.tensor([1, 255, 0, -7])
    valid = torch.tensor([True, False, True, False])
    out = D.panel_sums_torch(p, torch.where(valid, y, 0), 5, valid=valid)
    # over rows 0 and 2: top confidences 0.6 and 0.89, row sums 1.0 and 0.99, labels 1 and 0; the
    # masked rows enter the minimum as 0 (inside the range), not with their -1.0
    lo, hi, dev, y_lo, y_hi = out.check.tolist()
    assert (lo, hi, y_lo, y_hi) == (0.0, 0.89, 0.0, 1.0) and dev == pytest.approx(0.01, abs=1e-15)
    neg = p.clone()
    neg[2, 0] = -0.25
    assert D.panel_sums_torch(neg, torch.where(valid, y, 0), 5, valid=valid).check[0] == -0.25
    assert float(out.n) == 2 and out.weight.tolist() == [1.0, 0.0, 1.0, 0.0]
    ref = reference(p[[0, 2]], torch.tensor([1, 0]), 5)
    assert_matches(out, ref)
    # every row valid: the same numbers as dropping the invalid rows first
    full = D.panel_sums_torch(p[[0, 2]], torch.tensor([1, 0]), 5)
    assert full.weight is None and float(full.n) == 2
    assert full.check.tolist()[:2] == [0.1, 0.89] and full.check.tolist()[3:] == [0.0, 1.0]


def test_device_check_vector_without_a_mask_and_out_of_range_labels():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.05, 0.05, 0.9], [0.2, 0.7, 0.2]])
    out = D.panel_sums_torch(p, torch.tensor([4, -1, 1]), 4)
    lo, hi, dev, y_lo, y_hi = out.check.tolist()
    assert (lo, y_lo, y_hi) == (pytest.approx(0.05), -1.0, 4.0) and hi == pytest.approx(0.9)
    assert dev == pytest.approx(0.1, abs=1e-6)  # row 2 sums to 1.1
    # labels are clamped to [0, K) before any gather: 4 -> 2, -1 -> 0
    assert out.labels.tolist() == [2, 0, 1] and out.correct.tolist() == [False, False, True]
    with pytest.raises(ValueError, match="sum to 1"):
        raise_for_check(out.check, p.dtype, 3)


def test_nan_in_ignored_rows_reaches_no_sum(gen, monkeypatch):
    # The CPU path drops ignored rows; the device path weights them 0, and must not let their
    # values into a sum (NaN * 0 is NaN): every statistic equals the CPU path's.
    import calibkit.metrics as metrics

    probs = torch.softmax(torch.randn(2, 3, 4, 5, generator=gen, dtype=torch.float64) * 2, 1)
    labels = torch.randint(0, 3, (2, 4, 5), generator=gen)
    labels[0, 1] = 255
    probs[0, :, 1] = float("nan")
    probs[1, 0, 2, 2], labels[1, 2, 2] = float("inf"), 255
    cpu = metrics.CalibrationAccumulator(10, ignore_index=255, state="exact")
    cpu.update(probs, labels)
    monkeypatch.setattr(P, "_FORCE_TORCH_PATH", True)
    rows = _forced(probs, labels, 10, ignore_index=255)
    for t in (rows.top.conf, rows.conf, rows.nll, rows.brier, rows.classwise.conf):
        assert torch.isfinite(t).all()
    for state in ("exact", "fixed"):
        dev = metrics.CalibrationAccumulator(10, ignore_index=255, state=state)
        dev.update(probs, labels)
        got, want = dev.compute(), cpu.compute()
        for key in ("ece", "nll", "brier", "cece", "acc", "miou"):
            assert got[key] == pytest.approx(want[key], rel=1e-12, abs=1e-15), (state, key)


@pytest.mark.parametrize("exact", [False, True])
def test_classwise_gather_in_many_chunks(gen, monkeypatch, exact):
    # a tiny gather budget: chunks of a few rows; each chunk's sums must add up
    probs = _probs(gen, 97, 4, 0.7, torch.float32)
    labels = torch.randint(0, 4, (97,), generator=gen)
    valid = torch.rand(97, generator=gen) < 0.7
    ref = reference(probs, labels, 8, valid=valid.numpy())
    whole = D.classwise_torch(probs, labels, 8, valid=valid, exact=exact)
    monkeypatch.setattr(D, "_SELECT_BUDGET", 20)  # 20 // min(K, c_max) = 5 rows per chunk
    chunked = D.classwise_torch(probs, labels, 8, valid=valid, exact=exact)
    for got in (whole, chunked):
        assert torch.equal(got.count, torch.from_numpy(ref["cw"][0]))
        assert torch.equal(got.correct, torch.from_numpy(ref["cw"][2]))
        np.testing.assert_allclose(got.conf.numpy(), ref["cw"][1], rtol=0, atol=1e-6)
    monkeypatch.setattr(D, "_SELECT_BUDGET", 1)  # fewer slots than one row needs: one row per chunk
    one = D.classwise_torch(probs, labels, 8, valid=valid, exact=exact)
    assert torch.equal(one.count, whole.count) and torch.equal(one.correct, whole.correct)


def test_classwise_padding_never_counts(gen):
    # Every row of a confident matrix has one entry above 1/B: most of the c_max slots per row are
    # padding (index -1 -> 0, weight 0), spread over all slots; none may add a count or a value.
    probs = torch.zeros(50, 6, dtype=torch.float64)
    probs[torch.arange(50), torch.arange(50) % 6] = 1.0
    labels = torch.arange(50) % 6
    got = D.classwise_torch(probs, labels, 15)
    want = np.zeros((6, 15))
    counts = np.bincount(np.arange(50) % 6, minlength=6)
    want[:, 14] = counts  # the ones, in the last bin
    want[:, 0] = 50 - counts  # the zeros
    assert got.count.numpy().tolist() == want.tolist()
    assert got.conf[:, 14].tolist() == counts.tolist() and got.conf[:, :14].abs().sum() == 0
    assert got.correct[:, 14].tolist() == counts.tolist() and got.correct[:, :14].sum() == 0


def test_column_sums_and_bins_helpers(gen):
    x = torch.rand(37, 3, generator=gen)
    torch.testing.assert_close(D._column_sums(x), x.double().sum(0), rtol=1e-7, atol=0)
    assert D._column_sums(x).dtype == torch.float64
    assert D._column_sums(x[:5]).tolist() == x[:5].double().sum(0).tolist()  # under one group: float64 sums
    x64 = x.double()
    assert torch.equal(D._column_sums(x64), x64.sum(0))
    edges = torch.tensor([0.0, 1.0])
    z = D._bins(torch.tensor([0.3, 1.0]), edges)
    assert z.dtype == torch.int64 and z.tolist() == [0, 0]
    e = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0])
    assert D._bins(torch.tensor([0.0, 0.25, 0.26, 0.5, 0.75, 0.76, 1.0]), e).tolist() == \
        [0, 0, 1, 1, 2, 3, 3]


def test_classwise_bin_sums_accepts_int32_labels(gen):
    probs = _probs(gen, 40, 3, 1.0, torch.float64)
    labels = torch.randint(0, 3, (40,), generator=gen)
    ref = reference(probs, labels, 6)
    got = classwise_bin_sums(probs, labels.int(), 6)
    assert torch.equal(got.correct, torch.from_numpy(ref["cw"][2]))
    assert torch.equal(got.count, torch.from_numpy(ref["cw"][0]))


def test_device_path_reads_no_value_on_the_meta_device():
    # The meta device holds shapes and no data: any step that needed a value on the host (a host
    # synchronisation on an accelerator) fails there. The default gather never does; exact=True
    # reads the number of entries above 1/B first, by design.
    p = torch.full((5, 3), 1 / 3, device="meta")
    y = torch.zeros(5, dtype=torch.long)  # labels on the host: moved to the probabilities' device
    for dtype in (torch.float32, torch.float16):
        out = panel_sums(p.to(dtype), y, 10)
        tensors = [out.check, out.labels, out.conf, out.pred, out.correct, out.n, out.nll, out.brier,
                   out.top.count, out.top.conf, out.top.correct,
                   out.classwise.count, out.classwise.conf, out.classwise.correct]
        assert all(t.device.type == "meta" for t in tensors)  # everything stays on the device
        assert out.top.count.shape == (10,) and out.classwise.count.shape == (3, 10)
        assert out.n.dtype == out.nll.dtype == out.classwise.count.dtype == torch.float64
    one = panel_sums(p, y, 1)  # one bin: no inner edge
    assert one.top.count.device.type == one.classwise.correct.device.type == "meta"
    masked = panel_sums(p, y.to("meta"), 10, ignore_index=255)
    assert masked.weight.device.type == "meta" and masked.weight.shape == (5,)
    assert masked.n.device.type == "meta" and masked.classwise.conf.device.type == "meta"
    # the default of the device functions themselves: no value read
    assert D.panel_sums_torch(p, y.to("meta"), 10).classwise.count.device.type == "meta"
    assert D.classwise_torch(p, y.to("meta"), 10).count.device.type == "meta"
    assert classwise_bin_sums(p, y.to("meta"), 10).conf.device.type == "meta"
    with pytest.raises(NotImplementedError):
        D.classwise_torch(p, y.to("meta"), 10, exact=True)
    assert panel_sums(p, y, 10, full=False).classwise is None
    with pytest.raises(NotImplementedError):
        panel_sums(p, y, 10, exact=True)
    with pytest.raises(NotImplementedError):
        panel_sums(p, y.to("meta"), 10, ignore_index=255, exact=True)


def test_host_labels_with_ignore_index_on_the_device_path():
    # labels on the host, probabilities on the device, ignore_index: the row mask follows the
    # labels to the probabilities' device (as the labels themselves do)
    p = torch.full((4, 2), 0.5, device="meta")
    out = panel_sums(p, torch.tensor([0, 255, 1, 1]), 10, ignore_index=255)
    assert out.weight.device.type == "meta" and out.labels.device.type == "meta"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_max_entries_above_is_the_most_entries_a_valid_row_holds_above_one_over_b(dtype):
    from calibkit._validation import prob_sum_tol
    from calibkit.functional.panel_types import max_entries_above

    tol = prob_sum_tol(dtype)
    for n_bins in (1, 2, 3, 15, 64, 100, 1000):
        # c entries above 1/B sum to more than c/B; a valid row sums to at most 1 + tol. Count up.
        c = 0
        while (c + 1) / n_bins < 1 + tol:
            c += 1
        assert max_entries_above(n_bins, dtype) == c, (n_bins, dtype)
    # e.g. bfloat16's looser tolerance (1/64) lets 100 bins hold 101 entries just above 1/100
    assert (max_entries_above(100, torch.bfloat16), max_entries_above(15, torch.float32)) == (101, 15)
