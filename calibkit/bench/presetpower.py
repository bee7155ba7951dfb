"""What a preset's validation split can tell apart: the NLL difference its size detects, and the
warning of ``calibkit preset check`` when that is larger than the differences between calibrators
or methods usually are (``docs/metrics.md``, "Power")."""

from __future__ import annotations

import math
import warnings
from statistics import NormalDist

__all__ = ["ROW_SD_NLL", "TYPICAL_NLL_DIFFERENCE", "detectable_nll", "warn_small_validation"]

#: Per-row standard deviation of the test-NLL difference between two calibrators of one model
#: (0.02-0.27 on the real-outputs test bed, median about 0.12; ``docs/metrics.md``).
ROW_SD_NLL = 0.12
#: A typical NLL difference between two calibrators (or two methods after calibration) worth telling apart.
TYPICAL_NLL_DIFFERENCE = 0.01


def detectable_nll(n_rows: int, row_sd: float = ROW_SD_NLL) -> float:
    """The NLL difference ``n_rows`` validation rows detect (two-sided 5%, power 80%):
    ``(z_0.975 + z_0.8) row_sd / sqrt(n_rows)``."""
    z = NormalDist().inv_cdf
    return (z(0.975) + z(0.8)) * row_sd / math.sqrt(n_rows)


def warn_small_validation(preset, where: str = "") -> None:
    """Warn when the preset's ``val_size`` cannot separate a typical NLL difference
    (:data:`TYPICAL_NLL_DIFFERENCE`) on validation: the choice of a calibrator or a method pair then
    rests on noise, and only the report's confirmatory test-split comparisons can tell."""
    n = (preset.train or {}).get("val_size")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        return  # the data set's own split (its size is known only when the data are loaded)
    mde = detectable_nll(n)
    if mde > TYPICAL_NLL_DIFFERENCE:
        need = math.ceil(n * (mde / TYPICAL_NLL_DIFFERENCE) ** 2)
        warnings.warn(f"{where}val_size {n}: the validation split detects NLL differences of about {mde:.3f} or "
                      f"more (two-sided 5%, power 80%, per-row sd {ROW_SD_NLL}); typical differences between "
                      f"calibrators or methods are about {TYPICAL_NLL_DIFFERENCE}: validation cannot separate them "
                      f"(too little data to tell). Use val_size >= {need} for that, or rely on the report's "
                      "confirmatory test-split comparisons.", stacklevel=2)
