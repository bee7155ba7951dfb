"""bootstrap_cis: one draw of resamples for many models, equal to the per-model calls bit for bit."""

import pytest
import torch

from calibkit import bootstrap, resampling
from calibkit.bootstrap import bootstrap_ci, bootstrap_cis, paired_bootstrap_diff
from calibkit.functional import metrics as F


def _models(seed=0, n=400, k=6, m=4):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    return {f"t{t}": torch.softmax(z * t, 1) for t in (0.5, 1.0, 2.0, 3.0)[:m]}, y


def _same(a, b):
    assert (a.estimate, a.low, a.high, a.level, a.method, a.bias) == (b.estimate, b.low, b.high, b.level, b.method,
                                                                      b.bias)
    assert torch.equal(a.samples, b.samples)


@pytest.mark.parametrize("metric", ["ece", "aece", "cece", "mce", "nll", "brier", "acc", F.ece])
@pytest.mark.parametrize("method", ["basic", "percentile"])
def test_equal_to_the_per_model_calls(metric, method, monkeypatch):
    monkeypatch.setattr(resampling, "_ROW_BUDGET", 400 * 7)  # chunks of 7 resamples: the draw spans chunks
    probs, y = _models()
    kw = dict(n_resamples=30, seed=3, level=0.9, n_bins=10, method=method)
    cis, diffs = bootstrap_cis(metric, probs, y, reference="t1.0", **kw)
    assert list(cis) == list(probs) and list(diffs) == ["t0.5", "t2.0", "t3.0"]
    for key, p in probs.items():
        _same(cis[key], bootstrap_ci(metric, p, y, **kw))
        if key != "t1.0":
            _same(diffs[key], paired_bootstrap_diff(p, probs["t1.0"], y, metric, **kw))


def test_list_input_callable_metric_and_ignore_index():
    probs, y = _models(1, n=120, m=3)
    y = y.clone()
    y[::7] = -100
    metric = lambda p, t: float(F.brier(p, t))  # noqa: E731 - the per-resample path
    cis, diffs = bootstrap_cis(metric, list(probs.values()), y, n_resamples=12, seed=5, ignore_index=-100,
                               reference=2)
    assert list(cis) == [0, 1, 2] and list(diffs) == [0, 1]
    for i, p in enumerate(probs.values()):
        _same(cis[i], bootstrap_ci(metric, p, y, n_resamples=12, seed=5, ignore_index=-100))
    _same(diffs[0], paired_bootstrap_diff(probs["t0.5"], probs["t2.0"], y, metric, n_resamples=12, seed=5,
                                          ignore_index=-100))


def test_the_shared_draw_is_the_documented_one():
    """Resample r's accuracy, recomputed from the seeded index draw by hand."""
    probs, y = _models(2, n=50, m=2)
    cis, diffs = bootstrap_cis("acc", probs, y, n_resamples=20, seed=11, reference="t0.5")
    idx = torch.randint(0, 50, (20, 50), generator=torch.Generator().manual_seed(11))  # one chunk at N = 50
    for key, p in probs.items():
        correct = (p.argmax(1) == y).double()
        want = torch.stack([correct[row].mean() for row in idx])
        torch.testing.assert_close(cis[key].samples, want, rtol=0, atol=1e-15)
        assert cis[key].estimate == pytest.approx(float(correct.mean()), abs=1e-15)
    torch.testing.assert_close(diffs["t1.0"].samples, cis["t1.0"].samples - cis["t0.5"].samples, rtol=0, atol=0)
    assert diffs == {"t1.0": diffs["t1.0"]}


def test_no_reference_no_diffs():
    probs, y = _models(3, n=60, m=2)
    cis, diffs = bootstrap_cis("ece", probs, y, n_resamples=10)
    assert set(cis) == set(probs) and diffs == {}


def test_bad_arguments_refused():
    probs, y = _models(4, n=30, m=2)
    with pytest.raises(ValueError, match="a dict or a list"):
        bootstrap_cis("ece", probs["t0.5"], y)
    with pytest.raises(ValueError, match="at least one"):
        bootstrap_cis("ece", {}, y)
    with pytest.raises(ValueError, match="reference 'ts' is not a key"):
        bootstrap_cis("ece", probs, y, reference="ts")
    with pytest.raises(ValueError, match="n_resamples"):
        bootstrap_cis("ece", probs, y, n_resamples=0)
    with pytest.raises(ValueError, match="unknown metric"):
        bootstrap_cis("nope", probs, y)


def _draws(n, r, seed):
    return [(idx.clone(), W.clone()) for idx, W in bootstrap.count_draws(n, r, seed)]


def test_shared_draws_hand_out_the_draws_made_without_them(monkeypatch):
    """Inside shared_draws the resamples are those drawn outside (index for index), drawn once per size."""
    monkeypatch.setattr(resampling, "_ROW_BUDGET", 50 * 4)  # chunks of 4 resamples of 50 rows
    fresh = _draws(50, 10, 7)
    calls = []
    real = torch.randint
    monkeypatch.setattr(torch, "randint", lambda *a, **k: calls.append(1) or real(*a, **k))
    with bootstrap.shared_draws():
        first = list(bootstrap.count_draws(50, 10, 7))
        drawn = len(calls)
        again = list(bootstrap.count_draws(50, 10, 7))
        other = list(bootstrap.count_draws(50, 10, 8))  # another seed: drawn, not reused
    assert drawn == 3 and len(calls) == 6  # chunks 4 + 4 + 2, then seed 8's three; none for the repeat
    for got in (first, again):
        assert len(got) == len(fresh)
        for (i, w), (fi, fw) in zip(got, fresh):
            assert i.dtype == torch.int64 and torch.equal(i, fi) and torch.equal(w, fw)
    assert not torch.equal(other[0][1], fresh[0][1])
    assert resampling._SHARED is None  # released at the end of the block


def test_shared_draws_keep_nothing_past_their_budget_and_equal_intervals(monkeypatch):
    probs, y = _models(2, n=300)
    want = bootstrap_ci("ece", probs["t2.0"], y, n_resamples=40, seed=1)
    monkeypatch.setattr(resampling, "_SHARED_BUDGET", 300 * 40 - 1)  # one draw more than the budget holds
    with bootstrap.shared_draws():
        _same(bootstrap_ci("ece", probs["t2.0"], y, n_resamples=40, seed=1), want)
        assert resampling._SHARED == {}
    monkeypatch.setattr(resampling, "_SHARED_BUDGET", 300 * 40)
    with bootstrap.shared_draws():
        for _ in range(2):
            _same(bootstrap_ci("ece", probs["t2.0"], y, n_resamples=40, seed=1), want)
        assert len(resampling._SHARED) == 1


def test_binned_sums_equal_the_one_hot_products_bit_for_bit():
    """The counts and hits per bin (sums of integers) equal ``W @ onehot`` and ``W @ (onehot * correct)``."""
    from calibkit.functional.binning import bin_indices, equal_width_edges

    probs, y = _models(4, n=500)
    for n_bins in (1, 7, 15):
        model = bootstrap._Prepared(probs["t3.0"], y, n_bins)
        for _, W in bootstrap.count_draws(500, 25, 2):
            got = model._binned_sums(W)
            edges = equal_width_edges(n_bins, model.conf_native.dtype)
            onehot = torch.nn.functional.one_hot(bin_indices(model.conf_native, edges), n_bins).double()
            assert torch.equal(got.count, W @ onehot)
            assert torch.equal(got.conf, W @ (onehot * model.conf[:, None]))
            assert torch.equal(got.correct, W @ (onehot * model.correct[:, None]))


def test_shared_draws_reuse_a_models_binned_sums_and_never_a_changed_ones():
    """Inside shared_draws, ECE, O-ECE, U-ECE and MCE of one model and its pairings are those made
    outside bit for bit, from one computation of its binned sums per draw; a tensor changed in place
    is a new model; the sums are released at the end of the block."""
    probs, y = _models(3, n=300)
    a, b = probs["t0.5"].clone(), probs["t2.0"]
    metrics = ("ece", "o_ece", "u_ece", "mce")
    want = {m: bootstrap_ci(m, a, y, n_resamples=40, seed=1) for m in metrics}
    pair = paired_bootstrap_diff(a, b, y, "ece", n_resamples=40, seed=1)
    changed = a.flip(1)
    want_changed = bootstrap_ci("ece", changed, y, n_resamples=40, seed=1)
    with bootstrap.shared_draws():
        for _ in range(2):
            for m in metrics:
                _same(bootstrap_ci(m, a, y, n_resamples=40, seed=1), want[m])
            _same(paired_bootstrap_diff(a, b, y, "ece", n_resamples=40, seed=1), pair)
        assert len(resampling._SUMS) == 2  # a and b, on the one draw kept
        a.copy_(changed)  # in place: the same tensor object, another model
        _same(bootstrap_ci("ece", a, y, n_resamples=40, seed=1), want_changed)
        assert len(resampling._SUMS) == 3
    assert resampling._SUMS == {}


def test_inference_mode_tensors_get_the_same_intervals_inside_shared_draws():
    """Tensors made under torch.inference_mode() have no version counter: their binned sums are not
    cached, and the intervals equal those drawn outside the block."""
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        p = torch.softmax(3 * torch.randn(200, 4, generator=g), 1)
        y = torch.randint(0, 4, (200,), generator=g)
    outside = bootstrap_cis("ece", {"a": p}, y, n_resamples=30)[0]["a"]
    with bootstrap.shared_draws():
        inside = bootstrap_cis("ece", {"a": p}, y, n_resamples=30)[0]["a"]
        assert resampling._SUMS == {}
    assert (inside.estimate, inside.low, inside.high) == (outside.estimate, outside.low, outside.high)
