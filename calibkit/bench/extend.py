"""Grid extension and no-effect axes of ``calibkit tune``.

**Extension.** When a method's selection lies on the edge of one of its grids (the first or last
value of an axis with 3 or more values, :func:`calibkit.bench.space.at_edge`), the tuner adds one
value beyond that edge (:func:`next_value`), trains the new candidates (the full product with the
other axes) and selects again, at most :data:`MAX_EXTENSIONS` times per axis. The step, decided
here (the literature's grids say nothing about going past them):

* **geometric** when the two outermost values at that edge are both positive and their ratio is at
  least :data:`GEOMETRIC_RATIO` (1.5): the grid is read as log-spaced there and the next value
  continues the ratio (LS alpha 0.1, 0.2 -> 0.4; 0.03, 0.01 -> 0.00333);
* **linear** otherwise: the next value continues the outermost difference (focal gamma 3, 4 -> 5;
  MbLS margins 15, 20 -> 25);
* rounded to 3 significant digits, so that the value reads in a run key;
* never past the axis's hard bound (:data:`calibkit.bench.grid.BOUNDS`): a step that would pass a
  closed bound stops on the bound itself (margin 0), one that would pass an open bound goes half
  way to it (alpha 0.8 -> 0.9 below 1); an edge already on its bound is not extended.

What was added is recorded in the ``meta`` table of ``runs.db`` (:func:`meta_key`), with the
grid it extends, so that every process and every later ``calibkit tune`` in the directory see the
same space; a record made for another grid is ignored (and replaced when that grid is extended).

**No effect.** An axis has no effect when, for every setting of the method's other axes, all its
values gave **bit-identical validation logits** (``torch.equal`` on the ``val_logits`` of each
candidate's ``logits.safetensors``; the test tensors are never read). Only axes with 2 or more
values whose candidates all finished are judged.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from calibkit import rundir
from calibkit.bench.grid import Axis, Bound, bound_for
from calibkit.bench.space import at_edge

MAX_EXTENSIONS = 2
GEOMETRIC_RATIO = 1.5


def meta_key(preset: str, seed: int, method: str) -> str:
    """The ``meta`` row holding a method's tuning record (extensions, no-effect axes)."""
    return f"tune/{preset}/{int(seed)}/{method}"


def _round(x: float) -> float:
    return float(f"{x:.3g}")


def next_value(values, side: str, bound: Bound) -> tuple[float | None, str]:
    """The value beyond ``side`` (``"low"`` or ``"high"``) of a sorted grid, and how it was made.

    Returns:
        ``(value, step)`` with ``step`` one of ``geometric``, ``linear``, ``bound``, ``half-way``;
        ``(None, reason)`` when the edge cannot move (on its bound, or fewer than 2 values).
    """
    v = sorted(float(x) for x in values)
    if len(v) < 2:
        return None, "fewer than 2 values"
    edge, inner = (v[0], v[1]) if side == "low" else (v[-1], v[-2])
    if edge > 0 and inner > 0 and max(edge, inner) / min(edge, inner) >= GEOMETRIC_RATIO:
        new, step = _round(edge * edge / inner), "geometric"
    else:
        new, step = _round(edge + (edge - inner)), "linear"
    if not bound.admits(new):
        limit = bound.low if side == "low" else bound.high
        is_open = bound.low_open if side == "low" else bound.high_open
        if limit is None:  # a rounding artefact at an unbounded end: nothing sensible to add
            return None, "no admissible value"
        new, step = (_round((edge + limit) / 2), "half-way") if is_open else (float(limit), "bound")
        if not bound.admits(new):
            return None, f"on its bound {bound.text()}"
    if not (new < v[0] if side == "low" else new > v[-1]):  # the bound leaves no room past the edge
        return None, f"on its bound {bound.text()}"
    return new, step


def base_grids(space: dict) -> dict:
    return {a: [float(x) for x in axis.values] for a, axis in space.items()}


def extended_space(space: dict, record: dict | None) -> dict:
    """``space`` with the values of a tuning record added (``record`` for another grid: ignored)."""
    if not record or record.get("base") != base_grids(space):
        return dict(space)
    out = {}
    for address, axis in space.items():
        added = [float(x) for x in record.get("added", {}).get(address, [])]
        out[address] = Axis(tuple(sorted({*map(float, axis.values), *added})), axis.default)
    return out


def plan(space: dict, record: dict | None, winner: dict,
         limit: int = MAX_EXTENSIONS) -> tuple[dict | None, list[str]]:
    """The next record after a selection of ``winner`` in ``extended_space(space, record)``.

    Returns:
        ``(record, notes)``: ``record`` gains one value on every axis whose selection lies on an
        edge (if the axis has been extended fewer than ``limit`` times and the edge is
        not on its bound); ``notes`` says, per edge, what was added or why nothing was. The record
        is returned unchanged (same object, None when it was None) when nothing was added.
    """
    base = base_grids(space)
    current = record if record and record.get("base") == base else {"base": base, "added": {}, "steps": {}}
    full = extended_space(space, current)
    added = {a: list(v) for a, v in current.get("added", {}).items()}
    steps = {a: list(v) for a, v in current.get("steps", {}).items()}
    notes, changed = [], False
    for address in at_edge(winner, full):
        values = full[address].values
        side = "low" if float(winner[address]) == min(values) else "high"
        name = address.partition(".")[2] or address
        if len(added.get(address, [])) >= limit:
            notes.append(f"{name}={float(winner[address]):g} is on the {side} edge" + (
                f" after {limit} extension(s)" if limit else "; widen the grid") + ": not extended further")
            continue
        new, step = next_value(values, side, bound_for(address, space[address]))
        if new is None:
            notes.append(f"{name}={float(winner[address]):g} is on the {side} edge, {step}: not extended")
            continue
        added.setdefault(address, []).append(new)
        steps.setdefault(address, []).append(step)
        changed = True
        notes.append(f"{name}: {float(winner[address]):g} is on the {side} edge; {new:g} added ({step} step)")
    if not changed:
        return record, notes
    return {**current, "base": base, "added": added, "steps": steps}, notes


def no_effect_axes(space: dict, rows: list[dict]) -> list[str]:
    """Addresses whose values all gave bit-identical validation logits (see the module docstring).

    Args:
        space: the (extended) search space the rows belong to.
        rows: finished candidates (``hparams``, ``run_dir``).
    """
    cache = {}

    def logits(row):
        key = row["run_dir"]
        if key not in cache:
            cache[key] = _val_logits(row["run_dir"])
        return cache[key]

    out = []
    for address, axis in space.items():
        if len(axis.values) < 2:
            continue
        groups: dict[tuple, list[dict]] = {}
        for r in rows:
            rest = tuple(sorted((a, float(v)) for a, v in r["hparams"].items() if a != address))
            groups.setdefault(rest, []).append(r)
        full = [g for g in groups.values() if {float(r["hparams"][address]) for r in g} >= set(map(float, axis.values))]
        if not full:
            continue
        try:
            same = all(torch.equal(logits(g[0]), logits(r)) for g in full for r in g[1:])
        except (OSError, KeyError, ValueError):
            continue  # a candidate's logits are gone: no verdict
        if same:
            out.append(address)
    return out


def _val_logits(run_dir):
    with safe_open(str(Path(run_dir) / rundir.LOGITS), framework="pt") as f:
        return f.get_tensor("val_logits")


def dumps(record: dict) -> str:
    return json.dumps(record, sort_keys=True)
