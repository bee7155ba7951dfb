"""The bench from Python: check, build CSM's set, tune, bench and report in one call.

:func:`run_bench` is what ``calibkit bench`` does in one process, and :func:`run_tune` what
``calibkit tune`` does; the two commands parse their arguments into a :class:`BenchOptions` or a
:class:`TuneOptions`, call these functions and print what they return::

    from calibkit.pipeline import BenchOptions, run_bench

    result = run_bench("smoke", "runs/smoke", BenchOptions(methods=("ls",), seeds=(0,)))
    print(result.counts, result.report["text"])

The steps, in order: every precondition is checked before anything is written
(:func:`calibkit.bench.preflight.check_bench`: a bench that cannot run leaves no trace, not even
its output directory); with ``csm_build``, CSM's generated set is built in ``out``; with ``tune``,
every method's hyperparameters are selected on the validation split (the same tuning as
:func:`run_tune`, into the same directory) and the grid runs at the selection; the grid's runs
are trained, evaluated and recorded (:class:`calibkit.bench.runner.Bench`); the effective preset
is written to ``OUT/presets/<name>.toml``; the report is written to ``OUT/report/``. A second
call with the same arguments skips the finished runs and resumes interrupted ones.

Decisions: ``preset`` is a :class:`~calibkit.bench.grid.Preset`, a shipped preset's name or the
path of a preset TOML file (a ``str`` that names a shipped preset is that preset; a
``pathlib.Path`` is always a file). The options are frozen dataclasses checked when they are
made (a bad value is a :class:`~calibkit.errors.UserError` naming the field), so one options
object can be reused for several benches. The local ``--workers N`` processes of the command line
and its SLURM executor stay with the command line; they reach these functions through
:class:`Sharing`, which a Python caller leaves out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from os import PathLike, fspath
from pathlib import Path

from calibkit.bench.csmbuild import ensure
from calibkit.bench.grid import KEEP_POLICIES, PRESETS, REFERENCE, Preset, with_keep
from calibkit.bench.preflight import check_bench, check_tune
from calibkit.bench.presetcheck import check_seeds, warn_tune_seed
from calibkit.bench.presetfile import load_preset, read_preset_file, write_effective
from calibkit.bench.runner import Bench
from calibkit.bench.tune import Tuner
from calibkit.errors import UserError, UserRuntimeError
from calibkit.report import build_report
from calibkit.report.tuning import tuning_text, write_tuning_figure, write_tuning_json
from calibkit.store import describe_store

__all__ = ["BenchOptions", "BenchResult", "Sharing", "TuneOptions", "TuneReport", "TuneResult", "load",
           "run_bench", "run_tune", "tune_report", "write_report"]

PresetLike = Preset | str | PathLike


def _seeds(values) -> tuple[int, ...] | None:
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise UserError(f"seeds: expected a sequence of integers, got {values!r}")
    check_seeds(values, "seeds")  # at least one; integers >= 0; none twice
    return tuple(values)


def _names(name: str, values) -> tuple[str, ...] | None:
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not all(isinstance(v, str) for v in values):
        raise UserError(f"{name}: expected a sequence of method names, got {values!r}")
    return tuple(values)


def _check_common(opts) -> None:
    """The checks :class:`TuneOptions` and :class:`BenchOptions` share (``opts`` is either)."""
    object.__setattr__(opts, "methods", _names("methods", opts.methods))
    if opts.num_threads is not None and (isinstance(opts.num_threads, bool) or not isinstance(opts.num_threads, int)
                                         or opts.num_threads < 1):
        raise UserError(f"num_threads must be an integer >= 1 (or None: torch's default), got {opts.num_threads!r}")
    if isinstance(opts.max_extensions, bool) or not isinstance(opts.max_extensions, int) or opts.max_extensions < 0:
        raise UserError(f"max_extensions must be an integer >= 0 (0: never extend a grid), got {opts.max_extensions!r}")
    if opts.keep is not None and opts.keep not in KEEP_POLICIES:
        raise UserError(f"keep: unknown checkpoint policy {opts.keep!r}; choose one of {', '.join(KEEP_POLICIES)}")
    if not isinstance(opts.device, str):
        raise UserError(f"device: expected a string (auto, cpu, cuda or cuda:N), got {opts.device!r}")


@dataclass(frozen=True)
class TuneOptions:
    """What :func:`run_tune` selects, and where; the options of ``calibkit tune``.

    Attributes:
        methods: methods to tune (None: every method of the preset with a search space).
        seed: the selection seed (None: the preset's ``tune_seed``).
        data_dir: the data set's folder (None: the preset's ``data_dir``, else the standard place).
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        num_threads: torch CPU threads (None: the preset's, else torch's default).
        csm_store: CSM's generated set (None: the preset's, else the one shipped).
        csm_build: build CSM's generated set in ``out`` when there is none.
        store: the results database: None for ``OUT/runs.db``, a ``postgresql://`` URL or ``env:NAME``.
        keep: the checkpoint policy of every run (None: the preset's).
        max_extensions: times each grid axis may be extended past a selection on its edge.
        log: where progress lines go (``lambda *a, **k: None`` for none).
        report: write the tuning table, figure and JSON (:func:`tune_report`).
    """

    methods: tuple[str, ...] | None = None
    seed: int | None = None
    data_dir: str | None = None
    device: str = "auto"
    num_threads: int | None = None
    csm_store: str | None = None
    csm_build: bool = False
    store: str | None = None
    keep: str | None = None
    max_extensions: int = 2
    log: Callable[..., None] = print
    report: bool = True

    def __post_init__(self) -> None:
        _check_common(self)
        if self.seed is not None:
            check_seeds([self.seed], "seed")  # an integer >= 0


@dataclass(frozen=True)
class BenchOptions:
    """What :func:`run_bench` runs, and where; the options of ``calibkit bench``.

    Attributes:
        seeds: seeds to run (None: the preset's); no seed twice.
        methods: grid methods (None: the preset's list, else all; CE and the runs the others
            build on are always added).
        tune: select every method's hyperparameters on validation first (:func:`run_tune`, on
            the preset's ``tune_seed``), then run the grid at the selection.
        max_extensions: as for :class:`TuneOptions` (with ``tune``).
        report: write ``OUT/report/`` and return it in :attr:`BenchResult.report`.
        figures: draw the report's figures.
        alpha: miscoverage of the report's conformal sets, in (0, 1).
        data_dir, device, num_threads, csm_store, csm_build, store, keep, log: as for
            :class:`TuneOptions`.
    """

    seeds: tuple[int, ...] | None = None
    methods: tuple[str, ...] | None = None
    data_dir: str | None = None
    device: str = "auto"
    num_threads: int | None = None
    csm_store: str | None = None
    csm_build: bool = False
    store: str | None = None
    keep: str | None = None
    tune: bool = False
    max_extensions: int = 2
    log: Callable[..., None] = print
    report: bool = True
    figures: bool = True
    alpha: float = 0.1

    def __post_init__(self) -> None:
        _check_common(self)
        object.__setattr__(self, "seeds", _seeds(self.seeds))
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not 0 < self.alpha < 1:
            raise UserError(f"alpha must be a number in (0, 1) (the miscoverage of the conformal sets), "
                            f"got {self.alpha!r}")

    def tune_options(self) -> TuneOptions:
        """The options of the tuning step of ``tune=True`` (CSM's set is built by then)."""
        return TuneOptions(methods=self.methods, data_dir=self.data_dir, device=self.device,
                           num_threads=self.num_threads, csm_store=self.csm_store, store=self.store, keep=self.keep,
                           max_extensions=self.max_extensions, log=self.log, report=False)


@dataclass(frozen=True)
class Sharing:
    """How the command line's ``--workers N`` shares a bench or tuning with the processes it
    started (:mod:`calibkit.bench.workers`); a Python caller leaves it out.

    Attributes:
        released: this process is an extra worker its caller released: the caller has checked
            everything and records the preset, so neither is done again here.
        start: called once every check has passed, CSM's set is built, the selection made and the
            preset recorded, just before the first run (the caller releases its workers).
        finish: called after the runs, with whether they were interrupted; returns one line per
            worker that failed (counted as failures).
    """

    released: bool = False
    start: Callable[[], None] | None = None
    finish: Callable[[bool], list[str]] | None = None


@dataclass(frozen=True)
class TuneReport:
    """The selection as a terminal table, and the files :func:`tune_report` wrote."""

    text: str
    figure: Path | None
    json: Path | None


@dataclass
class TuneResult:
    """What :func:`run_tune` did.

    Attributes:
        preset: the preset tuned.
        counts: candidates ``done`` here, ``skipped`` (finished earlier or by another process)
            and ``failed`` (with the workers that failed).
        failures: one line per candidate that failed in this process, with its reason.
        worker_failures: one line per ``--workers`` process that failed.
        selection: ``{method: {address: value}}`` selected (empty off rank 0).
        tuned: the preset at the selected values (None unless asked for, or off rank 0).
        store: how messages name the results database.
        report: the tuning table and files (None when not asked for, or off rank 0).
        main: this process is rank 0 (the one that records and reports).
    """

    preset: Preset
    counts: dict[str, int]
    failures: list[str]
    selection: dict[str, dict]
    store: str
    tuned: Preset | None = None
    report: TuneReport | None = None
    main: bool = True
    worker_failures: list[str] = field(default_factory=list)


@dataclass
class BenchResult:
    """What :func:`run_bench` did.

    Attributes:
        preset: the preset the runs used (at the selected values with ``tune``).
        counts: runs ``done`` here, ``skipped`` (finished earlier) and ``failed`` (with the
            workers that failed).
        failures: one line per run that failed in this process, with its reason.
        worker_failures: one line per ``--workers`` process that failed.
        store: how messages name the results database.
        tuning: the tuning step's result (None without ``tune``).
        report: :func:`calibkit.report.build_report`'s dict (``text``, ``paths``, ...); None when
            not asked for, or off rank 0.
        main: this process is rank 0 (the one that records and reports).
    """

    preset: Preset
    counts: dict[str, int]
    failures: list[str]
    store: str
    tuning: TuneResult | None = None
    report: dict | None = None
    main: bool = True
    worker_failures: list[str] = field(default_factory=list)


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


def _tune(preset: Preset, out, options: TuneOptions, tuned: bool, sharing: Sharing) -> TuneResult:
    """Run the selection (checked already); with ``tuned``, also the preset at the selection
    (failed candidates are then an error: nothing would be selected for their method)."""
    tuner = Tuner(preset, out, methods=_seq(options.methods), seed=options.seed, data_dir=options.data_dir,
                  device=options.device, num_threads=options.num_threads, csm_store=options.csm_store,
                  log=options.log, max_extensions=options.max_extensions, store=options.store)
    where = describe_store(out, options.store)
    interrupted, problems = True, []
    try:
        if tuner.dd.is_main and not sharing.released:
            write_effective(preset, out, overwrite=False)  # a bench's own record is kept
        _say_skipped(tuner, options)
        if sharing.start is not None:
            sharing.start()
        counts = tuner.run()
        interrupted = False
        if tuned and counts["failed"]:
            first = f" (first: {tuner.failures[0]})" if tuner.failures else ""
            raise UserRuntimeError(f"{counts['failed']} tuning candidate(s) failed{first}; see {where} (run the same "
                                   "command again to retry them)")
        chosen = tuner.tuned_preset() if tuned else None
        selection = tuner.selection() if tuner.dd.is_main else {}
    finally:
        tuner.close()
        if sharing.finish is not None:
            problems = sharing.finish(interrupted)
    counts["failed"] += len(problems)
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


def run_tune(preset: PresetLike, out, options: TuneOptions = TuneOptions(), *, sharing: Sharing = Sharing()
             ) -> TuneResult:
    """Select each method's hyperparameters on the validation split (``calibkit tune``).

    Every candidate of each method's search space is trained on the selection seed and scored on
    the validation split; a selection on a grid's edge extends that axis (at most
    ``options.max_extensions`` times). Everything is checked before anything is written; a second
    call never retrains a finished candidate.

    Args:
        preset: a :class:`Preset`, a shipped preset's name or a preset TOML file's path.
        out: the output directory (``runs.db``, ``tune/``, ``runs/``, ``report/``).
        options: see :class:`TuneOptions`.
        sharing: the command line's ``--workers`` (:class:`Sharing`); leave it out.

    Raises:
        UserError: a bad preset, option, data set or output directory (nothing written).
    """
    base = load(preset, options.keep)
    if not sharing.released:  # before anything is created: a tuning that cannot run leaves no trace
        check_tune(base, out, methods=_seq(options.methods), seed=options.seed, data_dir=options.data_dir,
                   csm_store=options.csm_store, store=options.store, csm_build=options.csm_build,
                   device=options.device)
    seeds = None if options.seed is None else sorted({*base.seeds, options.seed})  # the bench's, the selection's
    options = _built(base, out, options, seeds)
    result = _tune(base, out, options, tuned=False, sharing=sharing)
    if options.report and result.main:
        result.report = tune_report(out, base.name, options.store)
    return result


def run_bench(preset: PresetLike, out, options: BenchOptions = BenchOptions(), *, sharing: Sharing = Sharing()
              ) -> BenchResult:
    """Check, (build CSM's set,) (tune,) run, record and report a bench (``calibkit bench``).

    Args:
        preset: a :class:`Preset`, a shipped preset's name or a preset TOML file's path.
        out: the output directory (``runs.db``, ``runs/``, ``presets/``, ``report/``).
        options: see :class:`BenchOptions`.
        sharing: the command line's ``--workers`` (:class:`Sharing`); leave it out.

    Returns:
        a :class:`BenchResult`; ``counts["failed"]`` runs failed (each recorded with its reason,
        the others ran on).

    Raises:
        UserError: a bad preset, option, data set or output directory (then nothing was written,
            ``out`` included), or, with ``tune``, candidates that failed.
    """
    base = load(preset, options.keep)
    if not sharing.released:  # every precondition before anything is created
        check_bench(base, out, seeds=_seq(options.seeds), methods=_seq(options.methods), data_dir=options.data_dir,
                    csm_store=options.csm_store, store=options.store, csm_build=options.csm_build,
                    device=options.device, seeds_flag="seeds")
    options = _built(base, out, options, _seq(options.seeds))  # before the workers start: they find it
    tuning, ran = None, base
    if options.tune:
        warn_tune_seed(base, base.tune_seed, options.seeds if options.seeds is not None else base.seeds)
        tuning = _tune(base, out, options.tune_options(), tuned=True, sharing=Sharing(released=sharing.released))
        ran = tuning.tuned or base  # tuned=True: always a preset (or an error)
    result = _grid(ran, out, options, sharing)
    result.tuning = tuning
    if options.report and result.main:
        result.report = write_report(out, ran.name, options)
    return result


def _grid(preset: Preset, out, options: BenchOptions, sharing: Sharing) -> BenchResult:
    """Run the grid's runs (checked already) and record the effective preset."""
    bench = Bench(preset, out, seeds=_seq(options.seeds), methods=_seq(options.methods), data_dir=options.data_dir,
                  device=options.device, num_threads=options.num_threads, csm_store=options.csm_store,
                  log=options.log, store=options.store)
    interrupted, problems = True, []
    try:
        if bench.dd.is_main and not sharing.released:
            bench.check_consistent()  # a refused bench leaves the directory's recorded preset as it was
            write_effective(preset, out)
        if sharing.start is not None:
            sharing.start()
        counts = bench.run()
        interrupted = False
    finally:
        bench.close()
        if sharing.finish is not None:
            problems = sharing.finish(interrupted)
    counts["failed"] += len(problems)
    return BenchResult(preset, counts, bench.failures, describe_store(out, options.store), main=bench.dd.is_main,
                       worker_failures=problems)


def write_report(out, preset: str, options: BenchOptions = BenchOptions()) -> dict:
    """Write ``OUT/report/`` for the preset named ``preset`` (:func:`calibkit.report.build_report`
    with the options' store, figures and alpha); returns its dict."""
    return build_report(out, preset=preset, store=options.store, figures=options.figures, alpha=options.alpha)
