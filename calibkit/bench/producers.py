"""How a run of the grid is produced: the run factory the bench and the tuner share, and one
producer per method kind.

:class:`RunFactory` holds what producing a run needs (the preset, the output directory, the data
and device settings, the process group, the environment recorded with each run) and nothing that
changes while a bench runs; the tuner makes one per candidate with :meth:`RunFactory.with_preset`
(the preset at the candidate's values), so no bench state is shared through copies.

:data:`PRODUCERS` maps a method kind (``MethodSpec.kind``) to its :class:`Producer`, the one place
that dispatches on it: ``train`` trains the run (:meth:`RunFactory.train`), ``maccal`` and ``csm``
build on the CE run of the same seed (:mod:`calibkit.bench.twostage`). A new kind is one entry here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import calibkit.train  # calibkit.train.train read at each call, so a replaced trainer is the one used
from calibkit.bench import twostage
from calibkit.bench.grid import METHODS, Preset
from calibkit.bench.paths import placement
from calibkit.bench.space import current_values
from calibkit.config import TrainConfig, resolve_milestones
from calibkit.distributed import Dist


def train_config(preset: Preset, method: str, seed: int, data_dir=None, device="auto", num_threads=None,
                 csm_data=None) -> TrainConfig:
    """The ``TrainConfig`` of one grid run (preset defaults <- per-method overrides)."""
    spec = METHODS[method]
    values = {"data": preset.dataset, "model": preset.model, **preset.train,
              **preset.train_by_method.get(method, {}),
              "loss": preset.loss_for(method), "method": spec.method, "seed": int(seed),
              "data_dir": data_dir, "device": device, "num_threads": num_threads,
              "checkpoint_every": preset.checkpoint_every}
    if spec.kind == "csm":
        values["csm_data"] = str(csm_data) if csm_data else None
    return TrainConfig.from_dict(values).validate()


@dataclass(frozen=True)
class RunFactory:
    """Produces the runs of one preset into one output directory (see the module docstring).

    Attributes:
        preset: the preset (a tuning candidate's: the preset at its values).
        out: the bench directory.
        dd: the process group (``calibkit.distributed.setup``).
        data_dir, device, num_threads, csm_store: as for :class:`calibkit.bench.runner.Bench`.
        env: the environment recorded with each run (``git_commit``, ``versions``;
            :func:`calibkit.rundir.environment`).
    """

    preset: Preset
    out: Path
    dd: Dist
    data_dir: str | None = None
    device: str = "auto"
    num_threads: int | None = None
    csm_store: str | None = None
    env: dict = field(default_factory=dict)

    def with_preset(self, preset: Preset) -> RunFactory:
        """This factory producing the runs of ``preset`` instead."""
        return dataclasses.replace(self, preset=preset)

    def produce(self, method: str, seed: int, run_dir: Path) -> dict:
        """Produce (or reuse) the run of ``method`` on ``seed`` in ``run_dir`` with its kind's producer;
        returns ``run_dir``, ``train_time_s`` and what the evaluation needs (``extra``, ``model``, ...)."""
        kind = METHODS[method].kind
        if kind not in PRODUCERS:
            raise ValueError(f"unknown method kind {kind!r} for {method}")
        return PRODUCERS[kind].make(self, method, seed, run_dir)

    def train(self, method: str, seed: int, run_dir: Path, csm_data=None) -> dict:
        """Train (or resume, or reuse) the run with :func:`calibkit.train.train`."""
        cfg = train_config(self.preset, method, seed, self.data_dir, self.device, self.num_threads, csm_data)
        # root: config.json records the generated set's path relative to the bench directory, which
        # may then be moved or copied with its runs (an interrupted run there still resumes).
        summary = calibkit.train.train(cfg, run_dir, progress=True, verbose=False, place=placement(self.out))
        if summary.get("status") != "done":
            raise RuntimeError(f"{run_dir}: training ended with status {summary.get('status')!r}")
        return {"run_dir": run_dir, "train_time_s": summary.get("wall_time_s"), "config": cfg.to_dict()}

    def config_record(self, method: str, seed: int) -> dict:
        """What a run's row records of its settings (what a table must not mix)."""
        spec, preset = METHODS[method], self.preset
        train = dict(preset.train)
        if train.get("milestones") is not None:  # in epochs, as the runs' configs (and older records) hold them
            train["milestones"] = resolve_milestones(train["milestones"], train.get("epochs", TrainConfig.epochs))
        record = {"preset": preset.name, "method": method, "kind": spec.kind, "seed": seed,
                  "keep": preset.keep, "hparams": current_values(preset, method),
                  "loss": preset.loss_for(method), "train_method": spec.method,
                  "dataset": preset.dataset, "model": preset.model, "train": train,
                  "train_overrides": preset.train_by_method.get(method, {}),
                  "ood": preset.ood, "robust_n": preset.robust_n,
                  "severities": list(preset.severities), "data_dir": self.data_dir}
        if spec.kind == "maccal":
            record["maccal"] = dict(preset.maccal)
        if spec.kind == "csm":
            record["csm"] = dict(preset.csm)
        return record


@dataclass(frozen=True)
class Producer:
    """How the runs of one method kind are made.

    Attributes:
        make: ``make(factory, method, seed, run_dir)`` -> what :meth:`RunFactory.produce` returns.
        single_process: the run is made by one process whatever the job's size (a scheduler gives
            its task one GPU).
    """

    make: Callable[[RunFactory, str, int, Path], dict]
    single_process: bool = False


def _train(runs: RunFactory, method: str, seed: int, run_dir: Path) -> dict:
    return runs.train(method, seed, run_dir)


def _maccal(runs: RunFactory, method: str, seed: int, run_dir: Path) -> dict:
    return twostage.produce_maccal(runs, seed, run_dir)


def _csm(runs: RunFactory, method: str, seed: int, run_dir: Path) -> dict:
    return twostage.produce_csm(runs, seed, run_dir)


PRODUCERS: dict[str, Producer] = {
    "train": Producer(_train),
    "maccal": Producer(_maccal, single_process=True),  # stage 2 runs in one process (rank 0)
    "csm": Producer(_csm),
}
