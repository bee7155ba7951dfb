"""Per-class evidence of a validation split: which classes it holds too few rows of, and which
calibrators cannot be fitted for a class it does not hold.

A calibrator with parameters per class (vector, matrix and Dirichlet scaling, the one-vs-rest
binning and sigmoid maps, BBQ, the structured maps) learns nothing about a class without a
validation row, and its fit pushes that class's probability towards 0: the class becomes
unreachable (measured by ``benchmarks/missing_class.py``: fitted on validation without one class of
five, nine of these ten predict that class on under 5% of the test rows the uncalibrated model gives
it, the structured vector scaling on under a fifth, and all lose test accuracy). Cross-fitting
cannot see the loss, since no validation row is of that class.

calibkit's rule (``docs/calibrators.md``, "A class missing from validation"):

* a class with fewer than :data:`MIN_ROWS_PER_CLASS` validation rows is named in a warning
  (:func:`thin_warning`), wherever calibrators are fitted;
* a calibrator that needs every class (:func:`needs_every_class`) is left out of the choice when a
  class has no validation row at all, with the reason in the tables (:func:`unestimable`); with
  one row it is fitted, cross-fitted and guarded like any other;
* the class-free maps (:data:`CLASS_FREE`: one temperature, an ensemble of temperatures, the
  top-label spline and scaling-binning) keep every class reachable and stay candidates;
* fitting a calibrator that needs every class directly from Python on labels that miss a class
  warns (:func:`warn_absent`, category :class:`ClassEvidenceWarning`).
"""

from __future__ import annotations

import warnings

import torch

__all__ = ["MIN_ROWS_PER_CLASS", "CLASS_FREE", "CLASS_FREE_TYPES", "NOT_FITTED", "ClassEvidenceWarning",
           "class_counts", "thin_classes", "absent_classes", "name_classes", "thin_warning", "needs_every_class",
           "unestimable", "warn_absent"]

#: fewer validation rows of a class than this: the class is named in a warning.
MIN_ROWS_PER_CLASS = 2

#: registered calibrators without per-class parameters: they keep a class without validation rows reachable.
CLASS_FREE = frozenset({"temperature", "ets", "spline", "scaling_binning"})
#: The classes of :data:`CLASS_FREE`, by name (the registry imports every calibrator module, which
#: import this one: a name keeps the import one-way).
CLASS_FREE_TYPES = frozenset({"TemperatureScaling", "EnsembleTemperatureScaling", "SplineCalibration",
                              "ScalingBinning"})
NOT_FITTED = "not fitted: "  # the start of the error of a calibrator refused before any fit

_LISTED = 10  # classes named in a message before "and N more"


class ClassEvidenceWarning(UserWarning):
    """A calibrator is fitted on labels that miss a class or hold too few rows of it."""


def class_counts(labels, k: int) -> torch.Tensor:
    """Rows per class (classes 0 to k - 1) of integer ``labels``: int64, length ``k``."""
    y = torch.as_tensor(labels).long().reshape(-1).cpu()
    return torch.bincount(y.clamp(0, max(k - 1, 0)), minlength=k)[:k]


def thin_classes(labels, k: int, minimum: int = MIN_ROWS_PER_CLASS) -> list[int]:
    """The classes with fewer than ``minimum`` rows in ``labels``, in order."""
    return [int(c) for c in torch.nonzero(class_counts(labels, k) < minimum).flatten()]


def absent_classes(labels, k: int) -> list[int]:
    """The classes without a row in ``labels``, in order."""
    return thin_classes(labels, k, 1)


def name_classes(classes: list[int]) -> str:
    """The classes as words: class 4; classes 3, 7; or the first ten followed by and N more."""
    if len(classes) == 1:
        return f"class {classes[0]}"
    shown = ", ".join(map(str, classes[:_LISTED]))
    more = f" and {len(classes) - _LISTED} more" if len(classes) > _LISTED else ""
    return f"classes {shown}{more}"


def thin_warning(labels, k: int, source: str = "validation") -> str | None:
    """The warning text for ``labels`` of ``k`` classes (None when every class has enough rows)."""
    thin = thin_classes(labels, k)
    if not thin:
        return None
    absent = absent_classes(labels, k)
    what = f"{len(absent)} without any row" if absent else "none absent"
    verb = "have" if len(thin) > 1 else "has"
    return (f"{source}: {name_classes(thin)} of K = {k} {verb} fewer than {MIN_ROWS_PER_CLASS} validation rows "
            f"({what}): calibrators with per-class parameters cannot be estimated for "
            f"{'them' if len(thin) > 1 else 'it'}; those that need every class are left out when a class has "
            "no row; use a validation split with every class")


def needs_every_class(name_or_type) -> bool:
    """Whether a calibrator (registry name, class or instance) has per-class parameters, i.e. is not
    in :data:`CLASS_FREE`. A calibrator outside the registry counts as needing every class."""
    if isinstance(name_or_type, str):
        return name_or_type not in CLASS_FREE
    cls = name_or_type if isinstance(name_or_type, type) else type(name_or_type)
    return not (cls.__name__ in CLASS_FREE_TYPES and cls.__module__.startswith("calibkit.calibrators."))


def unestimable(name: str, labels, k: int) -> str | None:
    """Why calibrator ``name`` is left out of the choice on these validation ``labels`` (a text
    starting with :data:`NOT_FITTED`), or None: it needs every class and some class has no row."""
    if not needs_every_class(name):
        return None
    absent = absent_classes(labels, k)
    if not absent:
        return None
    return (f"{NOT_FITTED}{name_classes(absent)} of K = {k} {'have' if len(absent) > 1 else 'has'} no validation "
            f"row; its per-class parameters cannot be estimated and would make "
            f"{'them' if len(absent) > 1 else 'it'} unreachable")


def warn_absent(calibrator, labels, k: int) -> None:
    """Warn (:class:`ClassEvidenceWarning`) when ``calibrator`` needs every class and ``labels``
    miss one; the fit goes on (the caller asked for this calibrator)."""
    if not needs_every_class(calibrator):
        return
    absent = absent_classes(labels, k)
    if absent:
        warnings.warn(f"{type(calibrator).__name__} fitted without a row of {name_classes(absent)} of K = {k}: its "
                      f"per-class parameters for {'them' if len(absent) > 1 else 'it'} cannot be estimated and the "
                      "calibrated probabilities may never predict them; fit it on labels with every class, or use "
                      "TemperatureScaling", ClassEvidenceWarning, stacklevel=3)
