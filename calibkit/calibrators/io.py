"""Saving and loading fitted calibrators: ``STEM.safetensors`` (tensor state) + ``STEM.json``.

The JSON sidecar holds ``{"format": "calibkit-calibrator", "version": 1, "calibrator": NAME,
"params": {...}, "state": {...}, "tensors": [...]}``: the registry name, the hyperparameters, the
non-tensor state (python numbers, exactly as JSON writes them) and the names of the tensors kept
in the safetensors file (float64/int64, CPU). A round trip reproduces ``predict_proba`` exactly.
Writes go to a temporary file first, so an existing pair is never left half-written.

:func:`load` validates what it reads before anything can use it: the format and its version
(only ``VERSION`` is known), the calibrator's name, its hyperparameters (the checks of ``fit``),
and every field of its state (no unknown field, no tensor the JSON does not list; type,
float64/int64 dtype, shape for the recorded ``K``, finite, in range:
:mod:`calibkit.calibrators._state`). A problem is one ``ValueError`` line naming the
file and the field. ``TemperatureScaling`` files written before it recorded ``K`` and the layout
(no ``n_classes_``/``binary_``) are refused with a line that says to fit and save it again: the
``K`` of such a file is unknown, and applying a temperature to another classifier's logits is
exactly the silent error the check exists for.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save as st_save

from calibkit.calibrators._state import COMMON, StateError, check_state
from calibkit.calibrators.registry import CALIBRATORS
from calibkit.calibrators.stack import NAME as STACK
from calibkit.calibrators.stack import StackedCalibration, check_stack
from calibkit.errors import UserError

__all__ = ["save", "load", "paths", "calibrator_class", "check_fitted_state"]

FORMAT = "calibkit-calibrator"
VERSION = 1


def paths(path) -> tuple[Path, Path]:
    """``(STEM.safetensors, STEM.json)`` for ``path`` given with either suffix or none."""
    p = Path(path)
    if p.suffix in (".safetensors", ".json"):
        p = p.with_suffix("")
    return p.with_name(p.name + ".safetensors"), p.with_name(p.name + ".json")


def _registry_name(cal) -> str:
    if type(cal) is StackedCalibration:
        return STACK
    for name, cls in CALIBRATORS.items():
        if type(cal) is cls:
            return name
    raise UserError(f"cannot save a {type(cal).__name__}: not a registered calibrator "
                     f"({', '.join(CALIBRATORS)}) nor a stack of them")


def calibrator_class(name: object):
    """The class saved under ``name``: a registry entry or the stack (None for anything else)."""
    if not isinstance(name, str):
        return None
    return StackedCalibration if name == STACK else CALIBRATORS.get(name)


def check_fitted_state(name: str, cal) -> None:
    """Validate the fitted state of ``cal`` saved as ``name`` (raises :class:`StateError`)."""
    check_stack(cal) if name == STACK else check_state(name, cal)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def save(cal, path) -> tuple[Path, Path]:
    """Write the fitted calibrator ``cal`` to ``STEM.safetensors`` + ``STEM.json``; returns both paths."""
    name = _registry_name(cal)
    d = cal.to_dict()
    tensors = {k: v for k, v in d["state"].items() if isinstance(v, torch.Tensor)}
    meta = {"format": FORMAT, "version": VERSION, "calibrator": name, "params": d["params"],
            "state": {k: v for k, v in d["state"].items() if k not in tensors}, "tensors": sorted(tensors)}
    json_text = json.dumps(meta, indent=2)  # fails here, before any write, on a value JSON cannot hold
    st_path, json_path = paths(path)
    st_path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(st_path, st_save(tensors) if tensors else st_save({}))
    _atomic_write(json_path, json_text.encode())
    return st_path, json_path


def load(path):
    """The calibrator saved by :func:`save` at ``path`` (``STEM``, ``STEM.json`` or ``STEM.safetensors``).

    Raises:
        FileNotFoundError: a file of the pair is missing.
        ValueError: the files are not a calibkit calibrator, have an unknown format version, name
            an unknown calibrator, lack state, or hold an invalid hyperparameter or state field
            (one line naming the file and the field; module docstring).
    """
    st_path, json_path = paths(path)
    for p in (json_path, st_path):
        if not p.is_file():
            raise FileNotFoundError(f"calibrator file not found: {p}; give the path a calibrator was saved to "
                                    "(`calibkit calibrate --save`, or the calibrator's save)")
    try:
        meta = json.loads(json_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{json_path}: not a calibrator description (invalid JSON: {exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise UserError(f"{json_path}: not a calibkit calibrator file (no \"format\": \"{FORMAT}\")")
    name = meta.get("calibrator")
    if calibrator_class(name) is None:
        raise UserError(f"{json_path}: unknown calibrator {name!r}; expected one of {', '.join(CALIBRATORS)}, {STACK}")
    version = meta.get("version")
    if isinstance(version, bool) or version != VERSION:
        raise UserError(f"{json_path}: unknown format version {version!r}; this calibkit reads version {VERSION}")
    try:
        tensors = load_file(str(st_path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise UserError(f"{st_path}: cannot read the calibrator's tensors ({exc})") from None
    names, saved, params = meta.get("tensors", []), meta.get("state", {}), meta.get("params", {})
    for key, value, kind in (("tensors", names, list), ("state", saved, dict), ("params", params, dict)):
        if not isinstance(value, kind) or (kind is list and not all(isinstance(v, str) for v in value)):
            raise UserError(f"{json_path}: invalid \"{key}\": must be a JSON "
                            f"{'list of names' if kind is list else 'object'}, "
                             f"got {json.dumps(value)[:60]}")
    missing = [k for k in names if k not in tensors]
    if missing:
        raise UserError(f"{st_path}: lacks the tensor(s) {', '.join(missing)}")
    cls = calibrator_class(name)
    required = cls._STATE + COMMON
    stray = sorted(set(tensors) - set(names))  # in the file, but not listed by the JSON
    if stray:
        raise UserError(f"{st_path}: unknown tensor(s) {', '.join(stray)}: {json_path.name} lists "
                         f"{', '.join(names) or 'none'}")
    unknown = sorted((set(saved) | set(names)) - set(required))
    if unknown:
        raise UserError(f"{json_path}: unknown state field(s) {', '.join(unknown)} (a {name} calibrator has "
                         f"{', '.join(required)})")
    state = {**saved, **{k: tensors[k] for k in names}}
    lacking = [k for k in required if k not in state]
    if lacking and lacking == [k for k in ("n_classes_", "binary_") if k in lacking] and name == "temperature":
        raise UserError(f"{json_path}: saved state lacks {', '.join(lacking)}: written by an older calibkit that did "
                         "not record the K it was fitted on; fit it again and save it")
    if lacking:
        raise UserError(f"{json_path}: saved state lacks {', '.join(lacking)}")
    try:
        cal = cls.from_dict({"params": params, "state": state})
        cal._check_params()  # the hyperparameter checks of fit, for every calibrator
    except (TypeError, ValueError) as exc:
        raise UserError(f"{json_path}: invalid hyperparameters ({exc})") from None
    try:
        check_fitted_state(name, cal)
    except StateError as exc:
        raise UserError(f"{st_path if exc.field in names else json_path}: {exc}") from None
    return cal
