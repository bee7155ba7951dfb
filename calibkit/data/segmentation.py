"""Semantic-segmentation data: loading into a :class:`DataBundle`, joint augmentation.

A segmentation bundle has ``modality == "segmentation"``, ``ignore_index == 255`` and splits whose
``labels`` are uint8 masks ``(N, H, W)``. ``calibkit.data.load`` hands the data sets registered
with ``modality="segmentation"`` to :func:`load_segmentation`.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import torch

from calibkit.errors import UserError

from .bundle import DataBundle, Split, channel_stats, index_checksum
from .scenes import SCENES_TRAIN, read_scenes
from .transforms import augment

VOID = 255


def augment_pair(images: torch.Tensor, masks: torch.Tensor, crop_pad: int, hflip: bool,
                 generator: torch.Generator | None = None, void: int = VOID) -> tuple[torch.Tensor, torch.Tensor]:
    """The same random crop (zero padding) and horizontal flip for images and their masks.

    Exactly :func:`calibkit.data.augment` on the images (same draws, same result), with the mask
    carried as an extra channel; padded pixels of the mask become ``void`` (the padding has no
    label), padded image pixels 0.

    Args:
        images: uint8 (N, C, H, W). masks: uint8 (N, H, W). crop_pad, hflip, generator: as in ``augment``.

    Returns:
        (images uint8 (N, C, H, W), masks uint8 (N, H, W)).
    """
    if masks.dim() != 3 or masks.shape[0] != images.shape[0] or masks.shape[1:] != images.shape[2:]:
        raise UserError(f"masks {tuple(masks.shape)} do not match images {tuple(images.shape)}")
    if masks.dtype != torch.uint8 or images.dtype != torch.uint8:
        raise UserError(f"augment_pair expects uint8 images and masks, got {images.dtype}, {masks.dtype}")
    # The mask travels as (void - mask): augment pads with 0, which maps back to void.
    both = augment(torch.cat([images, (void - masks)[:, None]], dim=1), crop_pad, hflip, generator)
    return both[:, :-1].contiguous(), (void - both[:, -1]).contiguous()


def _seeded_draw(n: int, size: int, seed: int, stream: int) -> tuple[np.ndarray, np.ndarray]:
    """``(rest, drawn)``: ``size`` of ``n`` indices drawn by ``SeedSequence([seed, stream])``, both sorted."""
    if not 0 <= size < n:
        raise UserError(f"val_size must be in [0, {n - 1}] for a training set of {n} images, got {size}")
    perm = np.random.default_rng(np.random.SeedSequence([seed, stream])).permutation(n)
    return np.sort(perm[size:]).astype(np.int64), np.sort(perm[:size]).astype(np.int64)


def _check_masks(name: str, part: str, split: Split, num_classes: int) -> None:
    if len(split) == 0:
        return
    m = split.labels
    bad = (m >= num_classes) & (m != VOID)
    if bad.any():
        raise UserError(f"{name} {part}: mask value {int(m[bad][0])} is neither a class < {num_classes} nor {VOID}")


def load_segmentation(name: str, spec, folder: str | None, seed: int, val_size, train_subset) -> DataBundle:
    """Load a segmentation data set registered in ``DATASETS`` (see :func:`calibkit.data.load`).

    ``scenes``: the validation scenes are composed from a seeded held-out part of the
    Fashion-MNIST training images (``val_size`` scenes, default 500); ``train_subset=n`` composes
    only the first ``n`` of the 4,000 training scenes (nested across sizes). ``voc``: ``val_size``
    images (default 10%) drawn from the official ``train`` list by a seeded permutation
    (stream 0). ``train_subset``: a seeded random subset of the training images (stream 1);
    class stratification does not apply to images holding several classes.
    """
    draw = train_subset
    if spec.read is read_scenes:
        n_val = spec.val_size if val_size is None else val_size
        if isinstance(n_val, float) or int(n_val) < 1:
            raise UserError(f"val_size for {name} is a number of scenes >= 1, got {n_val}")
        n_train = SCENES_TRAIN if train_subset is None else int(train_subset)
        if not 1 <= n_train <= SCENES_TRAIN:
            raise UserError(f"train_subset must be in [1, {SCENES_TRAIN}] for {name}, got {train_subset}")
        raw = read_scenes(folder, seed=seed, n_val=int(n_val), n_train=n_train)
        train, val = raw.train, raw.val
        draw = None  # already the first n scenes of the stream (nested), no further draw
        rule = "scenes composed from a seeded held-out part of the Fashion-MNIST training images"
        digest = hashlib.sha256(val.images.contiguous().numpy().tobytes())
        digest.update(val.labels.contiguous().numpy().tobytes())
        checksum = digest.hexdigest()[:16]
    else:
        raw = spec.read(folder)
        size = spec.val_size if val_size is None else val_size
        if isinstance(size, float) and not float(size).is_integer():
            if not 0 < size < 1:
                raise UserError(f"val_size must be an image count or a fraction in (0, 1), got {size}")
            size = int(round(size * len(raw.train)))
        train_idx, val_idx = _seeded_draw(len(raw.train), int(size), seed, stream=0)
        train, val = raw.train.subset(train_idx), raw.train.subset(val_idx)
        rule = "seeded random draw from the official training list"
        checksum = index_checksum(val_idx)
    train_checksum = None
    if draw is not None:
        if not 1 <= int(draw) <= len(train):
            raise UserError(f"train_subset must be in [1, {len(train)}] for {name}, got {draw}")
        if int(draw) < len(train):
            _, keep = _seeded_draw(len(train), int(draw), seed, stream=1)
            train = train.subset(keep)
            train_checksum = index_checksum(keep)
    num_classes = len(raw.class_names)
    for part, split in (("train", train), ("val", val), ("test", raw.test)):
        _check_masks(name, part, split, num_classes)
    mean, std = channel_stats(train.images)
    return DataBundle(
        name=name, train=train, val=val, test=raw.test, num_classes=num_classes,
        in_channels=int(train.images.shape[1]), mean=mean, std=std, hflip=spec.hflip, crop_pad=spec.crop_pad,
        class_names=list(raw.class_names),
        split={"seed": int(seed), "rule": rule, "train": len(train), "val": len(val), "test": len(raw.test),
               "train_subset": None if train_subset is None else int(train_subset), "val_checksum": checksum,
               "train_checksum": train_checksum},
        data_dir=os.path.abspath(folder) if folder else None, modality="segmentation", ignore_index=VOID,
    )
