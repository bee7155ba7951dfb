"""The protocol part of the bench report: splits, checkpoint policy, budget, hyperparameters, tuning.

:func:`protocol_section` is the report's builder (in ``calibkit.report.build.SECTIONS``) for
these parts; ``calibkit tune`` writes the tuning table and figure with the functions below:

* **Protocol**: how the validation split and the training subset were drawn (the split record of
  each seed's CE run, with its checksums), the test split, the checkpoint policy (one for every
  run, read from the run records) and the selection rule of the hyperparameters;
* **Training budget**: per method, epochs, training images, model and batch against CE's, and
  what a method adds on top (MaC-Cal's stage 2, CSM's generated images, RegMixup's mixed copy);
* **Hyperparameters**: per method, the values its runs used and where they come from;
* **Validation curves** (:func:`write_tuning_figure`): small multiples of validation ECE and
  accuracy against each searched value, the selected candidate marked, from the ``tuning`` table
  of ``DIR/runs.db`` when the directory holds a tuning run.

Heavy imports (matplotlib) stay inside the functions that draw.
"""

from __future__ import annotations

from pathlib import Path

from calibkit.bench.grid import METHODS, PRESETS, REFERENCE, Axis, space_for
from calibkit.bench.selection_rule import DEFAULT_CRITERION, Criterion, eligible
from calibkit.bench.space import at_edge
from calibkit.store import open_store

# The tuning run each shipped preset's values come from, for the report's provenance line (a
# directory without a tuning run of its own; presets not listed run published or declared values).
PROVENANCE = {"default": "the preset's values, selected by the committed tuning run (docs/bench.md, "
                         "\"The default preset's values\"; docs/tuning/default.json)"}

# What a method trains on top of the shared budget (same epochs, data and model as CE).
EXTRA_WORK = {"maccal": "+ stage 2 on the frozen features of CE's run", "csm": "+ 2 generated images per real one",
              "regmixup": "+ a Mixup copy of every batch", "mixup": "mixed batches (same count)"}


def _label(method: str) -> str:
    return METHODS[method].label if method in METHODS else method


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _values(d: dict) -> str:
    return ", ".join(f"{k.partition('.')[2] or k}={_fmt(v)}" for k, v in sorted(d.items())) or "-"


def _info(row: dict) -> dict:
    from calibkit import rundir

    try:
        return rundir.load_info(row["run_dir"])
    except (OSError, ValueError, TypeError):
        return {}


def load_candidates(out_dir, preset: str, store: str | None = None) -> list[dict]:
    """Finished tuning candidates of ``preset`` in ``out_dir/runs.db`` (empty without any), or in
    the PostgreSQL store at ``store``."""
    if store is None and not (Path(out_dir) / "runs.db").is_file():
        return []
    store = open_store(out_dir, store, readonly=True)
    try:
        return store.candidates(preset)
    finally:
        store.close()


def load_records(out_dir, preset: str, store: str | None = None) -> dict[str, dict]:
    """``{method: tuning record}`` (extensions, no-effect axes, notes; :mod:`calibkit.bench.extend`)
    of ``preset``'s tuning in ``out_dir/runs.db`` (or the store at ``store``), for the seeds that
    have candidates."""
    import json

    from calibkit.bench.extend import meta_key

    if store is None and not (Path(out_dir) / "runs.db").is_file():
        return {}
    store = open_store(out_dir, store, readonly=True)
    try:
        out = {}
        for c in store.candidates(preset):
            text = store.get_meta(meta_key(preset, c["seed"], c["method"]))
            if text:
                out[c["method"]] = json.loads(text)
        return out
    finally:
        store.close()


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
    from calibkit.bench.paths import RETIRED

    selection = selection_of(store, preset)
    shown, hidden = [], []
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
    from calibkit.report.preset import recorded_preset

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
    import json

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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    from calibkit.rundir import atomic_write

    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format=path.suffix[1:]))
    plt.close(fig)
    return path


# -- the report's sections -----------------------------------------------------------------------
def _provenance(preset: str, records) -> str:
    """Where the values of an untuned directory come from: a shipped preset's committed tuning run
    only when every run is that preset's (its data set and model), never for a user's own data."""
    shipped = PRESETS.get(preset)
    if preset in PROVENANCE and shipped is not None and all(
            rec.get("dataset") == shipped.dataset and rec.get("model") == shipped.model for rec in records):
        return PROVENANCE[preset]
    return "the preset's values (no tuning run in this directory; `calibkit tune` selects them on the validation split)"


def _hidden(out_dir, preset: str, store: str | None = None) -> list[dict]:
    if store is None and not (Path(out_dir) / "runs.db").is_file():
        return []
    store = open_store(out_dir, store, readonly=True)
    try:
        return current_runs(store.runs(preset, tolerant=True), store, preset)[1]  # a damaged cell: named elsewhere
    finally:
        store.close()


def _split_text(split: dict, dataset: str | None = None) -> tuple[str, str, str]:
    """(validation, training, test) lines of the protocol table from a run's split record."""
    from calibkit.data import DATASETS

    modality = getattr(DATASETS.get(dataset), "modality", "image")
    unit = "documents" if modality == "text" else "images"
    val = f"{split.get('val')} {unit}, {split.get('rule', '?')}"
    if split.get("val_checksum"):
        val += f" (checksum {split['val_checksum']})"
    if split.get("train_checksum"):
        train = (f"{split.get('train')} {unit}: a class-stratified random subset drawn with the run's seed from "
                 f"the {unit} left for training (checksum {split['train_checksum']})")
    elif split.get("train_subset") and modality == "segmentation":  # scenes are drawn one after another
        train = f"{split.get('train')} {unit}: the first {split['train_subset']} of the data set's training split"
    else:
        train = f"{split.get('train')} {unit}: all the {unit} left for training"
    return val, train, f"{split.get('test')} {unit}: the test split, the same for every seed"


def protocol_section(ctx) -> list:
    """Report builder (``ReportContext -> list[Section]``): protocol, training budget,
    hyperparameters per method and, when the directory holds a tuning run, the selection with its
    validation curves.
    """
    from calibkit.report.figures import Figure
    from calibkit.report.render import Section
    from calibkit.report.tables import Table

    out_dir, preset = ctx.out_dir, ctx.preset
    done = [r for r in ctx.rows if r["status"] == "done"]
    records = {r["run_key"]: (r.get("config") or {}) for r in done}
    policies = sorted({rec.get("keep", (rec.get("train") or {}).get("keep", "best-acc")) for rec in records.values()})
    proto = []
    for r in done:
        if r["method"] == REFERENCE:
            split = _info(r).get("split") or {}
            if split:
                val, train, test = _split_text(split, (_info(r).get("config") or {}).get("data"))
                proto += [[f"seed {r['seed']}: validation", val], [f"seed {r['seed']}: training", train]]
                test_row = ["test", test]
    if proto:
        proto.append(test_row)
    proto.append(["checkpoint policy", " / ".join(policies) + (" (one policy for every run)" if len(policies) == 1
                                                              else " (MIXED: runs are not comparable)")])
    cands = load_candidates(out_dir, preset, ctx.store)
    tuned = {c["method"]: c for c in cands if c["selected"]}
    crit = Criterion.from_dict(next(iter(tuned.values()))["criterion"]) if tuned else None
    proto.append(["hyperparameters", "selected in this directory by `calibkit tune` on the validation split of seed "
                  f"{next(iter(tuned.values()))['seed']}: min ECE (15 bins, before TS), {crit.describe()}" if tuned else
                  _provenance(preset, records.values())])
    hidden = _hidden(out_dir, preset, ctx.store)
    if hidden:
        proto.append(["runs not shown", f"{len(hidden)} run(s) at values other than this directory's selection "
                      f"(kept in runs.db): {', '.join(r['run_key'] for r in hidden)}"])

    declared = _recorded_preset(out_dir, preset)  # its own grids, where a preset file gave them
    budget_rows, ce_info = [], next((_info(r) for r in done if r["method"] == REFERENCE), {})
    ce_cfg = ce_info.get("config") or {}
    same = True
    hp_rows = []
    seen = set()
    for r in done:
        m = r["method"]
        if m in seen:
            continue
        seen.add(m)
        info, rec = _info(r), records[r["run_key"]]
        cfg = info.get("config") or {}
        n_train = (info.get("split") or {}).get("train")
        diff = [k for k in ("epochs", "model", "batch_size", "data", "train_subset")
                if ce_cfg and cfg.get(k) != ce_cfg.get(k)]
        same = same and not diff
        budget_rows.append([_label(m), str(cfg.get("epochs", "?")), str(n_train or "?"), str(cfg.get("model", "?")),
                            "same as CE" if not diff else "differs: " + ", ".join(diff), EXTRA_WORK.get(m, "")])
        searched = rec.get("hparams") or {}
        source = ("no search space" if m not in METHODS or not space_for(declared, m) else
                  "tuned here" if m in tuned and tuned[m]["hparams"] == searched else "preset")
        others = {k: v for k, v in {**(rec.get("train_overrides") or {}), **(rec.get("maccal") or {}),
                                    **(rec.get("csm") or {})}.items() if f"train.{k}" not in searched}
        hp_rows.append([_label(m), _values(searched), rec.get("loss", ""), _values(others), source])
    budget_note = ("every method trains with the same budget as CE (epochs, training images, model)" if same
                   else "NOT every method has CE's training budget (see the table)")
    summary = f"checkpoint policy: {' / '.join(policies)}; {budget_note}"
    sections = [
        # The protocol table is text (item, value): every column left-aligned, wrapped in the terminal.
        Section("Protocol", summary, [Table(["item", "value"], proto, key_columns=2)]),
        Section(f"Training budget: {budget_note}", tables=[Table(
            ["Method", "epochs", "train images", "model", "vs CE", "adds"], budget_rows)], terminal=False),
        Section("Hyperparameters per method", tables=[Table(
            ["Method", "searched values", "loss spec", "other settings", "source"], hp_rows)], terminal=False)]
    if cands:
        header, rows = tuning_rows(cands, load_records(out_dir, preset, ctx.store))
        sections.append(Section("Selection on the validation split (x100, before TS)",
                                tables=[Table(header, rows)], terminal=False))
        path = write_tuning_figure(out_dir, preset, ctx.figdir / "tuning.png", store=ctx.store) if ctx.figures else None
        if path is not None:
            sections.append(Section("Validation curves of the tuning run", terminal=False, figures=[Figure(
                path, "Validation ECE and accuracy against each searched value; the selected candidate is marked.")]))
    return sections
