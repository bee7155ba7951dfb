"""Temperature scaling: recovery of a known temperature, optimality, the grid variant, errors."""

import pytest
import torch

import calibkit.functional as F
from calibkit.calibrators import CALIBRATORS, NotFittedError, TemperatureScaling


def _synthetic(gen, n, k, scale=2.0):
    """Calibrated logits z (labels drawn from softmax(z)); logits z * T* then need T = T*."""
    z = torch.randn(n, k, generator=gen, dtype=torch.float64) * scale
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=gen).squeeze(1)
    return z, y


@pytest.fixture(scope="module")
def big():
    # 20,000 rows: T* recovered within 0.2%, and without the zero-step stop the fit at T* = 0.5,
    # 2 and 4 takes 39-41 iterations (checked by disabling it); 50,000 rows take 8x longer
    return _synthetic(torch.Generator().manual_seed(0), 20_000, 100)


@pytest.mark.parametrize("t_true", [0.5, 2.0, 4.0, 10.0])
def test_nll_fit_recovers_known_temperature(big, t_true):
    z, y = big
    ts = TemperatureScaling().fit((z * t_true).float(), y)
    assert ts.temperature_ == pytest.approx(t_true, rel=0.02)  # pitfall: no stop at 3.8 for T* = 10


def test_nll_fit_is_the_minimum(gen):
    z, y = _synthetic(gen, 3000, 10)
    logits = z * 3
    ts = TemperatureScaling().fit(logits, y)
    t = torch.tensor(ts.temperature_, dtype=torch.float64, requires_grad=True)
    loss = torch.nn.functional.cross_entropy(logits / t, y)
    (grad,) = torch.autograd.grad(loss, t)
    assert abs(grad.item()) < 1e-8  # stationary point, checked with autograd
    for factor in (0.99, 1.01):
        worse = torch.nn.functional.cross_entropy(logits / (ts.temperature_ * factor), y)
        assert worse.item() > loss.item()


def test_separable_data_stops_at_bound_with_warning():
    logits = torch.tensor([[2.0, -1.0], [-1.0, 3.0], [4.0, 0.0]])
    labels = torch.tensor([0, 1, 0])  # every argmax right: NLL falls forever as T -> 0
    with pytest.warns(UserWarning, match="separable"):
        ts = TemperatureScaling(t_min=0.05).fit(logits, labels)
    assert ts.temperature_ == 0.05


def test_transform_and_predict_proba(gen):
    z, y = _synthetic(gen, 500, 5)
    ts = TemperatureScaling().fit(z * 2, y)
    x = torch.randn(7, 5, generator=gen)
    torch.testing.assert_close(ts.transform(x), x / ts.temperature_)
    torch.testing.assert_close(ts.predict_proba(x), torch.softmax(x / ts.temperature_, 1))
    half = ts.transform(x.half())
    assert half.dtype == torch.float32  # half precision upcast before use
    assert ts.fit(z.numpy(), y.numpy()) is ts  # numpy accepted, fit returns self


def test_ece_grid_picks_the_best_grid_temperature(gen):
    z, y = _synthetic(gen, 4000, 10)
    logits = z * 3
    ts = TemperatureScaling(objective="ece", n_bins=15).fit(logits, y)
    grid = [i / 10 for i in range(1, 101)]
    eces = [F.ece(torch.softmax(logits / t, 1), y).item() for t in grid]
    assert ts.temperature_ == grid[min(range(100), key=lambda i: eces[i])]
    assert ts.temperature_ == pytest.approx(3.0, abs=0.5)


def test_unfitted_use_raises(gen):
    ts = TemperatureScaling()
    for call in (ts.transform, ts.predict_proba):
        with pytest.raises(NotFittedError, match="call fit"):
            call(torch.zeros(2, 3))
    assert issubclass(NotFittedError, ValueError)


def test_bad_arguments(gen):
    z, y = _synthetic(gen, 50, 3)
    with pytest.raises(ValueError, match="unknown objective 'brier'"):
        TemperatureScaling(objective="brier").fit(z, y)
    with pytest.raises(ValueError, match="n_bins"):
        TemperatureScaling(objective="ece", n_bins=0).fit(z, y)
    with pytest.raises(ValueError, match="out of range"):
        TemperatureScaling().fit(z, y + 3)
    with pytest.raises(ValueError, match="NaN"):
        TemperatureScaling().fit(z * float("nan"), y)


@pytest.mark.parametrize("name", list(CALIBRATORS))
def test_registry_estimator_conformance(name, gen):
    est = CALIBRATORS[name]()
    assert not any(k.endswith("_") for k in vars(est))  # __init__ stores hyperparameters only
    z, y = _synthetic(gen, 200, 4)
    assert est.fit(z, y) is est
    assert est.predict_proba(z).shape == z.shape


def test_evaluate_before_after_ts_matches_separate_fit_and_evaluate():
    from calibkit.calibrators import evaluate_before_after_ts
    from calibkit.metrics import evaluate

    g = torch.Generator().manual_seed(3)
    z = torch.randn(4000, 10, generator=g) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    val, test = 2.5 * z[:2000], 2.5 * z[2000:]
    out = evaluate_before_after_ts(val, y[:2000], test, y[2000:])
    t = TemperatureScaling().fit(val, y[:2000]).temperature_
    assert out["temperature"] == t
    assert out["before"] == evaluate(torch.softmax(test.double(), 1), y[2000:])
    assert out["after"] == evaluate(torch.softmax(test.double() / t, 1), y[2000:])
    assert out["after"]["ece"] < out["before"]["ece"]  # the logits were made 2.5x too sharp


def _grad_at(logits, y, t):
    t = torch.tensor(t, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(torch.nn.functional.cross_entropy(logits.double() / t, y), t)
    return grad.item()


@pytest.mark.parametrize("t_true", [0.5, 2.0, 4.0, 10.0])
def test_newton_stops_at_the_root_in_few_iterations(big, t_true):
    # A Newton step that lands on the root is a zero step equal to a bracket end: it must end
    # the fit, not hand over to bisection (which took ~40 iterations and stopped off the root).
    z, y = big
    logits = (z * t_true).float()
    ts = TemperatureScaling().fit(logits, y)
    assert ts.n_iter_ <= 10
    assert abs(_grad_at(logits, y, ts.temperature_)) < 1e-9  # the stationary point, by autograd


def test_binary_one_logit_is_sigmoid_of_z_over_t(gen):
    z = torch.randn(4000, generator=gen, dtype=torch.float64) * 2
    y = torch.bernoulli(torch.sigmoid(z), generator=gen).long()
    ts = TemperatureScaling().fit(3 * z, y)
    two = TemperatureScaling().fit(torch.stack([torch.zeros_like(z), 3 * z], 1), y)  # softmax((0, z)/T)
    assert ts.temperature_ == pytest.approx(two.temperature_, rel=1e-12)
    assert ts.temperature_ == pytest.approx(3.0, rel=0.1)
    # stationary point of the binary NLL of sigmoid(3 z / T), by autograd
    t = torch.tensor(ts.temperature_, dtype=torch.float64, requires_grad=True)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(3 * z / t, y.double())
    assert abs(torch.autograd.grad(loss, t)[0].item()) < 1e-9
    p = ts.predict_proba(3 * z)
    assert p.shape == (4000,)
    torch.testing.assert_close(p, torch.sigmoid(3 * z / ts.temperature_))
    assert F.ece(p, y).item() < F.ece(torch.sigmoid(3 * z), y).item()
    with pytest.raises(ValueError, match="out of range"):
        TemperatureScaling().fit(z, y + 1)


def test_dense_fit_equals_fit_on_valid_pixels_and_subsamples_with_a_seed(gen):
    z = torch.randn(3, 5, 8, 9, generator=gen, dtype=torch.float64)
    labels = torch.multinomial(torch.softmax(z, 1).movedim(1, -1).reshape(-1, 5), 1, generator=gen).view(3, 8, 9)
    labels[torch.rand(3, 8, 9, generator=gen) < 0.3] = 255
    logits = 3 * z  # over-confident pixels: T near 3
    rows, y = logits.movedim(1, -1).reshape(-1, 5), labels.reshape(-1)
    keep = y != 255
    full = TemperatureScaling().fit(logits, labels, ignore_index=255, max_pixels=None)
    assert full.temperature_ == TemperatureScaling().fit(rows[keep], y[keep]).temperature_
    sub = TemperatureScaling().fit(logits, labels, ignore_index=255, max_pixels=50, seed=4)
    drawn = torch.randperm(int(keep.sum()), generator=torch.Generator().manual_seed(4))[:50]
    idx = keep.nonzero().squeeze(1)[drawn.sort().values]
    assert sub.temperature_ == TemperatureScaling().fit(rows[idx], y[idx]).temperature_
    assert sub.temperature_ != full.temperature_ and 1.5 < full.temperature_ < 6
    assert (TemperatureScaling().fit(logits, labels, ignore_index=255, max_pixels=50, seed=4).temperature_
            == sub.temperature_)
    p = full.predict_proba(logits)
    assert p.shape == logits.shape
    torch.testing.assert_close(p, torch.softmax(logits / full.temperature_, 1))
    with pytest.raises(ValueError, match="need labels of shape"):
        TemperatureScaling().fit(logits, labels[:, :4])
    with pytest.raises(ValueError, match="max_pixels"):
        TemperatureScaling().fit(logits, labels, ignore_index=255, max_pixels=0)


def test_bfloat16_logits(gen):
    z, y = _synthetic(gen, 3000, 10)
    ts = TemperatureScaling().fit((2 * z).bfloat16(), y)
    ref = TemperatureScaling().fit((2 * z).bfloat16().double(), y)
    assert ts.temperature_ == ref.temperature_  # fitted in float64 on the exact upcast
    assert ts.predict_proba((2 * z).bfloat16()).dtype == torch.float32


def test_dense_transform_validates_without_flattening():
    ts = TemperatureScaling()
    ts.temperature_, ts.n_classes_, ts.binary_ = 2.0, 3, False
    x = torch.zeros(2, 3, 4, 4)
    torch.testing.assert_close(ts.transform(x + 1.0), x + 0.5)
    x[1, 2, 3, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        ts.transform(x)
    with pytest.raises(ValueError, match="K >= 2"):
        ts.transform(torch.zeros(2, 1, 4, 4))
    with pytest.raises(ValueError, match="logits have K = 4 classes but this TemperatureScaling was fitted on K = 3"):
        ts.transform(torch.zeros(2, 4, 4, 4))
