"""evaluate, the streaming/distributed accumulator and the bootstrap."""


import pytest
import torch

import calibkit.functional as F
from calibkit.metrics import PANEL, CalibrationAccumulator, bootstrap_ci, evaluate, paired_bootstrap_diff
from tests.helpers.gloo import on_two_processes

FUNCS = {"acc": F.accuracy, "ece": F.ece, "aece": F.adaptive_ece, "cece": F.classwise_ece, "mce": F.mce,
         "rmsce": F.rmsce, "nll": F.nll, "brier": F.brier,
         "o_ece": lambda p, y: F.over_under_ece(p, y)[0], "u_ece": lambda p, y: F.over_under_ece(p, y)[1]}


def _data(gen, n=1000, k=8, dtype=torch.float64, scale=2.5):
    logits = torch.randn(n, k, generator=gen, dtype=torch.float64) * scale
    labels = torch.randint(0, k, (n,), generator=gen)
    return torch.softmax(logits, 1).to(dtype), labels


def test_evaluate_equals_functional(gen):
    probs, labels = _data(gen)
    out = evaluate(probs, labels)
    assert tuple(out) == PANEL
    assert all(isinstance(v, float) for v in out.values())
    for key, fn in FUNCS.items():
        assert out[key] == pytest.approx(fn(probs, labels).item(), abs=1e-12), key
    assert out["o_ece"] + out["u_ece"] == pytest.approx(out["ece"], abs=1e-12)


def test_evaluate_validates(gen):
    with pytest.raises(ValueError, match="sum to 1"):
        evaluate(torch.rand(10, 3, generator=gen), torch.zeros(10, dtype=torch.long))
    with pytest.raises(ValueError, match="n_bins"):
        evaluate(*_data(gen, n=10), n_bins=0)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-9)])
def test_streaming_equals_evaluate_for_any_split(gen, dtype, tol):
    probs, labels = _data(gen, n=1500, dtype=dtype)
    ref = evaluate(probs, labels, n_bins=10)
    for sizes in ([1500], [1, 499, 1000], [29] * 51 + [21]):
        acc = CalibrationAccumulator(n_bins=10)
        for p, y in zip(probs.split(sizes), labels.split(sizes)):
            acc.update(p, y)
        got = acc.compute()
        for k in PANEL:
            assert got[k] == pytest.approx(ref[k], abs=tol), (sizes[:3], k)


def test_merge_equals_single_accumulator(gen):
    probs, labels = _data(gen, n=900)
    a, b, c = CalibrationAccumulator(), CalibrationAccumulator(), CalibrationAccumulator()
    a.update(probs[:300], labels[:300])
    b.update(probs[300:], labels[300:])
    c.merge(a).merge(b)  # c starts empty: merging into an empty accumulator works
    ref = evaluate(probs, labels)
    for k in PANEL:
        assert c.compute()[k] == pytest.approx(ref[k], abs=1e-12)


def test_accumulator_state_is_o_bins(gen):
    acc = CalibrationAccumulator(n_bins=15).update(*_data(gen, n=2000, k=8))
    assert acc._bins.shape == (3, 15) and acc._classwise.shape == (3, 8, 15)
    assert sum(t.numel() for t in acc._conf) == 2000  # AECE: one confidence per sample, not N x K


def test_accumulator_errors(gen):
    acc = CalibrationAccumulator()
    with pytest.raises(ValueError, match="N = 0"):
        acc.compute()
    acc.update(*_data(gen, n=10, k=3))
    with pytest.raises(ValueError, match="K = 4"):
        acc.update(*_data(gen, n=10, k=4))
    with pytest.raises(ValueError, match="n_bins"):
        acc.merge(CalibrationAccumulator(n_bins=10).update(*_data(gen, n=5, k=3)))


def _shard(rank, probs, labels):
    acc = CalibrationAccumulator(n_bins=15, num_classes=probs.shape[1])
    # uneven shards, so the all-gather padding of the per-sample arrays is exercised
    lo, hi = (0, 700) if rank == 0 else (700, len(labels))
    acc.update(probs[lo:hi], labels[lo:hi])
    return acc.sync().compute()


def test_two_process_gloo_sync_equals_evaluate(gen):
    probs, labels = _data(gen, n=1000, k=5)
    results = on_two_processes(_shard, probs, labels)
    ref = evaluate(probs, labels)
    for rank in (0, 1):
        for k in PANEL:
            assert results[rank][k] == pytest.approx(ref[k], abs=1e-12), (rank, k)


def test_sync_without_distributed_is_noop(gen):
    acc = CalibrationAccumulator().update(*_data(gen, n=50))
    assert acc.sync().compute() == acc.compute()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", list(FUNCS))
def test_bootstrap_fast_path_equals_per_resample_evaluation(gen, name, dtype):
    probs, labels = _data(gen, n=300, k=6, dtype=dtype)
    # percentile: the basic interval of a panel name is clipped to the metric's range, a callable's is not
    fast = bootstrap_ci(name, probs, labels, n_resamples=40, seed=3, method="percentile")
    slow = bootstrap_ci(lambda p, y: FUNCS[name](p, y), probs, labels, n_resamples=40, seed=3, method="percentile")
    # float32 cece: the functional version sums columns in 16-row float32 blocks (documented
    # relative error ~1e-8), the bootstrap in float64
    tol = 1e-8 if (name == "cece" and dtype == torch.float32) else 1e-12
    assert fast.estimate == pytest.approx(FUNCS[name](probs, labels).item(), abs=tol)
    torch.testing.assert_close(fast.samples, slow.samples, rtol=0, atol=tol)
    assert (fast.low, fast.high) == pytest.approx((slow.low, slow.high), abs=tol)


def test_bootstrap_reproducible_and_sensible(gen):
    probs, labels = _data(gen, n=2000, k=10)
    a = bootstrap_ci("ece", probs, labels, n_resamples=300, seed=7, method="percentile")
    b = bootstrap_ci(F.ece, probs, labels, n_resamples=300, seed=7, method="percentile")  # same fast path
    assert torch.equal(a.samples, b.samples) and (a.low, a.high) == (b.low, b.high)
    c = bootstrap_ci("ece", probs, labels, n_resamples=300, seed=8)
    assert not torch.equal(a.samples, c.samples)
    assert a.low < a.estimate < a.high and a.level == 0.95 and a.samples.shape == (300,)
    q = torch.quantile(a.samples, torch.tensor([0.025, 0.975], dtype=torch.float64))
    assert (a.low, a.high) == pytest.approx(tuple(q.tolist()))
    # the default basic interval reflects the quantiles about the estimate: [2e - q_hi, 2e - q_lo]
    basic = bootstrap_ci("ece", probs, labels, n_resamples=300, seed=7)
    assert basic.method == "basic" and torch.equal(basic.samples, a.samples)
    assert (basic.low, basic.high) == pytest.approx((2 * a.estimate - q[1].item(), 2 * a.estimate - q[0].item()))
    assert basic.bias == pytest.approx(a.samples.mean().item() - a.estimate)
    # interval of the accuracy ~ estimate +- 1.96 * binomial std
    acc = bootstrap_ci("acc", probs, labels, n_resamples=1000, seed=0)
    sd = (acc.estimate * (1 - acc.estimate) / 2000) ** 0.5
    assert acc.high - acc.low == pytest.approx(2 * 1.96 * sd, rel=0.15)


def test_paired_bootstrap(gen):
    probs, labels = _data(gen, n=1500, k=10)
    sharper = torch.softmax(torch.log(probs) * 2, 1)
    same = paired_bootstrap_diff(probs, probs, labels, "ece", n_resamples=100)
    assert same.estimate == 0 and torch.equal(same.samples, torch.zeros(100, dtype=torch.float64))
    d = paired_bootstrap_diff(sharper, probs, labels, "nll", n_resamples=200, seed=1)
    a = bootstrap_ci("nll", sharper, labels, n_resamples=200, seed=1)
    b = bootstrap_ci("nll", probs, labels, n_resamples=200, seed=1)
    torch.testing.assert_close(d.samples, a.samples - b.samples)  # same resample indices
    assert d.estimate == pytest.approx(a.estimate - b.estimate)
    # pairing removes sample difficulty: narrower than the difference of independent draws
    b_other = bootstrap_ci("nll", probs, labels, n_resamples=200, seed=2)
    assert ((d.high - d.low)
            < torch.quantile(a.samples - b_other.samples, 0.975) - torch.quantile(a.samples - b_other.samples, 0.025))


def test_bootstrap_bad_arguments(gen):
    probs, labels = _data(gen, n=20)
    with pytest.raises(ValueError, match="unknown metric 'foo'"):
        bootstrap_ci("foo", probs, labels)
    with pytest.raises(ValueError, match="n_resamples"):
        bootstrap_ci("ece", probs, labels, n_resamples=0)
    with pytest.raises(ValueError, match="level"):
        bootstrap_ci("ece", probs, labels, level=1.5)
    with pytest.raises(ValueError, match="rows"):
        paired_bootstrap_diff(probs, probs[:10], labels, "ece")


def test_basic_interval_corrects_the_upward_bias_of_ece():
    # Labels drawn from the model's own probabilities: the population ECE is exactly 0 (in every
    # bin the chance of being right equals the confidence). Binned ECE is biased upwards, so the
    # resamples lie above the estimate and the percentile interval excludes the truth. The basic
    # interval reflects the quantiles about the estimate: it moves down by the bias the bootstrap
    # sees and is centred on the bias-corrected estimate. (Its coverage is measured, not asserted
    # here: benchmarks/bootstrap_coverage.py.)
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(3000, 10, generator=g, dtype=torch.float64) * 2, 1)
    labels = torch.multinomial(probs, 1, generator=g).squeeze(1)
    pct = bootstrap_ci("ece", probs, labels, n_resamples=500, seed=0, method="percentile")
    basic = bootstrap_ci("ece", probs, labels, n_resamples=500, seed=0)
    assert pct.low > 0 and pct.bias > 0
    assert basic.bias == pct.bias and basic.corrected == pytest.approx(2 * basic.estimate - pct.samples.mean().item())
    assert basic.low <= basic.corrected <= basic.high
    assert ((basic.low, basic.high)
            == pytest.approx((max(0.0, 2 * basic.estimate - pct.high), 2 * basic.estimate - pct.low)))
    assert basic.low < pct.low and basic.high < pct.high


def test_paired_basic_interval_and_method_argument(gen):
    probs, labels = _data(gen, n=1200, k=6)
    sharper = torch.softmax(torch.log(probs) * 1.5, 1)
    pct = paired_bootstrap_diff(sharper, probs, labels, "ece", n_resamples=200, method="percentile")
    basic = paired_bootstrap_diff(sharper, probs, labels, "ece", n_resamples=200)
    q = torch.quantile(pct.samples, torch.tensor([0.025, 0.975], dtype=torch.float64))
    assert (pct.low, pct.high) == pytest.approx(tuple(q.tolist()))
    assert ((basic.low, basic.high)
            == pytest.approx((2 * basic.estimate - q[1].item(), 2 * basic.estimate - q[0].item())))
    with pytest.raises(ValueError, match="unknown interval method 'bca'"):
        bootstrap_ci("ece", probs, labels, method="bca")


def test_bootstrap_takes_binary_and_dense_inputs(gen):
    p = torch.rand(400, generator=gen, dtype=torch.float64)
    y = torch.bernoulli(p, generator=gen).long()
    a = bootstrap_ci("ece", p, y, n_resamples=50)
    b = bootstrap_ci("ece", torch.stack([1 - p, p], 1), y, n_resamples=50)
    assert torch.equal(a.samples, b.samples)
    probs = torch.softmax(torch.randn(2, 3, 6, 6, generator=gen, dtype=torch.float64), 1)
    labels = torch.randint(0, 3, (2, 6, 6), generator=gen)
    labels[:, 0] = 255
    rows, flat = probs.movedim(1, -1).reshape(-1, 3), labels.reshape(-1)
    d = bootstrap_ci("cece", probs, labels, n_resamples=30, ignore_index=255)
    f = bootstrap_ci("cece", rows[flat != 255], flat[flat != 255], n_resamples=30)
    assert torch.equal(d.samples, f.samples)
