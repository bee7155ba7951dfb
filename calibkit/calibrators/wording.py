"""The status texts of the calibrator choice: two numbers that read as different, and the rule.

A guard that excludes a calibrator compares two numbers; printed at a fixed precision they can read
equal (``NLL 0.2787 is above 0.2787``). :func:`distinct` prints both at the fewest decimals, from
a floor, at which they differ. A challenger that did not replace the default is described by where
the interval of its difference lies (:func:`comparison_note`): wholly above 0 (significantly
worse), across 0 (not separated), with the rule it failed stated, so that a row such as the
uncalibrated model's, far above temperature scaling, does not read as a near miss.
"""

from __future__ import annotations

MOST = 12  # decimals tried before falling back to repr (two different floats always differ there)


def distinct(a: float, b: float, least: int = 4) -> tuple[str, str]:
    """``a`` and ``b`` formatted with the fewest decimals ``>= least`` at which the two texts differ
    (``repr`` of each when they agree to :data:`MOST` decimals; equal values print equal)."""
    for digits in range(least, MOST + 1):
        ta, tb = f"{a:.{digits}f}", f"{b:.{digits}f}"
        if ta != tb:
            return ta, tb
    return (repr(float(a)), repr(float(b))) if a != b else (f"{a:.{least}f}", f"{b:.{least}f}")


def nll_above(nll: float, ref: float, ref_name: str) -> str:
    """The NLL guard's reason: both values at enough digits, and the rule."""
    a, b = distinct(nll, ref)
    return (f"cross-fitted NLL {a} is above {ref_name}'s {b} (rule: under the ECE rule, a calibrator whose "
            f"NLL is above {ref_name}'s is not trusted on its ECE)")


def accuracy_below(acc: float, ref: float, tolerance: float) -> str:
    """The accuracy guard's reason (fractions in, points out): the drop and the tolerance at enough digits."""
    drop, tol = distinct(100 * (ref - acc), 100 * tolerance, least=2)
    a, b = distinct(100 * acc, 100 * ref, least=2)
    return (f"accuracy {a}% is {drop} points below the uncalibrated {b}% (rule: at most {tol} points below)")


def comparison_note(default: str, metric: str, est: float, lo: float | None = None, hi: float | None = None,
                    why: str = "no resamples") -> str:
    """Why a challenger did not replace ``default``: its ``metric`` difference (challenger minus
    default, already scaled, e.g. ECE x100) with the interval, where that interval lies, and the rule.
    ``lo``/``hi`` None: a comparison of point estimates, ``why`` saying why there is no interval."""
    rule = f"it replaces {default} only when the whole 95% interval is below 0"
    if lo is None or hi is None:
        side = "below" if est < 0 else "not below"
        return f"{side} {default} on point estimates ({why}): {metric} difference {est:+.4f}"
    text = f"{metric} difference {est:+.4f} [{lo:+.4f}, {hi:+.4f}]"
    if hi < 0:
        return f"significantly below {default}: {text}"
    if lo > 0:
        return f"significantly above {default} (worse): {text}; {rule}"
    return f"not significantly below {default}: {text}, the interval reaches 0; {rule}"
