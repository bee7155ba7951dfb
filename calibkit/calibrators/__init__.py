"""Post-hoc calibrators, scikit-learn style, fitted on validation logits, never on the test split.

Every calibrator follows one protocol: ``__init__`` stores hyperparameters only (each has a
default, so ``CALIBRATORS[name]()`` works), ``fit(val_logits, val_labels)`` returns ``self``
with the learned state in ``_``-suffixed attributes, ``predict_proba(logits)`` returns ``(N, K)``
probabilities (binary ``(N,)`` positive-class logits give ``(N,)`` probabilities),
``to_dict()`` / ``from_dict()`` hold hyperparameters and state, :func:`save` / :func:`load`
write and read them (safetensors + a JSON sidecar). Definitions, defaults and pitfalls:
``docs/calibrators.md``.

One module per family: :mod:`.temperature`, :mod:`.scaling` (vector, matrix, Dirichlet),
:mod:`.ets`, :mod:`.binning` (histogram, isotonic, scaling-binning), :mod:`.spline`, :mod:`.sigmoid`
(Platt, beta), :mod:`.bbq`, :mod:`.structured` (SVS, SMS), :mod:`.cir`, :mod:`.venn_abers`,
:mod:`.spline_ovr`, :mod:`.boost` (LightGBM), :mod:`.io`;
the registry :data:`CALIBRATORS` lives in :mod:`.registry`. :mod:`.stack` mixes several of them
(:class:`StackedCalibration`, not in the registry: its components are registry entries).

Example:
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> z = torch.randn(2000, 10, generator=g) * 2
    >>> y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    >>> ts = TemperatureScaling().fit(3 * z, y)   # logits 3x too sharp
    >>> round(ts.temperature_, 1)
    3.0
"""

from __future__ import annotations

from calibkit.calibrators._base import NotFittedError, ProbabilitiesAsLogitsWarning
from calibkit.calibrators.bbq import BBQ
from calibkit.calibrators.binning import HistogramBinning, IsotonicCalibration, ScalingBinning, UniformHistogramBinning
from calibkit.calibrators.boost import LightGBMCalibration
from calibkit.calibrators.cir import CenteredIsotonicCalibration
from calibkit.calibrators.ets import EnsembleTemperatureScaling
from calibkit.calibrators.io import load, save
from calibkit.calibrators.registry import CALIBRATORS
from calibkit.calibrators.scaling import DirichletCalibration, MatrixScaling, VectorScaling
from calibkit.calibrators.sigmoid import BetaCalibration, PlattScaling
from calibkit.calibrators.spline import SplineCalibration
from calibkit.calibrators.spline_ovr import OneVsRestSplineCalibration
from calibkit.calibrators.stack import StackedCalibration
from calibkit.calibrators.structured import StructuredMatrixScaling, StructuredVectorScaling
from calibkit.calibrators.temperature import TemperatureScaling, evaluate_before_after_ts
from calibkit.calibrators.venn_abers import VennAbersCalibration

__all__ = ["NotFittedError", "ProbabilitiesAsLogitsWarning", "TemperatureScaling", "VectorScaling", "MatrixScaling",
           "DirichletCalibration", "EnsembleTemperatureScaling", "HistogramBinning", "IsotonicCalibration",
           "SplineCalibration", "ScalingBinning", "PlattScaling", "BetaCalibration", "BBQ",
           "StructuredVectorScaling", "StructuredMatrixScaling", "UniformHistogramBinning",
           "CenteredIsotonicCalibration", "VennAbersCalibration", "OneVsRestSplineCalibration", "LightGBMCalibration",
           "StackedCalibration", "CALIBRATORS", "evaluate_before_after_ts", "save", "load"]
