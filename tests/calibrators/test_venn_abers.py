"""Inductive Venn-Abers (VennAbersCalibration) against a direct computation: isotonic regression
fitted twice with the test point added (scikit-learn's IsotonicRegression), on small sets with ties."""

import numpy as np
import pytest
import torch

from calibkit.calibrators import VennAbersCalibration
from calibkit.calibrators.venn_abers import venn_abers_tables

sklearn_isotonic = pytest.importorskip("sklearn.isotonic")


def _direct(x, t, s):
    """``(p0, p1)`` of test score ``s``: the isotonic value at ``s`` with ``(s, 0)`` placed after its
    ties, and with ``(s, 1)`` placed before them."""
    out = []
    for label, shift in ((0, 1e-9), (1, -1e-9)):
        fit = sklearn_isotonic.IsotonicRegression().fit(np.append(x, s + shift), np.append(t, label))
        out.append(float(fit.predict([s + shift])[0]))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_p0_p1_equal_the_isotonic_fits_with_the_test_point(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 30))
    x = np.round(rng.random(n), 1)  # many ties
    t = (rng.random(n) < x).astype(float)
    scores, length, p0, p1 = venn_abers_tables(torch.tensor(x)[None], torch.tensor(t)[None])
    c = scores[0, : int(length[0])].numpy()
    for s in np.concatenate([x, rng.random(6), [0.0, 1.0]]):
        d0, d1 = _direct(x, t, s)
        assert p0[0, np.searchsorted(c, s, "right")].item() == pytest.approx(d0, abs=1e-12)
        assert p1[0, np.searchsorted(c, s, "left")].item() == pytest.approx(d1, abs=1e-12)
        assert d0 <= d1 + 1e-12


def test_multiclass_is_the_merged_one_vs_rest_rows():
    g = torch.Generator().manual_seed(5)
    z = torch.randn(60, 3, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g)[:, 0]
    zt = torch.randn(15, 3, generator=g, dtype=torch.float64) * 2
    q = VennAbersCalibration().fit(z, y).predict_proba(zt).numpy()
    p, pt = torch.softmax(z, 1).numpy(), torch.softmax(zt, 1).numpy()
    merged = np.empty_like(pt)
    for k in range(3):
        for i, s in enumerate(pt[:, k]):
            p0, p1 = _direct(p[:, k], (y.numpy() == k).astype(float), s)
            merged[i, k] = p1 / (1 - p0 + p1)
    merged = np.maximum(merged, 1e-12)
    np.testing.assert_allclose(q, merged / merged.sum(1, keepdims=True), rtol=0, atol=1e-10)


def test_binary_is_one_map_of_the_positive_class():
    g = torch.Generator().manual_seed(6)
    s = torch.randn(50, generator=g, dtype=torch.float64) * 2
    y = (torch.rand(50, generator=g, dtype=torch.float64) < torch.sigmoid(s)).long()
    cal = VennAbersCalibration().fit(s, y)
    assert tuple(cal.p0_.shape) == (1, int(cal.scores_.shape[1]) + 1)
    p = torch.sigmoid(s).numpy()
    for i in range(5):
        p0, p1 = _direct(p, y.numpy().astype(float), p[i])
        assert cal.predict_proba(s[i : i + 1]).item() == pytest.approx(p1 / (1 - p0 + p1), abs=1e-10)


def test_mean_merge_and_bad_merge():
    g = torch.Generator().manual_seed(7)
    s = torch.randn(40, generator=g, dtype=torch.float64)
    y = (torch.rand(40, generator=g, dtype=torch.float64) < torch.sigmoid(s)).long()
    cal = VennAbersCalibration(merge="mean").fit(s, y)
    p = torch.sigmoid(s).numpy()
    p0, p1 = _direct(p, y.numpy().astype(float), p[3])
    assert cal.predict_proba(s[3:4]).item() == pytest.approx((p0 + p1) / 2, abs=1e-10)
    with pytest.raises(ValueError, match="merge"):
        VennAbersCalibration(merge="max").fit(s, y)
