"""Pure tensor functions: calibration metrics and losses. No state, no I/O."""

from calibkit.functional.metrics import *  # noqa: F401,F403
from calibkit.functional.metrics import __all__ as _metrics_all
from calibkit.functional.losses import *  # noqa: F401,F403
from calibkit.functional.losses import __all__ as _losses_all

__all__ = list(_metrics_all) + list(_losses_all)
