"""The numpy/torch boundary (calibkit._arrays): numpy in -> python float / numpy out, torch in -> torch out.

Loops over every public function of calibkit.functional and calibkit.conformal that takes arrays,
so a function added to their ``__all__`` is checked without a new test.
"""

from __future__ import annotations

import inspect
from collections import namedtuple

import numpy as np
import pytest
import torch

import calibkit.conformal as conformal
import calibkit.functional as F
import calibkit.functional.losses as FL
from calibkit._arrays import array_io, to_numpy_side

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny fits: OpenMP threads cost more than they give

# functions of calibkit.functional's __all__ that are not called as f(probs, labels) in the loop below
_OTHER_INPUTS = {"ood_auroc", "fpr_at_95_tpr", "entropy_score", "max_confidence_score", "mean_iou",
                 "feature_l1_norms", "fedlas_nci", "fedlas_alpha", "adafocal", "weighted_label_smoothing",
                 "weighted_mbls", "soft_cross_entropy", "soft_l2", "margin_penalty"}
# the training losses called as f(logits, targets): those of calibkit.functional.losses not listed above
_LOGIT_FNS = {n for n in FL.__all__ if n not in _OTHER_INPUTS}
METRICS = [n for n in F.__all__ if n not in _OTHER_INPUTS and n not in FL.__all__]


def _data(n=300, k=4, seed=0):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, k)) * 2
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    y = np.array([rng.choice(k, p=row) for row in p])
    return z, p, y


def _same(a, b):
    """``a`` (numpy side) equals ``b`` (torch side) converted by hand."""
    if isinstance(b, torch.Tensor):
        if b.dim() == 0:
            assert type(a) is type(b.item()) and a == b.item()
        else:
            assert isinstance(a, np.ndarray)
            np.testing.assert_array_equal(a, b.numpy())
    elif isinstance(b, tuple):
        assert isinstance(a, tuple) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b


def test_the_rule_on_plain_values():
    assert to_numpy_side(torch.tensor(0.25, dtype=torch.float64)) == 0.25
    assert type(to_numpy_side(torch.tensor(3))) is int and type(to_numpy_side(torch.tensor(True))) is bool
    out = to_numpy_side(torch.ones(2, dtype=torch.bfloat16))
    assert out.dtype == np.float32 and out.tolist() == [1.0, 1.0]  # numpy has no bfloat16
    Pair = namedtuple("Pair", "a b")
    got = to_numpy_side({"x": Pair(torch.tensor(1.5), torch.arange(2)), "y": [np.float64(2.0), "s"]})
    assert isinstance(got["x"], Pair) and got["x"].a == 1.5 and got["x"].b.tolist() == [0, 1]
    assert got["y"] == [2.0, "s"] and type(got["y"][0]) is float

    @array_io
    def double(x, w=None):
        return torch.as_tensor(x) * 2

    assert isinstance(double(np.ones(2)), np.ndarray) and isinstance(double([1.0]), np.ndarray)
    assert isinstance(double(torch.ones(2)), torch.Tensor)
    assert isinstance(double(np.ones(2), w=torch.ones(1)), torch.Tensor)  # any tensor argument: torch out
    assert double.__name__ == "double" and "w" in inspect.signature(double).parameters


@pytest.mark.parametrize("name", METRICS)
def test_metric_returns_python_numbers_for_numpy_and_tensors_for_torch(name):
    fn = getattr(F, name)
    _, p, y = _data()
    got_np = fn(p, y)
    got_t = fn(torch.from_numpy(p), torch.from_numpy(y))
    leaves = got_t if isinstance(got_t, tuple) else (got_t,)
    assert all(isinstance(v, torch.Tensor) for v in leaves)
    for v in got_np if isinstance(got_np, tuple) else (got_np,):
        assert isinstance(v, (float, np.ndarray)), type(v)
    _same(got_np, got_t)
    # binary (N,) positive-class probabilities, float32: the same rule
    pb = p[:, :2] / p[:, :2].sum(1, keepdims=True)
    _same(fn(pb[:, 1].astype(np.float32), y % 2), fn(torch.from_numpy(pb[:, 1].astype(np.float32)),
                                                      torch.from_numpy(y % 2)))


def test_ece_value_for_numpy_input_is_the_hand_computed_one():
    # two bins: [0, .5) holds nothing; [.5, 1] holds confidences .9, .6, .8 with correctness 1, 0, 1:
    # |(.9 + .6 + .8) - 2| / 3 = 0.1
    p = np.array([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8]])
    y = np.array([0, 1, 1])
    got = F.ece(p, y, n_bins=2)
    assert type(got) is float and got == pytest.approx(0.1, abs=1e-15)
    assert F.accuracy(p, y) == pytest.approx(2 / 3, abs=1e-15)
    assert F.nll(p, y) == pytest.approx(-(np.log(0.9) + np.log(0.4) + np.log(0.8)) / 3, abs=1e-15)


def test_differentiable_paths_keep_their_graph_for_torch_input():
    z, _, y = _data(n=50)
    logits = torch.from_numpy(z).requires_grad_(True)
    loss = F.mbls(logits, torch.from_numpy(y))
    loss.backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    p = torch.softmax(logits, 1)
    assert F.nll(p, torch.from_numpy(y)).requires_grad and F.brier(p, torch.from_numpy(y)).requires_grad
    # the same loss for numpy input is a float of the same value
    assert F.mbls(z, y) == pytest.approx(float(loss), rel=1e-12)


@pytest.mark.parametrize("name", sorted(_LOGIT_FNS))
def test_losses_follow_the_rule(name):
    fn = getattr(F, name)
    z, _, y = _data(n=40)
    _same(fn(z, y), fn(torch.from_numpy(z), torch.from_numpy(y)))


def test_scores_and_iou_follow_the_rule():
    _, p, y = _data()
    _, q, _ = _data(seed=1)
    for fn in (F.entropy_score, F.max_confidence_score):
        _same(fn(p), fn(torch.from_numpy(p)))
    s_in, s_out = p.max(1), q.max(1) - 0.1
    for fn in (F.ood_auroc, F.fpr_at_95_tpr):
        _same(fn(s_in, s_out), fn(torch.from_numpy(s_in), torch.from_numpy(s_out)))
    _same(F.mean_iou(p, y, 4), F.mean_iou(torch.from_numpy(p), torch.from_numpy(y), 4))


def test_conformal_follows_the_rule():
    _, p, y = _data(n=400)
    sc = conformal.SplitConformal(alpha=0.1, score="lac").fit(p[:200], y[:200])
    sets_np, sets_t = sc.predict_set(p[200:]), sc.predict_set(torch.from_numpy(p[200:]))
    assert isinstance(sets_np, np.ndarray) and sets_np.dtype == np.bool_
    _same(sets_np, sets_t)
    _same(conformal.coverage(sets_np, y[200:]), conformal.coverage(sets_t, torch.from_numpy(y[200:])))
    _same(conformal.mean_set_size(sets_np), conformal.mean_set_size(sets_t))
    _same(conformal.class_scores(p, "lac"), conformal.class_scores(torch.from_numpy(p), "lac"))
