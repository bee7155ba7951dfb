"""``calibkit.seed_bootstrap``: the two-level (seeds x test samples) paired bootstrap, against
resampling written out loop by loop, its exact identity with the one-level bootstrap when the
seeds do not differ, its widening when they do, and its input checks."""

import numpy as np
import pytest
import torch

from calibkit.seed_bootstrap import MIN_SEEDS, auto_levels, resampled_means, seed_draws, seed_paired_interval


def basic(samples, estimate, level):
    """The basic bootstrap interval [2 e - q_hi, 2 e - q_lo] by numpy's (linear) quantiles."""
    q_lo, q_hi = np.quantile(np.asarray(samples, dtype=np.float64), [(1 - level) / 2, (1 + level) / 2])
    return 2 * estimate - q_hi, 2 * estimate - q_lo


def outer(seed, n_seeds, n_res):
    """The documented outer draw, written out: a child stream of numpy's SeedSequence(seed)."""
    child = np.random.SeedSequence(seed).spawn(1)[0]
    return np.random.default_rng(child).integers(0, n_seeds, size=(n_res, n_seeds))


def per_seed(seed=0, n_seeds=4, n_res=200, offsets=None):
    """(S,) estimates and (S, R) resampled differences: a common test-set part for every seed
    (the same test draw r for all seeds) plus a per-seed offset and a little per-seed noise."""
    gen = torch.Generator().manual_seed(seed)
    common = 0.01 * torch.randn(n_res, generator=gen, dtype=torch.float64)
    offsets = torch.zeros(n_seeds, dtype=torch.float64) if offsets is None else torch.as_tensor(offsets).double()
    own = 0.002 * torch.randn(n_seeds, n_res, generator=gen, dtype=torch.float64)
    samples = -0.03 + offsets[:, None] + common[None, :] + own
    estimates = -0.03 + offsets + 0.001 * torch.randn(n_seeds, generator=gen, dtype=torch.float64)
    return estimates.numpy(), samples


def test_two_level_samples_average_the_drawn_seeds_resample_by_resample():
    est, samples = per_seed(1, n_seeds=3, n_res=50)
    res = seed_paired_interval(est, samples, level=0.9, seed=7, levels=2)
    draws = outer(7, 3, 50)
    want = [np.mean([float(samples[j, r]) for j in draws[r]]) for r in range(50)]
    assert res["samples"].shape == (50,) and res["samples"].dtype == torch.float64
    assert res["samples"].numpy() == pytest.approx(want, abs=1e-15)
    assert res["estimate"] == pytest.approx(float(np.mean(est)), abs=1e-15)
    assert (res["lo"], res["hi"]) == pytest.approx(basic(want, np.mean(est), 0.9), abs=1e-12)
    assert res["bias"] == pytest.approx(np.mean(want) - np.mean(est), abs=1e-15)
    assert res["levels"] == 2 and res["seeds"] == 3
    assert torch.equal(seed_draws(3, 50, 7), torch.from_numpy(draws))


def test_one_level_samples_are_the_seed_means_of_each_test_draw():
    est, samples = per_seed(2, n_seeds=2, n_res=40)
    res = seed_paired_interval(est, samples, level=0.8)
    assert res["levels"] == 1 and res["seeds"] == 2  # two seeds: one level by default
    want = [(float(samples[0, r]) + float(samples[1, r])) / 2 for r in range(40)]
    assert res["samples"].numpy() == pytest.approx(want, abs=1e-15)
    assert (res["lo"], res["hi"]) == pytest.approx(basic(want, np.mean(est), 0.8), abs=1e-12)


def test_hand_case_three_seeds_without_test_noise_is_the_bootstrap_of_a_mean_of_three():
    # No test-set noise: seed s has the difference s/4 in every resample, so a resample is the mean
    # of the three drawn values; one level is 0.25 every time (zero width), two levels spread it.
    samples = torch.tensor([[0.0] * 8, [0.25] * 8, [0.5] * 8], dtype=torch.float64)
    est = [0.0, 0.25, 0.5]
    one = seed_paired_interval(est, samples, levels=1)
    assert one["lo"] == one["hi"] == 0.25 and torch.equal(one["samples"], torch.full((8,), 0.25, dtype=torch.float64))
    two = seed_paired_interval(est, samples, seed=3)
    assert two["levels"] == 2
    draws = outer(3, 3, 8)
    assert two["samples"].tolist() == pytest.approx([d.sum() / 4 / 3 for d in draws], abs=1e-15)
    assert set(np.round(two["samples"].numpy() * 12).astype(int)) <= set(range(7))  # sums of three of 0, 1, 2 quarters


def test_zero_seed_variance_gives_the_one_level_interval_bit_for_bit():
    # Identity: every seed has the same resampled differences (the same pair of runs under every
    # seed), so both levels average S copies of one number with one reduction -> equal samples and
    # equal interval, exactly, whatever the outer draw.
    _, one_seed = per_seed(3, n_seeds=1, n_res=300)
    for s in (3, 4, 5, 7):
        samples = one_seed.expand(s, -1).clone()
        est = np.full(s, -0.031)
        one = seed_paired_interval(est, samples, level=0.95, seed=11, levels=1)
        two = seed_paired_interval(est, samples, level=0.95, seed=11, levels=2)
        assert torch.equal(one["samples"], two["samples"])
        assert (one["lo"], one["hi"], one["estimate"]) == (two["lo"], two["hi"], two["estimate"])
        assert one["levels"] == 1 and two["levels"] == 2


def test_seed_offsets_widen_the_interval_by_the_mean_of_the_drawn_offsets():
    # seeds differ by offsets summing to 0: the one-level samples do not see them at all (the
    # seed mean of every test draw is unchanged), the two-level ones move by the mean of the
    # drawn offsets, resample by resample, and the interval widens.
    offsets = np.array([-0.02, 0.0, 0.005, 0.015])
    est0, base = per_seed(4, n_seeds=4, n_res=400)
    est, shifted = per_seed(4, n_seeds=4, n_res=400, offsets=offsets)
    flat = seed_paired_interval(est0, base, seed=5, levels=2)
    one = seed_paired_interval(est, shifted, seed=5, levels=1)
    two = seed_paired_interval(est, shifted, seed=5, levels=2)
    assert one["samples"].numpy() == pytest.approx(resampled_means(base).numpy(), abs=1e-15)
    draws = outer(5, 4, 400)
    assert (two["samples"] - flat["samples"]).numpy() == pytest.approx(offsets[draws].mean(1), abs=1e-15)
    assert two["hi"] - two["lo"] > one["hi"] - one["lo"]
    # the spread of the drawn offsets' mean is the bootstrap variance of a mean of 4: Var(offsets) / 4
    # (ddof 0), and it adds to the test-set part (the outer draw is independent of the test draw)
    assert np.var(offsets[draws].mean(1)) == pytest.approx(np.var(offsets) / 4, rel=0.2)
    assert two["samples"].var().item() == pytest.approx(flat["samples"].var().item() + np.var(offsets) / 4, rel=0.2)


def test_equal_seeds_give_equal_intervals_and_other_seeds_other_draws():
    est, samples = per_seed(5, n_seeds=5, n_res=100, offsets=[0.01, -0.01, 0.0, 0.02, -0.02])
    a = seed_paired_interval(est, samples, seed=2)
    b = seed_paired_interval(est, samples, seed=2)
    c = seed_paired_interval(est, samples, seed=3)
    assert torch.equal(a["samples"], b["samples"]) and (a["lo"], a["hi"]) == (b["lo"], b["hi"])
    assert not torch.equal(a["samples"], c["samples"])
    # the outer stream is a child of the seed, not the stream default_rng(seed) itself, which the
    # image-level test draw of calibkit.grouped_bootstrap uses
    assert not np.array_equal(seed_draws(5, 100, 2).numpy(), np.random.default_rng(2).integers(0, 5, size=(100, 5)))


def test_levels_by_seed_count_and_same_models():
    assert MIN_SEEDS == 3
    assert [auto_levels(s) for s in (1, 2, 3, 4, 10)] == [1, 1, 2, 2, 2]
    assert auto_levels(5, same_models=True) == 1
    for s, want in ((1, 1), (2, 1), (3, 2), (6, 2)):
        est, samples = per_seed(6, n_seeds=s, n_res=20)
        assert seed_paired_interval(est, samples)["levels"] == want


def test_bounds_clip_the_interval():
    est, samples = per_seed(7, n_seeds=3, n_res=60)
    free = seed_paired_interval(est, samples)
    clipped = seed_paired_interval(est, samples, bounds=(free["lo"] + 1e-3, 1.0))
    assert clipped["lo"] == free["lo"] + 1e-3 and clipped["hi"] == free["hi"]


def test_input_checks():
    est, samples = per_seed(8, n_seeds=3, n_res=10)
    with pytest.raises(ValueError, match="levels must be 1 or 2"):
        seed_paired_interval(est, samples, levels=3)
    with pytest.raises(ValueError, match=r"need estimates \(S,\) and samples \(S, R\)"):
        seed_paired_interval(est[:2], samples)
    with pytest.raises(ValueError, match=r"need estimates"):
        seed_paired_interval(est, samples[0])
    with pytest.raises(ValueError, match="level must be in"):
        seed_paired_interval(est, samples, level=1.0)
    for bad in (-1, 1.5, True, "0"):
        with pytest.raises(ValueError, match="seed must be an integer >= 0"):
            seed_draws(3, 10, bad)
    with pytest.raises(ValueError, match=r"draws must be \(R, S\)"):
        resampled_means(samples, torch.zeros(10, 2, dtype=torch.long))
