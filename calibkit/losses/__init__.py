"""Calibration losses as drop-in ``nn.Module`` s, and the ``LOSSES`` registry.

Every module is called as ``loss(logits (N, K), targets (N,), features=None) -> 0-dim tensor``
(batch mean), so it replaces ``nn.CrossEntropyLoss()`` in a plain loop. Stateless modules call
one function of :mod:`calibkit.functional.losses`; ``features`` is ignored by all but FeDLaS.

Dense prediction: every loss here also takes logits ``(N, K, *S)`` with targets ``(N, *S)``
(FeDLaS: features ``(N, D, *S)``); pixels whose target is the module's ``ignore_index``
(default 255) are dropped, and the value is the same loss on the valid pixels flattened to
``(P, K)`` -- the mean over valid pixels. See ``docs/segmentation.md`` for the per-loss decisions.

Two losses carry state:

* :class:`AdaFocal` keeps per-bin gammas and the validation bin edges in buffers;
  the trainer calls ``loss.update(val_logits, val_labels)`` after every epoch.
* :class:`FeDLaS` keeps the running feature-norm statistics ``mu``/``sigma`` in buffers and owns a
  trainable gate. The trainer optimises ``list(model.parameters()) + list(loss.parameters())``
  with one optimizer and saves ``loss.state_dict()`` in the checkpoint.

``build("mbls:margin=6,lam=0.1", num_classes=10)`` turns a spec string into a module.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

from torch import nn

from calibkit.errors import UserError

from .adafocal import AdaFocal
from .basic import ACLS, ECP, FLSD, IGNORE_INDEX, CrossEntropy, DualFocal, Focal, LabelSmoothing, MbLS
from .fedlas import FeDLaS, _fedlas_ls, _fedlas_mbls

__all__ = [
    "CrossEntropy", "LabelSmoothing", "Focal", "FLSD", "ECP", "MbLS", "ACLS", "DualFocal",
    "AdaFocal", "FeDLaS", "LOSSES", "build",
]


# name -> class or factory; `build` reads the hyperparameter names from their signatures.
LOSSES: dict[str, Callable[..., nn.Module]] = {
    "ce": CrossEntropy,
    "ls": LabelSmoothing,
    "focal": Focal,
    "flsd": FLSD,
    "ecp": ECP,
    "mbls": MbLS,
    "acls": ACLS,
    "dfl": DualFocal,
    "adafocal": AdaFocal,
    "fedlas_ls": _fedlas_ls,
    "fedlas_mbls": _fedlas_mbls,
}

_INT = re.compile(r"[+-]?\d+")


def _parse_value(text: str):
    """``true``/``false`` -> bool, integers, floats, otherwise the string (quotes stripped). No eval."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if _INT.fullmatch(text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text.strip("'\"")


def build(spec: str, num_classes: int | None = None, ignore_index: int | None = IGNORE_INDEX) -> nn.Module:
    """Build a loss module from ``"name"`` or ``"name:key=value,key=value"``.

    >>> build("mbls:margin=6,lam=0.1")
    MbLS(margin=6, lam=0.1)

    ``ignore_index`` (the unlabelled-pixel target of dense inputs, default 255) comes from the
    data, not from the spec, and is passed to every loss.

    Raises:
        ValueError: unknown name or hyperparameter (listing the valid ones), malformed spec, or a
            loss that needs ``num_classes`` (AdaFocal, FeDLaS) built without it.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise UserError(f"loss spec must be a non-empty string like 'mbls:margin=6', got {spec!r}")
    name, _, rest = spec.partition(":")
    name = name.strip().lower()
    if name not in LOSSES:
        raise UserError(f"unknown loss {name!r}; valid losses: {', '.join(LOSSES)}")
    factory = LOSSES[name]
    params = inspect.signature(factory).parameters
    valid = [p for p in params if p not in ("num_classes", "ignore_index")]
    kwargs = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key or not value.strip():
            raise UserError(f"malformed item {item!r} in loss spec {spec!r}: expected key=value")
        if key not in valid:
            raise UserError(f"unknown hyperparameter {key!r} for loss {name!r}; "
                             f"valid: {', '.join(valid) if valid else '(none)'}")
        if key in kwargs:
            raise UserError(f"hyperparameter {key!r} given twice in loss spec {spec!r}")
        kwargs[key] = _parse_value(value.strip())
    if "num_classes" in params:
        if num_classes is None:
            raise UserError(f"loss {name!r} needs num_classes: build({spec!r}, num_classes=K)")
        kwargs["num_classes"] = num_classes
    if "ignore_index" in params:
        kwargs["ignore_index"] = ignore_index
    return factory(**kwargs)
