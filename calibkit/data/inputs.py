"""How a modality's stored inputs become model inputs, in training and in evaluation.

The trainer, ``calibkit.rundir.predict_logits`` and the bench never touch pixels or tokens
themselves: they ask the bundle's modality for an *input pipeline* and call

* ``train_batch(x, y, generator) -> (inputs, targets)``: one training batch as stored (e.g. uint8
  images) with its targets -> what the model and the loss take (augmented and normalised images;
  a modality whose augmentation moves pixels, such as segmentation, transforms the targets with
  them);
* ``eval_batch(x) -> inputs``: the same without randomness.

``INPUTS`` maps ``DataBundle.modality`` to the pipeline class; each class builds itself from a
bundle (``from_bundle(bundle, augment)``) or from a finished run's ``config.json``
(``from_info(info)``), so a run is evaluated exactly as it was trained. Other modalities (text,
segmentation) add an entry.

Every pipeline keeps its constants (e.g. the normalisation mean and std) as tensors on the device
of the data, built once, so a training step does no host-device copy and no host synchronisation.

``"text"``: int64 token ids ``(N, L)`` (:class:`TokenInputs`), used as stored -- no augmentation,
no normalisation. ``"features"``: float32 inputs ``(N, ...)`` of the ``tensors`` data set
(:class:`FeatureInputs`), used as stored.
"""

from __future__ import annotations

from typing import Any

import torch

from calibkit.errors import UserError

from .segmentation import augment_pair
from .transforms import augment

__all__ = ["FeatureInputs", "ImageInputs", "SegmentationInputs", "INPUTS", "TokenInputs", "inputs_for",
           "inputs_from_info"]


class ImageInputs:
    """uint8 images ``(N, C, H, W)``: random crop/flip (training only), then ``(x/255 - mean) / std``.

    Args:
        mean, std: C floats in [0, 1] pixel units (the training split's statistics).
        crop_pad: zero padding of the random crop (0: no crop).
        hflip: random horizontal flips.

    The arithmetic is that of :func:`calibkit.data.normalize`, so the inputs are bit-identical to it.
    """

    def __init__(self, mean, std, crop_pad: int = 0, hflip: bool = False):
        mean_t = torch.as_tensor(mean, dtype=torch.float32).reshape(-1)
        std_t = torch.as_tensor(std, dtype=torch.float32).reshape(-1)
        if mean_t.numel() != std_t.numel() or not bool((std_t > 0).all()):
            raise UserError(f"mean/std must be C floats with std > 0, got {mean_t.tolist()} / {std_t.tolist()}")
        self.crop_pad, self.hflip = int(crop_pad), bool(hflip)
        self._stats: dict = {}  # device -> (mean, std) shaped (C, 1, 1)
        self._mean, self._std = mean_t, std_t

    @classmethod
    def from_bundle(cls, bundle, augment: bool = True) -> ImageInputs:
        crop_pad, hflip = (bundle.crop_pad, bundle.hflip) if augment else (0, False)
        return cls(bundle.mean, bundle.std, crop_pad, hflip)

    @classmethod
    def from_info(cls, info: dict) -> ImageInputs:
        return cls(info["mean"], info["std"])

    def _on(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        key = str(device)
        if key not in self._stats:
            self._stats[key] = (self._mean.to(device)[:, None, None], self._std.to(device)[:, None, None])
        return self._stats[key]

    def eval_batch(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.uint8 or x.dim() != 4 or x.shape[1] != self._mean.numel():
            raise UserError(f"images: expected uint8 (N, {self._mean.numel()}, H, W), got {x.dtype} {tuple(x.shape)}")
        mean, std = self._on(x.device)
        return (x.float().div_(255.0) - mean) / std

    def train_batch(self, x: torch.Tensor, y: torch.Tensor, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.crop_pad or self.hflip:
            x = augment(x, self.crop_pad, self.hflip, generator)
        return self.eval_batch(x), y


class SegmentationInputs(ImageInputs):
    """uint8 images with per-pixel targets (N, H, W): one random crop/flip moves both.

    Padding introduced by the crop is labelled ``ignore_index`` (it has no label); the images are
    normalised as in :class:`ImageInputs`. Targets are returned as stored (uint8 or int64, void
    included), which is what the dense losses take. ``dense`` tells the trainer to use the
    per-pixel validation (:mod:`calibkit.train.dense`).
    """

    dense = True

    def __init__(self, mean, std, crop_pad: int = 0, hflip: bool = False, ignore_index: int = 255):
        super().__init__(mean, std, crop_pad, hflip)
        self.ignore_index = int(ignore_index)

    @classmethod
    def from_bundle(cls, bundle, augment: bool = True) -> SegmentationInputs:
        crop_pad, hflip = (bundle.crop_pad, bundle.hflip) if augment else (0, False)
        return cls(bundle.mean, bundle.std, crop_pad, hflip, bundle.ignore_index)

    @classmethod
    def from_info(cls, info: dict) -> SegmentationInputs:
        return cls(info["mean"], info["std"], ignore_index=info.get("ignore_index", 255))

    def train_batch(self, x: torch.Tensor, y: torch.Tensor, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.crop_pad or self.hflip:
            x, y = augment_pair(x, y, self.crop_pad, self.hflip, generator, void=self.ignore_index)
        return self.eval_batch(x), y


class TokenInputs:
    """int64 token ids ``(N, L)``: used as they are (no augmentation, no normalisation).

    Evaluation batches are checked against the vocabulary size V (the bundle's ``in_channels``), so
    a run is never fed ids from another vocabulary silently.

    Args:
        vocab_size: V; every id must lie in [0, V).
    """

    def __init__(self, vocab_size: int):
        self.vocab_size = int(vocab_size)

    @classmethod
    def from_bundle(cls, bundle, augment: bool = True) -> TokenInputs:
        return cls(bundle.in_channels)

    @classmethod
    def from_info(cls, info: dict) -> TokenInputs:
        return cls(info["in_channels"])

    def eval_batch(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.int64 or x.dim() != 2:
            raise UserError(f"token ids: expected int64 (N, L), got {x.dtype} {tuple(x.shape)}")
        if x.numel() and not bool(((x >= 0) & (x < self.vocab_size)).all()):
            raise UserError(f"token ids: values must lie in [0, {self.vocab_size}) (the vocabulary size), "
                             f"got {int(x.min())}..{int(x.max())}")
        return x

    def train_batch(self, x: torch.Tensor, y: torch.Tensor, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch as it is. Training ids come from the bundle's own vocabulary, so their values
        are not re-read here (that would be a host synchronisation per step)."""
        if x.dtype != torch.int64 or x.dim() != 2:
            raise UserError(f"token ids: expected int64 (N, L), got {x.dtype} {tuple(x.shape)}")
        return x, y


class FeatureInputs:
    """float32 inputs ``(N, ...)`` of the ``features`` modality (the ``tensors`` data set): used as
    stored -- no augmentation, no normalisation (the user's arrays are the model's inputs)."""

    @classmethod
    def from_bundle(cls, bundle, augment: bool = True) -> FeatureInputs:
        return cls()

    @classmethod
    def from_info(cls, info: dict) -> FeatureInputs:
        return cls()

    def eval_batch(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.dim() < 2:
            raise UserError(f"features: expected float32 (N, ...), got {x.dtype} {tuple(x.shape)}")
        return x

    def train_batch(self, x: torch.Tensor, y: torch.Tensor, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.eval_batch(x), y


# Each pipeline is a class with the classmethods from_bundle and from_info.
INPUTS: dict[str, Any] = {"image": ImageInputs, "segmentation": SegmentationInputs, "text": TokenInputs,
                          "features": FeatureInputs}


def _pipeline(modality: str) -> Any:
    if modality not in INPUTS:
        raise UserError(f"unknown modality {modality!r}; known: {', '.join(INPUTS)}")
    return INPUTS[modality]


def inputs_for(bundle, augment: bool = True):
    """The input pipeline of a loaded :class:`~calibkit.data.bundle.DataBundle`."""
    return _pipeline(getattr(bundle, "modality", "image")).from_bundle(bundle, augment)


def inputs_from_info(info: dict):
    """The evaluation input pipeline of a finished run, from its ``config.json`` dict."""
    return _pipeline(info.get("modality", "image")).from_info(info)
