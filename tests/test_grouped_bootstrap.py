"""``calibkit.grouped_bootstrap``: the image-level paired bootstrap of a pixel ECE difference,
against a resampling written out pixel by pixel, and its input checks."""

import numpy as np
import pytest
import torch

from calibkit.functional import ece
from calibkit.grouped_bootstrap import paired_grouped_ece_diff


def _pixels(seed=0, p=90, k=3, g=6):
    gen = torch.Generator().manual_seed(seed)
    pa = torch.rand(p, k, generator=gen, dtype=torch.float64).softmax(1)
    pb = (3 * torch.rand(p, k, generator=gen, dtype=torch.float64)).softmax(1)
    labels = torch.randint(0, k, (p,), generator=gen)
    groups = torch.randint(0, g, (p,), generator=gen) * 7 + 100  # any integers name the images
    return pa, pb, labels, groups


def test_samples_equal_the_ece_difference_of_the_drawn_images_pixels():
    pa, pb, labels, groups = _pixels()
    res = paired_grouped_ece_diff(pa, pb, labels, groups, n_bins=10, n_resamples=5, seed=4)
    names = np.unique(groups.numpy())
    assert res["groups"] == len(names)
    assert res["estimate"] == pytest.approx(float(ece(pa, labels, 10) - ece(pb, labels, 10)), abs=1e-12)
    rng = np.random.default_rng(4)
    for r in range(5):
        drawn = names[rng.integers(0, len(names), size=len(names))]
        idx = torch.cat([torch.nonzero(groups == int(n)).flatten() for n in drawn])  # each draw keeps all its pixels
        want = float(ece(pa[idx], labels[idx], 10) - ece(pb[idx], labels[idx], 10))
        assert float(res["samples"][r]) == pytest.approx(want, abs=1e-12), r


def test_defaults_are_15_bins_1000_resamples_and_seed_0():
    pa, pb, labels, groups = _pixels(1)
    res = paired_grouped_ece_diff(pa, pb, labels, groups)
    assert res["samples"].shape == (1000,) and res["samples"].dtype == torch.float64
    assert torch.equal(res["samples"], paired_grouped_ece_diff(pa, pb, labels, groups, 15, 1000, 0)["samples"])
    assert not torch.equal(res["samples"], paired_grouped_ece_diff(pa, pb, labels, groups, seed=1)["samples"])
    assert res["estimate"] == pytest.approx(float(ece(pa, labels, 15) - ece(pb, labels, 15)), abs=1e-12)


def test_shapes_are_checked_one_by_one():
    pa, pb, labels, groups = _pixels(2, p=12)
    with pytest.raises(ValueError) as err:
        paired_grouped_ece_diff(pa, pb[:, :2], labels, groups)
    assert str(err.value) == "need probs (P, K) twice, labels (P,) and groups (P,), got (12, 3), (12, 2), (12,), (12,)"
    for args in ((pa[:, 0], pb[:, 0], labels, groups), (pa, pb, labels[:11], groups), (pa, pb, labels, groups[:11])):
        with pytest.raises(ValueError, match="need probs"):
            paired_grouped_ece_diff(*args)


def test_no_pixels_is_refused_and_one_pixel_is_enough():
    with pytest.raises(ValueError) as err:
        paired_grouped_ece_diff(torch.ones(0, 3) / 3, torch.ones(0, 3) / 3, torch.zeros(0), torch.zeros(0))
    assert str(err.value) == "no pixels to compare"
    res = paired_grouped_ece_diff(torch.tensor([[0.8, 0.2]]), torch.tensor([[0.6, 0.4]]), torch.tensor([0]),
                                  torch.tensor([5]), n_resamples=3)
    assert res["estimate"] == pytest.approx(0.2 - 0.4) and res["groups"] == 1
    assert torch.allclose(res["samples"], torch.full((3,), -0.2, dtype=torch.float64))
