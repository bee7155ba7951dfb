"""Temperature scaling at its edges: the NLL solver's start, bounds and iteration counts on data
whose answer is known, the ECE grid's ends, the defaults of ``fit``, every logits layout of
``transform``, the exact error messages and ``repr``."""

import math
import re
import warnings

import numpy as np
import pytest
import torch

from calibkit.calibrators import NotFittedError, TemperatureScaling, evaluate_before_after_ts
from calibkit.calibrators import temperature as calibrators  # the module of the solver the tests spy on
from calibkit.metrics import evaluate


def _calibrated_at_t1():
    # p = softmax(ln 3, 0) = (3/4, 1/4) and 3 of 4 labels are class 0: calibrated, so the NLL's
    # stationary point is T = 1 exactly (G(1) = ln 3 (3/4 - 3/4) = 0 up to rounding)
    return torch.tensor([[math.log(3), 0.0]] * 4, dtype=torch.float64), torch.tensor([0, 0, 0, 1])


def _synthetic(seed, n, k, t_true):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    return z * t_true, y  # logits t_true times too sharp: the fitted T is near t_true


@pytest.mark.parametrize("t_min", [0.01, 0.5])
def test_newton_starts_at_t1_and_a_calibrated_model_takes_one_step(t_min):
    # T = 1 (no scaling) is the first point tried whenever it lies inside (t_min, t_max)
    z, y = _calibrated_at_t1()
    ts = TemperatureScaling(t_min=t_min).fit(z, y)
    assert ts.temperature_ == pytest.approx(1.0, abs=1e-12)
    assert ts.n_iter_ == 1


def test_start_outside_t1_is_inside_the_bracket():
    # T = 1 outside (t_min, t_max): the solver starts inside the bracket and still finds the root
    z, y = _synthetic(1, 3000, 10, 4.0)
    ts = TemperatureScaling(t_min=2.0, t_max=50.0).fit(z, y)
    ref = TemperatureScaling().fit(z, y)
    assert ts.temperature_ == pytest.approx(ref.temperature_, rel=1e-9)
    assert 3.0 < ts.temperature_ < 5.0


def test_the_whole_default_range_is_searched():
    # roots near both ends of the default range (0.01, 100) are found, not reported as bounds
    for t_true in (70.0, 0.015):
        z, y = _synthetic(2, 3000, 10, t_true)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "returning the bound" warning
            t = TemperatureScaling().fit(z, y).temperature_
        assert t == pytest.approx(t_true, rel=0.15)


def test_a_root_below_t_min_returns_t_min_with_its_warning():
    z, y = _synthetic(3, 3000, 10, 0.007)  # the NLL's minimum lies at T ~ 0.007 < t_min = 0.01
    msg = "temperature scaling: NLL still decreases at T = 0.01 (separable data?); returning the bound"
    with pytest.warns(UserWarning, match="^" + re.escape(msg) + "$"):
        ts = TemperatureScaling().fit(z, y)
    assert ts.temperature_ == 0.01 and ts.n_iter_ == 2  # G evaluated at both bounds


def test_constant_logits_return_t_max_with_its_warning():
    # equal logits in every row: softmax is uniform whatever T, the NLL is flat (G = 0 everywhere)
    z, y = torch.zeros(5, 3, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1])
    msg = "temperature scaling: NLL still decreases at T = 100.0; returning the bound"
    with pytest.warns(UserWarning, match="^" + re.escape(msg) + "$"):
        ts = TemperatureScaling().fit(z, y)
    assert ts.temperature_ == 100.0 and ts.n_iter_ == 1  # G evaluated at t_max only


def test_ece_grid_ends_at_0_1_and_10():
    # far too flat logits want T < 0.1, far too sharp ones T > 10: the grid's ends are returned
    for t_true, end in ((0.03, 0.1), (30.0, 10.0)):
        z, y = _synthetic(4, 4000, 10, t_true)
        ts = TemperatureScaling(objective="ece").fit(z, y)
        assert ts.temperature_ == end and ts.n_iter_ == 100


def test_fit_defaults_seed_0_and_one_million_pixels():
    g = torch.Generator().manual_seed(5)
    z = torch.randn(2, 3, 6, 7, generator=g, dtype=torch.float64)
    labels = torch.multinomial(torch.softmax(z, 1).movedim(1, -1).reshape(-1, 3), 1, generator=g).view(2, 6, 7)
    logits = 3 * z
    t = [TemperatureScaling().fit(logits, labels, max_pixels=20, **kw).temperature_
         for kw in ({}, {"seed": 0}, {"seed": 1})]
    assert t[0] == t[1] != t[2]
    # the default cap, fast: the solver is replaced by a spy that records how many rows reach it
    rows = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(calibrators, "_fit_nll", lambda z, *a, **kw: rows.append(z.shape[0]) or (1.0, 1))
        logits, labels = torch.zeros(1, 2, 1_000_001), torch.zeros(1, 1_000_001, dtype=torch.long)
        TemperatureScaling().fit(logits, labels)
        TemperatureScaling().fit(logits, labels, max_pixels=None)
    assert rows == [1_000_000, 1_000_001]


@pytest.mark.slow  # three fits on a million pixels: left out of the mutation run
def test_fit_default_keeps_exactly_one_million_pixels():
    g = torch.Generator().manual_seed(5)
    # 1_001_000 pixels: the default keeps exactly 1_000_000 of them
    zb = torch.randn(1, 1001, 1000, generator=g, dtype=torch.float32)
    big_y = torch.bernoulli(torch.sigmoid(zb), generator=g).long()
    big = torch.stack([torch.zeros_like(zb), 2 * zb], 1)  # two-class pixels, T near 2
    default = TemperatureScaling().fit(big, big_y).temperature_
    assert default == TemperatureScaling().fit(big, big_y, max_pixels=1_000_000).temperature_
    assert default != TemperatureScaling().fit(big, big_y, max_pixels=None).temperature_


def test_transform_every_dense_layout():
    ts = TemperatureScaling()
    ts.temperature_, ts.binary_ = 4.0, False
    for shape in ((3, 2, 5), (3, 4, 5), (2, 2, 3, 3), (2, 3, 2, 2, 2)):  # (N, K, *spatial), K >= 2
        ts.n_classes_ = shape[1]  # as fitted on logits of this K
        x = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
        torch.testing.assert_close(ts.transform(x), x / 4)
        torch.testing.assert_close(ts.predict_proba(x), torch.softmax(x / 4, 1))


def test_transform_errors_name_the_problem():
    ts = TemperatureScaling()
    ts.temperature_, ts.n_classes_, ts.binary_ = 2.0, 3, False
    cases = [
        (torch.zeros(2, 3, 4, dtype=torch.long), r"^logits must be a floating-point tensor, got dtype torch.int64$"),
        (torch.zeros(0, 3, 4, 4), r"^dense logits need N >= 1 and K >= 2 along dim 1, got shape \(0, 3, 4, 4\)$"),
        (torch.zeros(2, 1, 4), r"^dense logits need N >= 1 and K >= 2 along dim 1, got shape \(2, 1, 4\)$"),
        (torch.zeros(2, 3, 4).index_put_((torch.tensor(1), torch.tensor(2), torch.tensor(3)), torch.tensor(np.inf)),
         r"^logits contains NaN or infinite value\(s\)$"),
        (torch.zeros(2, 3, 4).index_put_((torch.tensor(0), torch.tensor(0), torch.tensor(0)), torch.tensor(-np.inf)),
         r"^logits contains NaN or infinite value\(s\)$"),
        (np.array([["a", "b"]]), r"^logits must be numeric"),
    ]
    for x, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            ts.transform(x)


def test_binary_transform_checks_and_keeps_the_logits():
    ts = TemperatureScaling()
    ts.temperature_, ts.n_classes_, ts.binary_ = 2.0, 2, True
    z = torch.tensor([-3.0, 0.5, 4.0])
    torch.testing.assert_close(ts.transform(z), z / 2)
    torch.testing.assert_close(ts.predict_proba(z), torch.sigmoid(z / 2))
    with pytest.raises(ValueError, match="NaN"):
        ts.transform(torch.tensor([0.0, float("nan")]))


def test_messages_and_repr():
    with pytest.raises(ValueError, match=r"^unknown objective 'brier'; expected one of nll, ece$"):
        TemperatureScaling(objective="brier").fit(torch.zeros(2, 2), torch.tensor([0, 1]))
    msg = "this TemperatureScaling is not fitted yet: call fit(val_logits, val_labels) first"
    with pytest.raises(NotFittedError, match="^" + re.escape(msg) + "$"):
        TemperatureScaling().transform(torch.zeros(2, 2))
    assert repr(TemperatureScaling()) == "TemperatureScaling(objective='nll', n_bins=15)"
    ts = TemperatureScaling(objective="ece", n_bins=10)
    ts.temperature_ = 2.345678
    assert repr(ts) == "TemperatureScaling(objective='ece', n_bins=10, temperature_=2.346)"


def test_evaluate_before_after_ts_passes_objective_and_bins():
    z, y = _synthetic(6, 3000, 10, 2.5)
    val, test = (z[:1500], y[:1500]), (z[1500:], y[1500:])
    out = evaluate_before_after_ts(*val, *test, n_bins=5, objective="ece")
    ts = TemperatureScaling(objective="ece", n_bins=5).fit(*val)
    assert out["temperature"] == ts.temperature_
    assert ts.temperature_ != TemperatureScaling(objective="ece").fit(*val).temperature_  # n_bins matters here
    assert out["before"] == evaluate(torch.softmax(test[0], 1), test[1], n_bins=5)
    assert out["after"] == evaluate(torch.softmax(test[0] / ts.temperature_, 1), test[1], n_bins=5)


def test_fit_on_every_layout_equals_fit_on_the_kept_rows():
    g = torch.Generator().manual_seed(7)
    z = torch.randn(30, 3, 4, generator=g, dtype=torch.float64)  # (N, K, L): dense with one spatial dim
    y = torch.multinomial(torch.softmax(z, 1).movedim(1, -1).reshape(-1, 3), 1, generator=g).view(30, 4)
    rows, flat = (2 * z).movedim(1, -1).reshape(-1, 3), y.reshape(-1)
    t_rows = TemperatureScaling().fit(rows, flat).temperature_
    assert TemperatureScaling().fit(2 * z, y).temperature_ == t_rows  # no ignore_index: every pixel
    assert TemperatureScaling().fit(2 * z.unsqueeze(-1), y.unsqueeze(-1)).temperature_ == t_rows  # (N, K, L, 1)
    # (N, K) rows with ignore_index: the ignored rows are dropped
    y_ign = flat.clone()
    y_ign[::3] = 255
    keep = y_ign != 255
    assert (TemperatureScaling().fit(rows, y_ign, ignore_index=255).temperature_
            == TemperatureScaling().fit(rows[keep], flat[keep]).temperature_)
    with pytest.raises(ValueError, match=r"^labels has 121 entries but the predictions have 120 rows$"):
        TemperatureScaling().fit(rows, torch.cat([y_ign, y_ign[:1]]), ignore_index=255)


def test_fit_errors_name_the_argument():
    with pytest.raises(ValueError, match="^logits must be numeric"):
        TemperatureScaling().fit(np.array([["a", "b"]]), np.array([0]))
    with pytest.raises(ValueError, match="^labels must be numeric"):
        TemperatureScaling().fit(np.zeros((1, 2)), np.array(["a"]))


def test_fit_argument_checks():
    z, y = torch.zeros(4, 2, dtype=torch.float64), torch.tensor([0, 1, 0, 1])
    for t_min, t_max in ((0.0, 1.0), (2.0, 2.0), (3.0, 2.0)):
        with pytest.raises(ValueError, match=rf"^need 0 < t_min < t_max, got t_min={t_min}, t_max={t_max}$"):
            TemperatureScaling(t_min=t_min, t_max=t_max).fit(z, y)
    dense, labels = torch.zeros(1, 2, 2, 2, dtype=torch.float64), torch.tensor([[[0, 1], [1, 0]]])
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match=rf"^max_pixels must be an integer >= 1 or None, got {bad!r}$"):
            TemperatureScaling().fit(dense, labels, max_pixels=bad)
    with pytest.warns(UserWarning, match="returning the bound"):  # constant logits: T = t_max
        assert TemperatureScaling().fit(dense, labels, max_pixels=1).temperature_ == 100.0


def _traced_fit(z, y, **kw):
    """Fit with a spy on ``_moments``: every ``(b, G, H)`` the solver evaluates, in order."""
    calls, real = [], calibrators._moments

    def spy(z_, z2, z_y, b):
        g, h = real(z_, z2, z_y, b)
        calls.append((b, g, h))
        return g, h

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(calibrators, "_moments", spy)
        ts = TemperatureScaling(**kw).fit(z, y)
    return ts, calls


def _replay(calls, t_min, t_max, tol=1e-10):
    """The documented safeguarded Newton iteration in b = 1/T, replayed on the recorded (G, H):
    the points it must visit, the iteration it must stop at and the temperature it must return."""
    (b_lo, g_lo, _), (b_hi, g_hi, _) = calls[:2]
    assert (b_lo, b_hi) == (1 / t_max, 1 / t_min) and g_lo < 0 < g_hi  # both bounds first
    want = 1.0 if b_lo < 1.0 < b_hi else math.sqrt(b_lo * b_hi)  # T = 1 when strictly inside
    for i, (b, g, h) in enumerate(calls[2:]):
        assert b == want, f"iteration {i + 1} evaluated b = {b!r}, expected {want!r}"
        if g == 0:
            return i + 1, 1 / b
        b_lo, b_hi = (b, b_hi) if g < 0 else (b_lo, b)
        step = b - g / h if h > 0 else math.nan  # no curvature (one-hot rows): no Newton step
        if abs(step - b) <= tol * b:  # Newton converged
            return i + 1, 1 / step
        want = step if b_lo < step < b_hi else math.sqrt(b_lo * b_hi)  # else bisect in log b
        if abs(want - b) <= tol * b or b_hi - b_lo <= tol * b:
            return i + 1, 1 / want
    raise AssertionError("the solver evaluated no point after which it may stop")


@pytest.mark.parametrize("t_true,t_min,t_max", [
    (0.05, 0.01, 100.0), (0.5, 0.01, 100.0), (2.0, 0.01, 100.0), (30.0, 0.01, 100.0), (80.0, 0.01, 100.0),
    (4.0, 2.0, 50.0),   # T = 1 below the range: the start is the bracket's geometric middle
    (0.7, 0.5, 1.0),    # T = 1 is the upper bound: not strictly inside, so not the start
    (3.0, 1.0, 5.0),    # T = 1 is the lower bound
])
def test_solver_visits_exactly_the_points_of_its_iteration(t_true, t_min, t_max):
    z, y = _synthetic(7, 2000, 10, t_true)
    ts, calls = _traced_fit(z, y, t_min=t_min, t_max=t_max)
    n_iter, t = _replay(calls, t_min, t_max)
    assert len(calls) == n_iter + 2 and ts.n_iter_ == n_iter  # it stops where it may, not later
    assert ts.temperature_ == t


def test_zero_curvature_bisects():
    # two classes, logit gaps of at least 800: at the start T = 1 every row's softmax is one-hot
    # in float64 (exp(-800) = 0), so H = 0 there and the solver must bisect, not divide by H
    g = torch.Generator().manual_seed(8)
    sign = 2 * torch.randint(0, 2, (3000,), generator=g) - 1
    x = (800 + 400 * torch.rand(3000, generator=g, dtype=torch.float64)) * sign
    y = torch.bernoulli(torch.sigmoid(x / 400), generator=g).long()  # calibrated at T = 400
    z = torch.stack([torch.zeros_like(x), x], 1)
    ts, calls = _traced_fit(z, y, t_max=1000.0)
    assert calls[2][0] == 1.0 and calls[2][2] == 0.0  # the start, with no curvature
    n_iter, t = _replay(calls, 0.01, 1000.0)
    assert ts.n_iter_ == n_iter and ts.temperature_ == t and 300 < t < 500


def test_the_iteration_cap_is_max_iter():
    z, y = _synthetic(7, 2000, 10, 30.0)
    full = calibrators._fit_nll(z, y, 0.01, 100.0)
    assert full[1] > 3  # the fit needs more than 3 iterations
    t3, it3 = calibrators._fit_nll(z, y, 0.01, 100.0, max_iter=3)
    assert it3 == 3 and t3 != full[0]
