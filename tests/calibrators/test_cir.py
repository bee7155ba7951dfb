"""Centred isotonic regression (CenteredIsotonicCalibration) against a hand computation and an
independent implementation written here (PAV by repeated pooling, then the CIR rule)."""

import numpy as np
import torch

from calibkit.calibrators import CenteredIsotonicCalibration
from calibkit.calibrators.cir import cir_knots


def _pav(y):
    """Isotonic fit of ``y`` (equal weights, in order) by pooling adjacent violators one pair at a time."""
    blocks = [[float(v), 1.0] for v in y]  # [mean, weight]
    sizes = [1] * len(y)
    i = 0
    while i < len(blocks) - 1:
        if blocks[i][0] > blocks[i + 1][0]:
            m = (blocks[i][0] * blocks[i][1] + blocks[i + 1][0] * blocks[i + 1][1]) / (blocks[i][1] + blocks[i + 1][1])
            blocks[i] = [m, blocks[i][1] + blocks[i + 1][1]]
            sizes[i] += sizes.pop(i + 1)
            blocks.pop(i + 1)
            i = max(i - 1, 0)
        else:
            i += 1
    return np.repeat([b[0] for b in blocks], sizes)


def _cir_map(x, t):
    """The CIR map of one class: sorted scores ``x`` (ties pooled first), targets ``t``; returns a function."""
    ux, inv = np.unique(x, return_inverse=True)
    tm = np.bincount(inv, weights=t) / np.bincount(inv)
    w = np.bincount(inv)
    # weighted PAV through repetition: every tied score enters once per row
    v = _pav(np.repeat(tm, w))
    xs = np.repeat(ux, w)
    levels = [(xs[v == lv], lv) for lv in dict.fromkeys(v)]
    pts = []
    for n, (xl, lv) in enumerate(levels):
        if lv in (0.0, 1.0):
            pts += [(xl.min(), lv), (xl.max(), lv)]
        elif n == 0:
            pts += [(xl.min(), lv), (xl.mean(), lv)]
        elif n == len(levels) - 1:
            pts += [(xl.mean(), lv), (xl.max(), lv)]
        else:
            pts.append((xl.mean(), lv))
    px, py = np.array(pts).T
    return lambda s: np.interp(np.clip(s, px[0], px[-1]), px, py)


def test_knots_of_a_hand_example():
    # targets 0 1 0 1 1 0 at scores 1..6: levels {1}: 0, {2, 3}: 1/2, {4, 5, 6}: 2/3
    x = torch.arange(1.0, 7.0, dtype=torch.float64)[None]
    v = torch.tensor([[0, 0.5, 0.5, 2 / 3, 2 / 3, 2 / 3]], dtype=torch.float64)
    xs, ys, n = cir_knots(x, v)
    assert n.tolist() == [4]
    torch.testing.assert_close(xs[0], torch.tensor([1.0, 2.5, 5.0, 6.0], dtype=torch.float64))
    torch.testing.assert_close(ys[0], torch.tensor([0.0, 0.5, 2 / 3, 2 / 3], dtype=torch.float64))


def test_binary_scores_follow_the_hand_map():
    # binary logits whose sigmoid is the score; the map of the hand example, interpolated by hand
    p = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], dtype=torch.float64)
    y = torch.tensor([0, 1, 0, 1, 1, 0])
    cal = CenteredIsotonicCalibration().fit(torch.logit(p), y)
    q = cal.predict_proba(torch.logit(torch.tensor([0.2, 0.4, 0.05, 0.9], dtype=torch.float64)))
    # 0.2: between (0.1, 0) and (0.25, 1/2): 1/3; 0.4: between (0.25, 1/2) and (0.5, 2/3): 0.6;
    # below and above the range: the end levels (0 floored at 1e-12, 2/3)
    torch.testing.assert_close(q, torch.tensor([1 / 3, 0.6, 1e-12, 2 / 3], dtype=torch.float64), rtol=0, atol=1e-12)


def test_multiclass_matches_the_independent_implementation():
    g = torch.Generator().manual_seed(3)
    z = (torch.randn(300, 4, generator=g, dtype=torch.float64) * 2).round(decimals=1)  # ties included
    y = torch.multinomial(torch.softmax(z / 2, 1), 1, generator=g)[:, 0]
    zt = torch.randn(80, 4, generator=g, dtype=torch.float64) * 2.5
    q = CenteredIsotonicCalibration().fit(z, y).predict_proba(zt).numpy()
    p, pt = torch.softmax(z, 1).numpy(), torch.softmax(zt, 1).numpy()
    g_ = np.stack([_cir_map(p[:, k], (y.numpy() == k).astype(float))(pt[:, k]) for k in range(4)], 1)
    g_ = np.maximum(np.clip(g_, 0, 1), 1e-12)
    np.testing.assert_allclose(q, g_ / g_.sum(1, keepdims=True), rtol=0, atol=1e-12)


def test_no_exact_zero_and_monotone_knots():
    g = torch.Generator().manual_seed(4)
    z = torch.randn(400, 5, generator=g, dtype=torch.float64) * 4
    y = torch.randint(0, 5, (400,), generator=g)
    cal = CenteredIsotonicCalibration().fit(z, y)
    assert float(cal.predict_proba(z * 10).min()) > 0
    for k in range(5):  # knots non-decreasing in x and in value; a change of level moves x forward
        n = int(cal.n_knots_[k])
        dx, dy = cal.knots_x_[k, :n].diff(), cal.knots_y_[k, :n].diff()
        assert bool((dx >= 0).all()) and bool((dy >= 0).all()) and bool((dx[dy > 0] > 0).all())


def test_keep_edges_false_centres_the_zero_level():
    x = torch.arange(1.0, 7.0, dtype=torch.float64)[None]
    v = torch.tensor([[0, 0, 0.5, 0.5, 1, 1]], dtype=torch.float64)
    xs, ys, n = cir_knots(x, v, keep_edges=False)
    # first level {1, 2}: (1, 0), (1.5, 0); middle (3.5, 1/2); last {5, 6}: (5.5, 1), (6, 1)
    torch.testing.assert_close(xs[0, : int(n[0])], torch.tensor([1.0, 1.5, 3.5, 5.5, 6.0], dtype=torch.float64))
    xs, ys, n = cir_knots(x, v)  # the ends kept: (1, 0), (2, 0), (3.5, 1/2), (5, 1), (6, 1)
    torch.testing.assert_close(xs[0, : int(n[0])], torch.tensor([1.0, 2.0, 3.5, 5.0, 6.0], dtype=torch.float64))
