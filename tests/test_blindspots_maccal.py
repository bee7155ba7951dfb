"""MaC-Cal's tensor pieces at their edges: the strict mask threshold, requested dtypes, exact
bounds of the keep-rate rule and the wording of its errors."""

import pytest
import torch

from calibkit.methods.maccal import bernoulli_mask, masked_linear, mc_predict_proba, update_keep_rate
from calibkit.methods.maccal.masking import check_int, check_keep_rate

pytestmark = pytest.mark.usefixtures("one_thread")


def test_mask_is_strictly_below_the_keep_rate():
    # r equal to one of the uniforms drawn: that entry is dropped (M = [U < r], not U <= r)
    u = torch.rand(6, 7, generator=torch.Generator().manual_seed(3))
    r = float(u[2, 4])
    mask = bernoulli_mask((6, 7), r, torch.Generator().manual_seed(3))
    assert torch.equal(mask, (u < r).float()) and mask[2, 4] == 0


def test_mask_dtype_and_draws_do_not_depend_on_the_default_dtype():
    assert bernoulli_mask((2, 3), 1.0, dtype=torch.float64).dtype == torch.float64
    assert bernoulli_mask((2, 3), 0.5, torch.Generator().manual_seed(0), dtype=torch.float64).dtype == torch.float64
    want = bernoulli_mask((40, 50), 0.3, torch.Generator().manual_seed(1))
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:  # the uniforms are float32 draws whatever the default: the same masks for a seed
        got = bernoulli_mask((40, 50), 0.3, torch.Generator().manual_seed(1), dtype=torch.float32)
    finally:
        torch.set_default_dtype(before)
    assert torch.equal(got, want)


def test_masked_linear_in_bfloat16():
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 8, generator=gen).bfloat16(), torch.randn(4, 8, generator=gen).bfloat16()
    out = masked_linear(x, w, None, 0.5, torch.Generator().manual_seed(2))
    mask = bernoulli_mask((4, 8), 0.5, torch.Generator().manual_seed(2))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), (x.float() @ (w.float() * mask / 0.5).T), rtol=2e-2, atol=2e-2)


def test_shape_errors():
    msg = r"^features \(N, D\) and weight \(K, D\) must agree on D, got {} and {}$"
    with pytest.raises(ValueError, match=msg.format(r"\(2, 5\)", r"\(3, 4\)")):
        masked_linear(torch.ones(2, 5), torch.ones(3, 4), None, 0.5)
    with pytest.raises(ValueError, match=msg.format(r"\(2, 4, 1\)", r"\(3, 4\)")):
        masked_linear(torch.ones(2, 4, 1), torch.ones(3, 4), None, 0.5)
    with pytest.raises(ValueError, match=msg.format(r"\(2, 4\)", r"\(3, 4, 1\)")):
        mc_predict_proba(torch.ones(2, 4), torch.ones(3, 4, 1), None, 0.5, 2)


def test_integer_and_rate_checks_name_the_argument():
    with pytest.raises(ValueError, match=r"^mc_samples must be an integer >= 1, got 2.0$"):
        check_int(2.0, "mc_samples", 1)
    with pytest.raises(ValueError, match=r"^mc_samples must be an integer >= 1, got 2.0$"):
        mc_predict_proba(torch.ones(2, 4), torch.ones(3, 4), None, 0.5, 2.0)
    assert check_int(1, "n", 1) == 1
    with pytest.raises(ValueError, match=r"^keep_rate must lie in \(0, 1\], got 1.5$"):
        check_keep_rate(1.5)
    with pytest.raises(ValueError, match=r"^keep_rate must be a number in \(0, 1\], got '0.5'$"):
        bernoulli_mask((2, 2), "0.5")


def test_keep_rate_rule_defaults_bounds_and_messages():
    assert update_keep_rate(0.9, 0.95, 0.85) == pytest.approx(0.8)  # eta = 1 by default
    assert update_keep_rate(0.3, 0.9, 0.7, eta=0.5) == pytest.approx(0.2)
    assert update_keep_rate(0.15, 0.9, 0.7, eta=0.5) == pytest.approx(0.1)  # r_min = 0.1 by default
    assert update_keep_rate(0.5, 0.0, 0.0) == 0.5  # conf = acc = 0 is valid
    assert update_keep_rate(0.5, 0.9, 0.1, eta=0) == 0.5  # eta = 0 freezes the rate
    for kwargs, match in [
        ({"r": 1.5}, r"^r must lie in \(0, 1\], got 1.5$"),
        ({"r_min": 0.0}, r"^r_min must lie in \(0, 1\], got 0.0$"),
        ({"conf": 1.2}, r"^conf must lie in \[0, 1\], got 1.2$"),
        ({"acc": -0.1}, r"^acc must lie in \[0, 1\], got -0.1$"),
        ({"eta": -1}, r"^eta must be >= 0, got -1$"),
    ]:
        args = {"r": 0.5, "conf": 0.5, "acc": 0.5, **kwargs}
        with pytest.raises(ValueError, match=match):
            update_keep_rate(**args)
