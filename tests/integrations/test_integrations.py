"""The torchmetrics adapter (equal to evaluate, synced under two gloo processes) and the Hugging
Face compute_metrics (skipped when the library is missing)."""

import os
import subprocess
import sys

import pytest
import torch

from calibkit.metrics import PANEL, evaluate
from tests.helpers.gloo import on_two_processes

tm = pytest.importorskip("torchmetrics")
from calibkit.integrations.torchmetrics import CalibrationMetric  # noqa: E402


def _data(seed, n=900, k=6):
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(n, k, generator=g, dtype=torch.float64) * 2.5, 1)
    return probs, torch.randint(0, k, (n,), generator=g)


def test_metric_equals_evaluate_and_resets():
    probs, labels = _data(0)
    m = CalibrationMetric(num_classes=6)
    for p, y in zip(probs.split(250), labels.split(250)):
        m.update(p, y)
    got, ref = m.compute(), evaluate(probs, labels)
    assert tuple(got) == PANEL
    for key in PANEL:
        assert got[key].item() == pytest.approx(ref[key], abs=1e-12), key
    m.reset()
    m.update(probs[:100], labels[:100])
    assert m.compute()["ece"].item() == pytest.approx(evaluate(probs[:100], labels[:100])["ece"], abs=1e-12)


def test_metric_binary_and_dense():
    g = torch.Generator().manual_seed(1)
    p = torch.rand(300, generator=g, dtype=torch.float64)
    y = torch.bernoulli(p, generator=g).long()
    m = CalibrationMetric(num_classes=2)
    m.update(p, y)
    assert m.compute()["ece"].item() == pytest.approx(evaluate(torch.stack([1 - p, p], 1), y)["ece"], abs=1e-12)
    probs = torch.softmax(torch.randn(2, 3, 5, 5, generator=g, dtype=torch.float64), 1)
    labels = torch.randint(0, 3, (2, 5, 5), generator=g)
    with pytest.raises(ValueError, match="dense=True"):
        m3 = CalibrationMetric(num_classes=3)
        m3.update(probs, labels)
    md = CalibrationMetric(num_classes=3, dense=True, ignore_index=255)
    md.update(probs, labels)
    ref = evaluate(probs, labels, ignore_index=255)
    for key in ("ece", "cece", "nll", "miou"):
        assert md.compute()[key].item() == pytest.approx(ref[key], abs=1e-12)
    with pytest.raises(ValueError, match="num_classes=3"):
        md.update(torch.softmax(torch.randn(4, 5, generator=g), 1), torch.zeros(4, dtype=torch.long))


def test_metric_leaves_out_ignored_samples_and_pixels():
    probs, labels = _data(4, n=400)
    labels = labels.clone()
    labels[::7] = -1
    keep = labels != -1
    m = CalibrationMetric(num_classes=6, ignore_index=-1)
    for p, y in zip(probs.split(150), labels.split(150)):
        m.update(p, y)
    got, ref = m.compute(), evaluate(probs[keep], labels[keep])  # the same as dropping the rows
    for key in PANEL:
        assert got[key].item() == pytest.approx(ref[key], abs=1e-12), key
    g = torch.Generator().manual_seed(5)
    dense = torch.softmax(torch.randn(3, 4, 6, 6, generator=g, dtype=torch.float64) * 2, 1)
    masks = torch.randint(0, 4, (3, 6, 6), generator=g)
    masks[:, :2] = 255
    md = CalibrationMetric(num_classes=4, dense=True, ignore_index=255)
    md.update(dense[:2], masks[:2])
    md.update(dense[2:], masks[2:])
    rows, ys = dense.movedim(1, -1).reshape(-1, 4), masks.reshape(-1)
    flat = evaluate(rows[ys != 255], ys[ys != 255])
    for key in ("acc", "ece", "cece", "mce", "nll", "brier"):
        assert md.compute()[key].item() == pytest.approx(flat[key], abs=1e-12), key


def _shard(rank, probs, labels):
    m = CalibrationMetric(num_classes=probs.shape[1])
    lo, hi = (0, 650) if rank == 0 else (650, len(labels))  # uneven shards
    for p, y in zip(probs[lo:hi].split(200), labels[lo:hi].split(200)):
        m.update(p, y)
    return {k: v.item() for k, v in m.compute().items()}  # torchmetrics syncs in compute


def test_metric_syncs_under_two_gloo_processes():
    probs, labels = _data(2)
    results = on_two_processes(_shard, probs, labels)
    ref = evaluate(probs, labels)
    for rank in (0, 1):
        for key in PANEL:
            assert results[rank][key] == pytest.approx(ref[key], abs=1e-12), (rank, key)


def test_missing_torchmetrics_gives_a_clear_import_error(tmp_path):
    blocker = tmp_path / "torchmetrics.py"
    blocker.write_text("raise ImportError('no torchmetrics here')\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), root]))
    r = subprocess.run([sys.executable, "-c", "import calibkit.integrations.torchmetrics"], env=env,
                       capture_output=True, text=True)
    assert r.returncode != 0 and "pip install 'calibkit[integrations]'" in r.stderr
    r = subprocess.run([sys.executable, "-c", "import calibkit.metrics, calibkit.integrations.huggingface"], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr  # nothing else needs torchmetrics


def test_hf_compute_metrics_layouts():
    transformers = pytest.importorskip("transformers")
    from calibkit.integrations.huggingface import compute_metrics, make_compute_metrics

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(200, 4, generator=g, dtype=torch.float64) * 2
    labels = torch.randint(0, 4, (200,), generator=g)
    pred = transformers.EvalPrediction(predictions=logits.numpy(), label_ids=labels.numpy())
    cm = make_compute_metrics()  # the module's compute_metrics is this, built at import
    assert compute_metrics(pred) == cm(pred) == evaluate(torch.softmax(logits, 1), labels)
    # with the inputs kept (a 3-field EvalPrediction), and a tuple of outputs (logits, hidden states)
    # and of labels: the first of each is used
    with_inputs = transformers.EvalPrediction(predictions=logits.numpy(), label_ids=labels.numpy(),
                                              inputs=logits.numpy())
    assert cm(with_inputs) == cm(pred)
    hidden = torch.randn(200, 4, generator=g, dtype=torch.float64).numpy()
    assert cm(((logits.numpy(), hidden), (labels.numpy(), (labels.numpy() + 1) % 4))) == cm(pred)
    # one-logit binary head, (N, 1) or (N,): sigmoid, scored as binary
    z, yb = logits[:, 0], labels % 2
    ref = evaluate(torch.sigmoid(z), yb)
    assert cm(transformers.EvalPrediction(predictions=z[:, None].numpy(), label_ids=yb.numpy())) == ref
    assert cm((z.numpy(), yb.numpy())) == ref
    # token classification (N, T, K) with -100 on padding
    tok = torch.randn(5, 7, 3, generator=g, dtype=torch.float64)
    tl = torch.randint(0, 3, (5, 7), generator=g)
    tl[:, 5:] = -100
    keep = tl != -100
    ref = evaluate(torch.softmax(tok[keep], 1), tl[keep])
    got = cm(transformers.EvalPrediction(predictions=tok.numpy(), label_ids=tl.numpy()))
    for key in PANEL:
        assert got[key] == pytest.approx(ref[key], abs=1e-12)
    # dense (N, K, H, W): classes at dim 1
    dense = torch.randn(2, 3, 4, 4, generator=g, dtype=torch.float64)
    masks = torch.randint(0, 3, (2, 4, 4), generator=g)
    want = evaluate(torch.softmax(dense.movedim(1, -1).reshape(-1, 3), 1), masks.reshape(-1))
    got = cm((dense.numpy(), masks.numpy()))
    for key in ("acc", "ece", "nll", "brier"):
        assert got[key] == pytest.approx(want[key], abs=1e-12), key
    assert "miou" in got and set(make_compute_metrics(n_bins=5)(pred)) == set(PANEL)
    # n_bins reaches the binned metrics
    five = make_compute_metrics(n_bins=5)(pred)
    assert five == evaluate(torch.softmax(logits, 1), labels, n_bins=5)
    assert five["ece"] != compute_metrics(pred)["ece"] and five["nll"] == compute_metrics(pred)["nll"]
    # ignore_index=None keeps every label; another ignore label is left out
    some = labels.clone()
    some[:30] = 7
    seven = make_compute_metrics(ignore_index=7)(transformers.EvalPrediction(predictions=logits.numpy(),
                                                                             label_ids=some.numpy()))
    assert seven == evaluate(torch.softmax(logits[30:], 1), labels[30:])
    assert make_compute_metrics(ignore_index=None)(pred) == compute_metrics(pred)
