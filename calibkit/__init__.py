"""calibkit: make neural-network classifiers calibrated.

Subpackages follow one-way data flow:
``functional`` -> ``losses`` / ``metrics`` / ``calibrators`` -> ``train`` / ``methods`` -> ``bench`` -> ``cli``.

The names used most are also reachable from the top (``calibkit.TemperatureScaling``,
``calibkit.ece``, ``calibkit.CalibratedModel``, ...; the list is :data:`__all__`). They are
imported on first access (module ``__getattr__``), so ``import calibkit`` stays as light as the
command line needs: it imports neither torch nor numpy.

Example:
    >>> import numpy as np, calibkit
    >>> z = np.array([[4.0, 0.0], [0.0, 4.0], [3.0, 0.0], [0.0, 3.0]])
    >>> ts = calibkit.TemperatureScaling().fit(z, np.array([0, 1, 1, 1]))
    >>> type(ts.predict_proba(z)).__name__, type(calibkit.ece(ts.predict_proba(z), [0, 1, 1, 1])).__name__
    ('ndarray', 'float')
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> the module that defines it (imported on first access)
_LAZY = {
    # post-hoc calibrators and their files
    **dict.fromkeys(
        ["TemperatureScaling", "VectorScaling", "MatrixScaling", "DirichletCalibration", "EnsembleTemperatureScaling",
         "HistogramBinning", "IsotonicCalibration", "SplineCalibration", "ScalingBinning", "PlattScaling",
         "BetaCalibration", "BBQ", "StructuredVectorScaling", "StructuredMatrixScaling", "UniformHistogramBinning",
         "CenteredIsotonicCalibration", "VennAbersCalibration", "OneVsRestSplineCalibration", "LightGBMCalibration",
         "StackedCalibration", "CALIBRATORS",
         "NotFittedError", "ProbabilitiesAsLogitsWarning", "save", "load"],
        "calibkit.calibrators"),
    # metrics: the panel, streaming, intervals
    **dict.fromkeys(["evaluate", "CalibrationAccumulator", "PANEL", "bootstrap_ci", "paired_bootstrap_diff"],
                    "calibkit.metrics"),
    **dict.fromkeys(
        ["ece", "adaptive_ece", "classwise_ece", "mce", "rmsce", "over_under_ece", "nll", "brier", "accuracy",
         "smooth_ece", "ece_sweep", "ks_error", "risk_coverage_curve", "aurc", "eaurc", "augrc",
         "selective_risk", "spiegelhalter_z", "ks_calibration_test"],
        "calibkit.functional"),
    # training losses
    **dict.fromkeys(["CrossEntropy", "LabelSmoothing", "Focal", "FLSD", "ECP", "MbLS", "ACLS", "DualFocal",
                     "AdaFocal", "FeDLaS", "LOSSES"], "calibkit.losses"),
    "SplitConformal": "calibkit.conformal",
    "CalibratedModel": "calibkit.integrations.model",
    "UserError": "calibkit.errors",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'calibkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
