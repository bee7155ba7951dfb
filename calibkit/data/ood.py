"""Out-of-distribution image sets shaped like a data set, for OOD-detection AUROC.

``load_ood(name, like=bundle)`` returns uint8 images with the bundle's (C, H, W):

* ``"digits"`` -- the 1,797 UCI handwritten digits shipped with calibkit (always available offline):
  the 8x8 images scaled to 0..255, resized bilinearly to H x W, repeated to 3 channels for colour
  data. This is calibkit's default OOD set for Fashion-MNIST (clothing vs. digits) and works for
  any data set.
* ``"noise"`` -- uniform random images (seeded), a sanity check every detector should pass.
* any other ``DATASETS`` name -- that data set's test split, resized and converted (e.g. SVHN as
  the usual OOD set for CIFAR-10, when its files are available).

* ``"none"`` -- no OOD set: the bench measures no OOD detection (:data:`NO_OOD`; the caller
  checks for it, ``load_ood`` refuses it).
* a folder of the user's OOD images (any files directly in it or in its sub-folders), read in
  the bundle's channels and resized to its H x W;
* a ``.npz`` / ``.safetensors`` file of the user's OOD inputs, one array named ``x`` (or
  ``x_ood`` or ``x_test``), in the form of the bundle's inputs: images (resized), features of the
  same shape, or token ids of the same length and vocabulary.

For a text bundle, the OOD sets are texts encoded with its vocabulary
(:func:`calibkit.data.textsets.load_text_ood`: ``"debian-heldout"``, ``"noise"``). For inputs
without a calibkit vocabulary or image form (the ``tensors`` data set's token ids and features),
``"noise"`` is uniform random ids of the same length, or Gaussian features with the training
split's per-feature mean and standard deviation.
"""

from __future__ import annotations

import torch

from calibkit.errors import UserError

from .bundle import DataBundle
from .datasets import DATASETS, load
from .digits import digits_images

# the names of the sets (defined beside the user's sets, which need them)
from .ood_user import NO_OOD, NOISE_SIZE, OOD_KEYS, OOD_SETS, is_user_set, load_user_ood  # noqa: E402,F401
from .textsets import load_text_ood
from .transforms import resize


def load_ood(name: str, like: DataBundle, data_dir: str | None = None, seed: int = 0) -> torch.Tensor:
    """Images of an OOD set converted to the shape of ``like``'s images.

    Args:
        name: "digits", "noise", a ``DATASETS`` key, a folder or tensors file of the user's OOD
            inputs, or (text bundles) "debian-heldout".
        like: the in-distribution bundle (gives C, H, W).
        data_dir: files of a ``DATASETS`` OOD set, if it needs any.
        seed: seed of the "noise" set.

    Returns:
        uint8 tensor (M, C, H, W).
    """
    if name == NO_OOD:
        raise UserError("OOD set 'none': there are no OOD inputs to load (the bench skips OOD detection)")
    modality = getattr(like, "modality", "image")  # a stand-in for a bundle without it holds images
    if is_user_set(name) or (modality in ("text", "features") and like.vocab is None):
        return load_user_ood(name, like, seed)
    if modality == "text":  # token ids, not images
        return load_text_ood(name, like, data_dir, seed)
    c = like.in_channels
    h, w = like.image_size
    if c not in (1, 3):
        raise UserError(f"OOD sets are made for 1- or 3-channel data, the bundle has {c} channels")
    if name == "digits":
        images, _ = digits_images(size=8)  # native resolution; resized once below
    elif name == "noise":
        gen = torch.Generator().manual_seed(int(seed))
        return torch.randint(0, 256, (NOISE_SIZE, c, h, w), dtype=torch.uint8, generator=gen)
    elif name in DATASETS:
        if name == like.name:
            raise UserError(f"the OOD set must differ from the in-distribution data set {like.name!r}")
        # only the test split is used: hold nothing out (a protocol-fixed validation split stays)
        fixed_val = DATASETS[name].val_size == 0
        images = load(name, data_dir=data_dir, val_size=None if fixed_val else 0).test.images
    else:  # the one name left: the text OOD set
        raise UserError(f"OOD set {name!r} is made of texts, the {like.name} data are images; choose one of "
                        f"{sorted({*OOD_SETS, NO_OOD, *DATASETS})}, "
                        "or a folder or .npz/.safetensors file of OOD inputs")
    return resize(images, (h, w), c)
