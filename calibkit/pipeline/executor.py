"""Where a bench's runs execute: in this process, in N processes on this machine, or as SLURM arrays.

An :class:`Executor` executes a :class:`~calibkit.pipeline.spec.BenchSpec` (a bench or a tuning);
``calibkit bench`` and ``calibkit tune`` choose one from ``--executor`` and ``--workers`` and print
what it returns. The three:

* :class:`Inline`: this process runs the spec (:func:`calibkit.pipeline.run.run_spec`);
* :class:`LocalProcesses`: N identical workers on this machine, this process and N - 1 it starts
  (``calibkit bench --out OUT --spec FILE --await-start``, :mod:`calibkit.bench.workers`). Each
  runs the spec as :class:`Inline` does, and they share its runs through the store's claims (a run
  is trained by the worker that claims it; one that builds on a run another worker holds waits
  for it). The extra workers start up at once and wait; this process releases them once the state
  every worker reads is in place (its checks passed, CSM's set built, the selection made, the
  preset recorded), reaps those that end while it waits for a run one of them holds, and waits
  for them after its last run. It reaches them through :class:`calibkit.pipeline.run.Peers`, the
  two calls the pipeline makes itself; nothing below the pipeline calls back up.
* :class:`SlurmArrays`: submits the spec's missing runs as SLURM job arrays (:mod:`calibkit.bench.slurm`);
  each task runs one run key of the spec from its file and records it in its result file.

Every executor runs the same preflight (:func:`calibkit.pipeline.run.preflight`) before it starts
anything: :class:`Inline` and every worker of :class:`LocalProcesses` in :func:`~calibkit.pipeline.run.run_spec`
(an extra worker, released into a directory that is a bench's by then, checks the same spec and
passes as a second ``calibkit bench`` on it would), :class:`SlurmArrays` before it writes a job
script. A SLURM task runs one run of a spec that was checked at its submission and checks nothing more.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from calibkit.bench.grid import Preset
from calibkit.bench.slurm import SlurmOptions
from calibkit.bench.slurm_plan import submit_bench, submit_tune
from calibkit.bench.workers import cancel_workers, reaper, release_workers, start_workers, wait_workers
from calibkit.errors import UserError
from calibkit.pipeline.options import BenchOptions, BenchResult, TuneResult
from calibkit.pipeline.run import preflight, run_spec
from calibkit.pipeline.spec import BenchSpec

__all__ = ["Executor", "Inline", "LocalProcesses", "Outcome", "SlurmArrays", "Submission", "submission_argv",
           "worker_argv"]


@dataclass
class Submission:
    """What :class:`SlurmArrays` did: ``jobs`` is ``{stage: job id}`` (empty: nothing was missing;
    with ``dry_run``, the stages written and not submitted)."""

    preset: Preset
    jobs: dict[str, str] = field(default_factory=dict)
    dry_run: bool = False


Outcome = BenchResult | TuneResult | Submission


class Executor(Protocol):
    """Executes a bench's or a tuning's spec; see the module's text for the three."""

    def execute(self, spec: BenchSpec) -> Outcome:
        """Check ``spec`` (:func:`calibkit.pipeline.run.preflight`), then run it or submit it.

        Raises:
            UserError: a precondition that does not hold: nothing written and no run started
                (:class:`LocalProcesses` has started its waiting workers by then, and tells them
                the bench will not run).
        """
        ...


class Inline:
    """This process runs the spec, alone or as one worker of :class:`LocalProcesses`."""

    def execute(self, spec: BenchSpec) -> BenchResult | TuneResult:
        return run_spec(spec)


def worker_argv(spec: BenchSpec) -> list[str]:
    """The calibkit arguments of an extra worker of :class:`LocalProcesses`: wait to be released,
    then run ``spec`` from its file (written on release)."""
    return spec.argv(os.path.abspath(spec.path()), "--await-start")


class LocalProcesses:
    """``workers`` identical workers on this machine: this process and ``workers - 1`` it starts.

    Raises:
        UserError: ``workers`` below 1, or more than 1 under ``torchrun`` (the processes of one
            run there are torchrun's).
    """

    def __init__(self, workers: int):
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise UserError(f"--workers must be >= 1, got {workers}")
        if workers > 1 and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise UserError("--workers starts processes itself; under torchrun use --workers 1")
        self.workers = workers

    def execute(self, spec: BenchSpec) -> BenchResult | TuneResult:
        if self.workers == 1:
            return run_spec(spec)
        # first thing: they start up while this process checks the spec
        crew = _Crew(spec, start_workers(worker_argv(spec), self.workers - 1, spec.options.store))
        try:
            return run_spec(spec, peers=crew)
        finally:
            crew.cancel()  # those still waiting: the spec failed before its first run


class _Crew:
    """The extra workers of one :meth:`LocalProcesses.execute`, as :class:`calibkit.pipeline.run.Peers`."""

    def __init__(self, spec: BenchSpec, waiting: list):
        self.spec, self.waiting = spec, waiting
        self.released: list = []  # (Popen, log) of each released worker
        self.watch = reaper(self.released)

    def release(self) -> None:
        if not self.waiting:
            return
        self.spec.write()  # every check has passed: the workers read it once released
        self.released.extend(release_workers(self.waiting, self.spec.out))
        n = len(self.waiting) + 1
        self.waiting = []
        noun = "runs" if self.spec.command == "bench" else "candidates"
        print(f"{self.spec.command} {self.spec.load().name}: {n} processes share the {noun} (the others log to "
              f"{self.spec.out}/logs/worker-K.log)")

    def reaper(self) -> Callable[[], list[str]]:
        return self.watch

    def join(self, interrupted: bool) -> list[str]:
        return wait_workers(self.released, interrupted=interrupted)

    def cancel(self) -> None:
        if self.waiting:
            cancel_workers(self.waiting)
            self.waiting = []


def submission_argv(spec: BenchSpec, commands) -> dict[str, list[str]]:
    """Write the spec file of a SLURM submission (a ``bench --tune`` also its tuning's); returns the
    calibkit arguments of each kind of task (``commands``: of ``bench``, ``tune``, ``select``), each
    reading its spec file (the script adds ``--run-key``)."""
    tune = spec
    if spec.command == "bench":
        assert isinstance(spec.options, BenchOptions)
        tune = BenchSpec("tune", spec.preset, spec.out, spec.options.tune_options(), changes=spec.changes)
    argv = {}
    for command in commands:
        own = spec if command == spec.command else tune
        more = ("--select-only",) if command == "select" else ()
        argv[command] = own.argv(own.write(), *more)
    return argv


@dataclass(frozen=True)
class SlurmArrays:
    """Submit the spec's missing runs (a tuning's candidates and selection first with ``tune``)
    as SLURM job arrays with ``options``; ``dry_run`` writes the scripts and submits nothing."""

    options: SlurmOptions
    dry_run: bool = False

    def execute(self, spec: BenchSpec) -> Submission:
        """Raises UserError also for ``csm_build``: a task builds no CSM set (build it first)."""
        preset, opts = spec.load(), spec.options
        if opts.csm_build:
            raise UserError("--csm-build builds CSM's generated set in the process that runs the bench; with "
                            "--executor slurm build it first (a local run with --csm-build, or calibkit csm "
                            "generate) and pass --csm-store")
        preflight(preset, spec.out, opts)
        if spec.command == "tune":
            ids = submit_tune(spec.out, preset, opts, self.options, submission_argv(spec, ("tune", "select")),
                              dry_run=self.dry_run)
        else:
            assert isinstance(opts, BenchOptions)
            argv = submission_argv(spec, ("bench", "tune", "select") if opts.tune else ("bench",))
            ids = submit_bench(spec.out, preset, opts, self.options, argv, dry_run=self.dry_run)
        return Submission(preset, ids, self.dry_run)
