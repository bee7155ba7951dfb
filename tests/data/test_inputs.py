"""Input pipelines of the modalities (calibkit.data.inputs), in-process: what each builds from a bundle
or a run's config, what its batches are against the transforms they stand for, and its refusals."""

import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from calibkit.data import augment, normalize
from calibkit.data.inputs import (
    INPUTS,
    FeatureInputs,
    ImageInputs,
    SegmentationInputs,
    TokenInputs,
    inputs_for,
    inputs_from_info,
)
from calibkit.data.segmentation import augment_pair

META = torch.device("meta")


def images(n=4, c=2, h=5, w=6, seed=0):
    return torch.randint(0, 256, (n, c, h, w), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def bundle(**kw):
    fields = dict(mean=(0.25, 0.5), std=(0.5, 0.2), crop_pad=3, hflip=True, ignore_index=9, in_channels=11)
    return SimpleNamespace(**{**fields, **kw})


def test_image_inputs_settings_and_refusals():
    pipe = ImageInputs([0.25, 0.5], [0.5, 0.2], 2.0, 1)
    assert (pipe.crop_pad, pipe.hflip) == (2, True) and type(pipe.crop_pad) is int and type(pipe.hflip) is bool
    plain = ImageInputs([0.5], [0.5])
    assert (plain.crop_pad, plain.hflip) == (0, False)
    for mean, std, text in (([0.5, 0.5], [0.25], "[0.5, 0.5] / [0.25]"), ([0.5], [0.0], "[0.5] / [0.0]"),
                            ([0.5, 0.5], [0.5, -0.5], "[0.5, 0.5] / [0.5, -0.5]")):
        with pytest.raises(ValueError, match="^" + re.escape(f"mean/std must be C floats with std > 0, got {text}")
                           + "$"):
            ImageInputs(mean, std)


def test_image_eval_batch_is_normalize_bit_for_bit_and_checks_the_batch():
    pipe = ImageInputs((0.25, 0.5), (0.5, 0.2))
    x = images()
    out = pipe.eval_batch(x)
    assert out.dtype == torch.float32 and torch.equal(out, normalize(x, (0.25, 0.5), (0.5, 0.2)))
    assert torch.equal(pipe.eval_batch(x[:1]), out[:1])  # the statistics are built once and reused
    for bad, got in ((x.float(), "torch.float32 (4, 2, 5, 6)"), (x[:, 0], "torch.uint8 (4, 5, 6)"),
                     (images(c=3), "torch.uint8 (4, 3, 5, 6)")):
        with pytest.raises(ValueError, match="^" + re.escape(f"images: expected uint8 (N, 2, H, W), got {got}") + "$"):
            pipe.eval_batch(bad)
    # float64 statistics (NumPy arrays) still give float32 inputs, bit-identical to normalize
    wide = ImageInputs(np.array([0.25, 0.5]), np.array([0.5, 0.2])).eval_batch(x)
    assert wide.dtype == torch.float32 and torch.equal(wide, out)
    on_meta = pipe.eval_batch(torch.zeros(3, 2, 5, 6, dtype=torch.uint8, device=META))  # statistics follow the data
    assert on_meta.device == META and on_meta.shape == (3, 2, 5, 6)


@pytest.mark.parametrize("crop_pad,hflip", [(2, True), (1, False), (0, True)])
def test_image_train_batch_augments_then_normalises(crop_pad, hflip):
    pipe = ImageInputs((0.25, 0.5), (0.5, 0.2), crop_pad, hflip)
    x, y = images(), torch.tensor([0, 1, 1, 0])
    got, target = pipe.train_batch(x, y, torch.Generator().manual_seed(3))
    expected = normalize(augment(x, crop_pad, hflip, torch.Generator().manual_seed(3)), (0.25, 0.5), (0.5, 0.2))
    assert torch.equal(got, expected) and not torch.equal(got, pipe.eval_batch(x)) and target is y


def test_image_train_batch_without_augmentation_draws_nothing():
    pipe = ImageInputs((0.25, 0.5), (0.5, 0.2))
    g = torch.Generator().manual_seed(3)
    state = g.get_state().clone()
    x, y = images(), torch.tensor([0, 1, 1, 0])
    got, target = pipe.train_batch(x, y, g)
    assert torch.equal(got, pipe.eval_batch(x)) and target is y and torch.equal(g.get_state(), state)


def test_image_pipelines_from_a_bundle_and_from_a_run():
    trained = ImageInputs.from_bundle(bundle())
    assert (trained.crop_pad, trained.hflip) == (3, True)
    assert trained._mean.tolist() == [0.25, 0.5] and trained._std.tolist() == pytest.approx([0.5, 0.2])
    evaluated = ImageInputs.from_bundle(bundle(), augment=False)
    assert (evaluated.crop_pad, evaluated.hflip) == (0, False)
    run = ImageInputs.from_info({"mean": [0.25, 0.5], "std": [0.5, 0.2], "crop_pad": 3})
    assert ((run.crop_pad, run.hflip) == (0, False)
            and torch.equal(run.eval_batch(images()), trained.eval_batch(images())))


def test_segmentation_inputs_move_the_masks_with_the_pixels():
    pipe = SegmentationInputs.from_bundle(bundle())
    assert (pipe.crop_pad, pipe.hflip, pipe.ignore_index, pipe.dense) == (3, True, 9, True)
    x, y = images(), torch.randint(0, 4, (4, 5, 6), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    got, target = pipe.train_batch(x, y, torch.Generator().manual_seed(2))
    ref_x, ref_y = augment_pair(x, y, 3, True, torch.Generator().manual_seed(2), void=9)
    assert torch.equal(got, normalize(ref_x, (0.25, 0.5), (0.5, 0.2))) and torch.equal(target, ref_y)
    assert (target == 9).any()  # the padding is labelled with the bundle's ignore index
    for crop_pad, hflip in ((1, False), (0, True)):  # either augmentation alone still moves the masks
        one = SegmentationInputs((0.25, 0.5), (0.5, 0.2), crop_pad, hflip, 9)
        got, target = one.train_batch(x, y, torch.Generator().manual_seed(2))
        ref_x, ref_y = augment_pair(x, y, crop_pad, hflip, torch.Generator().manual_seed(2), void=9)
        assert torch.equal(target, ref_y) and not torch.equal(target, y)
    still = SegmentationInputs.from_bundle(bundle(), augment=False)
    assert (still.crop_pad, still.hflip, still.ignore_index) == (0, False, 9)
    got, target = still.train_batch(x, y)
    assert torch.equal(got, still.eval_batch(x)) and target is y


def test_segmentation_defaults_and_run_config():
    default = SegmentationInputs([0.5], [0.5])
    assert default.ignore_index == 255 and (default.crop_pad, default.hflip) == (0, False)
    assert type(SegmentationInputs([0.5], [0.5], ignore_index=7.0).ignore_index) is int
    run = SegmentationInputs.from_info({"mean": [0.5], "std": [0.25], "ignore_index": 7})
    assert (run.ignore_index, run.crop_pad, run.hflip) == (7, 0, False)
    assert SegmentationInputs.from_info({"mean": [0.5], "std": [0.25]}).ignore_index == 255
    torch.testing.assert_close(run.eval_batch(images(c=1)), (images(c=1).float() / 255 - 0.5) / 0.25)


def test_token_inputs():
    pipe = TokenInputs.from_bundle(bundle(in_channels=5), augment=True)
    assert pipe.vocab_size == 5 and TokenInputs.from_info({"in_channels": 7}).vocab_size == 7
    assert type(TokenInputs(5.0).vocab_size) is int
    x, y = torch.tensor([[0, 4, 1], [2, 3, 0]]), torch.tensor([1, 0])
    assert pipe.eval_batch(x) is x
    with pytest.raises(ValueError,
                       match=r"^token ids: values must lie in \[0, 5\) \(the vocabulary size\), got -1\.\.4$"):
        pipe.eval_batch(torch.tensor([[0, 4, -1]]))
    with pytest.raises(ValueError,
                       match=r"^token ids: values must lie in \[0, 5\) \(the vocabulary size\), got 0\.\.5$"):
        pipe.eval_batch(torch.tensor([[0, 5]]))
    for method in (pipe.eval_batch, lambda t: pipe.train_batch(t, y)):
        for bad, got in ((x.int(), "torch.int32 (2, 3)"), (x[None], "torch.int64 (1, 2, 3)")):
            with pytest.raises(ValueError, match="^" + re.escape(f"token ids: expected int64 (N, L), got {got}") + "$"):
                method(bad)
    got, target = pipe.train_batch(x + 10, y)  # training ids are not re-read (no host synchronisation)
    assert torch.equal(got, x + 10) and target is y


def test_feature_inputs():
    pipe = FeatureInputs.from_bundle(bundle())
    assert isinstance(pipe, FeatureInputs) and isinstance(FeatureInputs.from_info({}), FeatureInputs)
    x, y = torch.randn(3, 4), torch.tensor([0, 1, 0])
    assert pipe.eval_batch(x) is x and pipe.eval_batch(x[:, :, None]).shape == (3, 4, 1)
    got, target = pipe.train_batch(x, y)
    assert got is x and target is y
    for bad, got in ((x.double(), "torch.float64 (3, 4)"), (x[:, 0], "torch.float32 (3,)")):
        with pytest.raises(ValueError, match="^" + re.escape(f"features: expected float32 (N, ...), got {got}") + "$"):
            pipe.train_batch(bad, y)


def test_registry_and_lookups():
    assert INPUTS == {"image": ImageInputs, "segmentation": SegmentationInputs, "text": TokenInputs,
                      "features": FeatureInputs}
    image_bundle = SimpleNamespace(mean=(0.5,), std=(0.5,), crop_pad=2, hflip=True)  # no modality: an image set
    pipe = inputs_for(image_bundle)
    assert type(pipe) is ImageInputs and pipe.crop_pad == 2
    assert inputs_for(image_bundle, augment=False).crop_pad == 0
    assert type(inputs_for(bundle(modality="segmentation"))) is SegmentationInputs
    assert type(inputs_for(bundle(modality="text"))).__name__ == "TokenInputs"
    assert type(inputs_from_info({"mean": [0.5], "std": [0.5]})) is ImageInputs
    assert inputs_from_info({"modality": "text", "in_channels": 3}).vocab_size == 3
    with pytest.raises(ValueError, match=r"^unknown modality 'audio'; known: image, segmentation, text, features$"):
        inputs_for(bundle(modality="audio"))
    with pytest.raises(ValueError, match=r"^unknown modality 'audio'; known: image, segmentation, text, features$"):
        inputs_from_info({"modality": "audio"})
