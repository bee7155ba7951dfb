"""The protocol part of the bench report: splits, checkpoint policy, budget, hyperparameters, tuning.

:func:`protocol_section` is the report's builder (in ``calibkit.report.build.SECTIONS``) for
these parts:

* **Protocol**: how the validation split and the training subset were drawn (the split record of
  each seed's CE run, with its checksums), the test split, the checkpoint policy (one for every
  run, read from the run records) and the selection rule of the hyperparameters;
* **Training budget**: per method, epochs, training images, model and batch against CE's, and
  what a method adds on top (MaC-Cal's stage 2, CSM's generated images, RegMixup's mixed copy);
* **Hyperparameters**: per method, the values its runs used and where they come from;
* when the directory holds a tuning run, its selection table and validation curves
  (:mod:`calibkit.report.tuning`).
"""

from __future__ import annotations

from pathlib import Path

from calibkit import rundir
from calibkit.bench.grid import METHODS, PRESETS, REFERENCE, space_for
from calibkit.bench.selection_rule import Criterion
from calibkit.data import DATASETS
from calibkit.report import tuning  # its functions looked up at call time: tests and benchmarks replace them
from calibkit.report.figures import Figure
from calibkit.report.render import Section
from calibkit.report.tables import Table
from calibkit.report.tuning import _label, _recorded_preset, _values
from calibkit.store import open_store

# The tuning run each shipped preset's values come from, for the report's provenance line (a
# directory without a tuning run of its own; presets not listed run published or declared values).
PROVENANCE = {"default": "the preset's values, selected by the committed tuning run (docs/bench.md, "
                         "\"The default preset's values\"; docs/tuning/default.json)"}

# What a method trains on top of the shared budget (same epochs, data and model as CE).
EXTRA_WORK = {"maccal": "+ stage 2 on the frozen features of CE's run", "csm": "+ 2 generated images per real one",
              "regmixup": "+ a Mixup copy of every batch", "mixup": "mixed batches (same count)"}

# What "the same budget as CE" compares between a method's run and CE's.
BUDGET_KEYS = ("epochs", "model", "batch_size", "data", "train_subset")


def _info(row: dict) -> dict:
    try:
        return rundir.load_info(row["run_dir"])
    except (OSError, ValueError, TypeError):
        return {}


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
    db = open_store(out_dir, store, readonly=True)
    try:
        # a damaged cell is named elsewhere
        return tuning.current_runs(db.runs(preset, tolerant=True), db, preset)[1]
    finally:
        db.close()


def _split_text(split: dict, dataset: str | None = None) -> tuple[str, str, str]:
    """(validation, training, test) lines of the protocol table from a run's split record."""
    modality = getattr(DATASETS.get(dataset or ""), "modality", "image")
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


# -- the protocol table ---------------------------------------------------------------------------
def _split_rows(done: list[dict]) -> list[list[str]]:
    """Validation and training lines of every CE run with a split record, then the test line."""
    rows: list[list[str]] = []
    test_row: list[str] = []
    for r in done:
        if r["method"] != REFERENCE:
            continue
        info = _info(r)
        split = info.get("split") or {}
        if split:
            val, train, test = _split_text(split, (info.get("config") or {}).get("data"))
            rows += [[f"seed {r['seed']}: validation", val], [f"seed {r['seed']}: training", train]]
            test_row = ["test", test]
    return [*rows, test_row] if rows else rows


def _policies(records: dict[str, dict]) -> list[str]:
    """The checkpoint policies of the runs (the top-level ``keep``, else the train record's)."""
    return sorted({rec.get("keep", (rec.get("train") or {}).get("keep", "best-acc")) for rec in records.values()})


def _policy_row(policies: list[str]) -> list[str]:
    one = len(policies) == 1
    return ["checkpoint policy", " / ".join(policies) + (" (one policy for every run)" if one
                                                         else " (MIXED: runs are not comparable)")]


def _hyperparameter_row(tuned: dict[str, dict], preset: str, records: dict[str, dict]) -> list[str]:
    """How the values were chosen: this directory's tuning run (its rule), else where they come from."""
    if not tuned:
        return ["hyperparameters", _provenance(preset, records.values())]
    first = next(iter(tuned.values()))
    crit = Criterion.from_dict(first["criterion"])
    return ["hyperparameters", "selected in this directory by `calibkit tune` on the validation split of seed "
            f"{first['seed']}: min ECE (15 bins, before TS), {crit.describe()}"]


def _protocol_rows(ctx, done: list[dict], records: dict[str, dict], tuned: dict[str, dict]) -> list[list[str]]:
    rows = [*_split_rows(done), _policy_row(_policies(records)), _hyperparameter_row(tuned, ctx.preset, records)]
    hidden = _hidden(ctx.out_dir, ctx.preset, ctx.store)
    if hidden:
        rows.append(["runs not shown", f"{len(hidden)} run(s) at values other than this directory's selection "
                     f"(kept in runs.db): {', '.join(r['run_key'] for r in hidden)}"])
    return rows


# -- the budget and hyperparameter tables ---------------------------------------------------------
def _first_per_method(done: list[dict]) -> list[dict]:
    """The first finished run of each method, in the rows' order."""
    seen: dict[str, dict] = {}
    for r in done:
        seen.setdefault(r["method"], r)
    return list(seen.values())


def _budget_row(method: str, info: dict, ce_cfg: dict) -> tuple[list[str], list[str]]:
    """A method's row of the budget table and the budget keys where its run differs from CE's."""
    cfg = info.get("config") or {}
    n_train = (info.get("split") or {}).get("train")
    diff = [k for k in BUDGET_KEYS if ce_cfg and cfg.get(k) != ce_cfg.get(k)]
    row = [_label(method), str(cfg.get("epochs", "?")), str(n_train or "?"), str(cfg.get("model", "?")),
           "same as CE" if not diff else "differs: " + ", ".join(diff), EXTRA_WORK.get(method, "")]
    return row, diff


def _hparam_row(method: str, rec: dict, declared, tuned: dict[str, dict]) -> list[str]:
    """A method's searched values, loss, other settings and where the values come from."""
    searched = rec.get("hparams") or {}
    if method not in METHODS or not space_for(declared, method):
        source = "no search space"
    else:
        source = "tuned here" if method in tuned and tuned[method]["hparams"] == searched else "preset"
    settings = {**(rec.get("train_overrides") or {}), **(rec.get("maccal") or {}), **(rec.get("csm") or {})}
    others = {k: v for k, v in settings.items() if f"train.{k}" not in searched}
    return [_label(method), _values(searched), rec.get("loss", ""), _values(others), source]


def _method_tables(ctx, done: list[dict], records: dict[str, dict], tuned: dict[str, dict]):
    """``(budget rows, hyperparameter rows, same)``: ``same`` when every method has CE's budget."""
    declared = _recorded_preset(ctx.out_dir, ctx.preset)  # its own grids, where a preset file gave them
    ce_cfg = next((_info(r) for r in done if r["method"] == REFERENCE), {}).get("config") or {}
    budget_rows, hp_rows, same = [], [], True
    for r in _first_per_method(done):
        row, diff = _budget_row(r["method"], _info(r), ce_cfg)
        budget_rows.append(row)
        same = same and not diff
        hp_rows.append(_hparam_row(r["method"], records[r["run_key"]], declared, tuned))
    return budget_rows, hp_rows, same


def _tuning_sections(ctx, cands: list[dict]) -> list:
    """The selection table and, with figures, the validation curves of the directory's tuning run."""
    header, rows = tuning.tuning_rows(cands, tuning.load_records(ctx.out_dir, ctx.preset, ctx.store))
    sections = [Section("Selection on the validation split (x100, before TS)",
                        tables=[Table(header, rows)], terminal=False)]
    path = tuning.write_tuning_figure(ctx.out_dir, ctx.preset, ctx.figdir / "tuning.png", store=ctx.store) \
        if ctx.figures else None
    if path is not None:
        sections.append(Section("Validation curves of the tuning run", terminal=False, figures=[Figure(
            path, "Validation ECE and accuracy against each searched value; the selected candidate is marked.")]))
    return sections


def protocol_section(ctx) -> list:
    """Report builder (``ReportContext -> list[Section]``): protocol, training budget,
    hyperparameters per method and, when the directory holds a tuning run, the selection with its
    validation curves.
    """
    done = [r for r in ctx.rows if r["status"] == "done"]
    records = {r["run_key"]: (r.get("config") or {}) for r in done}
    cands = tuning.load_candidates(ctx.out_dir, ctx.preset, ctx.store)
    tuned = {c["method"]: c for c in cands if c["selected"]}
    proto = _protocol_rows(ctx, done, records, tuned)
    budget_rows, hp_rows, same = _method_tables(ctx, done, records, tuned)
    budget_note = ("every method trains with the same budget as CE (epochs, training images, model)" if same
                   else "NOT every method has CE's training budget (see the table)")
    summary = f"checkpoint policy: {' / '.join(_policies(records))}; {budget_note}"
    sections = [
        # The protocol table is text (item, value): every column left-aligned, wrapped in the terminal.
        Section("Protocol", summary, [Table(["item", "value"], proto, key_columns=2)]),
        Section(f"Training budget: {budget_note}", tables=[Table(
            ["Method", "epochs", "train images", "model", "vs CE", "adds"], budget_rows)], terminal=False),
        Section("Hyperparameters per method", tables=[Table(
            ["Method", "searched values", "loss spec", "other settings", "source"], hp_rows)], terminal=False)]
    return sections + (_tuning_sections(ctx, cands) if cands else [])
