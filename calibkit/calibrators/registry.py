"""The registry of calibrators by name (its own module, so that :mod:`calibkit.calibrators.io` can
read it without importing the package that imports ``io``)."""

from __future__ import annotations

from calibkit.calibrators._base import Calibrator
from calibkit.calibrators.bbq import BBQ
from calibkit.calibrators.binning import HistogramBinning, IsotonicCalibration, ScalingBinning, UniformHistogramBinning
from calibkit.calibrators.boost import OPT_IN, LightGBMCalibration
from calibkit.calibrators.cir import CenteredIsotonicCalibration
from calibkit.calibrators.ets import EnsembleTemperatureScaling
from calibkit.calibrators.scaling import DirichletCalibration, MatrixScaling, VectorScaling
from calibkit.calibrators.sigmoid import BetaCalibration, PlattScaling
from calibkit.calibrators.spline import SplineCalibration
from calibkit.calibrators.spline_ovr import OneVsRestSplineCalibration
from calibkit.calibrators.structured import StructuredMatrixScaling, StructuredVectorScaling
from calibkit.calibrators.temperature import TemperatureScaling
from calibkit.calibrators.venn_abers import VennAbersCalibration

__all__ = ["CALIBRATORS", "default_names"]

#: Registry of calibrators by name, in the order of the tables (tests loop over it).
#: TemperatureScaling stands apart from the Calibrator base (it also takes dense logits).
CALIBRATORS: dict[str, type[Calibrator | TemperatureScaling]] = {
    "temperature": TemperatureScaling,
    "vector": VectorScaling,
    "matrix": MatrixScaling,
    "dirichlet": DirichletCalibration,
    "ets": EnsembleTemperatureScaling,
    "histogram": HistogramBinning,
    "isotonic": IsotonicCalibration,
    "spline": SplineCalibration,
    "scaling_binning": ScalingBinning,
    "platt": PlattScaling,
    "beta": BetaCalibration,
    "bbq": BBQ,
    "svs": StructuredVectorScaling,
    "sms": StructuredMatrixScaling,
    "histogram_uniform": UniformHistogramBinning,
    "cir": CenteredIsotonicCalibration,
    "venn_abers": VennAbersCalibration,
    "spline_ovr": OneVsRestSplineCalibration,
    "lightgbm": LightGBMCalibration,
}


def default_names() -> list[str]:
    """The calibrators that run when none are named: the registry, in order, less the opt-in ones
    (:data:`calibkit.calibrators.boost.OPT_IN`, which run only when named)."""
    return [n for n in CALIBRATORS if n not in OPT_IN]
