"""The bench loop: for every seed and method, train (or reuse) the run, evaluate it, record it.

Resume and concurrency come from two layers:

* the results database (:mod:`calibkit.store`): a ``done`` row is skipped, a row claimed by a live
  bench is left to it, a ``failed`` row or one whose bench died is taken over;
* the run directories (``DIR/runs/<preset>/<method>/seed<k>``): ``calibkit.train.train`` resumes an
  unfinished run from its checkpoint and returns at once for a finished one, so an interrupted
  bench loses at most the epoch in progress.

A failing run is recorded as ``failed`` with its error and the bench goes on with the others.
Under ``torchrun`` every process runs the same loop (training is data-parallel); only rank 0
opens the database, evaluates and writes, and its decision to run or skip each run is broadcast.

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

import copy
import sys
import time
from pathlib import Path

import torch

from calibkit import distributed as D
from calibkit import rundir
from calibkit.bench.attempts import broadcast, claim_outcome, run_recorded, work_queue
from calibkit.bench.grid import METHODS, Preset, grid_methods
from calibkit.bench.paths import RETIRED, run_dir_for
from calibkit.bench.space import current_values
from calibkit.errors import UserError
from calibkit.store import open_store, run_key


def train_config(preset: Preset, method: str, seed: int, data_dir=None, device="auto", num_threads=None,
                 csm_data=None):
    """The ``TrainConfig`` of one grid run (preset defaults <- per-method overrides)."""
    from calibkit.config import TrainConfig

    spec = METHODS[method]
    values = {"data": preset.dataset, "model": preset.model, **preset.train,
              **preset.train_by_method.get(method, {}),
              "loss": preset.loss_for(method), "method": spec.method, "seed": int(seed),
              "data_dir": data_dir, "device": device, "num_threads": num_threads,
              "checkpoint_every": preset.checkpoint_every}
    if spec.kind == "csm":
        values["csm_data"] = str(csm_data) if csm_data else None
    return TrainConfig.from_dict(values).validate()


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
            (:func:`calibkit.store.open_store`), or an object with the store's API (a scheduler's
            task passes :class:`calibkit.bench.results.ResultFiles`). Opened by rank 0 only.
    """

    def __init__(self, preset: Preset, out, seeds=None, methods=None, data_dir=None, device="auto",
                 num_threads=None, csm_store=None, log=print, store=None):
        self.preset = preset
        self.out = Path(out)
        self.seeds = [int(s) for s in (seeds if seeds is not None else preset.seeds)]
        self.methods, self.skipped = grid_methods(preset, methods)
        self.data_dir = data_dir if data_dir is not None else preset.data_dir
        self.device = device
        self.num_threads = num_threads if num_threads is not None else preset.num_threads
        if self.num_threads:
            torch.set_num_threads(self.num_threads)  # also for evaluation, not only training
        self.csm_store = csm_store
        self.dd = D.setup(device)
        self.log = log if self.dd.is_main else (lambda *a, **k: None)
        self.store = None
        if self.dd.is_main:
            self.store = open_store(self.out, store) if store is None or isinstance(store, str) else store
        self._waiting: set = set()  # keys held by another process, announced once
        self._env = rundir.environment()
        self._data = {}
        self.failures: list[str] = []  # one line per run that failed here (run_recorded), for stderr
        if self.skipped:
            self.log(f"{', '.join(self.skipped)}: skipped (they mix or generate images; preset {preset.name} "
                     "trains on token ids)")

    # -- data shared by every run ------------------------------------------------------------------
    def eval_data(self, seed: int):
        """The evaluation sets (test, OOD, corrupted), built once per bench and shared by every run.

        They depend on the data set's test split (fixed: no seed draws it) and on the preset's
        ``ood``, ``robust_n`` and ``severities``, never on the seed or a method's hyperparameters,
        so one ``EvalData`` serves every seed and every view of this bench (:meth:`view`) that
        agrees on those. ``seed`` only picks which seed's split loads the test set the first time.
        """
        from calibkit.bench.evaluation import EvalData
        from calibkit.data import load

        p = self.preset
        key = (p.dataset, p.ood, p.robust_n, tuple(p.severities))
        if key not in self._data:
            cfg = train_config(p, "ce", seed, self.data_dir)
            bundle = load(cfg.data, data_dir=cfg.data_dir, seed=seed, val_size=cfg.val_size,
                          train_subset=cfg.train_subset)
            self._data[key] = EvalData(p, bundle, self.out / "cache", self.data_dir)
        return self._data[key]

    # -- producing one run ---------------------------------------------------------------------
    def produce(self, method: str, seed: int) -> dict:
        """Train (or reuse) the run; returns ``run_dir``, ``train_time_s`` and evaluation kwargs."""
        spec = METHODS[method]
        run_dir = run_dir_for(self.out, self.preset.name, method, seed)
        if spec.kind == "train":
            return self._train(method, seed, run_dir)
        if spec.kind == "maccal":
            from calibkit.bench.twostage import produce_maccal

            return produce_maccal(self, seed, run_dir)
        if spec.kind == "csm":
            from calibkit.bench.twostage import produce_csm

            return produce_csm(self, seed, run_dir)
        raise ValueError(f"unknown method kind {spec.kind!r} for {method}")

    def _train(self, method: str, seed: int, run_dir: Path, csm_data=None) -> dict:
        from calibkit.train import train

        cfg = train_config(self.preset, method, seed, self.data_dir, self.device, self.num_threads, csm_data)
        # root: config.json records the generated set's path relative to the bench directory, which
        # may then be moved or copied with its runs (an interrupted run there still resumes).
        summary = train(cfg, run_dir, progress=True, verbose=False, root=self.out)
        if summary.get("status") != "done":
            raise RuntimeError(f"{run_dir}: training ended with status {summary.get('status')!r}")
        return {"run_dir": run_dir, "train_time_s": summary.get("wall_time_s"), "config": cfg.to_dict()}

    # -- the loop -------------------------------------------------------------------------------
    def view(self, preset: Preset) -> Bench:
        """This bench (same database, data and output directory) running ``preset`` instead."""
        other = copy.copy(self)
        other.preset = preset
        return other

    def needs_ready(self, method: str, seed: int) -> bool:
        """False while a run that ``method`` builds on is being produced by another live bench."""
        busy = False
        if self.dd.is_main:
            busy = any(self.store.busy_elsewhere(run_key(self.preset.name, n, seed)) for n in METHODS[method].needs)
        return not broadcast(busy, self.dd)

    def run(self) -> dict:
        """Run every pending (seed, method); returns counts of done/skipped/failed runs."""
        from calibkit.bench.progress import RunProgress

        self.supersede(self.check_consistent())
        counts = {"done": 0, "skipped": 0, "failed": 0}
        items = [(seed, method) for seed in self.seeds for method in self.methods]
        progress = RunProgress(len(items), write=self.log,
                               bar=self.dd.is_main and self.log is print and sys.stderr.isatty())
        try:
            work_queue(items, lambda item: self.needs_ready(item[1], item[0]),
                       lambda item: self._attempt(item[0], item[1], counts, progress))
        finally:
            progress.close()
        return counts

    def run_one(self, seed: int, method: str) -> dict:
        """Produce, evaluate and record the one run ``(seed, method)`` (what a scheduler's task
        runs); returns the counts of :meth:`run`. What it builds on must be finished already."""
        from calibkit.bench.progress import RunProgress

        if method not in self.methods or seed not in self.seeds:
            raise UserError(f"{self.preset.name}/{method}/{seed} is not a run of this bench "
                             f"(methods {', '.join(self.methods)}; seeds {self.seeds})")
        self.check_consistent()
        counts = {"done": 0, "skipped": 0, "failed": 0}
        progress = RunProgress(1, write=self.log, bar=False)
        try:
            if not self._attempt(seed, method, counts, progress):  # held by another live task
                counts["skipped"] += 1
        finally:
            progress.close()
        return counts

    def _attempt(self, seed: int, method: str, counts: dict, progress) -> bool:
        """Claim, produce, evaluate and record one run (a failure is recorded, not raised).

        Returns False when another live process holds the run: the caller retries it later, so a
        bench ends only when every run of its grid is finished (by it or another process) or has
        failed; a holder that dies or stops refreshing its claim is taken over (:mod:`calibkit.store`).
        """
        key = run_key(self.preset.name, method, seed)
        outcome = None
        if self.dd.is_main:
            outcome = claim_outcome(self.store, "runs", key, self.store.claim(
                key, preset=self.preset.name, method=method, seed=seed,
                config=self._config_record(method, seed), git_commit=self._env["git_commit"],
                versions=self._env["versions"]))
        outcome = broadcast(outcome, self.dd)
        if outcome == "elsewhere":
            if key not in self._waiting:
                self._waiting.add(key)
                self.log(f"{key}: running in another process; waiting for it")
            return False
        if outcome == "done":
            counts["skipped"] += 1
            progress.end(key, "finished earlier; skipped")
            return True
        t0 = time.time()
        progress.begin(key)

        def work():
            made = self.produce(method, seed)
            m = None
            if self.dd.is_main:
                from calibkit.bench.evaluation import evaluate_run

                res = evaluate_run(made["run_dir"], self.eval_data(seed), model=made.get("model"),
                                   norm=made.get("norm"), device=self.dd.device)
                self.store.finish(key, run_dir=str(made["run_dir"]), train_time_s=made["train_time_s"],
                                  extra=made.get("extra"), **res)
                m = res["metrics"]
            D.barrier(self.dd)
            counts["done"] += 1
            progress.end(key, f"done in {time.time() - t0:.0f} s" + (
                f" (acc {m['before']['acc']:.2%}, ECE {m['before']['ece'] * 100:.2f} -> "
                f"{m['after']['ece'] * 100:.2f} after TS)" if m else ""), seconds=time.time() - t0)

        run_recorded(work, lambda text: self.store.fail(key, text), self.dd.is_main, counts,
                     lambda line: progress.end(key, line, seconds=time.time() - t0), self.failures,
                     f"run {key} (method {method}, seed {seed})")
        return True

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
        problem, stale = None, []
        if self.dd.is_main:
            selected = self.recorded_selection()
            for row in self.store.runs(self.preset.name):
                rec = row.get("config") or {}
                keep = rec.get("keep", (rec.get("train") or {}).get("keep", "best-acc"))
                if keep != self.preset.keep:
                    problem = (f"{self.out / 'runs.db'} holds runs of preset {self.preset.name} made under the "
                               f"checkpoint policy {keep!r}; this bench uses {self.preset.keep!r}. "
                               "Choose another --out (one policy per bench)")
                    break
                method = row["method"]
                if method in self.methods and rec.get("hparams") is not None and RETIRED not in row["run_key"]:
                    mine = self._config_record(method, int(row["seed"]))["hparams"]
                    if rec["hparams"] == mine:
                        continue
                    if selected.get(method) == mine:
                        stale.append(row["run_key"])
                        continue
                    problem = (f"{self.out / 'runs.db'}: {row['run_key']} was run with {rec['hparams']}, this "
                               f"bench would use {mine}. Choose another --out (one set of values per bench)"
                               + (f"; this directory's tuning selected {selected[method]} (bench --tune runs "
                                  "at the selection)" if method in selected else ""))
                    break
        problem, stale = broadcast((problem, stale), self.dd)
        if problem:
            raise UserError(problem)
        return stale

    def recorded_selection(self) -> dict[str, dict]:
        """``{method: values}`` selected by ``calibkit tune`` in this directory for this preset
        (on its selection seed ``Preset.tune_seed``); empty without a tuning run."""
        rows = self.store.candidates(self.preset.name, seed=self.preset.tune_seed)
        return {r["method"]: dict(r["hparams"]) for r in rows if r["selected"]}

    def supersede(self, keys: list[str]) -> None:
        """Move stale runs aside (:meth:`check_consistent`): each keeps its row and results under
        ``KEY~<values>`` and its run directory as ``seed<k>~<values>``, so that the method runs
        again at the recorded selection under the usual key; the report shows only the latter."""
        if not keys or not self.dd.is_main:
            D.barrier(self.dd)
            return
        from calibkit.bench.space import slug

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
            if old_dir is not None and old_dir.exists():
                old_dir.rename(new_dir)
            self.log(f"{key}: run at {row['config']['hparams']}, not this directory's selection; kept as "
                     f"{new_key} and run again")
        D.barrier(self.dd)

    def _config_record(self, method: str, seed: int) -> dict:
        from calibkit.config import TrainConfig, resolve_milestones

        spec = METHODS[method]
        train = dict(self.preset.train)
        if train.get("milestones") is not None:  # in epochs, as the runs' configs (and older records) hold them
            train["milestones"] = resolve_milestones(train["milestones"], train.get("epochs", TrainConfig.epochs))
        record = {"preset": self.preset.name, "method": method, "kind": spec.kind, "seed": seed,
                  "keep": self.preset.keep, "hparams": current_values(self.preset, method),
                  "loss": self.preset.loss_for(method), "train_method": spec.method,
                  "dataset": self.preset.dataset, "model": self.preset.model, "train": train,
                  "train_overrides": self.preset.train_by_method.get(method, {}),
                  "ood": self.preset.ood, "robust_n": self.preset.robust_n,
                  "severities": list(self.preset.severities), "data_dir": self.data_dir}
        if spec.kind == "maccal":
            record["maccal"] = dict(self.preset.maccal)
        if spec.kind == "csm":
            record["csm"] = dict(self.preset.csm)
        return record

    def close(self) -> None:
        """Close the database and leave the process group this bench created (under torchrun),
        so that no rank exits with a live gloo/nccl group (its destructor may abort the process)."""
        if self.store is not None:
            self.store.close()
        D.teardown(self.dd)
