"""The user's own OOD inputs (a folder or a tensors file) and ``noise`` for arrays without an
image form (see :mod:`calibkit.data.ood`)."""

from __future__ import annotations

import os

import torch

from calibkit.errors import UserError

from .datasets import DATASETS
from .folders import IMAGE_EXTENSIONS, _list_images, read_images
from .tensors import input_kind, read_arrays, to_inputs
from .transforms import resize

OOD_SETS = ("digits", "noise")  # always available; any DATASETS name works too
NO_OOD = "none"  # no OOD measurement
NOISE_SIZE = 2000
OOD_KEYS = ("x", "x_ood", "x_test")  # the array of a user's OOD tensors file


def is_user_set(name: str) -> bool:
    """Whether ``name`` is a path to the user's own OOD inputs rather than a registered set."""
    return name not in OOD_SETS and name not in DATASETS and name != NO_OOD and name != "debian-heldout"


def _noise(like, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(int(seed))
    x = like.train.images
    if like.modality == "text":
        return torch.randint(0, int(like.in_channels), (NOISE_SIZE, x.shape[1]), dtype=torch.int64, generator=gen)
    if like.modality == "features":
        mean, std = x.mean(0), x.std(0)
        return (mean + std * torch.randn((NOISE_SIZE, *x.shape[1:]), generator=gen)).float()
    c, (h, w) = like.in_channels, like.image_size
    return torch.randint(0, 256, (NOISE_SIZE, c, h, w), dtype=torch.uint8, generator=gen)


def _folder_images(folder: str, like) -> torch.Tensor:
    if like.modality != "image":
        raise UserError(f"OOD folder {folder}: the data are {like.modality}, not images; give a tensors file")
    paths = _list_images(folder)
    for sub in sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d))):
        paths += _list_images(os.path.join(folder, sub))
    if not paths:
        raise UserError(f"OOD folder {folder}: no images ({', '.join(IMAGE_EXTENSIONS)}) in it or its sub-folders")
    images = read_images(paths, "L" if like.in_channels == 1 else "RGB")  # one size, like a data set
    return resize(images, like.image_size, like.in_channels)


def _file_inputs(path: str, like) -> torch.Tensor:
    arrays = read_arrays(path)
    keys = [k for k in OOD_KEYS if k in arrays]
    if len(keys) != 1:
        raise UserError(f"OOD file {path}: expected one array named {' or '.join(OOD_KEYS)}, found "
                         f"{', '.join(sorted(arrays)) or 'none'}")
    x = arrays[keys[0]]
    where = f"OOD file {path}: {keys[0]}"
    kind = input_kind(x)
    if kind != like.modality:
        raise UserError(f"{where}: {x.dtype} {x.shape} are {kind} inputs, the data set's are {like.modality}")
    if len(x) == 0:
        raise UserError(f"{where} holds 0 rows; give at least one OOD input, or --ood none")
    inputs = to_inputs(x, kind, where)
    if kind == "image":
        return resize(inputs, like.image_size, like.in_channels)
    if inputs.shape[1:] != like.train.images.shape[1:]:
        raise UserError(f"{where}: shape (N, {', '.join(map(str, inputs.shape[1:]))}) differs from the data's "
                         f"(N, {', '.join(map(str, like.train.images.shape[1:]))})")
    if kind == "text" and inputs.numel() and int(inputs.max()) >= like.in_channels:
        raise UserError(f"{where}: token id {int(inputs.max())} is outside the data's vocabulary of "
                         f"{like.in_channels} ids")
    return inputs


def load_user_ood(name: str, like, seed: int = 0) -> torch.Tensor:
    """The OOD inputs ``name`` names for ``like``: ``noise``, a folder or a tensors file."""
    if name == "noise":
        return _noise(like, seed)
    if not is_user_set(name):
        raise UserError(f"OOD set {name!r} does not fit {like.modality} inputs without an image form; use "
                         "noise, none, or a tensors file of OOD inputs")
    if os.path.isdir(name):
        return _folder_images(name, like)
    if os.path.isfile(name):
        return _file_inputs(name, like)
    if "/" not in name and os.sep not in name and not name.endswith((".npz", ".safetensors")):
        raise UserError(f"unknown OOD set {name!r}; choose one of {sorted({*OOD_SETS, NO_OOD, *DATASETS})}, or "
                         "give a folder or .npz/.safetensors file of OOD inputs")
    raise FileNotFoundError(f"OOD set {name!r}: no such folder or file (an OOD set is digits, noise, none, a data "
                            "set name, or a folder or .npz/.safetensors file of OOD inputs)")
