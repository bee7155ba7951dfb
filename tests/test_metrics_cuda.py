"""The metric panel on a CUDA device: equal to the CPU, and ``update`` free of host
synchronisation (``torch.cuda.set_sync_debug_mode("error")`` raises on any). Skipped without a GPU."""

import pytest
import torch

import calibkit.functional as F
from calibkit.metrics import PANEL, CalibrationAccumulator, evaluate

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _data(seed, n=20000, k=30, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, k, generator=g) * 3
    return torch.softmax(logits, 1).to(dtype), torch.randint(0, k, (n,), generator=g)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_evaluate_on_cuda_equals_cpu(dtype):
    probs, labels = _data(0, dtype=dtype)
    ref = evaluate(probs, labels)
    got = evaluate(probs.cuda(), labels.cuda())
    for key in PANEL:  # float32 column totals are grouped in another order on the device
        assert got[key] == pytest.approx(ref[key], abs=1e-9 if dtype == torch.float64 else 1e-6), key


def test_functional_metrics_on_cuda_equal_cpu():
    probs, labels = _data(1, n=3000, k=7, dtype=torch.float64)
    for fn in (F.ece, F.adaptive_ece, F.classwise_ece, F.mce, F.rmsce, F.accuracy, F.nll, F.brier):
        got = fn(probs.cuda(), labels.cuda())
        assert got.device.type == "cuda"
        assert got.item() == pytest.approx(fn(probs, labels).item(), abs=1e-10), fn.__name__
    with pytest.raises(ValueError, match="sum to 1"):
        F.ece(torch.rand(10, 3).cuda(), torch.zeros(10, dtype=torch.long).cuda())


@pytest.mark.parametrize("state", ["exact", "fixed"])
def test_accumulator_update_never_waits_for_the_device(state):
    g = torch.Generator().manual_seed(2)
    batches = []
    for _ in range(4):
        probs = torch.softmax(torch.randn(2, 6, 16, 16, generator=g) * 3, 1)
        labels = torch.randint(0, 6, (2, 16, 16), generator=g)
        labels[torch.rand(2, 16, 16, generator=g) < 0.2] = 255
        batches.append((probs, labels))
    cpu = CalibrationAccumulator(ignore_index=255, state=state)
    for p, y in batches:
        cpu.update(p, y)
    dev = CalibrationAccumulator(ignore_index=255, state=state)
    gpu_batches = [(p.cuda(), y.cuda()) for p, y in batches]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for p, y in gpu_batches:
            dev.update(p, y)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    ref, got = cpu.compute(), dev.compute()
    for key in ref:
        assert got[key] == pytest.approx(ref[key], abs=1e-6), key


def test_deferred_check_on_cuda():
    acc = CalibrationAccumulator()
    acc.update(torch.tensor([[0.9, 0.3]]).cuda(), torch.tensor([0]).cuda())
    with pytest.raises(ValueError, match="sum to 1"):
        acc.compute()


def test_torchmetrics_metric_on_cuda():
    pytest.importorskip("torchmetrics")
    from calibkit.integrations.torchmetrics import CalibrationMetric

    probs, labels = _data(3, dtype=torch.float64)
    m = CalibrationMetric(num_classes=30).cuda()
    for p, y in zip(probs.split(5000), labels.split(5000)):
        m.update(p.cuda(), y.cuda())
    ref = evaluate(probs, labels)
    got = m.compute()
    for key in PANEL:
        assert got[key].item() == pytest.approx(ref[key], abs=1e-9), key
