"""Search-space helpers of the grid: enumerate a method's candidates, apply values to a preset,
read back the values a preset runs, and flag selections on a grid's edge.

A value's address says where it goes (``calibkit.bench.grid.TARGETS``): ``loss.<param>`` into
the method's loss spec, ``train.<field>`` into its training overrides, ``maccal.<field>`` and
``csm.<field>`` into the preset's MaC-Cal and CSM settings.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from calibkit.bench.grid import TARGETS, Preset, space_for
from calibkit.errors import UserError


def _fmt(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def slug(values: dict) -> str:
    """``{"loss.margin": 6.0}`` -> ``"margin=6"`` (a candidate's directory and key suffix)."""
    if not values:
        return "default"
    return ",".join(f"{a.partition('.')[2]}={v:g}" for a, v in sorted(values.items()))


def loss_params(spec: str) -> tuple[str, dict[str, str]]:
    """``"mbls:margin=6,lam=0.1"`` -> ``("mbls", {"margin": "6", "lam": "0.1"})`` (values as text)."""
    name, _, rest = spec.partition(":")
    params = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise UserError(f"loss spec {spec!r}: expected key=value, got {item!r}")
        params[key.strip()] = value.strip()
    return name.strip(), params


def with_loss_params(spec: str, values: dict) -> str:
    """The loss spec ``spec`` with some parameters set (others kept, in their order)."""
    name, params = loss_params(spec)
    params.update({k: _fmt(v) for k, v in values.items()})
    return name + (":" + ",".join(f"{k}={v}" for k, v in params.items()) if params else "")


def candidates(method: str, preset: Preset | None = None, space: dict | None = None) -> list[dict]:
    """Every point of ``space`` (default: the method's under ``preset``,
    ``calibkit.bench.grid.space_for``; ``[{}]`` for a method with none), in grid order."""
    space = space_for(preset, method) if space is None else space
    if not space:
        return [{}]
    names = list(space)
    return [dict(zip(names, combo)) for combo in itertools.product(*(space[n].values for n in names))]


def apply_values(preset: Preset, method: str, values: dict) -> Preset:
    """A copy of ``preset`` running ``method`` with the search-space ``values`` (``{address: v}``)."""
    losses, by_method = dict(preset.losses), {k: dict(v) for k, v in preset.train_by_method.items()}
    maccal, csm = dict(preset.maccal), dict(preset.csm)
    loss_values = {}
    for address, value in values.items():
        target, _, name = address.partition(".")
        if target not in TARGETS or not name:
            raise UserError(f"{method}: bad search-space address {address!r}; expected <{'|'.join(TARGETS)}>.<name>")
        if target == "loss":
            loss_values[name] = value
        elif target == "train":
            by_method.setdefault(method, {})[name] = value
        elif target == "maccal":
            maccal[name] = value
        else:
            csm[name] = value
    if loss_values:
        losses[method] = with_loss_params(preset.loss_for(method), loss_values)
    return replace(preset, losses=losses, train_by_method=by_method, maccal=maccal, csm=csm)


def current_values(preset: Preset, method: str) -> dict:
    """The values the preset runs ``method`` with, for each address of its space (published
    default where the preset sets none)."""
    out = {}
    _, params = loss_params(preset.loss_for(method))
    for address, axis in space_for(preset, method).items():
        target, _, name = address.partition(".")
        source = {"loss": params, "train": preset.train_by_method.get(method, {}),
                  "maccal": preset.maccal, "csm": preset.csm}[target]
        out[address] = float(source[name]) if name in source else axis.default
    return out


def at_edge(values: dict, space: dict) -> list[str]:
    """The addresses whose value is the first or last of a grid of 3 or more values."""
    return [a for a, axis in space.items()
            if len(axis.values) >= 3 and float(values[a]) in (min(axis.values), max(axis.values))]
