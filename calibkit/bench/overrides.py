"""Command-line changes to a preset: ``calibkit bench/tune --preset P --epochs 5 --data ...``.

:func:`with_flags` applies the flags of the common case on top of a preset (shipped or from a
file) and names the result so that it says what changed: ``default+epochs=5,lr=0.01``, or the name
given with ``--name``. The name is the first part of every run key and run directory, so a
changed preset never shares runs with the unchanged one.

Decisions where the spec is silent:

* values in the name keep only the characters of :data:`calibkit.bench.grid.NAME_CHARS` (others
  become ``-``; a path contributes its last component), so names stay filesystem-safe; a name
  longer than 100 characters must be given with ``--name``;
* ``--epochs`` keeps the preset's schedule: milestones given as fractions of the epochs (the
  shipped presets') and TrainConfig's default (50%/75%) follow by themselves; milestones given in
  epochs are scaled as fractions of the preset's epochs (``round(m * new / old)``, repeats and drops
  outside ``(0, epochs)`` removed);
* ``--data`` to a data set that is the user's own (``imagefolder``, ``tensors``) sets the OOD set
  to ``none`` unless ``--ood`` gives one (a built-in OOD set means nothing on arbitrary data), and
  drops the base preset's ``train_subset`` and ``val_size`` (sized for its own data set): all the
  training images, and the data set's own validation rule (10%), unless the flags give them.
"""

from __future__ import annotations

import os
from dataclasses import replace

from calibkit.bench.grid import NAME_CHARS, USER_DATASETS, Preset
from calibkit.bench.presetfile import check_name
from calibkit.errors import UserError

# flag -> where it goes: a top-level Preset field or a [train] key
TOP = ("dataset", "model", "ood")
TRAIN = ("epochs", "lr", "batch_size", "val_size", "train_subset", "augment")
ORDER = ("dataset", "model", "epochs", "lr", "batch_size", "val_size", "train_subset", "augment", "ood")
SHORT = {"dataset": "data"}  # the flag's name in the preset name
MAX_NAME = 100


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    text = str(value)
    if "/" in text or os.sep in text:
        text = os.path.basename(text.rstrip("/" + os.sep)) or text
    return "".join(c if c in NAME_CHARS else "-" for c in text)


def scaled_milestones(milestones: list[int], old_epochs: int, new_epochs: int) -> list[int]:
    """``milestones`` of an ``old_epochs`` schedule as the same fractions of ``new_epochs``."""
    out = sorted({int(round(m * new_epochs / old_epochs)) for m in milestones})
    return [m for m in out if 0 < m < new_epochs]


def with_flags(preset: Preset, name: str | None = None, **flags) -> Preset:
    """``preset`` with the given flags applied (``None`` values are ignored).

    Args:
        preset: the base preset.
        name: the new preset's name (default: the base name plus ``+key=value,...`` of what changed).
        **flags: ``dataset``, ``model``, ``ood`` (top-level fields) and ``epochs``, ``lr``,
            ``batch_size``, ``val_size``, ``train_subset``, ``augment`` (``[train]`` keys).

    Raises:
        ValueError: an unknown flag, or a generated name longer than 100 characters.
    """
    unknown = sorted(set(flags) - set(ORDER))
    if unknown:
        raise UserError(f"unknown preset flag(s) {', '.join(unknown)}; valid: {', '.join(ORDER)}")
    given = {k: flags[k] for k in ORDER if flags.get(k) is not None}
    if not given and name is None:
        return preset
    top = _top_fields(given)
    train = _train_fields(preset, given, top)
    if name is None:
        name = _changed_name(preset, given, top, train)
        if name is None:
            return preset

    return replace(preset, name=check_name(name), train=train, **top)


def _own_data(top: dict) -> bool:
    """Whether the flags move the preset to the user's own data (``imagefolder``, ``tensors``)."""
    return "dataset" in top and top["dataset"] in USER_DATASETS


def _top_fields(given: dict) -> dict:
    """The top-level fields the flags set; the user's own data gets no built-in OOD set unless given."""
    top = {k: v for k, v in given.items() if k in TOP}
    if _own_data(top) and "ood" not in top:
        top["ood"] = "none"
    return top


def _train_fields(preset: Preset, given: dict, top: dict) -> dict:
    """The preset's ``[train]`` table with the flags applied and epoch milestones rescaled."""
    train = dict(preset.train)
    if _own_data(top) and top["dataset"] != preset.dataset:
        for key in ("train_subset", "val_size"):  # sized for the preset's own data set
            train.pop(key, None)
    train.update({k: v for k, v in given.items() if k in TRAIN})
    ms = train.get("milestones") or []
    if "epochs" in given and ms and all(isinstance(m, int) and not isinstance(m, bool) for m in ms):
        old = int(preset.train.get("epochs", given["epochs"]))
        train["milestones"] = scaled_milestones(list(preset.train["milestones"]), old, int(given["epochs"]))
    return train


def _changed_name(preset: Preset, given: dict, top: dict, train: dict) -> str | None:
    """``base+key=value,...`` of the flags that change the preset (None when none does)."""
    changed = [k for k in ORDER if k in given and (
        top.get(k, train.get(k)) != (getattr(preset, k) if k in TOP else preset.train.get(k)))]
    if not changed:
        return None
    name = preset.name + "+" + ",".join(f"{SHORT.get(k, k)}={_fmt(given[k])}" for k in changed)
    if len(name) > MAX_NAME:
        raise UserError(f"the changed preset's name would be {len(name)} characters long; give one with --name")
    return name
