"""calibkit.functional metrics: hand-computed values, every pitfall of docs/metrics.md, parity."""

import numpy as np
import pytest
import torch

import calibkit.functional as F
from calibkit.functional.binning import equal_mass_edges, equal_width_bins

BINNED = [F.ece, F.adaptive_ece, F.classwise_ece, F.mce, F.rmsce, F.over_under_ece]
ALL = BINNED + [F.nll, F.brier, F.accuracy]


def _random(gen, n=500, k=7, scale=2.0, dtype=torch.float64):
    logits = torch.randn(n, k, generator=gen, dtype=torch.float64) * scale
    labels = torch.randint(0, k, (n,), generator=gen)
    return torch.softmax(logits, 1).to(dtype), labels


# ---------- independent brute-force reference (numpy loops, explicit (lo, hi] tests) ----------
def _ref_bins(conf, edges):
    out = np.empty(len(conf), dtype=int)
    for i, c in enumerate(conf):
        b = 0
        while b < len(edges) - 2 and c > edges[b + 1]:
            b += 1
        out[i] = b
    return out


def _ref_errors(conf, correct, bins, n_bins):
    n, ece, mce, sq, o, u = len(conf), 0.0, 0.0, 0.0, 0.0, 0.0
    for b in range(n_bins):
        m = bins == b
        if not m.any():
            continue
        gap = correct[m].mean() - conf[m].mean()
        w = m.sum() / n
        ece += w * abs(gap)
        mce = max(mce, abs(gap))
        sq += w * gap**2
        o += w * max(-gap, 0)
        u += w * max(gap, 0)
    return ece, mce, np.sqrt(sq), o, u


def test_docstring_example_by_hand():
    probs = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8]])
    labels = torch.tensor([0, 1, 1])
    # 2 bins: all confidences (0.9, 0.6, 0.8) in (0.5, 1]; acc 2/3, conf 2.3/3 -> 0.1
    assert F.ece(probs, labels, n_bins=2).item() == pytest.approx(0.1, abs=1e-7)
    # classwise: class 0 (0.9|1, 0.6|0 in bin 1; 0.2|0 in bin 0): (|1-1.5| + |0-0.2|)/3 = 0.7/3,
    # class 1 (0.1|0, 0.4|1 in bin 0; 0.8|1 in bin 1): (|1-0.5| + |1-0.8|)/3 = 0.7/3
    assert F.classwise_ece(probs, labels, n_bins=2).item() == pytest.approx(0.7 / 3, abs=1e-7)
    # equal mass, sorted conf (0.6, 0.8, 0.9), 2 bins: rank r in bin floor(2 r / 3):
    # {0.6 wrong, 0.8 right} and {0.9 right}: (2/3)|0.5-0.7| + (1/3)|1-0.9| = 1/6
    assert F.adaptive_ece(probs, labels, n_bins=2).item() == pytest.approx(1 / 6, abs=1e-7)


def test_outputs_are_0dim_float64_and_numpy_accepted(gen):
    probs, labels = _random(gen, dtype=torch.float32)
    for fn in [F.ece, F.adaptive_ece, F.classwise_ece, F.mce, F.rmsce, F.nll, F.brier, F.accuracy]:
        out = fn(probs, labels)
        assert out.dtype == torch.float64 and out.dim() == 0
        got = fn(probs.numpy(), labels.numpy())  # numpy in: a python float of the same value
        assert type(got) is float and got == out.item()


def test_pitfall1_confidence_exactly_one_has_no_phantom_bin():
    # half at conf 1.0 with 80% accuracy, half at 0.95 with 100%: both share the last of 15 bins
    probs = torch.tensor([[1.0, 0.0]] * 5 + [[0.95, 0.05]] * 5)
    labels = torch.tensor([0, 0, 0, 0, 1] + [0] * 5)
    assert F.ece(probs, labels).item() == pytest.approx(abs(0.9 - 0.975), abs=1e-7)  # 0.075
    assert F.mce(probs, labels).item() == pytest.approx(0.075, abs=1e-7)
    assert equal_width_bins(torch.tensor([1.0]), 15).item() == 14


def test_phantom_bin_of_torchmetrics_differs():
    # documents why the pitfall test exists: torchmetrics puts 1.0 in an extra bin -> 0.125
    tm = pytest.importorskip("torchmetrics.functional.classification")
    probs = torch.tensor([[1.0, 0.0]] * 5 + [[0.95, 0.05]] * 5)
    labels = torch.tensor([0, 0, 0, 0, 1] + [0] * 5)
    assert tm.multiclass_calibration_error(probs, labels, 2, n_bins=15).item() == pytest.approx(0.125, abs=1e-6)


_INT = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}


def _next_up(v):
    """Next representable value above a positive float (bit pattern + 1)."""
    return (v.view(_INT[v.dtype]) + 1).view(v.dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_pitfall2_edge_values_go_to_lower_bin_in_every_dtype(dtype):
    for n_bins in (3, 7, 10, 15):
        for j in range(1, n_bins + 1):
            v = torch.tensor(j / n_bins, dtype=dtype)
            assert equal_width_bins(v.view(1), n_bins).item() == j - 1, (n_bins, j)
            if j < n_bins:  # the next representable value above the edge belongs to the next bin
                assert equal_width_bins(_next_up(v).view(1), n_bins).item() == j
    assert equal_width_bins(torch.tensor([0.0], dtype=dtype), 10).item() == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_pitfall2_ece_with_edge_value_by_hand(dtype):
    # conf 0.3 (correct) and 0.25 (wrong), 10 bins: both in (0.2, 0.3] -> |0.5 - mean conf|.
    probs = torch.tensor([[0.3, 0.25, 0.25, 0.2], [0.25, 0.25, 0.25, 0.25]], dtype=dtype)  # pred 0, pred 0
    labels = torch.tensor([0, 3])
    c03 = float(torch.tensor(0.3, dtype=dtype))  # 0.3 as represented in this dtype
    expected = abs(0.5 - (c03 + 0.25) / 2)  # one bin; (lo,hi] would be 0.5*|1-c03| + 0.5*0.25 otherwise
    assert F.ece(probs, labels, n_bins=10).item() == pytest.approx(expected, abs=1e-12)


def test_pitfall3_binary_is_top_label_not_positive_class():
    # p1 = 0.9 (y=1) and p1 = 0.1 (y=1): top-label confidences 0.9 and 0.9, one right, one wrong
    probs = torch.tensor([[0.1, 0.9], [0.9, 0.1]])
    labels = torch.tensor([1, 1])
    assert F.ece(probs, labels, n_bins=10).item() == pytest.approx(0.4, abs=1e-7)
    # positive-class calibration would be 0.5*|1-0.9| + 0.5*|1-0.1| = 0.5: not what we compute


def test_pitfall3_labels_only_0_1_in_a_10_class_batch():
    probs = torch.full((2, 10), 0.4 / 9, dtype=torch.float64)
    probs[0, 5] = 0.6  # predicts class 5, label 0: wrong
    probs[1] = 0.3 / 9
    probs[1, 1] = 0.7  # predicts class 1, label 1: right
    labels = torch.tensor([0, 1])
    # 10-class top label: 0.6 in (0.5,0.6], 0.7 in (0.6,0.7]: 0.5*0.6 + 0.5*0.3
    assert F.ece(probs, labels, n_bins=10).item() == pytest.approx(0.45, abs=1e-12)
    assert F.accuracy(probs, labels).item() == 0.5
    # classwise averages over all 10 classes, not 2 (reference below divides by K = 10)
    assert F.classwise_ece(probs, labels, n_bins=10).item() == pytest.approx(_ref_classwise(probs, labels, 10))


def test_pitfall4_logits_in_unit_interval_are_rejected_not_guessed(gen):
    x = torch.rand(20, 5, generator=gen)  # all in [0, 1], rows do not sum to 1
    labels = torch.randint(0, 5, (20,), generator=gen)
    for fn in ALL:
        with pytest.raises(ValueError, match="sum to 1.*softmax"):
            fn(x, labels)
    with pytest.raises(ValueError, match="outside \\[0, 1\\].*softmax"):
        F.ece(torch.randn(20, 5, generator=gen) * 3, labels)


def test_pitfall5_equal_mass_bins_keep_ties_together():
    # conf 0.6 x4 (2 right, 2 wrong) and 0.9 x2 (right), 3 bins of 2 ranks: the inner edges are
    # the ranks 1 and 3, both 0.6, so the 0.6 block stays whole in bin 0 and 0.9 is in bin 2
    probs = torch.tensor([[0.6, 0.4]] * 4 + [[0.9, 0.1]] * 2, dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 1, 0, 0])
    assert equal_mass_edges(probs.max(1).values, 3).tolist() == [0.6, 0.6, 0.6, 0.9]
    # (4/6)|0.5-0.6| + (2/6)|1-0.9| = 0.1; a split tie would give 0.3667
    assert F.adaptive_ece(probs, labels, n_bins=3).item() == pytest.approx(0.1, abs=1e-12)


def test_equal_mass_edges_are_the_largest_values_of_the_bins_below(gen):
    # edge b = the largest of the sorted values whose rank r has floor(r B / N) < b; outer edges
    # the smallest and largest value
    for n in (1, 2, 7, 100, 1000, 1001):
        conf = torch.rand(n, generator=gen, dtype=torch.float64)
        s = np.sort(conf.numpy())
        for b in (1, 2, 3, 15):
            bins = np.array([r * b // n for r in range(n)])
            want = [s[0]] + [s[bins < j].max() for j in range(1, b)] + [s[-1]]
            assert equal_mass_edges(conf, b).tolist() == want


def _aece_direct(conf, correct, n_bins):
    """AECE written from the definition: sort; the sample of rank r goes to bin floor(r B / N);
    a block of tied confidences joins the bin of its lowest rank; sum_b |correct_b - conf_b| / N."""
    order = np.argsort(conf, kind="stable")
    c, a = conf[order], correct[order].astype(np.float64)
    n = len(c)
    bins = np.array([r * n_bins // n for r in range(n)])
    for r in range(1, n):
        if c[r] == c[r - 1]:
            bins[r] = bins[r - 1]
    total = 0.0
    for b in range(n_bins):
        inside = bins == b
        total += abs(a[inside].sum() - c[inside].sum())
    return total / n


@pytest.mark.parametrize("n,n_bins", [(600, 15), (600, 2), (1000, 10), (601, 15), (37, 4)])
def test_adaptive_ece_equals_a_direct_implementation(gen, n, n_bins):
    probs, _ = _random(gen, n=n, k=5)
    labels = torch.multinomial(probs, 1, generator=gen).squeeze(1)  # near-calibrated: gaps of both signs
    conf, pred = probs.max(1)
    correct = (pred == labels).numpy()
    got = float(F.adaptive_ece(probs, labels, n_bins=n_bins))
    assert got == pytest.approx(_aece_direct(conf.numpy(), correct, n_bins), abs=1e-13)
    # the same with many ties (confidences rounded to two decimals)
    tied = torch.cat([probs.max(1, keepdim=True).values.round(decimals=2), probs], 1)
    tied = tied / tied.sum(1, keepdim=True)
    conf, pred = tied.max(1)
    correct = (pred == labels).numpy()
    got = float(F.adaptive_ece(tied, labels, n_bins=n_bins))
    assert got == pytest.approx(_aece_direct(conf.numpy(), correct, n_bins), abs=1e-13)


def test_adaptive_ece_of_two_bins_of_two_by_hand():
    # confidences 0.6, 0.7 (right), 0.8, 0.9 (wrong); 2 bins of 2: (|2 - 1.3| + |0 - 1.7|) / 4 = 0.6
    # (3 and 1 samples would give (|2 - 2.1| + |0 - 0.9|) / 4 = 0.25)
    probs = torch.tensor([0.6, 0.7, 0.8, 0.9], dtype=torch.float64)
    labels = torch.tensor([1, 1, 0, 0])
    assert float(F.adaptive_ece(probs, labels, n_bins=2)) == pytest.approx(0.6, abs=1e-12)


def test_k2_all_metrics_by_hand():
    probs = torch.tensor([[0.8, 0.2], [0.3, 0.7], [0.55, 0.45]], dtype=torch.float64)
    labels = torch.tensor([0, 0, 1])
    # conf (0.8 right, 0.7 wrong, 0.55 wrong), 2 bins: all in (0.5, 1]: |1/3 - 2.05/3|
    assert F.ece(probs, labels, n_bins=2).item() == pytest.approx(1.05 / 3, abs=1e-12)
    assert F.nll(probs, labels).item() == pytest.approx(-(np.log(0.8) + np.log(0.3) + np.log(0.45)) / 3)
    brier = ((0.2**2 + 0.2**2) + (0.7**2 + 0.7**2) + (0.55**2 + 0.55**2)) / 3
    assert F.brier(probs, labels).item() == pytest.approx(brier, abs=1e-12)
    assert F.accuracy(probs, labels).item() == pytest.approx(1 / 3)


def _ref_classwise(probs, labels, n_bins):
    p, y = probs.double().numpy(), labels.numpy()
    edges = np.arange(n_bins + 1) / n_bins
    total = 0.0
    for k in range(p.shape[1]):
        bins = _ref_bins(p[:, k], edges)
        total += _ref_errors(p[:, k], (y == k).astype(float), bins, n_bins)[0]
    return total / p.shape[1]


@pytest.mark.parametrize("n_bins", [1, 2, 15])
def test_against_bruteforce_reference(gen, n_bins):
    probs, labels = _random(gen, n=300, k=6)
    p, y = probs.numpy(), labels.numpy()
    conf, correct = p.max(1), (p.argmax(1) == y).astype(float)
    ece, mce, rms, o, u = _ref_errors(conf, correct, _ref_bins(conf, np.arange(n_bins + 1) / n_bins), n_bins)
    assert F.ece(probs, labels, n_bins).item() == pytest.approx(ece, abs=1e-12)
    assert F.mce(probs, labels, n_bins).item() == pytest.approx(mce, abs=1e-12)
    assert F.rmsce(probs, labels, n_bins).item() == pytest.approx(rms, abs=1e-12)
    oo, uu = F.over_under_ece(probs, labels, n_bins)
    assert (oo.item(), uu.item()) == pytest.approx((o, u), abs=1e-12)
    assert (oo + uu).item() == pytest.approx(F.ece(probs, labels, n_bins).item(), abs=1e-12)
    srt, n = np.sort(conf), len(conf)
    rank_bin = np.array([r * n_bins // n for r in range(n)])  # rank r in bin floor(r B / N)
    edges = [srt[0]] + [srt[rank_bin < b].max() for b in range(1, n_bins)] + [srt[-1]]
    aece = _ref_errors(conf, correct, _ref_bins(conf, edges), n_bins)[0]
    assert F.adaptive_ece(probs, labels, n_bins).item() == pytest.approx(aece, abs=1e-12)
    assert (F.classwise_ece(probs, labels, n_bins).item()
            == pytest.approx(_ref_classwise(probs, labels, n_bins), abs=1e-12))
    onehot = np.eye(p.shape[1])[y]
    assert F.brier(probs, labels).item() == pytest.approx(((p - onehot) ** 2).sum(1).mean(), abs=1e-12)
    assert F.nll(probs, labels).item() == pytest.approx(-np.log(p[np.arange(len(y)), y]).mean(), abs=1e-12)


def test_classwise_float32_matches_float64_reference(gen):
    probs, labels = _random(gen, n=4000, k=10, dtype=torch.float32)
    assert F.classwise_ece(probs, labels).item() == pytest.approx(_ref_classwise(probs, labels, 15), abs=1e-9)


def test_debiased_rmsce_by_hand():
    # one bin (B=1): conf 0.7 x4 with correct (1,1,1,0): acc 0.75, gap 0.05
    probs = torch.tensor([[0.7, 0.3]] * 4, dtype=torch.float64)
    labels = torch.tensor([0, 0, 0, 1])
    assert F.rmsce(probs, labels, n_bins=1).item() == pytest.approx(0.05, abs=1e-12)
    # debiased: 0.05^2 - 0.75*0.25/3 < 0 -> clipped to 0
    assert F.rmsce(probs, labels, n_bins=1, debias=True).item() == 0.0
    probs = torch.tensor([[0.9, 0.1]] * 10, dtype=torch.float64)
    labels = torch.tensor([0] * 5 + [1] * 5)  # acc 0.5, gap 0.4
    expected = np.sqrt(0.4**2 - 0.5 * 0.5 / 9)
    assert F.rmsce(probs, labels, n_bins=1, debias=True).item() == pytest.approx(expected, abs=1e-12)


def test_nll_clamps_zero_probability():
    probs = torch.tensor([[1.0, 0.0]], dtype=torch.float32)
    val = F.nll(probs, torch.tensor([1])).item()
    assert val == pytest.approx(-np.log(np.finfo(np.float32).tiny))


def test_permutation_invariance(gen):
    probs, labels = _random(gen, n=400)
    perm = torch.randperm(400, generator=gen)
    for fn in [F.ece, F.adaptive_ece, F.classwise_ece, F.mce, F.rmsce, F.nll, F.brier]:
        assert fn(probs[perm], labels[perm]).item() == pytest.approx(fn(probs, labels).item(), abs=1e-12)


@pytest.mark.parametrize("norm,fn", [("l1", F.ece), ("max", F.mce)])
def test_parity_with_torchmetrics(gen, norm, fn):
    tm = pytest.importorskip("torchmetrics.functional.classification")
    for k in (2, 10, 100):
        probs, labels = _random(gen, n=3000, k=k, dtype=torch.float32)
        edges = torch.arange(16) / 15
        assert not torch.isin(probs.max(1).values, edges.float()).any()  # no edge values
        ref = tm.multiclass_calibration_error(probs, labels, k, n_bins=15, norm=norm).item()
        assert fn(probs, labels).item() == pytest.approx(ref, abs=1e-6)


def test_ood_auroc_parity_with_sklearn(gen):
    sk = pytest.importorskip("sklearn.metrics")
    s_in = torch.randn(300, generator=gen, dtype=torch.float64)
    s_out = torch.randn(200, generator=gen, dtype=torch.float64) + 0.7
    s_in[:50] = torch.round(s_in[:50])  # ties inside and across the two groups
    s_out[:50] = torch.round(s_out[:50])
    y = np.r_[np.zeros(300), np.ones(200)]
    ref = sk.roc_auc_score(y, np.r_[s_in.numpy(), s_out.numpy()])
    assert F.ood_auroc(s_in, s_out).item() == pytest.approx(ref, abs=1e-12)
    assert F.ood_auroc([0.1, 0.2], [0.3, 0.4]) == 1.0  # lists are numpy's side: python floats
    assert F.ood_auroc([0.5, 0.5], [0.5]) == 0.5


def test_fpr_at_95_tpr(gen):
    sk = pytest.importorskip("sklearn.metrics")
    # hand: OOD scores 1..20, in-scores 0.5..; 95% of 20 = 19 -> threshold 2
    s_out = torch.arange(1, 21, dtype=torch.float64)
    s_in = torch.tensor([0.5, 1.5, 2.0, 3.0])
    assert F.fpr_at_95_tpr(s_in, s_out).item() == pytest.approx(0.5)  # 2.0 and 3.0 are >= 2
    for _ in range(3):
        a = torch.randn(500, generator=gen, dtype=torch.float64)
        b = torch.randn(300, generator=gen, dtype=torch.float64) + 1
        fpr, tpr, _ = sk.roc_curve(np.r_[np.zeros(500), np.ones(300)], np.r_[a.numpy(), b.numpy()])
        assert F.fpr_at_95_tpr(a, b).item() == pytest.approx(fpr[np.searchsorted(tpr, 0.95)], abs=1e-12)


def test_ood_scores():
    probs = torch.tensor([[0.25] * 4, [1.0, 0, 0, 0], [0.5, 0.5, 0, 0]], dtype=torch.float64)
    assert F.entropy_score(probs).tolist() == pytest.approx([1.0, 0.0, 0.5])
    assert F.max_confidence_score(probs).tolist() == pytest.approx([0.75, 0.0, 0.5])


@pytest.mark.parametrize("fn", ALL)
def test_bad_input_raises_value_error_naming_the_problem(fn):
    good = torch.tensor([[0.7, 0.3], [0.4, 0.6]])
    y = torch.tensor([0, 1])
    cases = [
        ((good, torch.tensor([0, 1, 1])), "3 entries but the predictions have 2"),
        ((good, torch.tensor([0, 2])), "out of range"),
        ((good, torch.tensor([-1, 0])), "out of range"),
        ((good, torch.tensor([0.0, 1.0])), "integer"),
        ((torch.tensor([[float("nan"), 0.3], [0.4, 0.6]]), y), "NaN or infinite"),
        ((torch.tensor([[float("inf"), 0.3], [0.4, 0.6]]), y), "NaN or infinite"),
        ((torch.tensor([[0.7, 0.2], [0.4, 0.6]]), y), "sum to 1"),
        ((torch.zeros(0, 2), torch.zeros(0, dtype=torch.long)), "empty"),
        # 1-D probabilities are binary by contract, and need one 0/1 label each
        ((good[0], torch.tensor([0, 1, 1])), "need labels of shape \\(2,\\)"),
        ((good[0], torch.tensor([0, 2])), "out of range"),
        ((torch.tensor([0.2, 1.3]), y), "outside \\[0, 1\\].*sigmoid"),
        ((good[:, :, None], y), "need labels of shape \\(2, 1\\)"),  # dense (N, K, W) needs (N, W) labels
        ((good, ["a", "b"]), "string labels"),
        ((good, np.array(["a", "b"])), "string labels"),
    ]
    for args, msg in cases:
        with pytest.raises(ValueError, match=msg):
            fn(*args)


@pytest.mark.parametrize("fn", BINNED)
@pytest.mark.parametrize("n_bins", [0, -3, 2.5, True])
def test_bad_n_bins(fn, n_bins):
    with pytest.raises(ValueError, match="n_bins"):
        fn(torch.tensor([[0.7, 0.3]]), torch.tensor([0]), n_bins=n_bins)


def test_bad_ood_scores():
    with pytest.raises(ValueError, match="empty"):
        F.ood_auroc([], [0.1])
    with pytest.raises(ValueError, match="NaN"):
        F.fpr_at_95_tpr([0.1, float("nan")], [0.2])
    with pytest.raises(ValueError, match="shape"):
        F.ood_auroc(torch.zeros(2, 2), [0.1])
