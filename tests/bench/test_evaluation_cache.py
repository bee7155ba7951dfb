"""The bench's evaluation sets: the cached corrupted sets give the very floats of fresh ones."""

import torch

from calibkit.bench.evaluation import EvalData, robustness_metrics
from calibkit.bench.grid import get_preset, with_overrides
from calibkit.data import load
from calibkit.data.corruptions import CORRUPTIONS


def test_cached_corrupted_sets_keep_the_fresh_order_and_means(tmp_path):
    assert list(CORRUPTIONS) != sorted(CORRUPTIONS)  # else the order could not differ
    bundle = load("digits", seed=0, val_size=100)
    preset = with_overrides(get_preset("smoke"), dataset="digits", robust_n=60)
    fresh = EvalData(preset, bundle, tmp_path).corrupted()
    cached = EvalData(preset, bundle, tmp_path).corrupted()  # read back from tmp_path
    assert list(cached) == list(fresh) == [f"{c}/{s}" for c in CORRUPTIONS for s in preset.severities]
    assert all(torch.equal(fresh[k], cached[k]) for k in fresh)
    w = torch.randn(bundle.test.images[0].numel(), 10, generator=torch.Generator().manual_seed(0))
    predict = lambda x: x.flatten(1).double() @ w.double() / 255  # noqa: E731
    labels = bundle.test.labels[EvalData(preset, bundle).robust_index()]
    assert robustness_metrics(predict, fresh, labels, 1.3) == robustness_metrics(predict, cached, labels, 1.3)
