"""Input layouts of the metrics (binary 1-D, dense with ignore_index), the dtype-dependent row-sum
tolerance, mean IoU, and the device (whole-tensor torch) path driven with CPU tensors."""

import numpy as np
import pytest
import torch

import calibkit.functional as F
import calibkit.functional.panel as P
from calibkit._validation import prob_sum_tol
from calibkit.functional.binning import FINE_BINS, bin_sums, equal_mass_bins, fine_bin_index
from calibkit.functional.panel import panel_sums
from calibkit.functional.panel_device import panel_sums_torch, scatter_sums
from calibkit.metrics import PANEL, evaluate
from calibkit.plots import reliability_curve

BINNED = {"ece": F.ece, "aece": F.adaptive_ece, "cece": F.classwise_ece, "mce": F.mce, "rmsce": F.rmsce,
          "acc": F.accuracy, "nll": F.nll, "brier": F.brier,
          "o_ece": lambda p, y, **kw: F.over_under_ece(p, y, **kw)[0],
          "u_ece": lambda p, y, **kw: F.over_under_ece(p, y, **kw)[1]}


def _probs(gen, n=600, k=6, scale=2.5, dtype=torch.float64):
    logits = torch.randn(n, k, generator=gen, dtype=torch.float64) * scale
    return torch.softmax(logits, 1).to(dtype), torch.randint(0, k, (n,), generator=gen)


def _dense(gen, n=3, k=5, h=7, w=9, void=0.2):
    logits = torch.randn(n, k, h, w, generator=gen, dtype=torch.float64) * 3
    labels = torch.randint(0, k, (n, h, w), generator=gen)
    labels[torch.rand(n, h, w, generator=gen) < void] = 255
    return torch.softmax(logits, 1), labels


def _flat_valid(probs, labels, ignore=255):
    rows, y = probs.movedim(1, -1).reshape(-1, probs.shape[1]), labels.reshape(-1)
    return rows[y != ignore], y[y != ignore]


# ---------- binary (scikit-learn convention) ----------
@pytest.mark.parametrize("name", list(BINNED))
def test_binary_1d_equals_two_columns(gen, name):
    p = torch.rand(500, generator=gen, dtype=torch.float64)
    y = torch.bernoulli(p.clamp(0.1, 0.9), generator=gen).long()
    two = torch.stack([1 - p, p], 1)
    assert BINNED[name](p, y).item() == BINNED[name](two, y).item()


def test_binary_by_hand_confidence_is_max_p_one_minus_p():
    # p = 0.2 (y=0): conf 0.8, right; p = 0.7 (y=0): conf 0.7, wrong; p = 0.5 (y=1): conf 0.5,
    # predicts class 0 (first index on ties), wrong. One bin: |acc - conf| = |1/3 - 2/3| = 1/3.
    p, y = torch.tensor([0.2, 0.7, 0.5], dtype=torch.float64), torch.tensor([0, 0, 1])
    assert F.ece(p, y, n_bins=1).item() == pytest.approx(1 / 3)
    assert F.accuracy(p, y).item() == pytest.approx(1 / 3)
    # binary Brier of the two-column form = 2 * mean (p - y)^2
    assert F.brier(p, y).item() == pytest.approx(2 * ((p - y) ** 2).mean().item())
    assert evaluate(p, y, n_bins=1)["ece"] == pytest.approx(1 / 3)
    curve = reliability_curve(p, y, n_bins=2)
    assert curve.n == 3 and curve.count.tolist() == [1, 2]  # 0.5 in (0, 0.5]; 0.7, 0.8 above


def test_binary_errors_and_no_guessing(gen):
    with pytest.raises(ValueError, match="outside \\[0, 1\\].*sigmoid"):
        F.ece(torch.tensor([-1.2, 3.0]), torch.tensor([0, 1]))  # 1-D logits are not probabilities
    with pytest.raises(ValueError, match="out of range.*\\[0, 1\\]"):
        F.ece(torch.tensor([0.2, 0.6]), torch.tensor([0, 2]))
    # (N, 2) stays a K = 2 problem; labels only {0, 1} of a K = 10 batch stay K-class (pitfall 3)
    probs, y = _probs(gen, k=10)
    y = y % 2
    assert (F.classwise_ece(probs, y).item()
            != F.classwise_ece(probs[:, :2] / probs[:, :2].sum(1, keepdim=True), y).item())


def test_string_labels_raise_value_error():
    p = torch.tensor([[0.7, 0.3], [0.4, 0.6]])
    for labels in (["cat", "dog"], np.array(["cat", "dog"]), np.array(["cat", "dog"], dtype=object)):
        with pytest.raises(ValueError, match="string labels"):
            F.ece(p, labels)
        with pytest.raises(ValueError, match="string labels"):
            evaluate(p, labels)


# ---------- dense inputs and ignore_index ----------
@pytest.mark.parametrize("name", list(BINNED))
def test_dense_equals_flattened_valid_pixels(gen, name):
    probs, labels = _dense(gen)
    rows, y = _flat_valid(probs, labels)
    got = BINNED[name](probs, labels, ignore_index=255).item()
    assert got == pytest.approx(BINNED[name](rows, y).item(), abs=1e-12)


def test_dense_evaluate_and_miou(gen):
    probs, labels = _dense(gen, k=4)
    rows, y = _flat_valid(probs, labels)
    out, ref = evaluate(probs, labels, ignore_index=255), evaluate(rows, y)
    assert tuple(out)[: len(PANEL)] == PANEL and "miou" in out and "miou" not in ref
    for key in PANEL:
        assert out[key] == pytest.approx(ref[key], abs=1e-12)
    assert out["miou"] == pytest.approx(F.mean_iou(probs, labels, 4, ignore_index=255).item(), abs=1e-15)


def test_ignore_index_on_classification_and_all_ignored(gen):
    probs, y = _probs(gen)
    y2 = y.clone()
    y2[::3] = -100
    keep = y2 != -100
    assert F.ece(probs, y2, ignore_index=-100).item() == pytest.approx(F.ece(probs[keep], y[keep]).item(), abs=1e-15)
    with pytest.raises(ValueError, match="every label equals ignore_index"):
        F.ece(probs, torch.full_like(y, -100), ignore_index=-100)


def test_mean_iou_by_hand():
    # labels 0 0 1 1 2, predictions 0 1 1 1 0: IoU_0 = 1/3, IoU_1 = 2/3, IoU_2 = 0/1; class 3 absent
    labels = torch.tensor([[0, 0, 1, 1, 2, 255]])
    preds = torch.tensor([[0, 1, 1, 1, 0, 3]])
    assert F.mean_iou(preds, labels, 4, ignore_index=255).item() == pytest.approx((1 / 3 + 2 / 3 + 0) / 3)
    one_hot = torch.nn.functional.one_hot(preds, 4).movedim(-1, 1).double()  # (1, 4, 6) scores
    assert F.mean_iou(one_hot, labels, 4, ignore_index=255).item() == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="out of range"):
        F.mean_iou(preds, labels, 4)  # 255 not ignored
    with pytest.raises(ValueError, match="num_classes=3"):
        F.mean_iou(one_hot, labels, 3, ignore_index=255)


def test_mean_iou_matches_torchmetrics(gen):
    from torchmetrics.functional.segmentation import mean_iou as tm_miou

    probs, labels = _dense(gen, n=4, k=5, void=0.0)
    preds = probs.argmax(1)
    ref = tm_miou(preds, labels, num_classes=5, input_format="index", per_class=True)
    # torchmetrics averages per image; compare on one image at a time, classes present in it
    for i in range(4):
        per_class = ref[i]
        present = torch.stack([(preds[i] == c).any() | (labels[i] == c).any() for c in range(5)])
        expected = per_class[present].mean().item()
        assert F.mean_iou(preds[i : i + 1], labels[i : i + 1], 5).item() == pytest.approx(expected, abs=1e-6)


# ---------- dtype-dependent tolerance ----------
def test_bfloat16_softmax_rows_are_accepted(gen):
    assert F.ece(torch.tensor([[0.6, 0.4]]).bfloat16(), torch.tensor([0])).item() == pytest.approx(0.4, abs=0.003)
    z = torch.randn(4000, 10, generator=gen) * 3
    y = torch.randint(0, 10, (4000,), generator=gen)
    for p in (torch.softmax(z, 1).bfloat16(), torch.softmax(z.bfloat16(), 1)):
        dev = (p.float().sum(1) - 1).abs().max().item()
        assert 1e-3 < dev <= prob_sum_tol(torch.bfloat16)  # outside the old fixed 1e-3, inside the new one
        # reference: bins (lo, hi] against the edges j/15 rounded to bfloat16, sums in float64
        conf, pred = p.max(1)
        edges = (torch.arange(16, dtype=torch.float64) / 15).bfloat16().double()
        bins = torch.searchsorted(edges[1:-1], conf.double(), right=False)
        gap = torch.zeros(15, dtype=torch.float64).index_add_(0, bins, (pred == y).double() - conf.double())
        assert evaluate(p, y)["ece"] == pytest.approx((gap.abs().sum() / 4000).item(), abs=1e-12)
    # unnormalised bf16 scores are still refused, with the dtype's tolerance in the message
    with pytest.raises(ValueError, match="largest deviation 0.05.*0.0156.*bfloat16"):
        F.ece(torch.tensor([[0.55, 0.5]]).bfloat16(), torch.tensor([0]))
    assert prob_sum_tol(torch.float32) == 1e-3 and prob_sum_tol(torch.float16) == pytest.approx(2 * 2**-10)


# ---------- device path on CPU tensors ----------
def _same_sums(a, b, tol):
    for field in ("count", "conf", "correct"):
        torch.testing.assert_close(getattr(a, field), getattr(b, field), rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n_bins", [1, 10, 15])
def test_device_path_equals_cpu_path(gen, dtype, n_bins):
    probs, labels = _probs(gen, n=777, k=7, dtype=dtype)
    probs[0] = 0
    probs[0, 3] = 1  # confidence exactly 1.0
    cpu = panel_sums(probs, labels, n_bins)
    dev = panel_sums_torch(probs, labels, n_bins)
    # bins and counts are exact; float64 sums agree to rounding (float32 column totals in 16-row groups)
    assert torch.equal(cpu.top.count, dev.top.count) and torch.equal(cpu.classwise.count, dev.classwise.count)
    assert torch.equal(cpu.classwise.correct, dev.classwise.correct) and torch.equal(cpu.correct, dev.correct)
    assert torch.equal(cpu.conf, dev.conf) and torch.equal(cpu.pred, dev.pred)
    _same_sums(cpu.top, dev.top, 1e-10)
    # column totals: 16-row float32 groups, added in another order (~1e-7 of each group's sum)
    _same_sums(cpu.classwise, dev.classwise, 1e-10 if dtype == torch.float64 else 1e-7 * len(labels))
    assert dev.nll.item() == pytest.approx(cpu.nll.item(), rel=1e-12)
    assert dev.brier.item() == pytest.approx(cpu.brier.item(), rel=1e-6 if dtype != torch.float64 else 1e-12)
    lo, hi, worst, y_lo, y_hi = dev.check.tolist()
    assert (y_lo, y_hi) == (labels.min().item(), labels.max().item()) and lo == 0 and hi == 1
    assert worst == pytest.approx((probs.float().sum(1) - 1).abs().max().item(), abs=1e-6)


def test_device_path_weights_equal_dropping_rows(gen):
    probs, labels = _dense(gen)
    valid = (labels != 255).reshape(-1)
    rows, y = probs.movedim(1, -1).reshape(-1, 5), labels.reshape(-1)
    dev = panel_sums_torch(rows, torch.where(valid, y, 0), 15, valid=valid)
    cpu = panel_sums(rows[valid], y[valid], 15)
    _same_sums(cpu.top, dev.top, 1e-10)
    _same_sums(cpu.classwise, dev.classwise, 1e-10)
    assert dev.n.item() == cpu.n and dev.nll.item() == pytest.approx(cpu.nll.item(), rel=1e-12)
    # NaN in an ignored pixel is never read into the checks or the sums
    rows2 = rows.clone()
    rows2[~valid] = float("nan")
    dev2 = panel_sums_torch(rows2, torch.where(valid, y, 0), 15, valid=valid)
    assert torch.isfinite(dev2.check).all() and torch.isfinite(dev2.classwise.conf).all()


@pytest.fixture
def torch_path(monkeypatch):
    monkeypatch.setattr(P, "_FORCE_TORCH_PATH", True)


@pytest.mark.parametrize("name", list(BINNED))
def test_functional_metrics_through_device_path(gen, torch_path, name):
    probs, labels = _dense(gen)
    rows, y = _flat_valid(probs, labels)
    P._FORCE_TORCH_PATH = False
    ref = BINNED[name](rows, y).item()
    P._FORCE_TORCH_PATH = True
    assert BINNED[name](probs, labels, ignore_index=255).item() == pytest.approx(ref, abs=1e-12)


def test_device_path_deferred_checks_raise_the_cpu_errors(torch_path):
    y = torch.tensor([0, 1])
    cases = [(torch.tensor([[0.7, 0.2], [0.4, 0.6]]), y, "sum to 1"),
             (torch.tensor([[1.5, -0.5], [0.4, 0.6]]), y, "outside \\[0, 1\\]"),
             (torch.tensor([[float("nan"), 0.3], [0.4, 0.6]]), y, "NaN or infinite"),
             (torch.tensor([[0.7, 0.3], [0.4, 0.6]]), torch.tensor([0, 5]), "out of range: found 5")]
    for p, labels, msg in cases:
        with pytest.raises(ValueError, match=msg):
            F.ece(p, labels)
        with pytest.raises(ValueError, match=msg):
            evaluate(p, labels)


def test_scatter_sums_lanes_equal_bincount(gen):
    slot = torch.randint(0, 13, (1000,), generator=gen)
    w = torch.rand(1000, generator=gen, dtype=torch.float64)
    ref = torch.bincount(slot, weights=w, minlength=13)
    for lanes in (1, 4, 32):
        torch.testing.assert_close(scatter_sums(slot, w[:, None], 13, lanes=lanes)[:, 0], ref)


# ---------- the fine histogram of the fixed-memory state ----------
def test_fine_bins_are_monotone_and_resolve_one_minus_conf():
    c = torch.tensor([0.0, 0.5, 0.9, 0.99, 0.999, 1 - 2**-29, 1 - 2**-31, 1.0], dtype=torch.float64)
    idx = fine_bin_index(c)
    assert idx.tolist() == sorted(idx.tolist()) and len(set(idx.tolist())) == 7  # the last two share a bin
    assert idx[0] == 255 and idx[-1] == FINE_BINS - 1
    x = torch.rand(20000, dtype=torch.float64) ** 0.05
    s = x.sort().values
    assert (fine_bin_index(s).diff() >= 0).all()
    # a bin never spans more than 2^-8 of d = 1 - conf
    d = 1 - s
    for b in fine_bin_index(s).unique()[:-1]:
        sel = d[fine_bin_index(s) == b]
        assert sel.max() - sel.min() <= sel.max() * 2**-8


def test_equal_mass_on_ties_matches_exact_aece(gen):
    # few well-separated confidence values, so no fine bin holds two different confidences
    values = torch.tensor([0.35, 0.5, 0.62, 0.7, 0.81, 0.9, 0.95, 0.99, 0.999, 1.0], dtype=torch.float64)
    conf = values[torch.randint(0, 10, (3000,), generator=gen)]
    correct = torch.rand(3000, generator=gen, dtype=torch.float64) < conf
    assert fine_bin_index(values).unique().numel() == 10
    exact = bin_sums(equal_mass_bins(conf, 15), conf, correct, 15)
    from calibkit._panel_state import _hist_aece_sums

    hist = scatter_sums(fine_bin_index(conf), torch.stack([torch.ones_like(conf), conf, correct.double()], 1),
                        FINE_BINS).T
    approx = _hist_aece_sums(hist, 15)
    _same_sums(exact, approx, 1e-9)
