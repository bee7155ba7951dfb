"""``calibkit.integrations.torchmetrics.CalibrationMetric``: its argument checks, empty batches, the
reductions torchmetrics applies when it syncs (checked in-process with a stand-in gather), and the
device path's deferred checks and weights (forced on the CPU). The two-process gloo run is in
test_integrations.py."""

import pytest
import torch

from calibkit.functional import panel as P
from calibkit.metrics import PANEL, evaluate

pytest.importorskip("torchmetrics")
from calibkit.integrations.torchmetrics import CalibrationMetric  # noqa: E402


def _data(seed, n=300, k=5):
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(n, k, generator=g, dtype=torch.float64) * 2, 1)
    return probs, torch.randint(0, k, (n,), generator=g)


def _assert_panel(got, ref, keys=PANEL):
    for key in keys:
        assert got[key].item() == pytest.approx(ref[key], abs=1e-12), key


@pytest.mark.parametrize("bad", [1, 0, True, 3.0, 2.5, "3", None])
def test_num_classes_must_be_an_integer_of_at_least_two(bad):
    with pytest.raises(ValueError, match=rf"^num_classes must be an integer >= 2, got {bad!r}$"):
        CalibrationMetric(num_classes=bad)
    assert CalibrationMetric(num_classes=2).num_classes == 2


def test_dense_inputs_without_dense_are_refused_with_the_reason():
    probs = torch.softmax(torch.randn(2, 3, 4, 4, dtype=torch.float64), 1)
    with pytest.raises(ValueError) as err:
        CalibrationMetric(num_classes=3).update(probs, torch.zeros(2, 4, 4, dtype=torch.long))
    assert str(err.value) == ("dense inputs (N, K, *spatial) need CalibrationMetric(..., dense=True), whose memory "
                              "does not grow with the number of pixels")


@pytest.mark.filterwarnings("ignore:The ``compute`` method of metric")
def test_a_batch_of_ignored_labels_adds_nothing_and_nothing_seen_is_named():
    probs, labels = _data(0)
    m = CalibrationMetric(num_classes=5, ignore_index=-1)
    with pytest.raises(ValueError, match=r"^no samples accumulated \(N = 0\)"):
        m.compute()  # nothing seen at all
    m.update(probs[:10], torch.full((10,), -1))  # every label ignored: no error, no change
    with pytest.raises(ValueError, match=r"^no samples accumulated \(N = 0\)"):
        m.compute()
    m.update(probs, labels)
    _assert_panel(m.compute(), evaluate(probs, labels))


@pytest.mark.parametrize("dense", [False, True])
def test_sync_reduces_each_state_as_the_union_of_the_processes(dense):
    # a stand-in for torch.distributed: two processes that saw the same batches
    kw = dict(dist_sync_fn=lambda t, group=None: [t, t.clone()], distributed_available_fn=lambda: True)
    probs, labels = _data(1)
    if dense:  # (N, K, H, W) pixels
        probs, labels = probs.reshape(12, 5, 5, 5).movedim(-1, 1).contiguous(), labels.reshape(12, 5, 5)
    m = CalibrationMetric(num_classes=5, dense=dense, **kw)
    m.update(probs[:7], labels[:7])
    m.update(probs[7:], labels[7:])
    got = m.compute()
    both = evaluate(torch.cat([probs, probs]), torch.cat([labels, labels]))
    _assert_panel(got, both, ("acc", "ece", "cece", "nll", "brier", "miou") if dense else PANEL)


def test_device_path_defers_the_value_checks_and_weights_the_ignored_rows(monkeypatch):
    monkeypatch.setattr(P, "_FORCE_TORCH_PATH", True)
    probs, labels = _data(2)
    labels = labels.clone()
    labels[::4] = -1
    keep = labels != -1
    m = CalibrationMetric(num_classes=5, ignore_index=-1)
    for p, y in zip(probs.split(100), labels.split(100)):
        m.update(p, y)
    _assert_panel(m.compute(), evaluate(probs[keep], labels[keep]))  # AECE too: ignored rows weigh 0
    bad = probs.clone()
    bad[3] = bad[3] * 1.5  # a row that does not sum to one: found when the results are read
    m.reset()
    m.update(probs[:50], labels[:50])
    m.update(bad[:50], labels[:50])
    with pytest.raises(ValueError, match="sum to 1"):
        m.compute()
