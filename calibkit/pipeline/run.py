"""The steps of :mod:`calibkit.pipeline`: :func:`run_bench` and :func:`run_tune`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from os import PathLike, fspath
from typing import Protocol

import calibkit.report
from calibkit.bench.csmbuild import ensure
from calibkit.bench.grid import PRESETS, REFERENCE, Preset, with_keep
from calibkit.bench.preflight import check_bench, check_tune
from calibkit.bench.presetcheck import warn_tune_seed
from calibkit.bench.presetfile import load_preset, read_preset_file, write_effective
from calibkit.bench.runner import Bench
from calibkit.bench.tune import Tuner
from calibkit.errors import UserError, UserRuntimeError
from calibkit.pipeline.options import (
    BenchOptions,
    BenchResult,
    TuneOptions,
    TuneReport,
    TuneResult,
    check_out,
    checked,
)
from calibkit.pipeline.spec import BenchSpec
from calibkit.report.tuning import tuning_text, write_tuning_figure, write_tuning_json
from calibkit.store import describe_store

__all__ = ["Alone", "Peers", "load", "preflight", "run_bench", "run_spec", "run_tune", "tune_report", "write_report"]

PresetLike = Preset | str | PathLike


class Peers(Protocol):
    """The other workers of a bench or tuning, as the process that started them sees them
    (:class:`calibkit.pipeline.executor.LocalProcesses`); a process running alone has none
    (:class:`Alone`). The pipeline calls them at two points of its own: :meth:`release` once the
    state every worker reads is in place (the checks passed, CSM's set built, the selection made,
    the preset recorded), just before the first run, and :meth:`join` after the last one."""

    def release(self) -> None:
        """Let the waiting workers run the spec."""

    def reaper(self) -> Callable[[], list[str]] | None:
        """What the bench calls while it waits for a run a worker holds: reaps the workers that
        have ended and returns one line per worker that ended badly (None: nothing to watch)."""

    def join(self, interrupted: bool) -> list[str]:
        """Wait for the workers (stopped first when ``interrupted``); one line per worker that failed."""


class Alone:
    """The :class:`Peers` of a process that runs a bench by itself, or as one of its workers."""

    def release(self) -> None:
        pass

    def reaper(self) -> None:
        return None

    def join(self, interrupted: bool) -> list[str]:
        return []


def preflight(preset: Preset, out, options: BenchOptions | TuneOptions) -> None:
    """Every precondition of a bench (``options`` a :class:`BenchOptions`) or a tuning (a
    :class:`TuneOptions`), checked before anything is written: a bench that cannot run leaves no
    trace, not even its output directory (:func:`calibkit.bench.preflight.check_bench`,
    :func:`~calibkit.bench.preflight.check_tune`). Every executor runs it, each worker of
    ``--workers N`` too (the directory is a bench's by then: the checks hold there as well).
    """
    if isinstance(options, TuneOptions):
        check_tune(preset, out, methods=_seq(options.methods), seed=options.seed, data_dir=options.data_dir,
                   csm_store=options.csm_store, store=options.store, csm_build=options.csm_build,
                   device=options.device)
        return
    check_bench(preset, out, seeds=_seq(options.seeds), methods=_seq(options.methods), data_dir=options.data_dir,
                csm_store=options.csm_store, store=options.store, csm_build=options.csm_build,
                device=options.device, seeds_flag="seeds")


def load(preset: PresetLike, keep: str | None = None) -> Preset:
    """``preset`` as a :class:`Preset` (a shipped name or a TOML file's path), with ``keep``."""
    if isinstance(preset, Preset):
        found = preset
    elif isinstance(preset, str):
        found = load_preset(preset)
    elif isinstance(preset, PathLike):
        found = read_preset_file(fspath(preset))
    else:
        raise UserError(f"preset: expected a Preset, a shipped preset's name ({', '.join(PRESETS)}) or a preset "
                        f"file's path, got {preset!r}")
    return with_keep(found, keep)


def _seq(values) -> list | None:
    return None if values is None else list(values)


def _built(preset: Preset, out, options, seeds):
    """``options`` with CSM's generated set built in ``out`` when ``csm_build`` asks for it."""
    if not options.csm_build:
        return options
    store = ensure(preset, out, seeds, _seq(options.methods), options.data_dir, options.device, options.csm_store,
                   log=options.log)
    return replace(options, csm_store=store)


def _tune(preset: Preset, out, options: TuneOptions, tuned: bool, peers: Peers) -> TuneResult:
    """Run the selection (checked already); with ``tuned``, also the preset at the selection
    (failed candidates are then an error: nothing would be selected for their method)."""
    tuner = Tuner(preset, out, methods=_seq(options.methods), seed=options.seed, data_dir=options.data_dir,
                  device=options.device, num_threads=options.num_threads, csm_store=options.csm_store,
                  log=options.log, max_extensions=options.max_extensions, store=options.store)
    where = describe_store(out, options.store)
    interrupted, problems = True, []
    try:
        if tuner.dd.is_main:
            write_effective(preset, out, overwrite=False)  # a bench's own record is kept
        _say_skipped(tuner, options)
        peers.release()
        counts = tuner.run()
        interrupted = False
        if tuned and counts.failed:
            first = f" (first: {tuner.failures[0]})" if tuner.failures else ""
            raise UserRuntimeError(f"{counts.failed} tuning candidate(s) failed{first}; see {where} (run the same "
                                   "command again to retry them)")
        chosen = tuner.tuned_preset() if tuned else None
        selection = tuner.selection() if tuner.dd.is_main else {}
    finally:
        tuner.close()
        problems = peers.join(interrupted)
    counts.failed += len(problems)
    return TuneResult(preset, counts, tuner.failures, selection, where, tuned=chosen, main=tuner.dd.is_main,
                      worker_failures=problems)


def _say_skipped(tuner: Tuner, options: TuneOptions) -> None:
    """The methods the tuner leaves out, and why (one progress line each)."""
    if tuner.unsupported:
        tuner.log(f"tune {', '.join(tuner.unsupported)}: skipped (they mix or generate images; preset "
                  f"{tuner.preset.name} trains on token ids)")
    if options.methods and REFERENCE in options.methods:
        tuner.log(f"tune {REFERENCE}: no search space (nothing to tune); it is trained on the selection seed "
                  "only as the reference (and the base of MaC-Cal and CSM)")
    for m in tuner.skipped:
        tuner.log(f"tune {m}: no search space (nothing to tune); it runs at the preset's values")


def tune_report(out, preset: str, store: str | None = None) -> TuneReport:
    """The selection recorded in ``out`` for the preset named ``preset``: its terminal table,
    and the validation-curve figure and every candidate as JSON under ``OUT/report/``."""
    text = tuning_text(out, preset, store)
    figure = write_tuning_figure(out, preset, store=store)
    doc = write_tuning_json(out, preset, store=store)
    return TuneReport(text, figure, doc)


def run_tune(preset: PresetLike, out, options: TuneOptions | None = None, *, peers: Peers | None = None
             ) -> TuneResult:
    """Select each method's hyperparameters on the validation split (``calibkit tune``).

    Every candidate of each method's search space is trained on the selection seed and scored on
    the validation split; a selection on a grid's edge extends that axis (at most
    ``options.max_extensions`` times). Everything is checked before anything is written; a second
    call never retrains a finished candidate.

    Args:
        preset: a :class:`Preset`, a shipped preset's name or a preset TOML file's path.
        out: the output directory (``runs.db``, ``tune/``, ``runs/``, ``report/``).
        options: see :class:`TuneOptions` (None: the defaults).
        peers: the other workers of :class:`calibkit.pipeline.executor.LocalProcesses`; leave it out.

    Raises:
        UserError: a bad preset, option, data set or output directory (nothing written).
    """
    options = checked(options, TuneOptions)
    check_out(out)
    base = load(preset, options.keep)
    preflight(base, out, options)  # before anything is created: a tuning that cannot run leaves no trace
    seeds = None if options.seed is None else sorted({*base.seeds, options.seed})  # the bench's, the selection's
    options = _built(base, out, options, seeds)
    result = _tune(base, out, options, tuned=False, peers=peers or Alone())
    if options.report and result.main:
        result.report = tune_report(out, base.name, options.store)
    return result


def run_bench(preset: PresetLike, out, options: BenchOptions | None = None, *, peers: Peers | None = None
              ) -> BenchResult:
    """Check, (build CSM's set,) (tune,) run, record and report a bench (``calibkit bench``).

    Args:
        preset: a :class:`Preset`, a shipped preset's name or a preset TOML file's path.
        out: the output directory (``runs.db``, ``runs/``, ``presets/``, ``report/``).
        options: see :class:`BenchOptions` (None: the defaults).
        peers: the other workers of :class:`calibkit.pipeline.executor.LocalProcesses`; leave it out.

    Returns:
        a :class:`BenchResult`; ``counts.failed`` runs failed (each recorded with its reason,
        the others ran on).

    Raises:
        UserError: a bad preset, option, data set or output directory (then nothing was written,
            ``out`` included), or, with ``tune``, candidates that failed.
    """
    options = checked(options, BenchOptions)
    check_out(out)
    base = load(preset, options.keep)
    preflight(base, out, options)  # every precondition before anything is created
    options = _built(base, out, options, _seq(options.seeds))  # before the workers start: they find it
    tuning, ran = None, base
    if options.tune:
        warn_tune_seed(base, base.tune_seed, options.seeds if options.seeds is not None else base.seeds)
        # in this process alone: the workers are released at the grid, and find the selection made
        tuning = _tune(base, out, options.tune_options(), tuned=True, peers=Alone())
        ran = tuning.tuned or base  # tuned=True: always a preset (or an error)
    result = _grid(ran, out, options, peers or Alone())
    result.tuning = tuning
    if options.report and result.main:
        result.report = write_report(out, ran.name, options)
    return result


def run_spec(spec: BenchSpec, *, peers: Peers | None = None) -> BenchResult | TuneResult:
    """What ``spec`` says: :func:`run_bench` or :func:`run_tune` of its preset, directory and options
    (what :class:`calibkit.pipeline.executor.Inline` runs, and each process of
    :class:`~calibkit.pipeline.executor.LocalProcesses`)."""
    if not isinstance(spec, BenchSpec):
        raise UserError(f"spec: expected a calibkit.pipeline.BenchSpec, got a {type(spec).__name__}")
    if spec.command == "tune":
        assert isinstance(spec.options, TuneOptions)  # checked when the spec was made
        return run_tune(spec.load(), spec.out, spec.options, peers=peers)
    assert isinstance(spec.options, BenchOptions)
    return run_bench(spec.load(), spec.out, spec.options, peers=peers)


def _grid(preset: Preset, out, options: BenchOptions, peers: Peers) -> BenchResult:
    """Run the grid's runs (checked already) and record the effective preset."""
    bench = Bench(preset, out, seeds=_seq(options.seeds), methods=_seq(options.methods), data_dir=options.data_dir,
                  device=options.device, num_threads=options.num_threads, csm_store=options.csm_store,
                  log=options.log, store=options.store)
    interrupted, problems = True, []
    try:
        if bench.dd.is_main:
            bench.check_consistent()  # a refused bench leaves the directory's recorded preset as it was
            write_effective(preset, out)  # every worker writes the same text
        peers.release()
        counts = bench.run(reap=peers.reaper())
        interrupted = False
    finally:
        try:
            problems = peers.join(interrupted)
            if problems and not interrupted and bench.dd.is_main:
                # counted by their final state: a dead worker's runs were taken over and may be done
                counts.failed = len(bench.unfinished())
        finally:
            bench.close()
    return BenchResult(preset, counts, bench.failures, describe_store(out, options.store), main=bench.dd.is_main,
                       worker_failures=problems)


def write_report(out, preset: str, options: BenchOptions | None = None, progress=None) -> dict:
    """Write ``OUT/report/`` for the preset named ``preset`` (:func:`calibkit.report.build_report`
    with the options' store, figures, all_figures and alpha, and ``progress``, a
    :class:`calibkit.bench.progress.Phases` or None); returns its dict."""
    options = options or BenchOptions()
    # looked up at the call: a caller (or a test) that replaces calibkit.report.build_report gets its own
    extra = {} if progress is None else {"progress": progress}
    return calibkit.report.build_report(out, preset=preset, store=options.store, figures=options.figures,
                                        all_figures=options.all_figures, alpha=options.alpha, **extra)
