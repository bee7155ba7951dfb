"""API inputs that used to pass or mislead: validation and test logits of different classifiers,
a bootstrap of one sample, and the message for string labels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calibkit.bootstrap import bootstrap_ci, paired_bootstrap_diff
from calibkit.calibrators import evaluate_before_after_ts
from calibkit.functional import ece


def test_before_after_ts_refuses_logits_of_different_classifiers():
    g = torch.Generator().manual_seed(0)
    val, test = torch.randn(40, 10, generator=g), torch.randn(30, 3, generator=g)
    with pytest.raises(ValueError, match="^val_logits have 10 classes but test_logits have 3: both must come from the "
                                         "same classifier$"):
        evaluate_before_after_ts(val, torch.randint(0, 10, (40,), generator=g), test,
                                 torch.randint(0, 3, (30,), generator=g))
    # equal class counts still work, and agree with a temperature fitted by hand on the same data
    test = torch.randn(30, 10, generator=g)
    labels = torch.randint(0, 10, (30,), generator=g)
    val_labels = torch.cat([val[:28].argmax(1), torch.randint(0, 10, (12,), generator=g)])  # partly informative
    res = evaluate_before_after_ts(val, val_labels, test, labels)
    assert res["before"]["ece"] == pytest.approx(float(ece(test.double().softmax(1), labels)))


def test_bootstrap_of_one_sample_is_refused():
    p, y = torch.tensor([[0.7, 0.3]]), torch.tensor([0])
    for call in (lambda: bootstrap_ci("ece", p, y), lambda: paired_bootstrap_diff(p, p, y, "ece"),
                 lambda: bootstrap_ci("acc", torch.tensor([[0.7, 0.3], [0.4, 0.6]]), torch.tensor([0, -1]),
                                      ignore_index=-1)):  # one sample left after ignore_index
        with pytest.raises(ValueError, match="at least 2 samples: with N = 1"):
            call()
    two = bootstrap_ci("acc", torch.tensor([[0.7, 0.3], [0.4, 0.6]]), torch.tensor([0, 0]), n_resamples=400)
    # two samples, one right: the resampled accuracies are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4
    assert two.estimate == 0.5 and two.low <= 0.0 + 1e-12 and two.high >= 1.0 - 1e-12


@pytest.mark.parametrize("labels", [np.array(["cat", "dog"]), ["cat", "dog"]])
def test_string_labels_message_asks_for_integers_only(labels):
    probs = np.array([[0.6, 0.4], [0.3, 0.7]])
    with pytest.raises(ValueError) as info:
        ece(probs, labels)
    msg = str(info.value)
    assert "integer class indices" in msg and "map string labels to integers" in msg and "float" not in msg
    with pytest.raises(ValueError, match="must hold integer class indices, got dtype torch.float"):
        ece(probs, np.array([0.0, 1.0]))  # floats are refused too, as the message says


def test_string_probabilities_message_asks_for_floats():
    with pytest.raises(ValueError, match=r"^probs must be numeric \(floating-point numbers\), got a numpy array"):
        ece(np.array([["a", "b"]]), np.array([0]))


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
def test_unsigned_labels_are_class_indices(dtype):
    probs = np.array([[0.6, 0.4], [0.3, 0.7], [0.2, 0.8]])
    labels = np.array([0, 1, 0])
    want = float(ece(probs, labels))
    assert float(ece(probs, labels.astype(dtype))) == want
    assert float(ece(torch.from_numpy(probs), torch.from_numpy(labels.astype(dtype)))) == want
    with pytest.raises(ValueError, match="^labels out of range: found 2, expected values in \\[0, 1\\]$"):
        ece(probs, np.array([0, 2, 0], dtype))


def test_uint64_labels_above_the_int64_range_are_refused():
    probs = np.array([[0.6, 0.4], [0.3, 0.7]])
    for labels in (np.array([0, 2**63], np.uint64), torch.tensor([0, -1]).view(torch.uint64)):
        with pytest.raises(ValueError, match=r"^labels holds \d+, above the int64 range: not a class index$"):
            ece(probs, labels)
