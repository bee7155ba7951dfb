"""The user's own model: ``"package.module:factory"`` or ``"path/to/file.py:factory"``.

A model name that is not a ``MODELS`` key but holds a ``:`` names a callable
``factory(num_classes, in_channels)`` returning an ``nn.Module`` with calibkit's contract
(``calibkit.models``): ``forward_features(x) -> (N, D)``, ``head`` an ``nn.Linear(D, K)``, and
``model(x) == model.head(model.forward_features(x))``. The module is imported by name (it must be
on ``sys.path``, e.g. installed or in the working directory), or loaded from the ``.py`` file
(a relative path is read from the working directory). :func:`check_contract` builds nothing
itself; the bench's preflight builds the model once on the data and calls it, so a missing piece
is named before any run starts.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import torch
from torch import nn


def import_factory(spec: str):
    """The callable named by ``"module:attr"`` or ``"file.py:attr"``.

    Raises:
        ValueError: no ``:``, a missing file, a module that fails to import, or no such attribute.
    """
    module_name, colon, attr = spec.rpartition(":")
    if not colon or not module_name or not attr:
        raise ValueError(f"model {spec!r}: expected a calibkit.models name or 'package.module:factory'")
    if module_name.endswith(".py"):
        path = os.path.abspath(module_name)
        if not os.path.isfile(path):
            raise ValueError(f"model {spec!r}: file {module_name} not found")
        key = f"calibkit_user_model_{abs(hash(path))}"
        module = sys.modules.get(key)
        if module is None:
            loader_spec = importlib.util.spec_from_file_location(key, path)
            module = importlib.util.module_from_spec(loader_spec)
            try:
                loader_spec.loader.exec_module(module)
            except Exception as exc:
                raise ValueError(f"model {spec!r}: importing {module_name} failed ({type(exc).__name__}: {exc})") from exc
            sys.modules[key] = module
    else:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            raise ValueError(f"model {spec!r}: cannot import {module_name} ({exc}); is it on the Python path "
                             "(installed, or in the working directory)?") from None
        except Exception as exc:
            raise ValueError(f"model {spec!r}: importing {module_name} failed ({type(exc).__name__}: {exc})") from exc
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise ValueError(f"model {spec!r}: {module_name} has no callable {attr!r}")
    return factory


def check_contract(model, x: torch.Tensor, num_classes: int, name: str = "model") -> None:
    """Raise ``ValueError`` listing every part of the contract ``model`` misses on inputs ``x``.

    Checked: an ``nn.Module``; a ``forward_features`` method; a ``head`` that is an
    ``nn.Linear`` with ``out_features == num_classes``; ``forward_features(x)`` of shape
    ``(N, head.in_features)``; ``model(x)`` of shape ``(N, K)`` equal to ``head(features)``.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"{name}: the factory returned {type(model).__name__}, not a torch.nn.Module")
    problems = []
    if not callable(getattr(model, "forward_features", None)):
        problems.append("no forward_features(x) method (it returns the penultimate features (N, D))")
    head = getattr(model, "head", None)
    if not isinstance(head, nn.Linear):
        problems.append(f"head must be an nn.Linear(D, {num_classes}) attribute, got "
                        f"{type(head).__name__ if head is not None else 'none'}")
    elif head.out_features != num_classes:
        problems.append(f"head has {head.out_features} outputs, the data has {num_classes} classes")
    if problems:
        raise ValueError(f"{name} misses calibkit's model contract: " + "; ".join(problems))
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            feats = model.forward_features(x)
            logits = model(x)
    except Exception as exc:
        raise ValueError(f"{name}: a forward pass on inputs {x.dtype} {tuple(x.shape)} failed "
                         f"({type(exc).__name__}: {exc})") from exc
    finally:
        model.train(was)
    n = x.shape[0]
    if not isinstance(feats, torch.Tensor) or feats.shape != (n, head.in_features):
        got = tuple(feats.shape) if isinstance(feats, torch.Tensor) else type(feats).__name__
        problems.append(f"forward_features(x) must return (N, {head.in_features}) = head.in_features, got {got}")
    if not isinstance(logits, torch.Tensor) or logits.shape != (n, num_classes):
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        problems.append(f"model(x) must return logits (N, {num_classes}), got {got}")
    elif not problems and not torch.allclose(logits, head(feats), rtol=1e-4, atol=1e-5):
        problems.append("model(x) differs from model.head(model.forward_features(x)); forward must be exactly that")
    if problems:
        raise ValueError(f"{name} misses calibkit's model contract: " + "; ".join(problems))
