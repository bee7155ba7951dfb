"""Split conformal prediction sets (calibkit.conformal): the quantile rule on hand-computed cases,
the sets against a per-row loop of the scores' definitions, the coverage guarantee over many random
calibration/test splits (vectorised), the metrics, and the input checks."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from calibkit.calibrators._base import NotFittedError
from calibkit.conformal import (
    RAPS_LAMBDAS,
    RAPS_TUNE_FRACTION,
    SplitConformal,
    class_conditional_coverage,
    class_scores,
    conformal_quantile,
    coverage,
    mean_set_size,
    min_calibration_rows,
    size_stratified_coverage,
)
from calibkit.errors import UserError


def _data(n, k=10, scale=2.0, seed=0):
    """Exchangeable rows: probabilities softmax(scale * z), labels drawn from them."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(scale * torch.randn(n, k, generator=g, dtype=torch.float64), 1)
    return p, torch.multinomial(p, 1, generator=g).squeeze(1)


def _dyadic(n, k, units=64, seed=0):
    """Rows of multiples of 1 / units summing to exactly 1 (exact 1 - p, many ties)."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.bincount(torch.multinomial(torch.rand(k, generator=g) + 0.05, units, replacement=True,
                                             generator=g), minlength=k) for _ in range(n)]
    p = torch.stack(rows).double() / units
    return p, torch.multinomial(p, 1, generator=g).squeeze(1)


def _m(n, alpha_tenths):
    """ceil((n + 1)(1 - alpha)) in integers, alpha = alpha_tenths / 10 (or /100 when a float is given)."""
    num, den = (10 - alpha_tenths, 10) if isinstance(alpha_tenths, int) else (100 - round(alpha_tenths * 100), 100)
    return -(-(n + 1) * num // den)


# --- the quantile rule ------------------------------------------------------------------------

@pytest.mark.parametrize("alpha, expected", [(0.1, 9), (0.2, 8), (0.15, 9), (0.3, 7), (0.5, 5)])
def test_quantile_n9(alpha, expected):
    # n = 9 scores 1/16 .. 9/16: m = ceil(10 (1 - alpha)); alpha = 0.1 -> m = 9 exactly (no rounding to 10)
    scores = torch.arange(1, 10, dtype=torch.float64) / 16
    assert conformal_quantile(scores[torch.randperm(9)], alpha) == expected / 16


@pytest.mark.parametrize("alpha, least", [(0.1, 9), (0.05, 19), (0.2, 4), (0.15, 6), (0.3, 3), (0.5, 1), (0.01, 99),
                                          (0.25, 3), (0.9, 1)])
def test_minimum_calibration_rows_at_the_boundary(alpha, least):
    # least = the smallest n with ceil((n + 1)(1 - alpha)) <= n, found here by counting in integers (alpha in
    # hundredths): below it the quantile's rank passes n (an infinite threshold)
    hundredths = round(alpha * 100)
    smallest = next(n for n in range(1, 1000) if -(-(n + 1) * (100 - hundredths) // 100) <= n)
    assert smallest == least == min_calibration_rows(alpha)
    scores = torch.arange(1, least + 1, dtype=torch.float64)
    assert math.isfinite(conformal_quantile(scores, alpha))  # the minimum is accepted, with a finite threshold
    if least > 1:
        with pytest.raises(UserError, match=f"^{least - 1} calibration score\\(s\\) for alpha={alpha:g}: a conformal "
                           f"quantile needs at least {least} "):
            conformal_quantile(scores[:-1], alpha)
        probs = torch.stack([1 - scores[:-1] / 1000, scores[:-1] / 1000], 1)
        with pytest.raises(UserError, match=f"needs at least {least} "):  # the fit refuses the same
            SplitConformal("lac", alpha=alpha).fit(probs, torch.zeros(least - 1, dtype=torch.long))


def test_quantile_exact_products():
    # (n + 1)(1 - alpha) an integer that float arithmetic misses: m must be that integer
    for n, alpha in [(19, 0.05), (99, 0.1), (9, 0.3), (49, 0.02), (999, 0.1)]:
        m = round((n + 1) * (1 - alpha))
        assert conformal_quantile(torch.arange(n, dtype=torch.float64), alpha) == m - 1, (n, alpha)


def test_lac_hand_case_and_too_few_rows():
    # K = 2, p_y = 1 - j/16 for j = 1..9: the LAC scores are j/16; alpha = 0.1 -> qhat = 9/16
    s = torch.arange(1, 10, dtype=torch.float64) / 16
    probs = torch.stack([1 - s, s], 1)
    y = torch.zeros(9, dtype=torch.long)
    cp = SplitConformal("lac", alpha=0.1).fit(probs, y)
    assert cp.qhat_ == 9 / 16 and cp.n_calib_ == 9 and cp.n_classes_ == 2
    test = torch.tensor([[0.5, 0.5], [7 / 16, 9 / 16], [6 / 16, 10 / 16], [1.0, 0.0]], dtype=torch.float64)
    assert cp.predict_set(test).tolist() == [[True, True], [True, True], [False, True], [True, False]]
    for score in ("lac", "aps"):  # alpha = 0.05: m = 10 > 9, an infinite threshold: refused (19 rows needed)
        with pytest.raises(UserError, match="needs at least 19 "):
            SplitConformal(score, alpha=0.05, randomized=False).fit(probs, y)


def test_lac_set_is_probability_threshold():
    p, y = _dyadic(300, 6)
    cp = SplitConformal("lac", alpha=0.2).fit(p[:150], y[:150])
    sets = cp.predict_set(p[150:])
    assert torch.equal(sets, p[150:] >= 1 - cp.qhat_)
    assert cp.qhat_ == float(torch.sort(1 - p[:150].gather(1, y[:150, None]).squeeze(1)).values[_m(150, 2) - 1])
    # random (non-dyadic) rows: the same, away from rounding at the threshold
    p, y = _data(400, 5)
    cp = SplitConformal("lac", alpha=0.1).fit(p[:200], y[:200])
    t = 1 - cp.qhat_
    far = ((p[200:] - t).abs() > 1e-12)
    assert torch.equal(cp.predict_set(p[200:])[far], (p[200:] >= t)[far])


# --- APS / RAPS against a per-row loop ----------------------------------------------------------

def _loop_scores(row, u, k_reg=0, lam=0.0, raps=False):
    """Scores of every class of one row by the definitions: rank by probability descending (lower
    index first on ties), add the probabilities ranked above, u times the class's own, and for
    RAPS lam * max(0, rank - k_reg) with the 1-based rank."""
    order = sorted(range(len(row)), key=lambda j: (-row[j], j))
    out = [0.0] * len(row)
    above = 0.0
    for r, j in enumerate(order, start=1):
        out[j] = above + u * row[j] + (lam * max(0, r - k_reg) if raps else 0.0)
        above += row[j]
    return out


def _loop_fit_predict(cal, y, test, alpha_tenths, u_cal, u_test, **kw):
    scores = sorted(_loop_scores(cal[i].tolist(), u_cal[i], **kw)[int(y[i])] for i in range(len(y)))
    m = _m(len(scores), alpha_tenths)
    q = math.inf if m > len(scores) else scores[m - 1]
    sets = [[s <= q for s in _loop_scores(test[i].tolist(), u_test[i], **kw)] for i in range(len(test))]
    return q, torch.tensor(sets)


@pytest.mark.parametrize("score, kw", [("aps", {}), ("raps", {"k_reg": 2, "lam": 0.05}),
                                       ("raps", {"k_reg": 0, "lam": 0.3})])
@pytest.mark.parametrize("randomized", [False, True])
@pytest.mark.parametrize("ties", [False, True])
def test_sets_equal_loop(score, kw, randomized, ties):
    p, y = _dyadic(160, 5, units=16, seed=3) if ties else _data(160, 6, seed=3)
    cal, yc, test = p[:100], y[:100], p[100:]
    cp = SplitConformal(score, alpha=0.1, randomized=randomized, seed=7, **kw).fit(cal, yc)
    u_cal = np.random.default_rng([7, 0]).random(100) if randomized else np.ones(100)
    u_test = np.random.default_rng([7, 1]).random(60) if randomized else np.ones(60)
    q, sets = _loop_fit_predict(cal, yc, test, 1, u_cal, u_test, raps=score == "raps", **kw)
    assert cp.qhat_ == q
    assert torch.equal(cp.predict_set(test), sets)  # default u: default_rng([seed, 1]), one per row
    if randomized:  # an explicit u
        u = np.random.default_rng(11).random(60)
        _, sets_u = _loop_fit_predict(cal, yc, test, 1, u_cal, u, raps=score == "raps", **kw)
        assert torch.equal(cp.predict_set(test, u=torch.from_numpy(u)), sets_u)
    # the APS/RAPS sets are the top of the ranking: never a class missing above an included one
    ranked = cp.predict_set(test).gather(1, torch.sort(test, dim=1, descending=True, stable=True).indices)
    assert bool((ranked[:, 1:] <= ranked[:, :-1]).all())


def test_class_scores_tie_rule():
    p = torch.tensor([[0.25, 0.375, 0.375, 0.0]], dtype=torch.float64)
    # ranking 1, 2, 0, 3 (class 1 before class 2 on the tie)
    assert class_scores(p, "aps").tolist() == [[1.0, 0.375, 0.75, 1.0]]
    assert class_scores(p, "aps", u=torch.tensor([0.5])).tolist() == [[0.875, 0.1875, 0.5625, 1.0]]
    assert class_scores(p, "raps", k_reg=1, lam=0.5).tolist() == [[2.0, 0.375, 1.25, 2.5]]


def test_raps_tuning_rule():
    p, y = _data(500, 8, scale=1.5, seed=5)
    cp = SplitConformal("raps", alpha=0.1, randomized=True, seed=3).fit(p, y)
    n_t = math.floor(RAPS_TUNE_FRACTION * 500)
    assert cp.n_tune_ == n_t and cp.n_calib_ == 500 - n_t
    perm = np.random.default_rng([3, 2]).permutation(500)
    tune, rest = perm[:n_t], perm[n_t:]
    u = np.random.default_rng([3, 0]).random(500)
    ranks = sorted(1 + sorted(range(8), key=lambda j: (-p[i, j].item(), j)).index(int(y[i])) for i in tune)
    k_reg = ranks[_m(n_t, 1) - 1]
    assert cp.k_reg_ == k_reg
    sizes = []
    for lam in RAPS_LAMBDAS:
        q, sets = _loop_fit_predict(p[tune], y[tune], p[tune], 1, u[tune], u[tune], k_reg=k_reg, lam=lam, raps=True)
        sizes.append(float(sets.sum(1).double().mean()))
    assert cp.lam_ == RAPS_LAMBDAS[int(np.argmin(sizes))]
    q, _ = _loop_fit_predict(p[rest], y[rest], p[:1], 1, u[rest], [1.0], k_reg=k_reg, lam=cp.lam_, raps=True)
    assert cp.qhat_ == q
    # given k_reg and lam: no tuning part
    cp = SplitConformal("raps", k_reg=2, lam=0.01).fit(p, y)
    assert cp.n_tune_ == 0 and cp.n_calib_ == 500 and (cp.k_reg_, cp.lam_) == (2, 0.01)


# --- coverage over many random splits -------------------------------------------------------

N_POOL, N_CAL, N_SPLITS, ALPHA = 1000, 99, 500, 0.1
MEASURED = {}


def _split_coverage(true_scores, all_scores, seed=0):
    """Per-split coverage and mean set size over N_SPLITS random (N_CAL, rest) splits of the pool,
    all at once: qhat = the m-th smallest calibration score, m = ceil((N_CAL + 1)(1 - ALPHA))."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.argsort(torch.rand(N_SPLITS, N_POOL, generator=g), 1)
    cal, test = perm[:, :N_CAL], perm[:, N_CAL:]
    m = _m(N_CAL, 1)
    qhat = torch.sort(true_scores[cal], 1).values[:, m - 1]  # (S,)
    cov = (true_scores[test] <= qhat[:, None]).double().mean(1)
    size = (all_scores[test] <= qhat[:, None, None]).sum(2).double().mean(1)
    return cov, size, qhat, perm


@pytest.mark.parametrize("score, randomized, kw", [("lac", False, {}), ("aps", False, {}), ("aps", True, {}),
                                                   ("raps", True, {"k_reg": 1, "lam": 0.05}),
                                                   ("raps", False, {"k_reg": 1, "lam": 0.05})])
def test_coverage_many_splits(score, randomized, kw):
    p, y = _data(N_POOL, 10, scale=2.0, seed=1)
    u = torch.from_numpy(np.random.default_rng(5).random(N_POOL)) if randomized else None
    s_all = class_scores(p, score, u, **kw)
    s = s_all.gather(1, y[:, None]).squeeze(1)
    # no ties, except for the non-randomised APS/RAPS score at the pool's maximum (rows whose label is
    # ranked last score sum(p) = 1 up to rounding, + the RAPS penalty); fewer such rows than
    # N_CAL - m + 1 never make qhat that value, so the expected coverage is still m / (N_CAL + 1)
    # and both bounds hold
    top = s >= s.max() - 1e-9
    assert len(torch.unique(s[~top])) == N_POOL - int(top.sum()) and int(top.sum()) < N_CAL - _m(N_CAL, 1) + 1
    cov, size, qhat, perm = _split_coverage(s, s_all)
    mean, se = float(cov.mean()), float(cov.std() / math.sqrt(N_SPLITS))
    lo, hi = 1 - ALPHA, 1 - ALPHA + 1 / (N_CAL + 1)
    MEASURED[(score, randomized)] = (mean, se, float(size.mean()))
    assert lo - 4 * se <= mean <= hi + 4 * se, (mean, se)
    # the vectorised qhat is the fitted one (non-randomised: the same scores)
    if not randomized:
        cal, test = perm[0, :N_CAL], perm[0, N_CAL:]
        cp = SplitConformal(score, alpha=ALPHA, randomized=False, **kw).fit(p[cal], y[cal])
        assert cp.qhat_ == float(qhat[0])
        assert float(coverage(cp.predict_set(p[test]), y[test])) == pytest.approx(float(cov[0]), abs=1e-12)
        assert float(mean_set_size(cp.predict_set(p[test]))) == pytest.approx(float(size[0]), abs=1e-12)


def test_coverage_tuned_raps():
    # k_reg and lam chosen on a part of each calibration split, qhat on the rest (n_calib_ rows):
    # the guarantee holds with n = n_calib_; 100 splits, one fit each
    p, y = _data(N_POOL, 10, scale=2.0, seed=6)
    g = torch.Generator().manual_seed(8)
    covs, sizes = [], []
    for _ in range(100):
        perm = torch.randperm(N_POOL, generator=g)
        cal, test = perm[:199], perm[199:]
        cp = SplitConformal("raps", alpha=ALPHA).fit(p[cal], y[cal])
        sets = cp.predict_set(p[test])
        covs.append(float(coverage(sets, y[test])))
        sizes.append(float(mean_set_size(sets)))
    cov = torch.tensor(covs, dtype=torch.float64)
    mean, se = float(cov.mean()), float(cov.std() / math.sqrt(len(covs)))
    MEASURED[("raps tuned", True)] = (mean, se, float(np.mean(sizes)))
    assert cp.n_calib_ == 160 and 1 - ALPHA - 4 * se <= mean <= 1 - ALPHA + 1 / 161 + 4 * se, (mean, se)


def test_coverage_lower_bound_under_ties():
    # quantised probabilities: many tied LAC scores; only 1 - alpha is guaranteed (the sets include
    # every tie at qhat, so coverage can exceed 1 - alpha + 1/(n + 1))
    p, y = _dyadic(N_POOL, 4, units=8, seed=2)
    s_all = class_scores(p, "lac")
    s = s_all.gather(1, y[:, None]).squeeze(1)
    assert len(torch.unique(s)) < 10
    cov, _, _, _ = _split_coverage(s, s_all, seed=4)
    se = float(cov.std() / math.sqrt(N_SPLITS))
    assert float(cov.mean()) >= 1 - ALPHA - 4 * se


# --- metrics ---------------------------------------------------------------------------------

def test_metrics_hand_case():
    sets = torch.tensor([[True, False, False], [True, True, False], [False, False, False],
                         [True, True, True], [False, True, True]])
    y = torch.tensor([0, 2, 1, 2, 1])
    assert float(coverage(sets, y)) == 3 / 5
    assert float(mean_set_size(sets)) == (1 + 2 + 0 + 3 + 2) / 5
    r = size_stratified_coverage(sets, y, alpha=0.1)
    assert r["bins"] == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert r["count"].tolist() == [1, 1, 2, 1]
    assert r["coverage"].tolist() == [0.0, 1.0, 0.5, 1.0]
    assert float(r["sscv"]) == pytest.approx(0.9)
    r = size_stratified_coverage(sets, y, alpha=0.1, bins=[(0, 1), (2, 3), (4, 10)])
    assert r["count"].tolist() == [2, 3, 0] and r["coverage"][:2].tolist() == [0.5, pytest.approx(2 / 3)]
    assert math.isnan(float(r["coverage"][2])) and float(r["sscv"]) == pytest.approx(0.4)
    cc = class_conditional_coverage(sets, y, 3)
    assert cc[0] == 1.0 and cc[1] == 0.5 and cc[2] == 0.5
    cc = class_conditional_coverage(sets[:3], y[:3], 3)
    assert cc.tolist() == [1.0, 0.0, 0.0]
    assert cc.dtype == torch.float64
    assert math.isnan(float(class_conditional_coverage(sets[:1], y[:1], 3)[1]))


# --- input checks ----------------------------------------------------------------------------

def _fitted():
    p, y = _data(50, 4)
    return SplitConformal("aps").fit(p, y), p, y


@pytest.mark.parametrize("args, msg", [
    (lambda p, y: (p[:, 0], y), r"shape \(N, K\)"),
    (lambda p, y: (p, y[:-1]), "49 entries but the predictions have 50 rows"),
    (lambda p, y: (torch.where(torch.arange(4) == 0, float("nan"), p), y), "NaN"),
    (lambda p, y: (p, torch.where(torch.arange(50) == 3, 4, y)), r"labels out of range: found 4"),
    (lambda p, y: (p, torch.where(torch.arange(50) == 3, -1, y)), r"labels out of range: found -1"),
    (lambda p, y: (torch.log(p), y), "outside \\[0, 1\\]"),
    (lambda p, y: (p, y.double()), "integer class indices"),
])
def test_fit_input_errors(args, msg):
    p, y = _data(50, 4)
    with pytest.raises(ValueError, match=msg):
        SplitConformal("lac").fit(*args(p, y))


@pytest.mark.parametrize("kw, msg", [
    ({"alpha": 0.0}, r"alpha must be a number in \(0, 1\)"), ({"alpha": 1.0}, "alpha"), ({"alpha": 1.5}, "alpha"),
    ({"alpha": -0.1}, "alpha"), ({"alpha": True}, "alpha"), ({"alpha": "0.1"}, "alpha"),
    ({"score": "thr"}, "score must be one of"), ({"randomized": 1}, "randomized"), ({"seed": -1}, "seed"),
    ({"score": "aps", "lam": 0.1}, "apply to score='raps' only"), ({"score": "raps", "k_reg": -1}, "k_reg"),
    ({"score": "raps", "lam": float("nan")}, "lam"), ({"score": "raps", "k_reg": 1.5}, "k_reg"),
])
def test_param_errors(kw, msg):
    p, y = _data(50, 4)
    with pytest.raises(ValueError, match=msg):
        SplitConformal(**kw).fit(p, y)


def test_predict_errors():
    p, y = _data(50, 4)
    with pytest.raises(NotFittedError, match="not fitted yet"):
        SplitConformal().predict_set(p)
    cp, p, y = _fitted()
    with pytest.raises(ValueError, match="K = 3 classes but this SplitConformal was fitted on K = 4"):
        cp.predict_set(torch.softmax(torch.randn(5, 3), 1))
    with pytest.raises(ValueError, match=r"u must have shape \(50,\)"):
        cp.predict_set(p, u=torch.rand(49))
    with pytest.raises(ValueError, match=r"u must hold numbers in \[0, 1\]"):
        cp.predict_set(p, u=torch.full((50,), 1.5))
    with pytest.raises(ValueError, match="randomised APS/RAPS scores only"):
        SplitConformal("lac").fit(p, y).predict_set(p, u=torch.rand(50))
    with pytest.raises(ValueError, match="at least 2 classes"):
        cp.fit(torch.ones(5, 1, dtype=torch.float64), torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="needs >= 2 calibration rows"):
        SplitConformal("raps").fit(p[:1], y[:1])


def test_metric_errors():
    sets = torch.ones(4, 3, dtype=torch.bool)
    y = torch.tensor([0, 1, 2, 0])
    with pytest.raises(ValueError, match="boolean mask"):
        coverage(sets.int(), y)
    with pytest.raises(ValueError, match="labels out of range"):
        coverage(sets, torch.tensor([0, 1, 3, 0]))
    with pytest.raises(ValueError, match="3 entries but the predictions have 4 rows"):
        coverage(sets, y[:3])
    with pytest.raises(ValueError, match="alpha"):
        size_stratified_coverage(sets, y, alpha=1.0)
    with pytest.raises(ValueError, match=r"set sizes \[3\] fall in no bin"):
        size_stratified_coverage(sets, y, alpha=0.1, bins=[(0, 2)])
    with pytest.raises(ValueError, match="disjoint"):
        size_stratified_coverage(sets, y, alpha=0.1, bins=[(0, 2), (2, 3)])
    with pytest.raises(ValueError, match="n_classes must be the sets' number of columns K = 3"):
        class_conditional_coverage(sets, y, 4)


def test_print_measured(capsys):
    """Not a check: prints the coverage and set sizes of test_coverage_many_splits (run with -s)."""
    with capsys.disabled():
        for (score, rnd), (mean, se, size) in sorted(MEASURED.items()):
            print(f"\n{score:4s} randomized={rnd!s:5s} coverage {mean:.4f} +- {se:.4f}  mean size {size:.3f}")


def _confident_probs(n, k, seed):
    """Rows whose top entry is exactly 1.0 in float64 (logit gaps of 50), the true class on top in
    80% of them: non-randomised APS gives those rows the score 1.0 exactly."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, k, (n,), generator=g)
    z = torch.randn(n, k, generator=g, dtype=torch.float64)
    right = torch.rand(n, generator=g) < 0.8
    z[torch.arange(n), torch.where(right, y, (y + 1) % k)] += 50.0
    return torch.softmax(z, 1), y


def test_qhat_at_the_score_maximum_warns_and_randomised_aps_does_not():
    from calibkit.conformal import QhatAtMaximumWarning

    p, y = _confident_probs(300, 5, 0)
    scores = class_scores(p, "aps", None).gather(1, y[:, None]).squeeze(1)
    assert int((scores == 1.0).sum()) > 200  # the tie the warning is about
    with pytest.warns(QhatAtMaximumWarning, match=r"qhat = 1\.0 .*randomized=True"):
        cp = SplitConformal("aps", alpha=0.1, randomized=False).fit(p, y)
    assert cp.qhat_ == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error", QhatAtMaximumWarning)
        SplitConformal("aps", alpha=0.1, randomized=True).fit(p, y)  # u p_1 < 1 almost surely
        SplitConformal("lac", alpha=0.1).fit(p, y)  # LAC's set at qhat = 1 is every class: no rounding issue
        mixed = torch.softmax(torch.randn(300, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64), 1)
        SplitConformal("aps", alpha=0.1, randomized=False).fit(mixed, mixed.argmax(1))  # qhat < 1: no warning
