"""The bench loop: for every seed and method, train (or reuse) the run, evaluate it, record it.

Resume and concurrency come from two layers:

* the results database (:mod:`calibkit.store`): a ``done`` row is skipped, a row claimed by a live
  bench is left to it, a ``failed`` row or one whose bench died is taken over;
* the run directories (``DIR/runs/<preset>/<method>/seed<k>``): ``calibkit.train.train`` resumes an
  unfinished run from its checkpoint and returns at once for a finished one, so an interrupted
  bench loses at most the epoch in progress.

A failing run is recorded as ``failed`` with its error and the bench goes on with the others.
Under ``torchrun`` every process runs the same loop (training is data-parallel); only rank 0
opens the database, evaluates and writes (the others hold a :class:`~calibkit.store.null.NullStore`),
and its decision to run or skip each run is broadcast. Each run goes through the flow the tuner
uses too (:func:`calibkit.bench.attempts.attempt`), produced by the producer of its method's kind
(:data:`calibkit.bench.producers.PRODUCERS`).

Several benches on one output directory share the work: each claims the runs nobody holds, and a
run that builds on another one (MaC-Cal and CSM on the CE run of their seed) waits while another
live bench is still producing that one (:func:`work_queue`). Each process trains different runs,
so N processes keep N cores busy on one preset.

One checkpoint policy (``Preset.keep``) and one set of hyperparameters per method hold for a whole
output directory: a bench refuses to add runs to a directory whose finished runs were made under
another policy or other hyperparameters, so a table never mixes them. The one exception is a
re-tuning: runs of a method at other values than the directory's recorded selection, when the bench
runs at that selection, are moved aside (kept, under ``KEY~<values>``) and the method runs again.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import calibkit.data  # calibkit.data.load read at each call, so a replaced loader is the one used
from calibkit import distributed as D
from calibkit import rundir
from calibkit.bench import evaluation
from calibkit.bench.attempts import Counts, Task, attempt, broadcast, reaping_sleep, work_queue
from calibkit.bench.grid import METHODS, Preset, grid_methods
from calibkit.bench.paths import RETIRED, run_dir_for
from calibkit.bench.producers import RunFactory, train_config
from calibkit.bench.progress import RunProgress
from calibkit.bench.space import slug
from calibkit.errors import UserError
from calibkit.store import NullStore, ResultStore, open_store, run_key

__all__ = ["Bench", "open_bench_store", "open_runs", "run_dir_for", "train_config"]


def open_bench_store(out, store, is_main: bool) -> ResultStore:
    """The store of a bench or a tuning on this process: ``store`` when it is one already, else
    :func:`calibkit.store.open_store` of ``out`` and ``store`` (None or a URL) on rank 0, and a
    :class:`~calibkit.store.null.NullStore` on the other ranks (rank 0's answers reach them by broadcast)."""
    if not is_main:
        return NullStore()
    return open_store(out, store) if store is None or isinstance(store, str) else store


def open_runs(preset: Preset, out, data_dir, device, num_threads, csm_store, store) -> tuple[RunFactory, ResultStore]:
    """What a bench and a tuning set up alike: torch's CPU threads (``num_threads``, else the
    preset's), the process group, the store (:func:`open_bench_store`) and the run factory."""
    num_threads = num_threads if num_threads is not None else preset.num_threads
    if num_threads:
        torch.set_num_threads(num_threads)  # also for evaluation, not only training
    dd = D.setup(device)
    factory = RunFactory(preset, Path(out), dd, data_dir if data_dir is not None else preset.data_dir, device,
                         num_threads, csm_store, rundir.environment())
    return factory, open_bench_store(out, store, dd.is_main)


class Bench:
    """One bench: a preset, an output directory, the seeds and methods to run.

    Args:
        preset: the preset.
        out: output directory (``runs.db``, ``runs/``, ``cache/``, ``report/``).
        seeds: seeds to run (default: the preset's).
        methods: grid methods (default: the preset's, else all; CE and the runs they build on are
            always added; a text preset skips the methods that need images).
        data_dir: where the data set lives (default: the preset's ``data_dir``, else the data set's
            standard location).
        device: ``auto``, ``cpu`` or ``cuda[:N]``.
        num_threads: torch CPU threads (None: torch's default).
        csm_store: a CSM generated set (default: the one shipped for the preset's data set).
        log: where progress lines go.
        store: where the records go: None for ``out/runs.db``, a ``postgresql://`` URL
            (:func:`calibkit.store.open_store`), or a :class:`~calibkit.store.protocol.ResultStore`
            (a scheduler's task passes :class:`calibkit.bench.resultfiles.ResultFiles`). Opened by rank 0
            only (:func:`open_bench_store`).

    Attributes:
        factory: the :class:`~calibkit.bench.producers.RunFactory` producing this bench's runs.
    """

    def __init__(self, preset: Preset, out, seeds=None, methods=None, data_dir=None, device="auto",
                 num_threads=None, csm_store=None, log=print, store=None):
        self.out = Path(out)
        self.seeds = [int(s) for s in (seeds if seeds is not None else preset.seeds)]
        self.methods, self.skipped = grid_methods(preset, methods)
        self.factory, self.store = open_runs(preset, out, data_dir, device, num_threads, csm_store, store)
        f = self.factory
        self.dd, self.data_dir, self.device, self.num_threads, self.csm_store = (f.dd, f.data_dir, f.device,
                                                                                 f.num_threads, f.csm_store)
        self.log = log if self.dd.is_main else (lambda *a, **k: None)
        self._waiting: set = set()  # keys held by another process, announced once
        self._data: dict = {}
        self.failures: list[str] = []  # one line per run that failed here (run_recorded), for stderr
        if self.skipped:
            self.log(f"{', '.join(self.skipped)}: skipped (they mix or generate images; preset {preset.name} "
                     "trains on token ids)")

    # -- data shared by every run ------------------------------------------------------------------
    @property
    def preset(self) -> Preset:
        return self.factory.preset

    def eval_data(self, seed: int, preset: Preset | None = None):
        """The evaluation sets (test, OOD, corrupted), built once per bench and shared by every run.

        They depend on the data set's test split (fixed: no seed draws it) and on the preset's
        ``ood``, ``robust_n`` and ``severities``, never on the seed or a method's hyperparameters,
        so one ``EvalData`` serves every seed and every ``preset`` (default: this bench's) that
        agrees on those. ``seed`` only picks which seed's split loads the test set the first time.
        """
        p = self.preset if preset is None else preset
        key = (p.dataset, p.ood, p.robust_n, tuple(p.severities))
        if key not in self._data:
            cfg = train_config(p, "ce", seed, self.data_dir)
            bundle = calibkit.data.load(cfg.data, data_dir=cfg.data_dir, seed=seed, val_size=cfg.val_size,
                                        train_subset=cfg.train_subset)
            self._data[key] = evaluation.EvalData(p, bundle, self.out / "cache", self.data_dir)
        return self._data[key]

    # -- producing one run ---------------------------------------------------------------------
    def produce(self, method: str, seed: int) -> dict:
        """Train (or reuse) the run; returns ``run_dir``, ``train_time_s`` and the evaluation's arguments."""
        return self.factory.produce(method, seed, run_dir_for(self.out, self.preset.name, method, seed))

    def _task(self, seed: int, method: str) -> Task:
        """The attempt of run ``(seed, method)``: claimed in ``runs``, evaluated and recorded by rank 0."""
        key = run_key(self.preset.name, method, seed)
        env = self.factory.env

        def claim() -> bool:
            return self.store.claim(key, preset=self.preset.name, method=method, seed=seed,
                                    config=self.factory.config_record(method, seed),
                                    git_commit=env["git_commit"], versions=env["versions"])

        def record(made: dict) -> str:
            details = ""
            if self.dd.is_main:  # evaluation is rank 0's alone
                res = evaluation.evaluate_run(made["run_dir"], self.eval_data(seed), model=made.get("model"),
                                              norm=made.get("norm"), device=self.dd.device)
                self.store.finish(key, run_dir=str(made["run_dir"]), train_time_s=made["train_time_s"],
                                  extra=made.get("extra"), **res)
                m = res["metrics"]
                details = (f" (acc {m['before']['acc']:.2%}, ECE {m['before']['ece'] * 100:.2f} -> "
                           f"{m['after']['ece'] * 100:.2f} after TS)")
            D.barrier(self.dd)
            return details

        return Task(key, "runs", f"run {key} (method {method}, seed {seed})", claim,
                    lambda: self.produce(method, seed), record, lambda text: self.store.fail(key, text))

    # -- the loop -------------------------------------------------------------------------------
    def needs_ready(self, method: str, seed: int) -> bool:
        """False while a run that ``method`` builds on is being produced by another live bench."""
        busy = any(self.store.busy_elsewhere(run_key(self.preset.name, n, seed)) for n in METHODS[method].needs)
        return not broadcast(busy, self.dd)

    def run(self, reap=None) -> Counts:
        """Run every pending (seed, method); returns the :class:`~calibkit.bench.attempts.Counts`
        of done, skipped and failed runs. ``reap``: the ``--workers`` processes' watcher
        (:func:`calibkit.bench.workers.reaper`); while waiting for a run another process holds,
        a worker that ends is noticed within half a second and its runs taken over at once."""
        self.supersede(self.check_consistent())
        counts = Counts()
        items = [(seed, method) for seed in self.seeds for method in self.methods]
        progress = RunProgress(len(items), write=self.log,
                               bar=self.dd.is_main and self.log is print and sys.stderr.isatty())
        report = _Report(progress, self.log, self._waiting)
        pause = {} if reap is None else {"sleep": reaping_sleep(reap, self.log)}
        try:
            work_queue(items, lambda item: self.needs_ready(item[1], item[0]),
                       lambda item: attempt(self._task(*item), self.store, self.dd, counts, report, self.failures),
                       **pause)
        finally:
            progress.close()
        return counts

    def unfinished(self) -> list[str]:
        """The keys of this bench's runs that are not ``done`` in the store (read by rank 0)."""
        keys = [run_key(self.preset.name, m, s) for s in self.seeds for m in self.methods]
        return [k for k in keys if self.store.status(k) != "done"]

    def run_one(self, seed: int, method: str) -> Counts:
        """Produce, evaluate and record the one run ``(seed, method)`` (what a scheduler's task
        runs); returns the counts of :meth:`run` (a run another live process holds is skipped,
        not waited for). What it builds on must be finished already."""
        if method not in self.methods or seed not in self.seeds:
            raise UserError(f"{self.preset.name}/{method}/{seed} is not a run of this bench "
                             f"(methods {', '.join(self.methods)}; seeds {self.seeds})")
        self.check_consistent()
        counts = Counts()
        progress = RunProgress(1, write=self.log, bar=False)
        try:
            attempt(self._task(seed, method), self.store, self.dd, counts, _Report(progress, self.log, self._waiting),
                    self.failures, waits=False)
        finally:
            progress.close()
        return counts

    def check_consistent(self) -> list[str]:
        """Refuse to mix checkpoint policies or hyperparameters in one output directory.

        A finished run of a method at other values than this bench's is **stale** when this
        bench's values are the directory's recorded selection for that method (``calibkit tune``
        chose other values since the run was made): it is returned, to be moved aside by
        :meth:`supersede` and run again. Any other difference is refused.

        Returns:
            the run keys of the stale runs.

        Raises:
            ValueError: a finished run of this preset was made under another checkpoint policy, or
                one of the selected methods with other hyperparameters (not a re-tuning), than this
                bench would use.
        """
        problem, stale = broadcast(self._inconsistency(), self.dd)
        if problem:
            raise UserError(problem)
        return stale

    def _inconsistency(self) -> tuple[str | None, list[str]]:
        """``(problem, stale run keys)`` of :meth:`check_consistent` (read by rank 0)."""
        selected = self.recorded_selection()
        stale: list[str] = []
        for row in self.store.runs(self.preset.name):
            rec = row.get("config") or {}
            keep = rec.get("keep", (rec.get("train") or {}).get("keep", "best-acc"))
            if keep != self.preset.keep:
                return (f"{self.out / 'runs.db'} holds runs of preset {self.preset.name} made under the "
                        f"checkpoint policy {keep!r}; this bench uses {self.preset.keep!r}. "
                        "Choose another --out (one policy per bench)"), stale
            method = row["method"]
            if method in self.methods and rec.get("hparams") is not None and RETIRED not in row["run_key"]:
                mine = self.factory.config_record(method, int(row["seed"]))["hparams"]
                if rec["hparams"] == mine:
                    continue
                if selected.get(method) == mine:
                    stale.append(row["run_key"])
                    continue
                return (f"{self.out / 'runs.db'}: {row['run_key']} was run with {rec['hparams']}, this "
                        f"bench would use {mine}. Choose another --out (one set of values per bench)"
                        + (f"; this directory's tuning selected {selected[method]} (bench --tune runs "
                           "at the selection)" if method in selected else "")), stale
        return None, stale

    def recorded_selection(self) -> dict[str, dict]:
        """``{method: values}`` selected by ``calibkit tune`` in this directory for this preset
        (on its selection seed ``Preset.tune_seed``); empty without a tuning run."""
        rows = self.store.candidates(self.preset.name, seed=self.preset.tune_seed)
        return {r["method"]: dict(r["hparams"]) for r in rows if r["selected"]}

    def supersede(self, keys: list[str]) -> None:
        """Move stale runs aside (:meth:`check_consistent`): each keeps its row and results under
        ``KEY~<values>`` and its run directory as ``seed<k>~<values>``, so that the method runs
        again at the recorded selection under the usual key; the report shows only the latter."""
        for key in keys:
            row = self.store.get(key)
            if row is None or row["status"] != "done":
                continue  # another worker of this bench moved it already
            tag = RETIRED + slug(row["config"]["hparams"])
            new_key, k = key + tag, 1
            while self.store.get(new_key) is not None:
                k += 1
                new_key = f"{key}{tag}{RETIRED}{k}"
            old_dir = Path(row["run_dir"]) if row.get("run_dir") else None
            new_dir = old_dir.with_name(old_dir.name + new_key[len(key):]) if old_dir is not None else None
            try:
                self.store.retire(key, new_key, str(new_dir) if new_dir else None,
                                  str(new_dir / rundir.LOGITS) if new_dir else None)
            except KeyError:
                continue  # lost the race to another worker
            if old_dir is not None and new_dir is not None and old_dir.exists():  # new_dir is set with old_dir
                old_dir.rename(new_dir)
            self.log(f"{key}: run at {row['config']['hparams']}, not this directory's selection; kept as "
                     f"{new_key} and run again")
        D.barrier(self.dd)

    def close(self) -> None:
        """Close the database and leave the process group this bench created (under torchrun),
        so that no rank exits with a live gloo/nccl group (its destructor may abort the process)."""
        self.store.close()
        D.teardown(self.dd)


class _Report:
    """How a bench's attempts speak: one progress line per run (:class:`RunProgress`), and one log
    line the first time a run is seen held by another process (``waiting``: the keys announced)."""

    def __init__(self, progress: RunProgress, log, waiting: set):
        self.progress, self.log, self.waiting = progress, log, waiting

    def held(self, key: str, waits: bool) -> None:
        if key not in self.waiting:
            self.waiting.add(key)
            self.log(f"{key}: running in another process; waiting for it")

    def skipped(self, key: str) -> None:
        self.progress.end(key, "finished earlier; skipped")

    def begin(self, key: str) -> None:
        self.progress.begin(key)

    def done(self, key: str, seconds: float, details: str | None) -> None:
        self.progress.end(key, f"done in {seconds:.0f} s{details or ''}", seconds=seconds)

    def failed(self, key: str, line: str, seconds: float) -> None:
        self.progress.end(key, line, seconds=seconds)
