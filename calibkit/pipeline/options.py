"""The options and results of :mod:`calibkit.pipeline`: frozen, checked when made."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from calibkit.bench.attempts import Counts
from calibkit.bench.grid import KEEP_POLICIES, Preset
from calibkit.bench.presetcheck import check_seeds
from calibkit.errors import UserError
from calibkit.store import is_url, redact

__all__ = ["BenchOptions", "BenchResult", "TuneOptions", "TuneReport", "TuneResult", "checked", "check_out"]


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


DEVICE = re.compile(r"auto|cpu|mps|cuda(:[0-9]+)?")


def _flag(name: str, value) -> None:
    if not isinstance(value, bool):  # "no" or 0 would otherwise count as their truth value
        raise UserError(f"{name} must be True or False, got {value!r}")


def _path_or_none(name: str, value) -> None:
    if value is not None and not isinstance(value, (str, os.PathLike)):
        raise UserError(f"{name}: expected a path (a str or os.PathLike) or None, got {value!r}")


def _store(value) -> None:
    """The store's scheme, as ``--store`` takes it (the server itself is checked before the first write)."""
    if value is None:
        return
    if not isinstance(value, str) or not (value.startswith("env:") or is_url(value)):
        shown = redact(value) if isinstance(value, str) else repr(value)
        raise UserError(f"store: expected None (OUT/runs.db), a postgresql:// URL or env:NAME, got {shown!r}")


def _check_common(opts) -> None:
    """The checks :class:`TuneOptions` and :class:`BenchOptions` share (``opts`` is either): every
    field's type, range and name, the store's scheme and the device's spelling, so that a bad
    option is refused when the options are made, before anything is written."""
    object.__setattr__(opts, "methods", _names("methods", opts.methods))
    for name in ("csm_build", "report"):
        _flag(name, getattr(opts, name))
    for name in ("data_dir", "csm_store"):
        _path_or_none(name, getattr(opts, name))
    _store(opts.store)
    if not callable(opts.log):
        raise UserError(f"log must be a callable taking print's arguments (lambda *a, **k: None for none), "
                        f"got {opts.log!r}")
    if opts.num_threads is not None and (isinstance(opts.num_threads, bool) or not isinstance(opts.num_threads, int)
                                         or opts.num_threads < 1):
        raise UserError(f"num_threads must be an integer >= 1 (or None: the preset's), got {opts.num_threads!r}")
    if isinstance(opts.max_extensions, bool) or not isinstance(opts.max_extensions, int) or opts.max_extensions < 0:
        raise UserError(f"max_extensions must be an integer >= 0 (0: never extend a grid), got {opts.max_extensions!r}")
    if opts.keep is not None and opts.keep not in KEEP_POLICIES:
        raise UserError(f"keep: unknown checkpoint policy {opts.keep!r}; choose one of {', '.join(KEEP_POLICIES)}")
    if not isinstance(opts.device, str) or not DEVICE.fullmatch(opts.device):
        raise UserError(f"device: unknown device {opts.device!r} (use auto, cpu, cuda or cuda:N)")


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
        all_figures: draw every method's reliability figure, whatever the preset's ``report_figures``.
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
    all_figures: bool = False
    alpha: float = 0.1

    def __post_init__(self) -> None:
        _check_common(self)
        object.__setattr__(self, "seeds", _seeds(self.seeds))
        for name in ("tune", "figures", "all_figures"):
            _flag(name, getattr(self, name))
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not 0 < self.alpha < 1:
            raise UserError(f"alpha must be a number in (0, 1) (the miscoverage of the conformal sets), "
                            f"got {self.alpha!r}")

    def tune_options(self) -> TuneOptions:
        """The options of the tuning step of ``tune=True`` (CSM's set is built by then)."""
        return TuneOptions(methods=self.methods, data_dir=self.data_dir, device=self.device,
                           num_threads=self.num_threads, csm_store=self.csm_store, store=self.store, keep=self.keep,
                           max_extensions=self.max_extensions, log=self.log, report=False)


def checked(options, cls):
    """``options`` (None: ``cls()``), refused unless it is a ``cls`` (a dict or another options object)."""
    if options is None:
        return cls()
    if not isinstance(options, cls):
        raise UserError(f"options: expected a calibkit.pipeline.{cls.__name__} (or None), got a "
                        f"{type(options).__name__}; build one with {cls.__name__}(**your_dict)")
    return options


def check_out(out) -> None:
    """The output directory's type (its place on disk is checked with the preset)."""
    if isinstance(out, bytes) or not isinstance(out, (str, os.PathLike)) or not os.fspath(out):
        raise UserError(f"out: expected the output directory's path (a non-empty str or os.PathLike), got {out!r}")


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
    counts: Counts
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
        counts: runs ``done`` here, ``skipped`` (finished earlier) and ``failed``; when a
            ``--workers`` process failed, ``failed`` counts the bench's runs by their final state
            (those not done once every worker has ended: a dead worker's taken-over runs are done).
        failures: one line per run that failed in this process, with its reason.
        worker_failures: one line per ``--workers`` process that failed.
        store: how messages name the results database.
        tuning: the tuning step's result (None without ``tune``).
        report: :func:`calibkit.report.build_report`'s dict (``text``, ``paths``, ...); None when
            not asked for, or off rank 0.
        main: this process is rank 0 (the one that records and reports).
    """

    preset: Preset
    counts: Counts
    failures: list[str]
    store: str
    tuning: TuneResult | None = None
    report: dict | None = None
    main: bool = True
    worker_failures: list[str] = field(default_factory=list)
