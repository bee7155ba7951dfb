"""Result files: a run's record kept beside the run, for compute nodes that never open ``runs.db``.

On a cluster the run directories live on a shared (network) filesystem, where SQLite's WAL mode
does not work. A run executed by a scheduler (``calibkit bench --executor slurm``) therefore
writes its record into its own directory instead, and a later ``--collect`` (or ``calibkit
report``) on one machine imports the new files into the local ``runs.db``:

* ``RUN_DIR/result.json``: a grid run (``OUT/runs/<preset>/<method>/seed<k>/``);
* ``RUN_DIR/candidate.json``: a tuning candidate (``OUT/tune/<preset>/<method>/<values>/``,
  CE's in the CE run directory of the selection seed);
* ``OUT/tune/<preset>/selection/<method>-seed<k>.json``: a method's selection.

Each file holds ``{"format", "version", "table", "row", "slurm"}``: ``row`` has every column of
the database row (JSON columns as JSON values), with ``run_dir`` and ``logits_path`` relative to
the bench directory, so that the files stay valid wherever the directory is mounted; ``slurm``
the job id, array job id and task id, node and restart count of the task that wrote it. A file is
written atomically (temporary file, fsync, rename, fsync of the folder): a reader on another host
sees the old file or the new one, never a part. A ``done`` file is never replaced.

:class:`ResultFiles` is the store a single run uses in that mode: it answers every call of
:class:`calibkit.store.protocol.ResultStore`, reading and writing these files only. Dependencies
between runs are the scheduler's business there, so ``busy_elsewhere`` is always False; the files
keep no tuning records (``keeps_records`` is False: ``get_meta`` answers None and ``put_meta``
keeps nothing, so a scheduled tuning never extends a grid), and runs are not moved aside
(``retire`` raises :class:`~calibkit.store.common.StoreError`: collect the files into ``runs.db``
first). The directory layout of runs is the bench's (:mod:`calibkit.bench.paths`); these files are
a :class:`~calibkit.store.protocol.ResultStore` backend kept in the bench because they live in its
run directories.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from calibkit.bench.paths import CANDIDATE, RECORD_FORMAT, RESULT, candidate_dir_for, run_dir_for
from calibkit.diskio import atomic_write
from calibkit.errors import UserError, UserKeyError
from calibkit.store.common import KEY_COLUMN, RUNS, TUNING, StoreError, claim_fields

FORMAT = RECORD_FORMAT
VERSION = 1
PATH_COLUMNS = ("run_dir", "logits_path")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def slurm_facts(env=None) -> dict:
    """The SLURM task that runs this process (empty outside SLURM)."""
    env = os.environ if env is None else env
    if "SLURM_JOB_ID" not in env:
        return {}
    facts = {"job_id": env.get("SLURM_JOB_ID"), "array_job_id": env.get("SLURM_ARRAY_JOB_ID"),
             "array_task_id": env.get("SLURM_ARRAY_TASK_ID"), "node": env.get("SLURMD_NODENAME"),
             "restart_count": int(env.get("SLURM_RESTART_COUNT") or 0)}
    return {k: v for k, v in facts.items() if v is not None}


def write_atomic(path: Path, doc: dict) -> None:
    """``doc`` as JSON at ``path`` (:func:`calibkit.diskio.atomic_write`), the file and its folder
    synced to disk before and after the rename: a reader on another host sees the old file or the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True, allow_nan=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())

    atomic_write(path, write)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read_doc(path: Path, table: str | None = None) -> dict | None:
    """The result document at ``path`` (None when absent).

    Raises:
        ValueError: the file is not valid JSON or not a calibkit result file (of ``table``).
    """
    path = Path(path)
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: corrupt result file ({exc}); move it away to run that run again") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("row"), dict):
        raise UserError(f"{path} is not a calibkit result file")
    if int(doc.get("version", 0)) > VERSION:
        raise UserError(f"{path}: result file version {doc['version']} is newer than this calibkit ({VERSION})")
    if table is not None and doc.get("table") != table:
        raise UserError(f"{path}: a {doc.get('table')!r} result where a {table!r} one was expected")
    return doc


def relative(out: Path, path) -> str | None:
    """``path`` relative to the bench directory ``out`` (as given when it lies outside it)."""
    if path is None:
        return None
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path(out).resolve()))
    except ValueError:
        return str(p)


def absolute(out: Path, path: str | None) -> str | None:
    """A stored path made absolute under this host's view of the bench directory ``out``."""
    if path is None:
        return None
    p = Path(path)
    return str(p if p.is_absolute() else Path(out).resolve() / p)


def split_run_key(key: str) -> tuple[str, str, int]:
    """``"preset/method/seed"`` -> ``(preset, method, seed)``."""
    parts = key.split("/")
    if len(parts) != 3 or not parts[2].lstrip("-").isdigit():
        raise UserError(f"run key {key!r} is not preset/method/seed")
    return parts[0], parts[1], int(parts[2])


def split_cand_key(key: str) -> tuple[str, str, int, str]:
    """``"preset/method/seed/values"`` -> ``(preset, method, seed, values)``."""
    parts = key.split("/")
    if len(parts) != 4 or not parts[2].lstrip("-").isdigit():
        raise UserError(f"candidate key {key!r} is not preset/method/seed/values")
    return parts[0], parts[1], int(parts[2]), parts[3]


def result_path(out: Path, key: str) -> Path:
    preset, method, seed = split_run_key(key)
    return run_dir_for(out, preset, method, seed) / RESULT


def candidate_path(out: Path, key: str) -> Path:
    preset, method, seed, values = split_cand_key(key)
    return candidate_dir_for(out, preset, method, seed, values) / CANDIDATE


def selection_path(out: Path, preset: str, method: str, seed: int) -> Path:
    return Path(out) / "tune" / preset / "selection" / f"{method}-seed{int(seed)}.json"


def result_files(out: Path, preset: str | None = None) -> list[Path]:
    """Every run and candidate result file under ``out`` (of ``preset``), runs first."""
    out = Path(out)
    pattern = preset if preset is not None else "*"
    return (sorted(out.glob(f"runs/{pattern}/*/*/{RESULT}")) + sorted(out.glob(f"runs/{pattern}/*/*/{CANDIDATE}"))
            + sorted(out.glob(f"tune/{pattern}/*/*/{CANDIDATE}")))


class ResultFiles:
    """The store of one run executed by a scheduler: result files instead of ``runs.db``.

    Args:
        out: the bench directory.
    """

    # Tuning records (grid extensions, no-effect axes) are the database's alone.
    keeps_records = False

    def __init__(self, out):
        self.out = Path(out)
        self.path = str(self.out)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:files"
        self._claims: dict[tuple[str, str], dict] = {}

    def close(self) -> None:
        pass

    # -- the calls of Bench and Tuner -------------------------------------------------------------
    def claim(self, key: str, *, preset: str, method: str, seed: int, table: str = RUNS, hparams=None, config=None,
              git_commit=None, versions=None) -> bool:
        """False when the row's result file says ``done``; otherwise the claim is remembered."""
        fixed, update = claim_fields(table, {"preset": preset, "method": method, "seed": int(seed), "hparams": hparams,
                                             "config": config, "git_commit": git_commit, "versions": versions})
        extra = {"selected": 0} if table == TUNING else {}
        return self._claim(table, key, {KEY_COLUMN[table]: key, **fixed, **update, **extra})

    def finish(self, key: str, table: str = RUNS, **fields) -> None:
        self._write(table, key, "done", fields)

    def fail(self, key: str, error: str, table: str = RUNS) -> None:
        self._write(table, key, "failed", {"error": str(error)[:4000]})

    def status(self, key: str, table: str = "runs") -> str | None:
        """The status in the result file of ``key`` (None: no file yet)."""
        doc = read_doc(self._file(table, key), table)
        return doc["row"].get("status") if doc else None

    def busy_elsewhere(self, key: str, table: str = "runs") -> bool:
        return False  # the scheduler starts a run only once what it builds on is done

    def runs(self, preset: str | None = None, status: str | None = "done", tolerant: bool = False) -> list[dict]:
        """The rows of the run result files (of ``preset``, with ``status``), paths made absolute
        (``tolerant`` is accepted for the protocol: a corrupt file is always an error here)."""
        return self._rows(self.out.glob(f"runs/{preset or '*'}/*/*/{RESULT}"), "runs", status)

    def get(self, key: str) -> dict | None:
        """The row in the result file of run ``key``, paths made absolute (None: no file yet)."""
        rows = self._rows([p for p in [result_path(self.out, key)] if p.is_file()], "runs", None)
        return rows[0] if rows else None

    def retire(self, key: str, new_key: str, run_dir: str | None, logits_path: str | None) -> None:
        """Not done by result files: a re-tuned method's old runs are moved aside in ``runs.db``.

        Raises:
            StoreError: always, naming the run.
        """
        raise StoreError(f"result files under {self.out} cannot move run {key} aside; collect them into "
                         "runs.db (calibkit bench --collect) and run the bench there")

    def get_meta(self, key: str) -> str | None:
        """None: result files keep no tuning records (``keeps_records``)."""
        return None

    def put_meta(self, key: str, value: str) -> None:
        """Nothing kept: result files keep no tuning records (``keeps_records``)."""

    def candidates(self, preset=None, method=None, seed=None, status: str | None = "done") -> list[dict]:
        """The rows of the candidate files, filtered like :meth:`calibkit.store.Store.candidates`;
        ``selected`` is 1 for the candidate a selection file names."""
        files = [p for p in result_files(self.out, preset) if p.name == CANDIDATE]
        rows = [r for r in self._rows(files, "tuning", status)
                if (method is None or r["method"] == method) and (seed is None or r["seed"] == int(seed))]
        for row in rows:
            sel = read_doc(selection_path(self.out, row["preset"], row["method"], row["seed"]), "selection")
            chosen = sel is not None and sel["row"]["cand_key"] == row["cand_key"]
            row["selected"] = int(chosen)
            row["criterion"] = sel["row"]["criterion"] if sel is not None and chosen else None
        return rows

    def select_candidate(self, preset: str, method: str, seed: int, key: str, criterion: dict) -> None:
        """Record ``key`` as the selection of ``(preset, method, seed)`` in a selection file."""
        doc = read_doc(candidate_path(self.out, key), "tuning")
        if doc is None or doc["row"]["status"] != "done":
            raise UserKeyError(f"no finished candidate {key!r} of {preset}/{method}/{seed} under {self.out}")
        write_atomic(selection_path(self.out, preset, method, seed), {
            "format": FORMAT, "version": VERSION, "table": "selection", "slurm": slurm_facts(),
            "row": {"preset": preset, "method": method, "seed": int(seed), "cand_key": key,
                    "criterion": criterion, "selected_at": _now()}})

    # -- plumbing -----------------------------------------------------------------------------------
    def _file(self, table: str, key: str) -> Path:
        return result_path(self.out, key) if table == "runs" else candidate_path(self.out, key)

    def _claim(self, table: str, key: str, row: dict) -> bool:
        old = read_doc(self._file(table, key), table)
        if old is not None and old["row"].get("status") == "done":
            return False
        now = _now()
        attempts = int(old["row"].get("attempts") or 0) + 1 if old else 1
        self._claims[(table, key)] = {**row, "owner": self.owner, "attempts": attempts,
                                      "created_at": (old or {}).get("row", {}).get("created_at", now),
                                      "started_at": now}
        return True

    def _write(self, table: str, key: str, status: str, fields: dict) -> None:
        claim = self._claims.get((table, key))
        if claim is None:
            raise KeyError(f"{key!r} was never claimed in {self.out}")
        path = self._file(table, key)
        old = read_doc(path, table)
        if old is not None and old["row"].get("status") == "done":
            raise UserError(f"{path} already holds a finished result; not overwriting it")
        row = {**claim, **fields, "status": status, "finished_at": _now()}
        for col in PATH_COLUMNS:
            if row.get(col) is not None:
                row[col] = relative(self.out, row[col])
        write_atomic(path, {"format": FORMAT, "version": VERSION, "table": table, "row": row,
                            "slurm": slurm_facts()})

    def _rows(self, files, table: str, status: str | None) -> list[dict]:
        rows = []
        for path in sorted(files):
            doc = read_doc(path, table)
            if doc is None:  # removed since it was listed
                continue
            row = dict(doc["row"])
            if status is not None and row.get("status") != status:
                continue
            for col in PATH_COLUMNS:
                row[col] = absolute(self.out, row.get(col))
            rows.append(row)
        return rows


if TYPE_CHECKING:  # the type checker verifies that the result files answer every call of the store protocol
    from calibkit.store.protocol import ResultStore

    def _conforms(files: ResultFiles) -> ResultStore:
        return files
