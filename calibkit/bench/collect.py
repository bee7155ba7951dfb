"""``calibkit bench --collect`` (and ``calibkit report``): result files into the local ``runs.db``.

Every run and candidate result file under the bench directory (:mod:`calibkit.bench.resultfiles`) is
imported with ``Store.import_row(table, row)``: a row absent from the database is inserted, a
``running`` or ``failed`` one is replaced by the file's, a ``done`` one is never rewritten. The
import is therefore idempotent: collecting twice, or while tasks still run, imports each finished
result once. Selection files then flag their candidates (``Store.select_candidate``).

The database keeps the run paths under this host's view of the bench directory (the files keep
them relative to it), and the SLURM task that wrote a row in its ``owner`` column
(``slurm:<array job>_<task>:restarts=<k>``), a value no live process can hold.

A run whose task died without writing a result (an unwritable run directory, a node lost without
requeue) leaves nothing to import: :func:`unfinished` names every run of a grid without a
finished result, with its state (``bench --collect`` prints one line per run and exits 1 when one
has no live task), and :func:`unrecorded` gives the report the submitted runs that have no
row at all, so that its title names them.
"""

from __future__ import annotations

import json
from pathlib import Path

from calibkit.bench import resultfiles as R
from calibkit.bench.slurm import key_states, submissions
from calibkit.errors import UserError
from calibkit.store import Store, open_store
from calibkit.store.common import COLUMNS


def _db_row(out: Path, doc: dict) -> dict:
    row = {k: v for k, v in doc["row"].items() if k in COLUMNS[doc["table"]]}
    for col in R.PATH_COLUMNS:
        if col in COLUMNS[doc["table"]]:
            row[col] = R.absolute(out, row.get(col))
    slurm = doc.get("slurm") or {}
    if slurm:
        task = f"{slurm.get('array_job_id', slurm.get('job_id'))}_{slurm.get('array_task_id', 0)}"
        row["owner"] = f"slurm:{task}:restarts={slurm.get('restart_count', 0)}"
    if doc["table"] == "tuning":
        row["selected"], row["criterion"] = 0, None
    return row


def collect(out, preset: str | None = None, store=None) -> dict:
    """Import the result files under ``out`` into ``out/runs.db``.

    Args:
        out: the bench directory.
        preset: only this preset's files (default: all).
        store: an open store (default: ``Store(out/runs.db)``, closed again).

    Returns:
        ``{"files": n, "imported": n, "unchanged": n, "selections": n}``.

    Raises:
        ValueError: a result file is corrupt (nothing of it is imported; the others are).
    """
    out = Path(out)
    files = R.result_files(out, preset)
    counts = {"files": len(files), "imported": 0, "unchanged": 0, "selections": 0}
    own = store is None
    if own:
        if not files:
            return counts
        store = Store(out / "runs.db")
    try:
        bad = []
        for path in files:
            try:
                doc = R.read_doc(path)
            except ValueError as exc:
                bad.append(str(exc))
                continue
            assert doc is not None  # listed by the glob above: the file is there
            counts["imported" if store.import_row(doc["table"], _db_row(out, doc)) else "unchanged"] += 1
        for path in sorted(out.glob(f"tune/{preset or '*'}/selection/*.json")):
            found = R.read_doc(path, "selection")
            assert found is not None  # listed by the glob above: the file is there
            sel = found["row"]
            done = {r["cand_key"]: r for r in store.candidates(sel["preset"], sel["method"], sel["seed"])}
            row = done.get(sel["cand_key"])
            if row is None:
                bad.append(f"{path}: selects {sel['cand_key']}, which is not a finished candidate")
                continue
            if not row["selected"] or json.dumps(row["criterion"], sort_keys=True) != json.dumps(
                    sel["criterion"], sort_keys=True):
                store.select_candidate(sel["preset"], sel["method"], sel["seed"], sel["cand_key"], sel["criterion"])
                counts["selections"] += 1
        if bad:
            raise UserError(f"{len(bad)} result file(s) not imported: " + "; ".join(bad))
    finally:
        if own:
            store.close()
    return counts


# States of a run that still has a live task (collect again once it ends); any other unfinished
# state is a missing run (bench --collect exits 1).
LIVE = ("queued", "running")
# What a bench folder holds (one of them at least): its database, runs, tuning, SLURM submissions.
BENCH_MARKS = ("runs.db", "runs", "tune", "slurm")



def collect_line(out, counts: dict) -> str:
    """The line ``bench --collect`` and ``tune --collect`` print for :func:`collect`'s ``counts``."""
    if counts["files"]:
        return (f"collect {out}: {counts['imported']} new result(s) imported into {out}/runs.db, "
                f"{counts['unchanged']} already there, {counts['selections']} selection(s)")
    return (f"collect {out}: no result files to import; {out}/runs.db "
            + ("unchanged" if (Path(out) / "runs.db").is_file() else "not created"))

def check_bench_folder(out, store: str | None = None) -> None:
    """Refuse (one line) a ``--out`` that is not a bench's folder, before ``--status`` or
    ``--collect`` reads it: missing, a file, or (without a ``--store`` server) holding none of
    :data:`BENCH_MARKS`. Nothing is created.

    Raises:
        FileNotFoundError, NotADirectoryError, ValueError: naming the folder and what is wrong.
    """
    out = Path(out)
    if not out.exists():
        raise FileNotFoundError(f"--out {out}: no such folder; give the --out folder of a bench (nothing was read "
                                "or written)")
    if not out.is_dir():
        raise NotADirectoryError(f"--out {out} is a file, not the folder of a bench (nothing was read or written)")
    if store is None and not any((out / mark).exists() for mark in BENCH_MARKS):
        raise UserError(f"--out {out} is not the folder of a bench: it holds none of {', '.join(BENCH_MARKS)} "
                         "(nothing was read or written)")


def recorded_states(store, keys, table: str = "runs") -> dict[str, tuple[str, str]]:
    """``{key: (state, detail)}`` of the keys with a row in ``store``, in ``--status``'s words:
    ``done`` (its run folder), ``running`` (claimed by a live process), ``failed`` (its error's
    last line, or a claim whose process ended without finishing)."""
    col = "run_key" if table == "runs" else "cand_key"
    rows = store.runs(status=None, tolerant=True) if table == "runs" else store.candidates(status=None)
    rows = {r[col]: r for r in rows}
    states = {}
    for key in keys:
        row = rows.get(key)
        if row is None:
            continue
        if row["status"] == "done":
            where = f"recorded in {store.where}"
            states[key] = ("done", f"{row['run_dir']} ({where})" if row.get("run_dir") else where)
        elif row["status"] == "running" and store.busy_elsewhere(key, table):
            states[key] = ("running", f"claimed in {store.where} by {row.get('owner')}")
        elif row["status"] == "running":
            states[key] = ("failed", f"{store.where}: its process ended before finishing it; run the same command "
                                     "again to resume it")
        else:
            last = (row.get("error") or "").strip().splitlines()[-1:] or ["no error recorded"]
            states[key] = ("failed", f"{store.where}: {last[0]}")
    return states


def read_recorded(out, keys, table: str = "runs", store: str | None = None) -> dict[str, tuple[str, str]]:
    """:func:`recorded_states` of the bench's database (``out/runs.db`` or the ``store`` URL),
    opened read-only; ``{}`` when there is none yet.

    Raises:
        calibkit.store.StoreError: the database exists but cannot be used (corrupt, unreachable).
    """
    if store is None and not (Path(out) / "runs.db").is_file():
        return {}
    try:
        db = open_store(out, store, readonly=True)
    except FileNotFoundError:  # a server schema without the tables yet
        return {}
    try:
        return recorded_states(db, keys, table)
    finally:
        db.close()


def unfinished(out, keys, recorded: dict | None = None) -> list[tuple[str, str, str]]:
    """``(key, state, detail)`` of every run key in ``keys`` without a finished result file, in order.

    ``recorded``: the states ``runs.db`` holds (:func:`read_recorded`; a run it holds as done is
    finished). The state is that of ``--status`` (``failed``, ``queued``, ``running``, ``not submitted``), except
    that a run submitted but neither finished nor in a queue this host can read (no ``squeue``
    here: a copy of the folder) is ``no result``: whether it still runs cannot be told from here.
    """
    submitted = {k for sub in submissions(out) for k in sub.get("tasks", {}).values()}
    rows = []
    for key, (state, detail) in key_states(out, list(keys), recorded=recorded).items():
        if state == "done":
            continue
        if state == "not submitted" and key in submitted:
            state, detail = "no result", "submitted, no result file; no squeue here to say whether it still runs"
        rows.append((key, state, detail))
    return rows


def unrecorded(out, preset: str, recorded) -> list[dict]:
    """``{"run_key", "status"}`` of every run of ``preset`` submitted to SLURM from ``out`` that has
    no row among ``recorded`` (run keys) and no finished result file; status as :func:`unfinished`."""
    recorded = set(recorded)
    keys = [k for k in dict.fromkeys(k for sub in submissions(out) for k in sub.get("tasks", {}).values())
            if k.count("/") == 2 and k.split("/")[0] == preset and k not in recorded]
    return [{"run_key": k, "status": state} for k, state, _ in unfinished(out, keys)] if keys else []
