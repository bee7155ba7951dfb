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
object can be reused for several benches. A :class:`BenchSpec` is one bench or tuning as one value
(preset, directory, options), written to a JSON file in the output directory that the command
line's ``--workers N`` processes and SLURM tasks read (:func:`run_spec` runs one). Where a spec's
runs execute is an :class:`~calibkit.pipeline.executor.Executor`'s choice: this process
(:class:`~calibkit.pipeline.executor.Inline`), N processes on this machine sharing the runs through
the store's claims (:class:`~calibkit.pipeline.executor.LocalProcesses`) or SLURM job arrays
(:class:`~calibkit.pipeline.executor.SlurmArrays`); each runs the same checks first
(:func:`preflight`)::

    from calibkit.pipeline import BenchOptions, BenchSpec, LocalProcesses

    result = LocalProcesses(2).execute(BenchSpec("bench", "smoke", "runs/smoke", BenchOptions()))
"""

from __future__ import annotations

from calibkit.pipeline.executor import Executor, Inline, LocalProcesses, SlurmArrays, Submission
from calibkit.pipeline.options import BenchOptions, BenchResult, TuneOptions, TuneReport, TuneResult
from calibkit.pipeline.run import load, preflight, run_bench, run_spec, run_tune, tune_report, write_report
from calibkit.pipeline.spec import BenchSpec, read_spec

__all__ = ["BenchOptions", "BenchResult", "BenchSpec", "Executor", "Inline", "LocalProcesses", "SlurmArrays",
           "Submission", "TuneOptions", "TuneReport", "TuneResult", "load", "preflight", "read_spec", "run_bench",
           "run_spec", "run_tune", "tune_report", "write_report"]
