"""Pure tensor functions: calibration metrics, estimators, selective-prediction metrics, calibration
tests and losses. No state, no I/O."""

from calibkit.functional.calibration_tests import ks_calibration_test, spiegelhalter_z  # noqa: F401
from calibkit.functional.estimators import ece_sweep, ks_error, smooth_ece  # noqa: F401
from calibkit.functional.losses import *  # noqa: F401,F403
from calibkit.functional.losses import __all__ as _losses_all
from calibkit.functional.metrics import *  # noqa: F401,F403
from calibkit.functional.metrics import __all__ as _metrics_all
from calibkit.functional.selective import augrc, aurc, eaurc, risk_coverage_curve, selective_risk  # noqa: F401

__all__ = (list(_metrics_all) + ["smooth_ece", "ece_sweep", "ks_error"]
           + ["risk_coverage_curve", "aurc", "eaurc", "augrc", "selective_risk"]
           + ["spiegelhalter_z", "ks_calibration_test"] + list(_losses_all))
