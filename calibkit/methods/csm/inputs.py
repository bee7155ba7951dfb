"""Inputs of the CSM stages: image tensors or a Dataset, and the generator's training images.

* :func:`as_image_tensors`: the user's images (uint8 tensors, float tensors in [0, 1] or a
  ``torch.utils.data.Dataset`` of ``(image, label)``) -> uint8 (N, C, H, W) + int64 (N,), the form
  every CSM stage takes.
* :func:`training_images_outside_validation`: the official training images of a registered data set
  that lie in *no* validation split of the given seeds, so that a generator trained on them carries
  no information about any of those seeds' validation (or test) images.
"""

from __future__ import annotations

import torch

import calibkit.data
import calibkit.data.bundle
from calibkit.data.bundle import stratified_split
from calibkit.errors import UserError, UserRuntimeError


def _to_uint8(x: torch.Tensor, what: str) -> torch.Tensor:
    if x.dtype == torch.uint8:
        return x
    if not x.is_floating_point():
        raise UserError(f"{what} must be uint8 or float in [0, 1], got {x.dtype}")
    if not torch.isfinite(x).all() or x.min() < 0 or x.max() > 1:
        raise UserError(f"{what}: float images must lie in [0, 1] (got values in "
                         f"[{float(x.min()):.3g}, {float(x.max()):.3g}]); undo any normalisation first")
    return (x * 255).round().to(torch.uint8)


def as_image_tensors(images, labels=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(uint8 images (N, C, H, W), int64 labels (N,))`` from tensors or a Dataset.

    Args:
        images: a tensor (N, C, H, W) (or (N, H, W) for one channel), uint8 or float in [0, 1]
            (quantised to 8 bits: generated sets are stored as uint8); or a map-style
            ``torch.utils.data.Dataset`` whose items are ``(image, label)`` with image (C, H, W)
            or (H, W) as above (then ``labels`` must be None).
        labels: (N,) integer class labels when ``images`` is a tensor.
    """
    if isinstance(images, torch.Tensor):
        if labels is None:
            raise UserError("labels are required when images is a tensor")
        x, y = images, torch.as_tensor(labels)
    else:
        if labels is not None:
            raise UserError("pass either (images, labels) tensors or a Dataset of (image, label) pairs")
        try:
            items = [images[i] for i in range(len(images))]
        except TypeError as exc:
            raise UserError(f"images must be a tensor or a map-style Dataset, got {type(images).__name__}") from exc
        if not items:
            raise UserError("the Dataset is empty")
        x = torch.stack([torch.as_tensor(im) for im, _ in items])
        y = torch.tensor([int(lab) for _, lab in items])
    if x.dim() == 3:
        x = x.unsqueeze(1)
    if x.dim() != 4:
        raise UserError(f"images must have shape (N, C, H, W) or (N, H, W), got {tuple(x.shape)}")
    if y.dtype.is_floating_point or y.shape != (x.shape[0],):
        raise UserError(f"labels must be integers of shape ({x.shape[0]},), got {y.dtype} {tuple(y.shape)}")
    if len(y) and int(y.min()) < 0:
        raise UserError(f"labels must be >= 0, got {int(y.min())}")
    return _to_uint8(x, "images").contiguous(), y.long()


def training_images_outside_validation(name: str, seeds, val_size=None, data_dir=None):
    """Official training images of ``name`` outside the validation split of every seed in ``seeds``.

    The validation split of seed s is the one :func:`calibkit.data.load` draws with
    ``seed=s, val_size=val_size`` (checked against its recorded index checksum, so the exclusion
    follows the split rule of the installed version). The test split is never read into the result.

    Returns:
        ``(images uint8 (N, C, H, W), labels int64 (N,), bundle, record)``: ``bundle`` is the
        loaded data set (class names, channels), ``record`` describes the exclusion for
        ``generator.json`` (seeds, val_size, rule, each seed's validation checksum, image counts).
    """
    seeds = sorted({int(s) for s in seeds})
    if not seeds:
        raise UserError("give at least one seed whose validation split is to be excluded")
    probe = calibkit.data.load(name, data_dir=data_dir, seed=seeds[0], val_size=val_size)
    if probe.split["rule"] == "fixed by the protocol":  # validation is not part of the training split
        return probe.train.images, probe.train.labels, probe, {
            "excluded_val_seeds": seeds, "rule": probe.split["rule"], "official_train": len(probe.train),
            "excluded": 0, "train_images": len(probe.train)}
    full = calibkit.data.load(name, data_dir=data_dir, seed=0, val_size=0)  # the whole official training split
    labels = full.train.labels.numpy()
    excluded, checks = set(), {}
    for s in seeds:
        ref = probe if s == seeds[0] else calibkit.data.load(name, data_dir=data_dir, seed=s, val_size=val_size)
        size = ref.split["val"]
        _, val_idx = stratified_split(labels, size, s, stream=0)
        if calibkit.data.bundle.index_checksum(val_idx) != ref.split["val_checksum"]:
            raise UserRuntimeError(f"{name}: could not reproduce the validation split of seed {s}; "
                               "the split rule of calibkit.data.load changed")
        excluded.update(val_idx.tolist())
        checks[str(s)] = ref.split["val_checksum"]
    keep = torch.tensor(sorted(set(range(len(labels))) - excluded), dtype=torch.long)
    record = {"excluded_val_seeds": seeds, "val_size": size, "rule": ref.split["rule"],
              "val_checksums": checks, "official_train": len(labels), "excluded": len(excluded),
              "train_images": len(keep), "train_checksum": calibkit.data.bundle.index_checksum(keep.numpy())}
    return full.train.images[keep], full.train.labels[keep], full, record
