"""The user's own model: ``"package.module:factory"`` or ``"path/to/file.py:factory"``.

A model name that is not a ``MODELS`` key but holds a ``:`` names a callable
``factory(num_classes, in_channels)`` returning an ``nn.Module`` with calibkit's contract
(``calibkit.models``): ``forward_features(x) -> (N, D)``, ``head`` an ``nn.Linear(D, K)``, and
``model(x) == model.head(model.forward_features(x))``. The module is imported by name, or loaded
from the ``.py`` file (a relative path is read from the working directory).

Where ``module:factory`` is looked for (calibkit's rule, the same for the ``calibkit`` console
script, ``python -m calibkit`` and the bench's worker processes): the working directory first,
then ``sys.path`` (installed packages, ``PYTHONPATH``). A ``mymodels.py`` (or a ``mymodels/``
package) in the working directory therefore wins over an installed module of the same name, as it
does for ``python -m``; a module already imported in the process (``torch``, ``numpy``, ...) is
that module. The working directory is on ``sys.path`` only while the module itself is imported:
what it imports at its top level is found there too, a module it imports later (inside the
factory) must be importable from ``sys.path``. A module that raises or calls ``sys.exit`` when
imported is one ``ValueError`` naming the module (never an exit of calibkit).

:func:`check_contract` builds nothing itself; the bench's preflight builds the model once on the
data and calls it, so a missing piece is named before any run starts.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import torch
from torch import nn

from calibkit.errors import UserError


def import_factory(spec: str):
    """The callable named by ``"module:attr"`` or ``"file.py:attr"``.

    Raises:
        ValueError: no ``:``, a missing file, a module that fails to import, or no such attribute.
    """
    module_name, colon, attr = spec.rpartition(":")
    if not colon or not module_name or not attr:
        raise UserError(f"model {spec!r}: expected a calibkit.models name or 'package.module:factory'")
    if module_name.endswith(".py"):
        path = os.path.abspath(module_name)
        if not os.path.isfile(path):
            raise UserError(f"model {spec!r}: file {module_name} not found")
        key = f"calibkit_user_model_{abs(hash(path))}"
        module = sys.modules.get(key)
        if module is None:
            loader_spec = importlib.util.spec_from_file_location(key, path)
            if loader_spec is None or loader_spec.loader is None:
                raise UserError(f"model {spec!r}: {path} cannot be imported as a Python module")
            module = importlib.util.module_from_spec(loader_spec)
            with _import_errors(spec, module_name):
                loader_spec.loader.exec_module(module)
            sys.modules[key] = module
    else:
        module = _import_from_cwd(spec, module_name)
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise UserError(f"model {spec!r}: {module_name} has no callable {attr!r}")
    return factory


def _import_from_cwd(spec: str, module_name: str):
    """``import module_name`` with the working directory first on ``sys.path`` for this import only."""
    cwd = os.getcwd()
    sys.path.insert(0, cwd)
    importlib.invalidate_caches()  # a module written since the last import is found
    try:
        with _import_errors(spec, module_name):
            return importlib.import_module(module_name)
    finally:
        try:
            sys.path.remove(cwd)  # the first occurrence: the one inserted above
        except ValueError:
            pass


class _import_errors:
    """Turn what importing the user's module raises (``SystemExit`` too) into one ``ValueError``."""

    def __init__(self, spec: str, module_name: str):
        self.spec, self.module_name = spec, module_name

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None or not isinstance(exc, (Exception, SystemExit)):
            return False  # KeyboardInterrupt and the like pass through
        where = f"model {self.spec!r}: "
        top = self.module_name.split(".")[0]
        if isinstance(exc, ModuleNotFoundError) and exc.name in (self.module_name, top) or (
                isinstance(exc, ModuleNotFoundError) and self.module_name.startswith(f"{exc.name}.")):
            raise UserError(f"{where}cannot import {self.module_name} ({exc}); it is looked for in the working "
                             f"directory ({os.getcwd()}) and on the Python path (installed, or PYTHONPATH)") from None
        if isinstance(exc, SystemExit):
            raise UserError(f"{where}importing {self.module_name} called sys.exit({exc.code!r}); a model module must "
                             "not exit when imported (guard script code with `if __name__ == \"__main__\":`)") from None
        raise UserError(f"{where}importing {self.module_name} failed ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())})") from exc


def check_contract(model, x: torch.Tensor, num_classes: int, name: str = "model") -> None:
    """Raise ``ValueError`` listing every part of the contract ``model`` misses on inputs ``x``.

    Checked: an ``nn.Module``; a ``forward_features`` method; a ``head`` that is an
    ``nn.Linear`` with ``out_features == num_classes``; ``forward_features(x)`` of shape
    ``(N, head.in_features)``; ``model(x)`` of shape ``(N, K)``; both finite (NaN or infinite
    outputs are one line saying so); ``model(x)`` equal to ``head(features)``.
    """
    if not isinstance(model, nn.Module):
        raise UserError(f"{name}: the factory returned {type(model).__name__}, not a torch.nn.Module")
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
        raise UserError(f"{name} misses calibkit's model contract: " + "; ".join(problems))
    assert isinstance(head, nn.Linear)  # for the type checker: a problem above otherwise
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            feats = model.forward_features(x)  # type: ignore[operator]  # checked above
            logits = model(x)
    except Exception as exc:
        raise UserError(f"{name}: a forward pass on inputs {x.dtype} {tuple(x.shape)} failed "
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
    if problems:
        raise UserError(f"{name} misses calibkit's model contract: " + "; ".join(problems))
    _check_finite(name, x, feats, logits)
    if not torch.allclose(logits, head(feats), rtol=1e-4, atol=1e-5):
        raise UserError(f"{name} misses calibkit's model contract: model(x) differs from "
                         "model.head(model.forward_features(x)); forward must be exactly that")


def _check_finite(name: str, x: torch.Tensor, feats: torch.Tensor, logits: torch.Tensor) -> None:
    """NaN or infinite outputs on (finite) training inputs: every run would train on NaN losses
    (and NaN never equals NaN, so they would otherwise read as a forward that is not the head's)."""
    bad = [what for what, t in (("forward_features(x)", feats), ("model(x)", logits)) if not torch.isfinite(t).all()]
    if bad:
        raise UserError(f"{name}: the outputs are not finite: {' and '.join(bad)} hold NaN or infinite values on "
                         f"{x.shape[0]} training inputs ({x.dtype} {tuple(x.shape)}); check the model's forward and "
                         "its initialisation")
