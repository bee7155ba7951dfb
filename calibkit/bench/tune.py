"""``calibkit tune``: select every method's hyperparameters on the validation split.

For each method of the grid with a search space (``calibkit.bench.grid.space_for``), every
candidate of the space is trained on the preset's selection seed (``Preset.tune_seed``), with the
preset's training budget and checkpoint policy, and scored on the **validation split only**: the
candidate's validation logits are the only tensors read from its run directory
(:func:`val_metrics`), so the test split takes no part in the selection.

The rule (:class:`calibkit.bench.selection_rule.Criterion`, recorded with the selection; that
module says why), as in the literature (the papers tune on validation; ``docs/bench.md``):

1. every candidate's validation accuracy and ECE (15 bins) of the deployed predictor, before
   temperature scaling;
2. a candidate is excluded when its validation accuracy lies below the method's most accurate
   candidate's by more than 1 point **and** by more than 1.96 standard errors of the difference
   (two binomial proportions on the recorded ``n`` validation images): calibration is never
   bought with accuracy, and no candidate is excluded for a difference within the split's noise;
3. the lowest ECE wins; candidates within ``tie`` of it are tied and the one nearest the
   published value (``Axis.default``) wins, then the first in grid order.

When a selection lies on the edge of a grid, the tuner extends that axis and tunes on (at most
twice per axis, never past the axis's hard bound; :mod:`calibkit.bench.extend` gives the step
rule); an axis whose values all gave bit-identical validation logits is recorded as having no
effect. Both are recorded per method in the ``meta`` table of ``runs.db`` and shown by
``calibkit.report.tuning``.

Resume and sharing work are those of the bench: candidates are rows of the ``tuning`` table of
``DIR/runs.db``, claimed before they run; a finished candidate is never trained again, and several
``calibkit tune`` processes on one directory split the candidates between them. MaC-Cal's and
CSM's candidates build on the CE run of the selection seed, which is tuned first (CE has nothing
to select; its run is the reference line of the validation curves). Candidate runs live in
``DIR/tune/<preset>/<method>/<values>/`` (CE's in ``DIR/runs/<preset>/ce/seed<k>``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from safetensors import safe_open

from calibkit import distributed as D
from calibkit import rundir
from calibkit.bench.attempts import POLL_S, Counts, Task, attempt, broadcast, work_queue
from calibkit.bench.extend import MAX_EXTENSIONS, base_grids, extended_space, meta_key, no_effect_axes, plan
from calibkit.bench.grid import METHODS, REFERENCE, Preset, applicable, space_for
from calibkit.bench.paths import candidate_dir_for
from calibkit.bench.runner import open_runs
from calibkit.bench.selection_rule import DEFAULT_CRITERION, Criterion, select  # noqa: F401  (this module's API)
from calibkit.bench.space import apply_values, candidates, slug  # noqa: F401  (slug: also this module's API)
from calibkit.errors import UserError, UserRuntimeError
from calibkit.metrics import evaluate
from calibkit.store import run_key
from calibkit.store.common import TUNING


def cand_key(preset: str, method: str, seed: int, values: dict) -> str:
    """The key of one candidate: ``preset/method/seed/<values>``."""
    return f"{run_key(preset, method, seed)}/{slug(values)}"


def val_metrics(run_dir, n_bins: int = 15) -> dict:
    """Validation metrics of a finished run, read from its validation logits alone.

    Only the ``val_logits`` and ``val_labels`` tensors of ``logits.safetensors`` are loaded; the
    test tensors beside them are never read.

    Returns:
        ``calibkit.metrics.evaluate`` of the softmax of the validation logits (acc, ece, nll, ...)
        plus ``n`` (validation images).
    """
    path = Path(run_dir) / rundir.LOGITS
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: the candidate's run did not finish")
    with safe_open(str(path), framework="pt") as f:
        logits, labels = f.get_tensor("val_logits"), f.get_tensor("val_labels")
    out = {k: float(v) for k, v in evaluate(logits.double().softmax(1), labels.long(), n_bins=n_bins).items()}
    out["n"] = int(len(labels))
    return out


class Tuner:
    """One selection run: a preset, an output directory, the methods to tune.

    Args:
        preset: the preset (its training settings and checkpoint policy hold for every candidate).
        out: output directory (``runs.db`` with its ``tuning`` table, ``tune/``, ``runs/``).
        methods: methods to tune (default: every method of the preset with a search space); methods
            without one and methods the preset's modality cannot run (``unsupported``) are skipped;
            CE is always trained (the reference and the base of MaC-Cal and CSM).
        seed: the selection seed (default ``preset.tune_seed``).
        criterion: the selection rule.
        max_extensions: extensions per axis of a selection on a grid edge (0: never extend).
        data_dir, device, num_threads, csm_store, log, store: as for :class:`calibkit.bench.runner.Bench`.

    Attributes:
        factory: the :class:`~calibkit.bench.producers.RunFactory` of the preset; a candidate's
            runs come from ``factory.with_preset`` of the preset at its values.
    """

    def __init__(self, preset: Preset, out, methods=None, seed=None, data_dir=None, device="auto",
                 num_threads=None, csm_store=None, criterion: Criterion = DEFAULT_CRITERION, log=print,
                 max_extensions: int = MAX_EXTENSIONS, store=None):
        names = list(preset.methods or METHODS) if methods is None else list(methods)
        unknown = [m for m in names if m not in METHODS]
        if unknown:
            raise UserError(f"unknown method(s) {', '.join(unknown)}; valid methods: {', '.join(METHODS)}")
        names, self.unsupported = applicable(names, preset)
        self.methods = [m for m in METHODS if m in names and space_for(preset, m)]
        self.skipped = [m for m in names if m != REFERENCE and not space_for(preset, m)]
        self.seed = int(preset.tune_seed if seed is None else seed)
        self.criterion = criterion
        if max_extensions < 0:
            raise UserError(f"max_extensions must be >= 0, got {max_extensions}")
        self.max_extensions = int(max_extensions)
        self.factory, self.store = open_runs(preset, out, data_dir, device, num_threads, csm_store, store)
        self.preset, self.out, self.dd = preset, Path(out), self.factory.dd
        self.log = log if self.dd.is_main else (lambda *a, **k: None)
        self.spaces = {m: space_for(preset, m) for m in self.methods}  # + extensions: refresh()
        self.failures: list[str] = []  # one line per candidate that failed here, for stderr

    # -- candidates -----------------------------------------------------------------------------
    def items(self) -> list[tuple[str, dict]]:
        """``(method, values)`` of every candidate, CE first, then the grid order."""
        return [(REFERENCE, {})] + [(m, v) for m in self.methods for v in candidates(m, space=self.spaces[m])]

    def run_dir(self, method: str, values: dict) -> Path:
        return candidate_dir_for(self.out, self.preset.name, method, self.seed, slug(values))

    def record(self, method: str, values: dict) -> dict:
        """The candidate's run record (what the bench would record for it), JSON-normalised."""
        rec = self._runs(method, values).config_record(method, self.seed)
        rec.pop("data_dir", None)  # the same data under another path is the same candidate
        return json.loads(json.dumps(rec, sort_keys=True))

    def check_consistent(self) -> None:
        """Refuse a directory whose finished candidates were trained with other settings.

        Raises:
            ValueError: a finished candidate's record differs from what this tuner would train
                (another checkpoint policy, epochs, data, ...); use another ``--out``.
        """
        problem = broadcast(self._inconsistency(), self.dd)
        if problem:
            raise UserError(problem)

    def _inconsistency(self) -> str | None:
        """The problem :meth:`check_consistent` raises, or None (read by rank 0)."""
        for row in self.store.candidates(self.preset.name, seed=self.seed):
            if row["method"] not in METHODS:
                continue
            mine = self.record(row["method"], row["hparams"])
            theirs = {k: v for k, v in (row["config"] or {}).items() if k != "data_dir"}
            if theirs != mine:
                diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
                return (f"{self.out / 'runs.db'}: candidate {row['cand_key']} was trained with other "
                        f"settings ({', '.join(diff)}); choose another --out")
        return None

    def _runs(self, method: str, values: dict):
        """The run factory of candidate ``(method, values)``: the preset at its values."""
        return self.factory.with_preset(apply_values(self.preset, method, values))

    def produce(self, method: str, values: dict) -> dict:
        """Train (or reuse) candidate ``(method, values)`` in its directory (:meth:`run_dir`)."""
        return self._runs(method, values).produce(method, self.seed, self.run_dir(method, values))

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> Counts:
        """Train and score every unfinished candidate, select, extend the grids whose selection
        lies on an edge (:mod:`calibkit.bench.extend`) and go on until no grid grows; returns counts."""
        self.check_consistent()
        counts = Counts()
        self.refresh()
        seen: set[str] = set()
        while True:
            items = [i for i in self.items() if cand_key(self.preset.name, i[0], self.seed, i[1]) not in seen]
            if not items:  # nothing new since the last selection: the grids stopped growing
                return counts
            seen.update(cand_key(self.preset.name, m, self.seed, v) for m, v in items)
            self._round(items, counts)
            self.wait_for_others()
            if self.dd.is_main:  # rank 0 selects (and logs); the others read the grids it extended
                self.select_all()  # may extend grids: the next pass trains what they gained
            self.refresh()

    def refresh(self) -> None:
        """Read every method's current space (declared grid + recorded extensions) from the database."""
        self.spaces = broadcast(self._read_spaces(), self.dd)

    def _read_spaces(self) -> dict:
        return {m: extended_space(space_for(self.preset, m), self.record_of(m)) for m in self.methods}

    def record_of(self, method: str) -> dict | None:
        """The method's tuning record in ``runs.db`` (extensions, no-effect axes, notes), or ``None``
        (also from a store that keeps no records: ``ResultStore.keeps_records``)."""
        text = self.store.get_meta(meta_key(self.preset.name, self.seed, method))
        return json.loads(text) if text else None

    def wait_for_others(self, poll_s: float = POLL_S) -> None:
        """Wait while another live process still trains a candidate of this tuning (its result
        may move a selection onto an edge, and so extend a grid)."""
        while True:
            busy = any(self.store.busy_elsewhere(r["cand_key"], "tuning") for r in
                       self.store.candidates(self.preset.name, seed=self.seed, status="running"))
            if not broadcast(busy, self.dd):
                return
            time.sleep(poll_s)

    def _round(self, items: list, counts: Counts) -> None:
        everything = self.items()
        total = len(everything)
        position = {cand_key(self.preset.name, m, self.seed, v): i + 1 for i, (m, v) in enumerate(everything)}

        def ready(item) -> bool:
            busy = any(self.store.busy_elsewhere(cand_key(self.preset.name, n, self.seed, {}), "tuning")
                       for n in METHODS[item[0]].needs)
            return not broadcast(busy, self.dd)

        waiting: set = set()
        work_queue(items, ready, lambda item: self._attempt(
            item, counts, _Report(self.log, f"[{position[self.key(*item)]}/{total}]", waiting)))

    def key(self, method: str, values: dict) -> str:
        return cand_key(self.preset.name, method, self.seed, values)

    def run_one(self, key: str) -> Counts:
        """Train and score the one candidate ``key`` (what a scheduler's task runs); no selection."""
        self.refresh()  # the grids as extended in the database
        items = {self.key(m, v): (m, v) for m, v in self.items()}
        if key not in items:
            raise UserError(f"{key} is not a candidate of this tuning ({len(items)} candidates of "
                             f"{', '.join([REFERENCE, *self.methods])})")
        self.check_consistent()
        counts = Counts()
        self._attempt(items[key], counts, _Report(self.log, "[1/1]"))
        return counts

    def _attempt(self, item: tuple[str, dict], counts: Counts, report: _Report) -> bool:
        """Claim, train, score and record one candidate (:func:`calibkit.bench.attempts.attempt`).

        Returns False when another live process holds the candidate and ``report`` waits for it
        (the work queue retries it later, and takes it over if its holder dies), True when it is
        settled here (trained, failed, finished earlier, or held elsewhere with nothing to wait in).
        """
        return attempt(self._task(*item), self.store, self.dd, counts, report, self.failures,
                       waits=report.waiting is not None)

    def _task(self, method: str, values: dict) -> Task:
        """The attempt of candidate ``(method, values)``: claimed in ``tuning``, scored by rank 0 on
        its validation logits (:func:`val_metrics`)."""
        key = self.key(method, values)

        def claim() -> bool:
            return self.store.claim(key, preset=self.preset.name, method=method, seed=self.seed, table=TUNING,
                                    hparams=values, config=self.record(method, values),
                                    git_commit=self.factory.env["git_commit"])

        def record(made: dict) -> str | None:
            if not self.dd.is_main:
                return None
            m = val_metrics(made["run_dir"], self.criterion.n_bins)
            self.store.finish(key, TUNING, metrics=m, run_dir=str(made["run_dir"]),
                              train_time_s=made.get("train_time_s"))
            return f" (val acc {m['acc']:.2%}, val ECE {m['ece'] * 100:.2f})"

        return Task(key, TUNING, f"candidate {key} (method {method}, seed {self.seed})", claim,
                    lambda: self.produce(method, values), record, lambda text: self.store.fail(key, text, TUNING))

    # -- the selection --------------------------------------------------------------------------
    def finished(self, method: str) -> list[dict]:
        """The method's finished candidates, in grid order (only those of its current space)."""
        rows = {slug(r["hparams"]): r for r in self.store.candidates(self.preset.name, method, self.seed)}
        return [rows[slug(v)] for v in candidates(method, space=self.spaces[method]) if slug(v) in rows]

    def select_all(self) -> dict[str, dict]:
        """Select every method whose candidates all finished, record its no-effect axes and the
        extension of any grid its selection lies on the edge of (the next pass of :meth:`run`
        trains what a grid gained); ``{method: selected values}``."""
        self.spaces = self._read_spaces()  # another process may have extended a grid since this one looked
        chosen = {}
        for method in self.methods:
            space = self.spaces[method]
            rows, n = self.finished(method), len(candidates(method, space=space))
            if len(rows) < n:
                wanted = {slug(v) for v in candidates(method, space=space)}
                if any(slug(r["hparams"]) in wanted
                       for r in self.store.candidates(self.preset.name, method, self.seed, status="failed")):
                    self.log(f"tune {method}: {len(rows)} of {n} candidates finished; "
                             "no selection yet (run the same command again)")
                continue  # else: values another process added are still to train
            win = rows[select(rows, space, self.criterion)]
            self.store.select_candidate(self.preset.name, method, self.seed, win["cand_key"],
                                        self.criterion.to_dict())
            chosen[method] = dict(win["hparams"])
            base, old = space_for(self.preset, method), self.record_of(method)
            new, notes = plan(base, old, win["hparams"], self.max_extensions)
            kept = new is not None and new.get("base") == base_grids(base)  # else a fresh record
            record = dict(new) if new is not None and kept else {"base": base_grids(base), "added": {}, "steps": {}}
            record["no_effect"] = no_effect_axes(space, rows)
            record["notes"] = notes
            if record != old:
                self.store.put_meta(meta_key(self.preset.name, self.seed, method), json.dumps(record, sort_keys=True))
            for note in notes:
                self.log(f"tune {method}: {note}")
            for address in record["no_effect"]:
                self.log(f"tune {method}: {address.partition('.')[2]} had no effect (its values gave "
                         "bit-identical validation logits)")
        return chosen

    def selection(self) -> dict[str, dict]:
        """``{method: selected values}`` recorded in the database for this preset and seed."""
        self.spaces = self._read_spaces()  # the grids as extended in the database
        out = {}
        for method in self.methods:
            rows = [r for r in self.finished(method) if r["selected"]]
            if rows:
                out[method] = dict(rows[0]["hparams"])
        return out

    def tuned_preset(self) -> Preset:
        """The preset with every tuned method at its selected values.

        Raises:
            RuntimeError: a method has no selection (some of its candidates failed).
        """
        chosen = broadcast(self.selection(), self.dd)
        missing = [m for m in self.methods if m not in chosen]
        if missing:
            raise UserRuntimeError(f"no selection for {', '.join(missing)} (failed candidates; see {self.out}/runs.db)")
        preset = self.preset
        for method, values in chosen.items():
            preset = apply_values(preset, method, values)
        return preset

    def close(self) -> None:
        """Close the store and leave the process group this tuning created (as ``Bench.close``)."""
        self.store.close()
        D.teardown(self.dd)


class _Report:
    """How a tuning's attempts speak: log lines ``<tag> tune <key>: ...``; ``waiting`` remembers the
    candidates announced as held by another process (None: one scheduled candidate, nothing waits)."""

    def __init__(self, log, tag: str, waiting: set | None = None):
        self.log, self.tag, self.waiting = log, tag, waiting

    def held(self, key: str, waits: bool) -> None:
        if self.waiting is None:
            self.log(f"{self.tag} tune {key}: running in another process; skipped")
        elif key not in self.waiting:
            self.waiting.add(key)
            self.log(f"{self.tag} tune {key}: running in another process; waiting for it")

    def skipped(self, key: str) -> None:
        self.log(f"{self.tag} tune {key}: finished earlier; skipped")

    def begin(self, key: str) -> None:
        self.log(f"{self.tag} tune {key}: running")

    def done(self, key: str, seconds: float, details: str | None) -> None:
        if details is not None:  # rank 0 scored it
            self.log(f"{self.tag} tune {key}: done in {seconds:.0f} s{details}")

    def failed(self, key: str, line: str, seconds: float) -> None:
        self.log(f"{self.tag} tune {key}: {line}")
