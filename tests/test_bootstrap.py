"""The bootstrap (calibkit.bootstrap) against resamples drawn here, independently of the library.

The library summarises resample ``r`` by its count vector; here the same indices are drawn from an
identically seeded generator and each metric is evaluated on the resampled rows themselves.
"""

from __future__ import annotations

import pytest
import torch

from calibkit import functional as F
from calibkit.bootstrap import bootstrap_ci, bootstrap_interval, paired_bootstrap_diff

FUNCS = {"acc": F.accuracy, "ece": F.ece, "aece": F.adaptive_ece, "cece": F.classwise_ece, "mce": F.mce,
         "rmsce": F.rmsce, "nll": F.nll, "brier": F.brier}


def data(n=120, k=4, seed=0, dtype=torch.float64, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(n, k, generator=g, dtype=torch.float64) * scale, 1).to(dtype)
    labels = torch.randint(0, k, (n,), generator=g)
    return probs, labels


def by_hand(name, probs, labels, n_resamples, seed, n_bins=15):
    """Each resample's metric on its rows, indices drawn as documented: R x N uniform draws."""
    idx = torch.randint(0, len(labels), (n_resamples, len(labels)), generator=torch.Generator().manual_seed(seed))
    kw = {} if name in ("acc", "nll", "brier") else {"n_bins": n_bins}
    return torch.tensor([float(FUNCS[name](probs[i], labels[i], **kw)) for i in idx], dtype=torch.float64)


@pytest.mark.parametrize("n_bins", [2, 15])
@pytest.mark.parametrize("name", list(FUNCS))
def test_resamples_are_the_metric_on_uniformly_drawn_rows(name, n_bins):
    probs, labels = data()
    res = bootstrap_ci(name, probs, labels, n_resamples=25, seed=4, n_bins=n_bins, method="percentile")
    torch.testing.assert_close(res.samples, by_hand(name, probs, labels, 25, 4, n_bins), rtol=0, atol=1e-12)
    kw = {} if name in ("acc", "nll", "brier") else {"n_bins": n_bins}
    assert res.estimate == pytest.approx(float(FUNCS[name](probs, labels, **kw)), abs=1e-12)


def test_small_sets_leave_equal_mass_bins_empty():
    probs, labels = data(n=5, k=3, seed=1)  # 5 samples, 15 equal-mass bins: most bins hold nothing
    res = bootstrap_ci("aece", probs, labels, n_resamples=30, seed=2)
    torch.testing.assert_close(res.samples, by_hand("aece", probs, labels, 30, 2), rtol=0, atol=1e-12)


def test_resamples_drawn_in_chunks_are_the_same_draws():
    # 50,000 rows x 100 resamples exceed the 4 million counts held at once: drawn 80 at a time
    probs, labels = data(n=50_000, k=3, seed=3)
    res = bootstrap_ci("acc", probs, labels, n_resamples=100, seed=5)
    assert res.samples.shape == (100,)
    correct = (probs.argmax(1) == labels).double()
    idx = torch.randint(0, 50_000, (100, 50_000), generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(res.samples, correct[idx].mean(1), rtol=0, atol=1e-12)


def test_defaults_and_single_resample():
    probs, labels = data(n=40)
    res = bootstrap_ci("acc", probs, labels)
    assert res.samples.shape == (1000,) and res.level == 0.95 and res.method == "basic"
    assert torch.equal(res.samples, by_hand("acc", probs, labels, 1000, 0))  # seed 0
    diff = paired_bootstrap_diff(probs, probs.flip(1), labels, "ece")
    assert diff.samples.shape == (1000,) and diff.level == 0.95
    a = bootstrap_ci("ece", probs, labels, n_resamples=1000, seed=0)
    b = bootstrap_ci("ece", probs.flip(1), labels, n_resamples=1000, seed=0)
    torch.testing.assert_close(diff.samples, a.samples - b.samples)  # seed 0 and 15 bins by default
    assert diff.estimate == pytest.approx(float(F.ece(probs, labels, 15) - F.ece(probs.flip(1), labels, 15)))
    few = bootstrap_ci("acc", probs, labels, n_resamples=10, seed=3)  # MIN_RESAMPLES
    assert torch.equal(few.samples, by_hand("acc", probs, labels, 10, 3))
    with pytest.raises(ValueError, match="n_resamples must be an integer >= 10"):
        bootstrap_ci("acc", probs, labels, n_resamples=9)
    # bootstrap_interval defaults: level 0.95, the basic interval
    s = torch.arange(101, dtype=torch.float64)  # quantiles 2.5 and 97.5
    assert bootstrap_interval(s, 50.0) == pytest.approx((2 * 50 - 97.5, 2 * 50 - 2.5))
    assert bootstrap_interval(s, 50.0, method="percentile") == pytest.approx((2.5, 97.5))


def test_basic_interval_is_clipped_to_the_metrics_range_only():
    # constant 50/50 predictions, half of them right: ECE 0 on the full set, above 0 on almost every
    # resample, so the unclipped basic interval [2*0 - q_hi, 2*0 - q_lo] lies below 0
    probs = torch.full((60, 2), 0.5, dtype=torch.float64)
    labels = torch.arange(60) % 2
    res = bootstrap_ci("ece", probs, labels, n_resamples=200, seed=1)
    assert res.estimate == 0.0 and float(res.samples.max()) > 0
    assert (res.low, res.high) == (0.0, 0.0)
    q = torch.quantile(res.samples, torch.tensor([0.025, 0.975], dtype=torch.float64))
    free = bootstrap_ci(lambda p, y: F.ece(p, y), probs, labels, n_resamples=200, seed=1)  # a callable: not clipped
    assert torch.equal(free.samples, res.samples)
    # the basic interval is (-q_hi, -q_lo); the reported one is extended to hold the estimate 0
    assert bootstrap_interval(free.samples, 0.0) == pytest.approx((-float(q[1]), -float(q[0])))
    assert (free.low, free.high) == pytest.approx((-float(q[1]), max(-float(q[0]), 0.0)))
    assert free.low < 0


def test_paired_difference_leaves_ignored_labels_out():
    probs, labels = data(n=80, k=3, seed=6)
    other = torch.softmax(torch.log(probs) * 1.7, 1)
    masked = labels.clone()
    masked[::4] = 255
    keep = masked != 255
    got = paired_bootstrap_diff(probs, other, masked, "ece", n_resamples=50, seed=2, ignore_index=255)
    ref = paired_bootstrap_diff(probs[keep], other[keep], labels[keep], "ece", n_resamples=50, seed=2)
    assert torch.equal(got.samples, ref.samples) and got.estimate == ref.estimate


def test_argument_errors_are_named_in_full():
    probs, labels = data(n=20)
    with pytest.raises(ValueError, match=r"^unknown metric 'foo'; expected one of acc, ece, aece, cece, mce, rmsce, "
                                         r"o_ece, u_ece, nll, brier or a callable$"):
        bootstrap_ci("foo", probs, labels)
    with pytest.raises(ValueError, match=r"^metric must be a name or a callable, got int$"):
        bootstrap_ci(3, probs, labels)
    with pytest.raises(ValueError, match=r"^unknown interval method 'bca'; expected one of basic, percentile$"):
        bootstrap_ci("ece", probs, labels, method="bca")
    with pytest.raises(ValueError, match=r"^unknown interval method 'BASIC'; expected one of basic, percentile$"):
        bootstrap_interval(torch.zeros(3), 0.0, method="BASIC")
    for bad in (True, 2.5, 0):
        with pytest.raises(ValueError, match=rf"^n_resamples must be an integer >= 10 \(fewer resamples give no "
                                             rf"interval: one gives \[x, x\]\), got {bad!r}$"):
            bootstrap_ci("ece", probs, labels, n_resamples=bad)
    for bad in (0.0, 1.0):
        with pytest.raises(ValueError, match=rf"^level must be in \(0, 1\), got {bad!r}$"):
            bootstrap_ci("ece", probs, labels, level=bad)
    with pytest.raises(ValueError, match=r"^labels has 20 entries but the predictions have 10 rows$"):
        paired_bootstrap_diff(probs, probs[:10], labels, "ece")  # each model is checked against the labels


def test_a_reported_interval_always_holds_its_estimate():
    """Skewed resamples put the basic interval wholly on one side of the estimate; the reported one is
    extended to it (every resample above the estimate: ``[2e - q_hi, 2e - q_lo]`` lies below e)."""
    from calibkit.bootstrap import _result

    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        est = float(torch.rand((), generator=g))
        samples = est + torch.rand(50, generator=g, dtype=torch.float64) * float(torch.rand((), generator=g))
        raw = bootstrap_interval(samples, est, 0.95, "basic", (0.0, 1.0))
        res = _result(est, samples, 0.95, "basic", (0.0, 1.0))
        assert res.low <= est <= res.high
        assert res.low == min(raw[0], est) and res.high == max(raw[1], est)  # widened, never narrowed
