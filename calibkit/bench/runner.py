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
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path

import torch

from calibkit import distributed as D
from calibkit import rundir
from calibkit.bench.grid import METHODS, Preset, select_methods
from calibkit.store import Store, run_key


def run_dir_for(out: Path, preset: str, method: str, seed: int) -> Path:
    return Path(out) / "runs" / preset / method / f"seed{seed}"


def train_config(preset: Preset, method: str, seed: int, data_dir=None, device="auto", num_threads=None,
                 csm_data=None):
    """The ``TrainConfig`` of one grid run (preset defaults <- per-method overrides)."""
    from calibkit.config import TrainConfig

    spec = METHODS[method]
    values = {"data": preset.dataset, "model": preset.model, **preset.train,
              **preset.train_by_method.get(method, {}),
              "loss": preset.loss_for(method), "method": spec.method, "seed": int(seed),
              "data_dir": data_dir, "device": device, "num_threads": num_threads}
    if spec.kind == "csm":
        values["csm_data"] = str(csm_data) if csm_data else None
    return TrainConfig.from_dict(values).validate()


def _broadcast(value, dd):
    if not dd.enabled:
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


class Bench:
    """One bench: a preset, an output directory, the seeds and methods to run.

    Args:
        preset: the preset.
        out: output directory (``runs.db``, ``runs/``, ``cache/``, ``report/``).
        seeds: seeds to run (default: the preset's).
        methods: grid methods (default: all; CE and the runs they build on are always added).
        data_dir: where the data set lives (default: its standard location).
        device: ``auto``, ``cpu`` or ``cuda[:N]``.
        num_threads: torch CPU threads (None: torch's default).
        csm_store: a CSM generated set (default: the one shipped for the preset's data set).
        log: where progress lines go.
    """

    def __init__(self, preset: Preset, out, seeds=None, methods=None, data_dir=None, device="auto",
                 num_threads=None, csm_store=None, log=print):
        self.preset = preset
        self.out = Path(out)
        self.seeds = [int(s) for s in (seeds if seeds is not None else preset.seeds)]
        self.methods = select_methods(methods if methods is not None else preset.methods)
        self.data_dir = data_dir
        self.device = device
        self.num_threads = num_threads if num_threads is not None else preset.num_threads
        if self.num_threads:
            torch.set_num_threads(self.num_threads)  # also for evaluation, not only training
        self.csm_store = csm_store
        self.dd = D.setup(device)
        self.log = log if self.dd.is_main else (lambda *a, **k: None)
        self.store = Store(self.out / "runs.db") if self.dd.is_main else None
        self._env = rundir.environment()
        self._data = {}

    # -- data shared by every run of a seed ------------------------------------------------------
    def eval_data(self, seed: int):
        from calibkit.bench.evaluation import EvalData
        from calibkit.data import load

        if seed not in self._data:
            cfg = train_config(self.preset, "ce", seed, self.data_dir)
            bundle = load(cfg.data, data_dir=cfg.data_dir, seed=seed, val_size=cfg.val_size,
                          train_subset=cfg.train_subset)
            self._data[seed] = EvalData(self.preset, bundle, self.out / "cache", self.data_dir)
        return self._data[seed]

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
        summary = train(cfg, run_dir, progress=True, verbose=False)
        if summary.get("status") != "done":
            raise RuntimeError(f"{run_dir}: training ended with status {summary.get('status')!r}")
        return {"run_dir": run_dir, "train_time_s": summary.get("wall_time_s"), "config": cfg.to_dict()}

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> dict:
        """Run every pending (seed, method); returns counts of done/skipped/failed runs."""
        counts = {"done": 0, "skipped": 0, "failed": 0}
        total = len(self.seeds) * len(self.methods)
        i = 0
        for seed in self.seeds:
            for method in self.methods:
                i += 1
                key = run_key(self.preset.name, method, seed)
                claimed = None
                if self.dd.is_main:
                    claimed = self.store.claim(
                        key, preset=self.preset.name, method=method, seed=seed,
                        config=self._config_record(method, seed), git_commit=self._env["git_commit"],
                        versions=self._env["versions"])
                if not _broadcast(claimed, self.dd):
                    counts["skipped"] += 1
                    self.log(f"[{i}/{total}] {key}: finished earlier (or running elsewhere); skipped")
                    continue
                t0 = time.time()
                self.log(f"[{i}/{total}] {key}: running")
                try:
                    made = self.produce(method, seed)
                    if self.dd.is_main:
                        from calibkit.bench.evaluation import evaluate_run

                        res = evaluate_run(made["run_dir"], self.eval_data(seed), model=made.get("model"),
                                           norm=made.get("norm"), device=self.dd.device)
                        self.store.finish(key, run_dir=str(made["run_dir"]), train_time_s=made["train_time_s"],
                                          extra=made.get("extra"), **res)
                        m = res["metrics"]
                        self.log(f"[{i}/{total}] {key}: done in {time.time() - t0:.0f} s "
                                 f"(acc {m['before']['acc']:.2%}, ECE {m['before']['ece'] * 100:.2f} -> "
                                 f"{m['after']['ece'] * 100:.2f} after TS)")
                    D.barrier(self.dd)
                    counts["done"] += 1
                except KeyboardInterrupt:
                    if self.dd.is_main:
                        self.store.fail(key, "interrupted")
                    raise
                except Exception as exc:  # one broken run must not stop the grid
                    counts["failed"] += 1
                    if self.dd.is_main:
                        self.store.fail(key, "".join(traceback.format_exception(exc)))
                    self.log(f"[{i}/{total}] {key}: FAILED: {type(exc).__name__}: {exc}")
        return counts

    def _config_record(self, method: str, seed: int) -> dict:
        spec = METHODS[method]
        record = {"preset": self.preset.name, "method": method, "kind": spec.kind, "seed": seed,
                  "loss": self.preset.loss_for(method), "train_method": spec.method,
                  "dataset": self.preset.dataset, "model": self.preset.model, "train": dict(self.preset.train),
                  "train_overrides": self.preset.train_by_method.get(method, {}),
                  "ood": self.preset.ood, "robust_n": self.preset.robust_n,
                  "severities": list(self.preset.severities), "data_dir": self.data_dir}
        if spec.kind == "maccal":
            record["maccal"] = dict(self.preset.maccal)
        if spec.kind == "csm":
            record["csm"] = dict(self.preset.csm)
        return record

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
