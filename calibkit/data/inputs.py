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
"""

from __future__ import annotations

import torch

from .transforms import augment

__all__ = ["ImageInputs", "INPUTS", "inputs_for", "inputs_from_info"]


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
            raise ValueError(f"mean/std must be C floats with std > 0, got {mean_t.tolist()} / {std_t.tolist()}")
        self.crop_pad, self.hflip = int(crop_pad), bool(hflip)
        self._stats = {}  # device -> (mean, std) shaped (C, 1, 1)
        self._mean, self._std = mean_t, std_t

    @classmethod
    def from_bundle(cls, bundle, augment: bool = True) -> "ImageInputs":
        crop_pad, hflip = (bundle.crop_pad, bundle.hflip) if augment else (0, False)
        return cls(bundle.mean, bundle.std, crop_pad, hflip)

    @classmethod
    def from_info(cls, info: dict) -> "ImageInputs":
        return cls(info["mean"], info["std"])

    def _on(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        key = str(device)
        if key not in self._stats:
            self._stats[key] = (self._mean.to(device)[:, None, None], self._std.to(device)[:, None, None])
        return self._stats[key]

    def eval_batch(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.uint8 or x.dim() != 4 or x.shape[1] != self._mean.numel():
            raise ValueError(f"images: expected uint8 (N, {self._mean.numel()}, H, W), got {x.dtype} {tuple(x.shape)}")
        mean, std = self._on(x.device)
        return (x.float().div_(255.0) - mean) / std

    def train_batch(self, x: torch.Tensor, y: torch.Tensor, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.crop_pad or self.hflip:
            x = augment(x, self.crop_pad, self.hflip, generator)
        return self.eval_batch(x), y


INPUTS: dict[str, type] = {"image": ImageInputs}


def _pipeline(modality: str) -> type:
    if modality not in INPUTS:
        raise ValueError(f"unknown modality {modality!r}; known: {', '.join(INPUTS)}")
    return INPUTS[modality]


def inputs_for(bundle, augment: bool = True):
    """The input pipeline of a loaded :class:`~calibkit.data.bundle.DataBundle`."""
    return _pipeline(getattr(bundle, "modality", "image")).from_bundle(bundle, augment)


def inputs_from_info(info: dict):
    """The evaluation input pipeline of a finished run, from its ``config.json`` dict."""
    return _pipeline(info.get("modality", "image")).from_info(info)
