"""Segmentation pieces of the trainer, data and report: input pipeline, pixel samples, accounting,
checkpoint policy, nested scene subsets and the image-level bootstrap."""

import numpy as np
import pytest
import torch

from calibkit.data.inputs import INPUTS, SegmentationInputs
from tests.helpers.formats import fake_fmnist
def test_segmentation_inputs_move_masks_and_pad_void(gen):
    x = torch.randint(0, 256, (5, 1, 12, 12), dtype=torch.uint8, generator=gen)
    y = torch.randint(0, 4, (5, 12, 12), dtype=torch.uint8, generator=gen)
    pipe = SegmentationInputs([0.5], [0.25], crop_pad=3, hflip=True)
    assert INPUTS["segmentation"] is SegmentationInputs and pipe.dense
    xs, ys = pipe.train_batch(x, y, torch.Generator().manual_seed(1))
    assert xs.shape == (5, 1, 12, 12) and xs.dtype == torch.float32 and ys.shape == (5, 12, 12)
    assert (ys == 255).any() and set(torch.unique(ys).tolist()) <= {0, 1, 2, 3, 255}
    # evaluation: normalisation only, targets untouched
    torch.testing.assert_close(pipe.eval_batch(x), (x.float() / 255 - 0.5) / 0.25)
    info_pipe = SegmentationInputs.from_info({"mean": [0.5], "std": [0.25], "ignore_index": 7})
    assert info_pipe.ignore_index == 7 and info_pipe.crop_pad == 0 and not info_pipe.hflip


def test_image_level_methods_are_refused_for_segmentation():
    from calibkit.config import TrainConfig
    from calibkit.losses import build
    from calibkit.train.steps import build_step

    pipe = SegmentationInputs([0.5], [0.25])
    for method in ("mixup", "regmixup", "csm"):
        cfg = TrainConfig(method=method, loss="ce")
        with pytest.raises(ValueError, match="segmentation trains with method 'standard'"):
            build_step(cfg, build("ce"), 3, pipe, 0)


def test_training_accuracy_counts_labelled_pixels():
    from calibkit.train.steps import EpochSums

    sums = EpochSums(2, "cpu")
    logits = torch.zeros(2, 3, 2, 2)
    logits[:, 1] = 1.0  # predicts class 1 everywhere
    target = torch.tensor([[[1, 255], [0, 1]], [[255, 255], [1, 2]]])
    sums.add(0, torch.tensor(0.5), logits, target)
    loss_sum, correct, seen, first_bad, _ = sums.read()
    assert seen == 5 and correct == 3 and first_bad == -1  # 5 labelled pixels, 3 of them class 1
    assert loss_sum == pytest.approx(0.5 * 5)
    sums.add(1, torch.tensor(0.25), logits[:1], target[:1])  # 3 labelled pixels, 2 of class 1
    loss_sum, correct, seen, _, _ = sums.read()
    assert (seen, correct) == (8, 5) and loss_sum == pytest.approx(0.5 * 5 + 0.25 * 3)


def test_keep_best_miou():
    from calibkit.train.keep import Keeper

    k = Keeper("best-miou")
    assert [k.offer(e, {"val_miou": v}) for e, v in enumerate([0.2, 0.5, 0.4], start=1)] == [True, True, False]
    assert k.epoch == 2


def test_sample_positions_are_labelled_sorted_and_fixed(gen):
    from calibkit.train.dense import sample_positions

    masks = torch.randint(0, 3, (4, 6, 7), generator=gen)
    masks[masks == 2] = 255
    masks[3] = 255  # an image without labelled pixels
    pos = sample_positions(masks, 10, 255)
    assert pos.shape == (4, 10) and torch.equal(pos, sample_positions(masks, 10, 255))
    for i in range(4):
        p = pos[i][pos[i] >= 0]
        labelled = (masks[i].reshape(-1) != 255).sum().item()
        assert len(p) == min(10, labelled) and (masks[i].reshape(-1)[p] != 255).all()
        assert (p.diff() > 0).all() and (pos[i][len(p):] == -1).all()
    every = sample_positions(masks, 100, 255)  # more than there are: every labelled pixel once
    assert sorted(every[0][every[0] >= 0].tolist()) == torch.nonzero(masks[0].reshape(-1) != 255).squeeze(1).tolist()


def test_scene_subsets_are_nested(tmp_path):
    from calibkit.data import load

    fake_fmnist(str(tmp_path), n_train=60, n_test=12)
    small = load("scenes", data_dir=str(tmp_path), seed=2, val_size=4, train_subset=5)
    large = load("scenes", data_dir=str(tmp_path), seed=2, val_size=4, train_subset=9)
    assert torch.equal(small.train.images, large.train.images[:5]) and torch.equal(small.train.labels, large.train.labels[:5])
    assert torch.equal(small.val.labels, large.val.labels) and small.split["train_subset"] == 5
    with pytest.raises(ValueError, match="train_subset"):
        load("scenes", data_dir=str(tmp_path), train_subset=4001)


def test_grouped_bootstrap_estimate_and_pairing(gen):
    from calibkit.functional import ece
    from calibkit.grouped_bootstrap import paired_grouped_ece_diff

    n, k = 600, 4
    pa = torch.softmax(torch.randn(n, k, generator=gen, dtype=torch.float64) * 3, 1)
    pb = torch.softmax(torch.randn(n, k, generator=gen, dtype=torch.float64), 1)
    labels = torch.randint(0, k, (n,), generator=gen)
    groups = torch.arange(n) // 20  # 30 images of 20 pixels
    res = paired_grouped_ece_diff(pa, pb, labels, groups, n_resamples=200, seed=3)
    assert res["groups"] == 30 and res["samples"].shape == (200,)
    assert res["estimate"] == pytest.approx(float(ece(pa, labels) - ece(pb, labels)), abs=1e-12)
    same = paired_grouped_ece_diff(pa, pa, labels, groups, n_resamples=50)
    assert same["estimate"] == 0 and (same["samples"] == 0).all()
    # a resample is a multiset of whole images: with every image drawn once it is the full estimate,
    # so re-deriving one resample by hand from its image counts gives the reported value
    rng = np.random.default_rng(3)
    counts = np.bincount(rng.integers(0, 30, size=30), minlength=30)
    w = torch.from_numpy(counts[groups.numpy()]).double()
    idx = torch.repeat_interleave(torch.arange(n), w.long())
    by_hand = float(ece(pa[idx], labels[idx]) - ece(pb[idx], labels[idx]))
    assert float(res["samples"][0]) == pytest.approx(by_hand, abs=1e-12)


def test_model_and_data_must_both_be_dense_or_not(tmp_path):
    from calibkit.config import TrainConfig
    from calibkit.train import train

    (tmp_path / "f").mkdir()
    fake_fmnist(str(tmp_path / "f"), n_train=60, n_test=12)
    with pytest.raises(ValueError, match="segmentation data needs a dense model"):
        train(TrainConfig(data="scenes", data_dir=str(tmp_path / "f"), model="resnet8", epochs=1, batch_size=4,
                          train_subset=8, val_size=4, device="cpu"), tmp_path / "a", progress=False, verbose=False)
    with pytest.raises(ValueError, match="needs a classifier"):
        train(TrainConfig(data="digits", model="unet", epochs=1, batch_size=8, device="cpu"), tmp_path / "b",
              progress=False, verbose=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # nothing written
