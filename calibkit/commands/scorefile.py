"""Reading a file of scores for ``calibkit calibrate`` and ``calibkit apply``.

A file (``.npz``, ``.safetensors`` or ``.pt``) holds logits (or probabilities) and, usually, labels
under names that :class:`Keys` chooses: by default ``logits`` (or ``probs``) and ``labels``, each
with an optional prefix (``val_``, ``test_``: the layout of a calibkit run's ``logits.safetensors``).
Nothing is unpickled.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from calibkit._validation import check_labels, check_probs
from calibkit.data.tensors import check_is_file, read_npz, read_pt
from calibkit.errors import UserError


@dataclass(frozen=True)
class Keys:
    """The entry names of a scores file.

    Attributes:
        logits: the entry read as logits (``None``: ``logits``, or ``probs`` read as probabilities).
        probs: the entry read as probabilities (``--probs-key``); at most one of ``logits``/``probs``.
        labels: the labels' entry.
        prefix: put before every name (``"val_"``, ``"test_"``; ``""`` for a plain file).
    """

    logits: str | None = None
    probs: str | None = None
    labels: str = "labels"
    prefix: str = ""

    def with_prefix(self, prefix: str) -> Keys:
        return Keys(self.logits, self.probs, self.labels, prefix)

    def score_names(self) -> list[tuple[str, str]]:
        """``[(entry, "logits" | "probs")]`` to look for, in order."""
        if self.logits is not None:
            return [(self.prefix + self.logits, "logits")]
        if self.probs is not None:
            return [(self.prefix + self.probs, "probs")]
        return [(self.prefix + "logits", "logits"), (self.prefix + "probs", "probs")]


PLAIN = Keys()


def read_scores(path, require_labels: bool = True, keys: Keys = PLAIN):
    """``(logits, labels, source)`` of a ``.npz`` / ``.safetensors`` / ``.pt`` file (:func:`scores_of`)."""
    path = Path(path)
    check_is_file(path)
    return scores_of(read_entries(path), path, require_labels, keys)


def found(data) -> str:
    return ", ".join(sorted(data)) or "nothing"


def scores_of(data: dict, where, require_labels: bool = True, keys: Keys = PLAIN):
    """``(logits, labels, source)`` of the entries ``data`` of the file ``where``.

    ``logits``: float64 ``(N, K)`` or binary ``(N,)``; from probabilities when the entry read is
    one (``log``, or ``logit`` for 1-D, of the probabilities raised to at least 1e-300);
    ``labels``: int64 ``(N,)`` in ``[0, K)`` (``None`` when absent and not required);
    ``source``: the entry read (``"logits"``, ``"val_probs"``, ...). Raises :class:`UserError`
    naming the file (both ``logits`` and ``probs``, a missing entry with the entries found, fewer
    than 2 columns, non-finite values, bad labels, ...).
    """
    present = [(name, kind) for name, kind in keys.score_names() if name in data]
    if len(present) == 2:
        raise UserError(f"{where}: holds both '{present[0][0]}' and '{present[1][0]}'; keep one of them (calibkit "
                         "never guesses which one you meant), or name one with --logits-key / --probs-key")
    if not present:
        wanted = " or ".join(f"'{n}'" for n, _ in keys.score_names())
        split = any(str(k).startswith(("val_", "test_")) for k in data) and not keys.prefix
        hint = ("; it holds val_*/test_* entries: give it alone as --from FILE (without --split), or --run for a "
                "run's logits.safetensors" if split else "")
        raise UserError(f"{where}: no {wanted} entry (found: {found(data)}); name the entry with --logits-key "
                         f"(logits) or --probs-key (probabilities){hint}")
    key, kind = present[0]
    try:
        x = torch.as_tensor(np.asarray(data[key])) if not isinstance(data[key], torch.Tensor) else data[key]
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where}: '{key}' is not a numeric array ({exc})") from None
    if not x.dtype.is_floating_point or x.dim() not in (1, 2) or x.shape[0] == 0:
        raise UserError(f"{where}: '{key}' must be a non-empty float array of shape (N, K) or (N,), "
                         f"got {x.dtype} {tuple(x.shape)}")
    if x.dim() == 2 and x.shape[1] < 2:
        what = "no classes (0 columns)" if x.shape[1] == 0 else "a single column"
        raise UserError(f"{where}: '{key}' has {what}, shape {tuple(x.shape)}; expected (N, K) with K >= 2 classes, "
                         "or binary positive-class scores as a 1-D (N,) array")
    x = x.double()
    if not bool(torch.isfinite(x).all()):
        raise UserError(f"{where}: '{key}' contains {int((~torch.isfinite(x)).sum())} NaN or infinite value(s)")
    if kind == "probs":
        try:
            check_probs(torch.stack([1 - x, x], 1) if x.dim() == 1 else x, name=f"{where}: '{key}'")
        except ValueError as exc:
            raise UserError(str(exc)) from None
        p = x.clamp(min=1e-300)
        x = torch.log(p) - torch.log((1 - x).clamp(min=1e-300)) if x.dim() == 1 else torch.log(p)
    label_key = keys.prefix + keys.labels
    labels = data.get(label_key)
    if labels is None:
        if require_labels:
            raise UserError(f"{where}: no '{label_key}' entry (found: {found(data)}); name the labels' entry with "
                             "--labels-key")
        return x, None, key
    y = np.asarray(labels) if not isinstance(labels, torch.Tensor) else labels
    k = 2 if x.dim() == 1 else x.shape[1]
    try:
        y = check_labels(y, k, x.shape[0])
    except ValueError as exc:
        raise UserError(f"{where}: {exc}") from None
    return x, y, key


def read_entries(path) -> dict:
    """Every entry of a ``.npz`` / ``.pt`` / ``.safetensors`` file (nothing unpickled)."""
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return read_npz(path)
    if suffix == ".pt":
        return read_pt(path)
    if suffix == ".safetensors":
        try:
            return load_file(str(path))
        except Exception as exc:  # the reader raises its own types for a damaged file
            reason = (str(exc).strip().splitlines() or [""])[0][:120]
            raise UserError(f"{path}: not a readable .safetensors file ({type(exc).__name__}: {reason})") from None
    raise UserError(f"{path}: unsupported file type {suffix or '(none)'}; use .npz, .safetensors or .pt")
