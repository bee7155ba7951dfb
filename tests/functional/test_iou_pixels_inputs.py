"""Input handling of the functional layer: mean IoU (``functional/iou.py``), the dense-pixel rows
of the losses (``functional/pixels.py``) and the metric input layouts (``functional/inputs.py``),
checked against hand computations, with every error message matched exactly."""

import numpy as np
import pytest
import torch

from calibkit._validation import trusted_inputs
from calibkit.functional.inputs import to_rows
from calibkit.functional.iou import confusion_matrix, iou_from_confusion, mean_iou
from calibkit.functional.pixels import check_ignore_index, dense_rows, feature_rows, flatten_pixels, is_dense


# ---------- iou.py ----------
def test_confusion_matrix_by_hand_with_weights():
    labels = torch.tensor([0, 0, 1, 2, 2, 2])
    preds = torch.tensor([0, 1, 1, 2, 0, 2])
    cm = confusion_matrix(preds, labels, 3)
    assert cm.dtype == torch.float64
    assert cm.tolist() == [[1, 1, 0], [0, 1, 0], [1, 0, 2]]  # rows: labels, columns: predictions
    w = torch.tensor([1, 0, 1, 1, 0, 1])
    assert confusion_matrix(preds, labels, 3, weight=w).tolist() == [[1, 0, 0], [0, 1, 0], [0, 0, 2]]
    # int32 inputs index the same cells
    assert confusion_matrix(preds.int(), labels.int(), 3).tolist() == cm.tolist()


def test_confusion_matrix_stays_on_the_device():
    # meta tensors carry no data: the matrix is built on the predictions' device, without reading values
    preds = torch.zeros(6, dtype=torch.long, device="meta")
    cm = confusion_matrix(preds, preds, 3)
    assert cm.device.type == "meta" and cm.shape == (3, 3) and cm.dtype == torch.float64


def test_mean_iou_names_unconvertible_inputs():
    with pytest.raises(ValueError, match=r"^probs_or_preds must be numeric"):
        mean_iou(np.array(["a", "b"]), torch.tensor([0, 1]), 2)
    with pytest.raises(ValueError, match=r"^labels must be numeric"):
        mean_iou(torch.tensor([0, 1]), np.array(["a", "b"]), 2)
    with pytest.raises(ValueError, match=r"^labels: cannot convert"):
        mean_iou(torch.tensor([0, 1]), ["a", "b"], 2)


def test_iou_from_confusion_by_hand():
    # IoU_0 = 1 / (2 + 2 - 1) = 1/3, IoU_1 = 1 / (1 + 2 - 1) = 1/2, IoU_2 = 2 / (3 + 2 - 2) = 2/3;
    # class 3 absent from labels and predictions: left out of the mean
    cm = torch.tensor([[1, 1, 0, 0], [0, 1, 0, 0], [1, 0, 2, 0], [0, 0, 0, 0]])
    got = iou_from_confusion(cm)
    assert got.dtype == torch.float64 and got.dim() == 0
    assert got.item() == pytest.approx((1 / 3 + 1 / 2 + 2 / 3) / 3, abs=1e-15)
    # a class with a single sample, predicted as another class: union 2, IoU 0; and a class whose
    # union is 1 (one sample, predicted right): IoU 1
    assert iou_from_confusion(torch.tensor([[1.0, 0.0], [0.0, 0.0]])).item() == 1.0
    assert iou_from_confusion(torch.tensor([[0.0, 1.0], [0.0, 0.0]])).item() == 0.0
    assert torch.isnan(iou_from_confusion(torch.zeros(3, 3)))


def test_mean_iou_layouts():
    labels = torch.tensor([0, 1, 1, 0])
    # binary: predicted positive when p > 0.5 (0.5 itself is negative)
    p = torch.tensor([0.5, 0.51, 0.2, 0.9])  # preds 0 1 0 1
    # class 0: tp 1 (idx 0), union: labels {0, 3}, preds {0, 2} -> 3; class 1: tp 1, union 3
    assert mean_iou(p, labels, 2).item() == pytest.approx(1 / 3)
    # (N, K) scores and logits: argmax, first index on ties
    scores = torch.tensor([[0.5, 0.5], [-1.0, 2.0], [3.0, 1.0], [0.0, 0.0]])  # preds 0 1 0 0
    assert mean_iou(scores, labels, 2).item() == pytest.approx((2 / 3 + 1 / 2) / 2)
    # integer predictions, numpy input: a python float
    got = mean_iou(np.array([0, 1, 1, 0]), labels.numpy(), 2)
    assert type(got) is float and got == 1.0
    # dense (N, K, H, W) with ignore_index
    dense = torch.zeros(1, 3, 1, 3)
    dense[0, 2, 0, 0] = dense[0, 1, 0, 1] = dense[0, 0, 0, 2] = 1.0  # preds 2 1 0
    lab = torch.tensor([[[2, 0, 255]]])
    # class 0: label at pixel 1 only (pred 1); class 1: pred at pixel 1 only; class 2: right
    assert mean_iou(dense, lab, 3, ignore_index=255).item() == pytest.approx((0 + 0 + 1) / 3)


def test_mean_iou_errors():
    y = torch.tensor([0, 1])
    for bad in (True, 2.0, 0, -1, "2"):
        with pytest.raises(ValueError, match=rf"^num_classes must be an integer >= 1, got {bad!r}$"):
            mean_iou(torch.tensor([0, 1]), y, bad)
    mean_iou(torch.tensor([0, 0]), torch.tensor([0, 0]), 1)  # one class is allowed
    for bad in (torch.tensor([True, False]), torch.tensor([1j, 0j])):
        with pytest.raises(ValueError, match=rf"^probs_or_preds must be probabilities, logits or integer "
                                             rf"predictions, got {bad.dtype}$"):
            mean_iou(bad, y, 2)
    with pytest.raises(ValueError, match=r"^integer predictions of shape \(3,\) need labels of the same shape, "
                                         r"got \(2,\)$"):
        mean_iou(torch.tensor([0, 1, 1]), y, 2)
    with pytest.raises(ValueError, match=r"^probs_or_preds contains NaN or infinite value\(s\)$"):
        mean_iou(torch.tensor([[0.5, float("inf")], [0.5, 0.5]]), y, 2)
    with pytest.raises(ValueError, match=r"^1-D probs_or_preds \(binary\) need labels of shape \(3,\), got \(2,\)$"):
        mean_iou(torch.tensor([0.1, 0.2, 0.3]), y, 2)
    with pytest.raises(ValueError, match=r"^probs_or_preds has 3 classes along dim 1 but num_classes=2$"):
        mean_iou(torch.ones(2, 3) / 3, y, 2)
    with pytest.raises(ValueError, match=r"^probs_or_preds of shape \(2, 2, 3\) \(N, K, \*spatial\) need labels of "
                                         r"shape \(2, 3\), got \(2,\)$"):
        mean_iou(torch.ones(2, 2, 3) / 2, y, 2)
    with pytest.raises(ValueError, match=r"^no samples to evaluate: every label equals ignore_index=255$"):
        mean_iou(torch.tensor([0, 1]), torch.tensor([255, 255]), 2, ignore_index=255)
    with pytest.raises(ValueError, match=r"^no samples to evaluate$"):
        mean_iou(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), 2)
    with pytest.raises(ValueError, match=r"^labels out of range: found 2, expected values in \[0, 1\]$"):
        mean_iou(torch.tensor([0, 1]), torch.tensor([0, 2]), 2)
    with pytest.raises(ValueError, match=r"^labels must hold integer class indices"):
        mean_iou(torch.tensor([0, 1]), torch.tensor([0.0, 1.0]), 2, ignore_index=255)
    with pytest.raises(ValueError, match=r"^predictions out of range: found 2, expected \[0, 1\]$"):
        mean_iou(torch.tensor([0, 2]), y, 2)
    with pytest.raises(ValueError, match=r"^predictions out of range: found -1, expected \[0, 1\]$"):
        mean_iou(torch.tensor([-1, 5]), y, 2)
    # the prediction of an ignored pixel is never checked
    assert mean_iou(torch.tensor([0, 7]), torch.tensor([0, 255]), 2, ignore_index=255).item() == 1.0


# ---------- pixels.py ----------
def test_is_dense_and_check_ignore_index():
    assert is_dense(torch.zeros(2, 3, 4)) and is_dense(torch.zeros(1, 2, 3, 4, 5))
    assert not is_dense(torch.zeros(2, 3)) and not is_dense(np.zeros((2, 3, 4)))
    assert check_ignore_index(None) is None and check_ignore_index(255) == 255 and check_ignore_index(-100) == -100
    for bad in (True, 255.0, "255"):
        with pytest.raises(ValueError, match=rf"^ignore_index must be an integer or None, got {bad!r}$"):
            check_ignore_index(bad)


def _dense_case():
    # (N=2, K=3, H=1, W=2) logits; pixel (n, w): logits[n, :, 0, w] = 10 n + w + (0, 1, 2)
    logits = torch.arange(2.0)[:, None, None, None] * 10 + torch.arange(2.0)[None, None, None, :] \
        + torch.arange(3.0)[None, :, None, None]
    targets = torch.tensor([[[2, 255]], [[0, 1]]])
    return logits, targets


def test_flatten_pixels_and_dense_rows_by_hand():
    logits, targets = _dense_case()
    flat, y, feats = flatten_pixels(logits, targets)
    assert flat.tolist() == [[0, 1, 2], [10, 11, 12], [11, 12, 13]] and y.tolist() == [2, 0, 1] and feats is None
    assert y.dtype == torch.int64
    rows, t, valid = dense_rows(logits, targets)
    assert rows.tolist() == [[0, 1, 2], [1, 2, 3], [10, 11, 12], [11, 12, 13]]
    assert t.tolist() == [2, 0, 0, 1] and valid.tolist() == [True, False, True, True]  # ignored: target 0
    rows, t, valid = dense_rows(logits, targets.clamp(max=2), ignore_index=None)
    assert t.tolist() == [2, 2, 0, 1] and valid.tolist() == [True] * 4 and valid.dtype == torch.bool
    # features at the same resolution follow the same pixels
    features = logits[:, :2] * -1
    flat, y, feats = flatten_pixels(logits, targets, features=features)
    assert feats.tolist() == [[0, -1], [-10, -11], [-11, -12]]
    assert feature_rows(features, logits).tolist() == [[0, -1], [-1, -2], [-10, -11], [-11, -12]]


def test_pixels_errors():
    logits, targets = _dense_case()
    with pytest.raises(ValueError, match=r"^scores must have shape \(N, K, H, W\) \(dense\), got \(2, 3\)$"):
        dense_rows(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), name="scores")
    with pytest.raises(ValueError, match=r"^logits must be a floating-point tensor, got dtype torch.int64$"):
        flatten_pixels(logits.long(), targets)
    for shape in ((0, 3, 1, 2), (2, 0, 1, 2), (2, 3, 0, 2), (2, 3, 1, 0)):
        with pytest.raises(ValueError, match=rf"^logits is empty: got shape {re_shape(shape)}$"):
            dense_rows(torch.zeros(shape), torch.zeros(shape[:1] + shape[2:], dtype=torch.long))
    bad = logits.clone()
    bad[0, 0, 0, 0], bad[1, 2, 0, 1] = float("nan"), float("-inf")
    with pytest.raises(ValueError, match=r"^logits contains 2 NaN or infinite value\(s\)$"):
        dense_rows(bad, targets)
    with trusted_inputs():  # values are not read: no error
        dense_rows(bad, targets)
    with pytest.raises(ValueError, match=r"^logits must have at least 2 classes \(K >= 2\) on axis 1, got K = 1$"):
        dense_rows(logits[:, :1], targets)
    with pytest.raises(ValueError, match=r"^targets must have shape \(2, 1, 2\) to match logits \(2, 3, 1, 2\), "
                                         r"got \(2, 2\)$"):
        dense_rows(logits, targets[:, 0])
    for t in (targets.float(), targets.bool(), targets.to(torch.complex64)):
        with pytest.raises(ValueError, match=rf"^targets must hold integer class indices, got dtype {t.dtype}$"):
            dense_rows(logits, t)
    with pytest.raises(ValueError, match=r"^targets out of range: found 255, expected values in \[0, 2\]$"):
        dense_rows(logits, targets, ignore_index=None)
    with pytest.raises(ValueError, match=r"^targets out of range: found 3, expected values in \[0, 2\] "
                                         r"or ignore_index=255$"):
        dense_rows(logits, torch.tensor([[[3, 255]], [[0, 1]]]))
    with pytest.raises(ValueError, match=r"^targets out of range: found -1, expected values in \[0, 2\]"):
        dense_rows(logits, torch.tensor([[[0, 255]], [[-1, 1]]]))
    with trusted_inputs():
        rows, t, valid = dense_rows(logits, torch.tensor([[[3, 255]], [[0, 1]]]))
        assert t.tolist() == [3, 0, 0, 1]
    assert dense_rows(logits, targets.clamp(max=2), ignore_index=None)[2].all()
    with pytest.raises(ValueError, match=r"^ignore_index must be an integer or None"):
        dense_rows(logits, targets, ignore_index=255.0)
    # features
    with pytest.raises(ValueError, match=r"^features must have shape \(N, D, \*S\) = \(2, D, 1, 2\) to match scores, "
                                         r"got \(2, 4, 2, 1\)$"):
        feature_rows(torch.zeros(2, 4, 2, 1), logits, name="scores")
    for f in (torch.zeros(1, 4, 1, 2), torch.zeros(2, 4, 2)):
        with pytest.raises(ValueError, match=r"^features must have shape"):
            flatten_pixels(logits, targets, features=f)
    with pytest.raises(ValueError, match=r"^features contains 1 NaN"):
        feature_rows(torch.tensor([[[[0.0, float("nan")]]], [[[0.0, 0.0]]]]), logits)
    with pytest.raises(ValueError, match=r"^features must be a floating-point tensor"):
        feature_rows(torch.zeros(2, 4, 1, 2, dtype=torch.long), logits)


def test_pixels_more_layouts_and_names():
    # one spatial axis and two classes are valid dense inputs
    logits = torch.tensor([[[1.0, -1.0, 0.5], [0.0, 2.0, 0.5]]])  # (N=1, K=2, L=3)
    rows, t, valid = dense_rows(logits, torch.tensor([[1, 255, 0]]))
    assert rows.tolist() == [[1, 0], [-1, 2], [0.5, 0.5]] and t.tolist() == [1, 0, 0]
    assert valid.tolist() == [True, False, True]
    # a single +inf (the minimum is finite) is caught
    bad = logits.clone()
    bad[0, 1, 2] = float("inf")
    with pytest.raises(ValueError, match=r"^logits contains 1 NaN or infinite value\(s\)$"):
        dense_rows(bad, torch.tensor([[1, 0, 0]]))
    # unconvertible inputs are named
    y = torch.tensor([[1, 0, 0]])
    with pytest.raises(ValueError, match=r"^scores must be numeric"):
        dense_rows(np.array([[["a"]]]), y, name="scores")
    with pytest.raises(ValueError, match=r"^targets must be numeric"):
        dense_rows(logits, np.array([["a", "b", "c"]]))
    with pytest.raises(ValueError, match=r"^features must be numeric"):
        feature_rows(np.array([[["a"]]]), logits)
    # the features' error names the logits argument, by default "logits"
    with pytest.raises(ValueError, match=r"^features must have shape \(N, D, \*S\) = \(1, D, 3\) to match logits, "
                                         r"got \(1, 4, 2\)$"):
        feature_rows(torch.zeros(1, 4, 2), logits)
    with pytest.raises(ValueError, match=r"to match scores, got \(1, 4, 2\)$"):
        flatten_pixels(logits, y, features=torch.zeros(1, 4, 2), name="scores")


def test_dense_rows_move_targets_to_the_logits_device():
    logits = torch.zeros(2, 3, 4, 4, device="meta")
    with trusted_inputs():  # no value can be read on the meta device
        rows, t, valid = dense_rows(logits, torch.zeros(2, 4, 4, dtype=torch.long))
    assert rows.shape == (32, 3) and t.device.type == valid.device.type == "meta"


def re_shape(shape):
    return str(tuple(shape)).replace("(", r"\(").replace(")", r"\)")


def test_flatten_pixels_gradient_reaches_only_valid_pixels():
    logits, targets = _dense_case()
    logits.requires_grad_(True)
    flat, y, _ = flatten_pixels(logits, targets)
    flat.sum().backward()
    assert logits.grad[0, :, 0, 1].abs().sum() == 0 and logits.grad[0, :, 0, 0].tolist() == [1, 1, 1]


# ---------- inputs.py ----------
def test_to_rows_binary_layout():
    p = torch.tensor([0.2, 0.5, 0.9], dtype=torch.float64)
    r = to_rows(p, torch.tensor([0, 1, 1]))
    assert r.binary and not r.dense and r.valid is None
    assert r.probs.tolist() == [[0.8, 0.2], [0.5, 0.5], [pytest.approx(0.1), 0.9]]
    assert r.probs.dtype == torch.float64
    with pytest.raises(ValueError, match=r"^1-D scores \(binary: positive-class probabilities, shape \(3,\)\) need "
                                         r"labels of shape \(3,\), got \(2,\)$"):
        to_rows(p, torch.tensor([0, 1]), name="scores")
    with pytest.raises(ValueError, match=r"need labels of shape \(3,\), got \(3, 1\)$"):
        to_rows(p, torch.tensor([[0], [1], [1]]))
    with pytest.raises(ValueError, match=r"^probs must be a floating-point tensor, got dtype torch.int64$"):
        to_rows(torch.tensor([0, 1, 1]), torch.tensor([0, 1, 1]))
    with pytest.raises(ValueError, match=r"^scores has entries outside \[0, 1\]"):
        to_rows(torch.tensor([0.2, 1.5]), torch.tensor([0, 1]), name="scores")
    with pytest.raises(ValueError, match=r"^probs has entries outside \[0, 1\]"):
        to_rows(torch.tensor([-0.1, 0.5]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"^probs contains NaN"):
        to_rows(torch.tensor([float("nan"), 0.5]), torch.tensor([0, 1]))
    # 0 and 1 are valid; an empty vector is not checked here
    assert to_rows(torch.tensor([0.0, 1.0]), torch.tensor([0, 1])).probs.tolist() == [[1, 0], [0, 1]]
    assert to_rows(torch.zeros(0), torch.zeros(0, dtype=torch.long)).probs.shape == (0, 2)
    # on another device the values are left to the caller's deferred check
    meta = to_rows(torch.full((2,), 3.0, device="meta"), torch.zeros(2, dtype=torch.long, device="meta"))
    assert meta.probs.shape == (2, 2) and meta.binary


def test_to_rows_dense_and_ignore_index():
    probs = torch.arange(12.0).reshape(1, 3, 2, 2)  # pixel (h, w) row: [2h + w, 4 + 2h + w, 8 + 2h + w]
    labels = torch.tensor([[[0, 255], [2, 1]]])
    r = to_rows(probs, labels)
    assert r.dense and not r.binary and r.valid is None
    assert r.probs.tolist() == [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]] and r.labels.tolist() == [0, 255, 2, 1]
    c = to_rows(probs, labels, ignore_index=255)
    assert c.valid is None and c.labels.tolist() == [0, 2, 1]
    assert c.probs.tolist() == [[0, 4, 8], [2, 6, 10], [3, 7, 11]]
    m = to_rows(probs, labels, ignore_index=255, compact=False)
    assert m.probs.tolist() == r.probs.tolist() and m.labels.tolist() == [0, 0, 2, 1]
    assert m.valid.tolist() == [True, False, True, True] and m.dense
    flat = torch.tensor([[0.6, 0.4], [0.3, 0.7], [0.5, 0.5]], dtype=torch.float64)
    y = torch.tensor([1, -100, 0])
    c = to_rows(flat, y, ignore_index=-100)
    assert c.probs.tolist() == [[0.6, 0.4], [0.5, 0.5]] and c.labels.tolist() == [1, 0] and not c.dense
    m = to_rows(flat, y, ignore_index=-100, compact=False)
    assert m.probs is flat and m.labels.tolist() == [1, 0, 0] and m.valid.tolist() == [True, False, True]
    # compact defaults to the device: removed on the CPU, a mask elsewhere
    d = to_rows(flat.to("meta"), y.to("meta"), ignore_index=-100)
    assert d.valid is not None and d.probs.shape == (3, 2)
    # binary with ignore_index
    b = to_rows(torch.tensor([0.2, 0.9, 0.4]), torch.tensor([1, 7, 0]), ignore_index=7)
    assert b.binary and b.labels.tolist() == [1, 0] and b.probs[:, 1].tolist() == pytest.approx([0.2, 0.4])
    b = to_rows(torch.tensor([0.2, 0.9, 0.4]), torch.tensor([1, 7, 0]), ignore_index=7, compact=False)
    assert b.binary is True and not b.dense and b.valid.tolist() == [True, False, True]


def test_to_rows_one_spatial_axis():
    # (N, K, L): dense with a single spatial axis
    probs = torch.tensor([[[0.9, 0.2, 0.5], [0.1, 0.8, 0.5]]], dtype=torch.float64)  # N=1, K=2, L=3
    r = to_rows(probs, torch.tensor([[0, 1, 1]]))
    assert r.dense and r.probs.tolist() == [[0.9, 0.1], [0.2, 0.8], [0.5, 0.5]] and r.labels.tolist() == [0, 1, 1]
    m = to_rows(probs, torch.tensor([[0, 9, 1]]), ignore_index=9, compact=False)
    assert m.dense and m.valid.tolist() == [True, False, True] and m.labels.tolist() == [0, 0, 1]


def test_to_rows_errors():
    probs = torch.full((1, 3, 2, 2), 1 / 3)
    with pytest.raises(ValueError, match=r"^dense scores of shape \(1, 3, 2, 2\) \(N, K, \*spatial\) need labels of "
                                         r"shape \(1, 2, 2\), got \(4,\) \(binary maps: pass 1-D positive-class "
                                         r"probabilities and labels, e.g. probs.flatten\(\), labels.flatten\(\)\)$"):
        to_rows(probs, torch.zeros(4, dtype=torch.long), name="scores")
    with pytest.raises(ValueError, match=r"^labels must hold integer class indices, got dtype torch.float32$"):
        to_rows(probs, torch.zeros(1, 2, 2), ignore_index=255)
    for lab in (torch.zeros(1, 2, 2, dtype=torch.bool), torch.zeros(1, 2, 2, dtype=torch.complex64)):
        with pytest.raises(ValueError, match=r"^labels must hold integer class indices"):
            to_rows(probs, lab, ignore_index=255)
    # (N, K) with ignore_index: the labels' shape is checked before the mask indexes the rows
    flat = torch.full((3, 2), 0.5)
    with pytest.raises(ValueError, match=r"^labels has 2 entries but the predictions have 3 rows$"):
        to_rows(flat, torch.tensor([0, 1]), ignore_index=-100)
    with pytest.raises(ValueError, match=r"^labels must have shape \(N,\), got \(3, 1\)$"):
        to_rows(flat, torch.zeros(3, 1, dtype=torch.long), ignore_index=-100)
    # a 0-dim input gets the layout error, with or without ignore_index
    with pytest.raises(ValueError, match=r"^probs must have shape \(N, K\), got \(\)$"):
        to_rows(torch.tensor(0.5), torch.tensor([0]), ignore_index=9)
    # without ignore_index the labels are left to the caller (a float label passes here)
    assert to_rows(flat, torch.zeros(3)).labels.dtype == torch.float32
    # unconvertible inputs are named
    with pytest.raises(ValueError, match=r"^scores must be numeric"):
        to_rows(np.array(["a", "b"]), torch.tensor([0, 1]), name="scores")
    with pytest.raises(ValueError, match=r"^labels must be numeric"):
        to_rows(flat, np.array(["a", "b", "c"]))
    with pytest.raises(ValueError, match=r"^labels: cannot convert"):
        to_rows(flat, ["a", "b", "c"])
    # numpy input, converted
    r = to_rows(np.full((2, 2), 0.5), np.array([0, 1]))
    assert isinstance(r.probs, torch.Tensor) and r.probs.dtype == torch.float64
