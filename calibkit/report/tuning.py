"""The tuning part of the bench report: the selection table, its JSON record and the validation curves.

``calibkit tune`` writes the tuning table and figure with the functions below, and the report's
protocol section (:mod:`calibkit.report.protocol`) shows them when the directory holds a tuning run:

* **Selection** (:func:`tuning_rows`, :func:`tuning_text`, :func:`write_tuning_json`): per tuned
  method, the selected values, their validation metrics, the candidates and the exclusions;
* **Validation curves** (:func:`write_tuning_figure`): small multiples of validation ECE and
  accuracy against each searched value, the selected candidate marked, from the ``tuning`` table
  of ``DIR/runs.db`` when the directory holds a tuning run.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt

from calibkit.bench.extend import meta_key
from calibkit.bench.grid import METHODS, REFERENCE, Axis
from calibkit.bench.paths import RETIRED
from calibkit.bench.selection_rule import DEFAULT_CRITERION, Criterion, eligible
from calibkit.bench.space import at_edge
from calibkit.errors import UserError
from calibkit.report.preset import recorded_preset
from calibkit.rundir import atomic_write
from calibkit.store import describe_store, open_store


def _label(method: str) -> str:
    return METHODS[method].label if method in METHODS else method


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _values(d: dict) -> str:
    return ", ".join(f"{k.partition('.')[2] or k}={_fmt(v)}" for k, v in sorted(d.items())) or "-"


def load_candidates(out_dir, preset: str, store: str | None = None) -> list[dict]:
    """Finished tuning candidates of ``preset`` in ``out_dir/runs.db`` (empty without any), or in
    the PostgreSQL store at ``store``."""
    if store is None and not (Path(out_dir) / "runs.db").is_file():
        return []
    db = open_store(out_dir, store, readonly=True)
    try:
        return db.candidates(preset)
    finally:
        db.close()


def load_records(out_dir, preset: str, store: str | None = None) -> dict[str, dict]:
    """``{method: tuning record}`` (extensions, no-effect axes, notes; :mod:`calibkit.bench.extend`)
    of ``preset``'s tuning in ``out_dir/runs.db`` (or the store at ``store``), for the seeds that
    have candidates."""
    if store is None and not (Path(out_dir) / "runs.db").is_file():
        return {}
    db = open_store(out_dir, store, readonly=True)
    try:
        out = {}
        for c in db.candidates(preset):
            text = db.get_meta(meta_key(preset, c["seed"], c["method"]))
            if text:
                out[c["method"]] = json.loads(text)
        return out
    finally:
        db.close()


def space_of(method: str, record: dict | None) -> dict:
    """The space a method was tuned on: the grid its record extends plus what was added (else
    the declared grid)."""
    if not record:
        return METHODS[method].space if method in METHODS else {}
    return {a: Axis(tuple(sorted({*v, *record.get("added", {}).get(a, [])})), 0.0) for a, v in record["base"].items()}


def selection_of(store, preset: str) -> dict[str, dict]:
    """``{method: selected values}`` recorded in the tuning table (the latest selection seed wins)."""
    return {c["method"]: dict(c["hparams"]) for c in store.candidates(preset) if c["selected"]}


def current_runs(rows: list[dict], store, preset: str) -> tuple[list[dict], list[dict]]:
    """``(shown, hidden)``: the runs the report shows, and the others: runs moved aside by a
    re-tuning (``KEY~<values>``, :meth:`calibkit.bench.runner.Bench.supersede`) and runs of a
    method at other values than the directory's recorded selection. So a report never shows two
    values for one method."""
    selection = selection_of(store, preset)
    shown: list[dict] = []
    hidden: list[dict] = []
    for r in rows:
        values = (r.get("config") or {}).get("hparams")
        stale = r["method"] in selection and values is not None and values != selection[r["method"]]
        (hidden if RETIRED in r["run_key"] or stale else shown).append(r)
    return shown, hidden


def _extended(record: dict | None) -> str:
    added = (record or {}).get("added") or {}
    return "; ".join(f"{a.partition('.')[2]} +{', +'.join(f'{v:g}' for v in vs)}" for a, vs in sorted(added.items())
                     if vs) or "-"


def _recorded_preset(out_dir, preset: str):
    """The preset recorded in ``out_dir`` (``calibkit.report.preset.recorded_preset``), or None."""
    try:
        return recorded_preset(out_dir, preset)
    except (OSError, ValueError):
        return None


def _excluded(group: list[dict]) -> list[dict]:
    """A method's candidates outside the accuracy window of the criterion recorded with its
    selection (``Criterion.from_dict``: an old record reads as its own rule), else the default."""
    chosen = next((c for c in group if c["selected"]), None)
    inside = set(eligible(group, Criterion.from_dict(chosen.get("criterion")) if chosen else DEFAULT_CRITERION))
    return [c for i, c in enumerate(group) if i not in inside]


def _by_method(cands: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for c in cands:
        out.setdefault(c["method"], []).append(c)
    return out


# -- text ----------------------------------------------------------------------------------------
def tuning_rows(cands: list[dict], records: dict | None = None) -> tuple[list[str], list[list[str]]]:
    """One row per tuned method: the selection, its validation metrics, candidates, exclusions,
    the values the tuner added beyond the declared grid, and notes (edges, axes with no effect)."""
    records = records or {}
    header = ["Method", "selected", "val ECE", "val Acc", "candidates", "excluded (acc)", "extended", "note"]
    rows = []
    for method, group in _by_method(cands).items():
        if method == REFERENCE or method not in METHODS:
            continue
        record = records.get(method)
        chosen = [c for c in group if c["selected"]]
        excluded = len(_excluded(group))
        notes = [f"no effect: {a} (bit-identical validation logits)"
                 for a in (record or {}).get("no_effect", [])]
        if chosen:
            edge = at_edge(chosen[0]["hparams"], space_of(method, record))
            if edge:
                notes.insert(0, f"on the grid edge ({', '.join(edge)})")
            c = chosen[0]
            rows.append([_label(method), _values(c["hparams"]), f"{100 * c['metrics']['ece']:.2f}",
                         f"{100 * c['metrics']['acc']:.2f}", str(len(group)), str(excluded), _extended(record),
                         "; ".join(notes)])
        else:
            rows.append([_label(method), "(no selection yet)", "", "", str(len(group)), str(excluded),
                         _extended(record), "; ".join(notes)])
    return header, rows


def tuning_text(out_dir, preset: str, store: str | None = None) -> str:
    """A terminal table of the selection recorded in ``out_dir/runs.db`` (or ``store``)."""
    cands = load_candidates(out_dir, preset, store)
    if not cands:
        return f"no tuning candidates of preset {preset!r} in {out_dir}/runs.db"
    header, rows = tuning_rows(cands, load_records(out_dir, preset, store))
    seeds = sorted({c["seed"] for c in cands})
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths))  # noqa: E731
    ce = [c for c in cands if c["method"] == REFERENCE]
    ref = (f"; CE: val ECE {100 * ce[0]['metrics']['ece']:.2f}, val Acc {100 * ce[0]['metrics']['acc']:.2f}"
           if ce else "")
    title = (f"selection on the validation split (seed {', '.join(map(str, seeds))}; ECE and Acc x100, before "
             f"temperature scaling{ref})")
    return "\n".join([title, line(header), *map(line, rows)])


def write_tuning_json(out_dir, preset: str, path=None, store: str | None = None) -> Path | None:
    """Every candidate of ``preset`` (values, validation metrics, selected flag) as one JSON file.

    The file (default ``out_dir/report/tuning.json``) is what a committed tuning run keeps with
    the repository, so that anyone can re-derive a preset's values with
    :func:`calibkit.bench.tune.select`. Returns its path, or ``None`` without candidates.
    """
    cands = load_candidates(out_dir, preset, store)
    if not cands:
        return None
    keep = ("acc", "ece", "aece", "nll", "brier", "o_ece", "u_ece", "n")
    doc = {"preset": preset, "seed": sorted({c["seed"] for c in cands}),
           "criterion": next((c["criterion"] for c in cands if c["selected"]), None),
           "extensions": load_records(out_dir, preset, store),
           "candidates": [{"method": c["method"], "hparams": c["hparams"], "selected": bool(c["selected"]),
                           "metrics": {k: c["metrics"][k] for k in keep if k in c["metrics"]},
                           "keep": (c.get("config") or {}).get("keep"), "train_time_s": c.get("train_time_s"),
                           "started_at": c.get("started_at"), "finished_at": c.get("finished_at")}
                          for c in cands]}
    path = Path(path) if path else Path(out_dir) / "report" / "tuning.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, sort_keys=True))
    return path


# -- figure --------------------------------------------------------------------------------------
def _panels(cands: list[dict], records: dict | None = None) -> list[tuple[str, str, list[dict], dict | None]]:
    """``(method, address, candidates along that axis, selected)``: the curve through the selection."""
    panels = []
    for method, group in _by_method(cands).items():
        space = space_of(method, (records or {}).get(method)) if method in METHODS else {}
        if not space:
            continue
        chosen = next((c for c in group if c["selected"]), None)
        for address in space:
            others = [a for a in space if a != address]
            own = METHODS[method].space  # a preset file's address may not be among the method's own
            pin = (chosen["hparams"] if chosen
                   else {a: own[a].default if a in own else space[a].values[0] for a in others})
            line = [c for c in group if all(float(c["hparams"][a]) == float(pin[a]) for a in others)]
            line.sort(key=lambda c: float(c["hparams"][address]))
            if line:
                panels.append((method, address, line, chosen))
    return panels


def write_tuning_figure(out_dir, preset: str, path=None, dpi: int = 110, store: str | None = None) -> Path | None:
    """Small multiples of validation ECE and accuracy against each searched value.

    One panel per (method, searched hyperparameter); for a 2-D space the curve runs along one
    axis with the other at its selected value. ECE (x100, solid, left axis), accuracy (%, dashed,
    right axis), the selected candidate as a star, candidates excluded by the accuracy rule as
    crosses, CE's validation ECE as a dotted line. Returns the PNG path, or ``None`` without
    candidates.
    """
    cands = load_candidates(out_dir, preset, store)
    panels = _panels(cands, load_records(out_dir, preset, store))
    if not panels:
        return None

    matplotlib.use("Agg")

    ce = next((c for c in cands if c["method"] == REFERENCE), None)
    out = {c["cand_key"] for g in _by_method(cands).values() for c in _excluded(g)}
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 2.6 * rows), squeeze=False)
    for ax, (method, address, line, chosen) in zip(axes.flat, panels):
        xs = list(range(len(line)))
        ece = [100 * c["metrics"]["ece"] for c in line]
        acc = [100 * c["metrics"]["acc"] for c in line]
        ax.plot(xs, ece, "o-", color="tab:blue", ms=4)
        for x, c, e in zip(xs, line, ece):
            if c["cand_key"] in out:
                ax.plot(x, e, "x", color="tab:red", ms=8)
            if chosen is not None and c["cand_key"] == chosen["cand_key"]:
                ax.plot(x, e, "*", color="tab:orange", ms=14, zorder=5)
        if ce is not None:
            ax.axhline(100 * ce["metrics"]["ece"], color="gray", ls=":", lw=1)
        ax.set_xticks(xs)
        ax.set_xticklabels([_fmt(float(c["hparams"][address])) for c in line], fontsize=7)
        ax.set_title(f"{_label(method)}: {address.partition('.')[2]}", fontsize=9)
        ax.set_ylabel("val ECE (x100)", fontsize=7, color="tab:blue")
        ax.tick_params(labelsize=7)
        twin = ax.twinx()
        twin.plot(xs, acc, "s--", color="tab:green", ms=3, lw=1)
        mid, half = (min(acc) + max(acc)) / 2, max((max(acc) - min(acc)) / 2 + 0.2, 1.0)
        twin.set_ylim(mid - half, mid + half)  # at least 2 points tall: the exclusion rule's scale
        twin.set_ylabel("val Acc (%)", fontsize=7, color="tab:green")
        twin.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle("Validation ECE (solid, blue) and accuracy (dashed, green) against each searched value\n"
                 "star = selected; x = excluded (outside the accuracy window); dotted = CE's ECE", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / rows / 2.6))
    path = Path(path) if path else Path(out_dir) / "report" / "figures" / "tuning.png"
    path.parent.mkdir(parents=True, exist_ok=True)

    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format=path.suffix[1:]))
    plt.close(fig)
    return path


def load_current_runs(out_dir, preset: str | None, location: str | None = None) -> tuple[str, list]:
    """``(preset, rows)``: the runs of ``preset`` (default: the last one recorded) the report shows, read
    from the bench directory's store (or ``location``)."""
    store = open_store(out_dir, location, readonly=True)
    where = describe_store(out_dir, location)
    try:
        presets = store.presets()
        if not presets:
            raise UserError(f"{where} holds no runs yet")
        if preset is None:
            preset = presets[-1]
        elif preset not in presets:
            raise UserError(f"no runs of preset {preset!r} in {where}; found: {', '.join(presets)}")
        # a damaged cell: named, row left out; runs moved aside by a re-tuning or at other values
        # than the directory's selection: left out (one value per method)
        return preset, current_runs(store.runs(preset, status=None, tolerant=True), store, preset)[0]
    finally:
        store.close()
