"""The example programs under examples/ run in their quick mode and do what they say."""

import importlib.util
import os

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_example(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "examples", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.usefixtures("one_thread")
def test_csm_own_data_example_quick():
    pytest.importorskip("diffusers")
    pytest.importorskip("sklearn")
    res = _load_example("csm_own_data").main(["--quick"])
    mixes = res["mixes"]
    n = 45 * 8  # every class pair once, 8 images per group
    assert mixes["images"].shape == (n, 1, 8, 8) and mixes["images"].dtype == torch.uint8
    soft = mixes["soft_labels"]
    rows = torch.arange(n)
    # Each soft label is a two-class distribution on the image's own pair (c1, c2).
    assert torch.allclose(soft.sum(1), torch.ones(n), atol=1e-6)
    assert torch.allclose(soft[rows, mixes["c1"]] + soft[rows, mixes["c2"]], torch.ones(n), atol=1e-6)
    for name in ("cross-entropy", "CSM"):
        m = res[name]
        assert 0.5 < m["acc"] <= 1 and 0 <= m["ece"] <= 1  # 10 classes: trained, far above chance
