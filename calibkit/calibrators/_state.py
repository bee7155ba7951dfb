"""A calibrator's saved state, declared once: its fields, in order, each with what it must be.

:data:`FIELDS` maps every registered calibrator's name to its fitted attributes (ending in ``_``)
and each one's check; it is the only list of them. A calibrator class reads its ``_STATE`` (what
``to_dict``, :func:`calibkit.calibrators.save` and ``load`` carry) from it with
:func:`state_names`, and :func:`check_state` (run by :func:`calibkit.calibrators.load`) runs the
checks in that order. Every calibrator also records :data:`COMMON`, ``n_classes_`` and ``binary_``.

A saved pair is data from outside the process: a hand-edited or corrupted file must be refused
with one line naming the file and the field, never applied (a negative temperature inverts the
ranking, a NaN weight gives all-NaN rows, a string where a number belongs ends in a traceback).
Every field of every registered calibrator is checked for its type, its dtype and shape for the
recorded ``K`` (float64 / int64 tensors, as :func:`calibkit.calibrators.save` writes them), being
finite, and its range:

* every calibrator: ``n_classes_`` an integer >= 2, ``binary_`` a boolean (binary: ``K = 2``);
* ``temperature_`` (temperature, ETS, scaling-binning): a finite number > 0; ``n_iter_`` an
  integer >= 0;
* vector / matrix / Dirichlet: ``weight_`` ``(K,)`` / ``(K, K)``, ``bias_`` ``(K,)``, finite;
  Dirichlet's ``lam_``, ``mu_`` finite and >= 0, ``cv_nll_`` a mapping to finite numbers;
* ETS: ``weights_`` ``(3,)``, >= 0, summing to 1 (within 1e-9);
* histogram (both binnings) / scaling-binning: ``edges_`` ``(G, B - 1)`` non-decreasing in
  ``[0, 1]``, ``values_`` ``(G, B)`` in ``[0, 1]`` (``B`` = ``n_bins``; ``G = 1`` for top-label
  histogram binning, else ``K``);
* isotonic: ``knots_x_``, ``knots_y_`` ``(G, L)`` (``G = 1`` with ``irm``, else ``K``), ``knots_x_``
  non-decreasing, ``knots_y_`` in ``[0, 1]``, ``n_knots_`` ``(G,)`` int64 in ``[1, L]``;
* spline: ``coef_`` ``(n_knots,)``, ``knots_x_``, ``knots_y_`` ``(1, L)`` finite with
  ``knots_x_`` non-decreasing, ``n_knots_`` ``(1,)`` int64 in ``[1, L]``;
* Platt / beta: ``coef_`` ``(G, 2)`` / ``(G, 3)`` finite (``G = K``, 1 when ``K = 2``), beta's
  ``a, b >= 0``; ``n_iter_`` an integer >= 0;
* BBQ: ``n_bins_`` ``(M,)`` int64 >= 1, ``weights_`` ``(G, M)`` >= 0 with rows summing to 1
  (within 1e-9), ``knots_`` ``(G, E)`` non-decreasing in ``[0, 1]`` with ``E = sum (B - 1)``,
  ``levels_`` ``(G, E + 1)`` in ``[0, 1]``;
* SVS / SMS: ``temperature_`` > 0, ``mix_`` in ``(0, 1)``, ``weight_`` ``(K,)`` / ``(K, K)``,
  ``bias_`` ``(K,)`` finite, ``reg_`` a mapping of the penalty names to finite numbers >= 0,
  ``reg_scale_`` a finite number > 0, ``cv_nll_`` a mapping to finite numbers, ``n_iter_`` an
  integer >= 0;
* CIR: ``knots_x_``, ``knots_y_`` ``(G, L)`` (``G = K``, 1 when ``K = 2``), ``knots_x_``
  non-decreasing, ``knots_y_`` in ``[0, 1]``, ``n_knots_`` ``(G,)`` int64 in ``[1, L]``;
* Venn-Abers: ``scores_`` ``(G, L)`` non-decreasing, ``n_scores_`` ``(G,)`` int64 in ``[1, L]``,
  ``p0_``, ``p1_`` ``(G, L + 1)`` in ``[0, 1]``;
* one-vs-rest spline: ``coef_`` ``(G, n_knots)`` finite, the knot tables as CIR's without the range;
* LightGBM: ``models_`` a list of ``n_folds`` (1 when ``n_folds = 0``) LightGBM model texts.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

__all__ = ["check_state", "StateError", "FIELDS", "COMMON", "state_names"]

# What every fitted calibrator records besides its own fields: K of the fit and the binary layout.
COMMON = ("n_classes_", "binary_")

# A field's check, called as check(state, field, params, k) once the fields before it have passed:
# ``state`` holds every field of the calibrator, ``params`` its hyperparameters, ``k`` its K.
Check = Callable[[dict, str, dict, int], object]


class StateError(ValueError):
    """A field of a saved state is invalid: ``field`` names it, the message says why."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"invalid {field}: {problem}")
        self.field = field


def _show(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _integer(state, field, lo):
    v = state[field]
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise StateError(field, f"must be an integer >= {lo}, got {_show(v)}")
    return v


def _number(state, field, positive=False):
    v = state[field]
    ok = (not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
          and (v > 0 if positive else v >= 0))
    if not ok:
        raise StateError(field, f"must be a finite number {'> 0' if positive else '>= 0'}, got {_show(v)}")
    return float(v)


def _tensor(state, field, shape, dtype=torch.float64, lo=None, hi=None, rows_sorted=False):
    v = state[field]
    if not isinstance(v, torch.Tensor):
        raise StateError(field, f"must be a {str(dtype).replace('torch.', '')} tensor of shape {shape} "
                                f"(kept in the .safetensors file), got {type(v).__name__} {_show(v)}")
    if v.dtype != dtype or tuple(v.shape) != tuple(shape):
        raise StateError(field, f"must be a {str(dtype).replace('torch.', '')} tensor of shape {tuple(shape)}, "
                                f"got {str(v.dtype).replace('torch.', '')} of shape {tuple(v.shape)}")
    if v.dtype.is_floating_point and not bool(torch.isfinite(v).all()):
        raise StateError(field, f"holds {int((~torch.isfinite(v)).sum())} NaN or infinite value(s)")
    outside = torch.zeros_like(v, dtype=torch.bool)
    if lo is not None:
        outside |= v < lo
    if hi is not None:
        outside |= v > hi
    if bool(outside.any()):
        span = f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"in [{lo}, {hi}]"
        raise StateError(field, f"must be {span}, found {v[outside].flatten()[0].item()!r}")
    if rows_sorted and v.dim() == 2 and v.shape[1] > 1 and bool((v[:, 1:] < v[:, :-1]).any()):
        raise StateError(field, "must be non-decreasing along each row")
    return v


def _width(v, dim: int = 2) -> int:
    """The last size of ``v`` when it is a tensor of ``dim`` dimensions (else 0: its own check says why)."""
    return v.shape[-1] if isinstance(v, torch.Tensor) and v.dim() == dim else 0


def _groups(k: int) -> int:
    """One map per class, one when ``K = 2`` (the positive class's)."""
    return 1 if k == 2 else k


def _hist_groups(params, k):
    return 1 if params.get("multiclass") == "top_label" else k


def _iterations(state, field, params, k):
    _integer(state, field, 0)


def _positive(state, field, params, k):
    _number(state, field, positive=True)


def _non_negative(state, field, params, k):
    _number(state, field)


def _vector(state, field, params, k):
    _tensor(state, field, (k,))


def _matrix(state, field, params, k):
    _tensor(state, field, (k, k))


def _held_out_nll(candidate: str) -> Check:
    """A mapping of each ``candidate`` (a string key) to its finite held-out NLL."""
    def check(state, field, params, k):
        cv = state[field]
        if not isinstance(cv, dict) or not all(isinstance(a, str) and not isinstance(b, bool)
                                               and isinstance(b, (int, float)) and math.isfinite(b)
                                               for a, b in cv.items()):
            raise StateError(field, f"must map each {candidate} to a finite held-out NLL, got {_show(cv)}")
    return check


_cv_nll = _held_out_nll("'lam,mu'")


def _ets_weights(state, field, params, k):
    w = _tensor(state, field, (3,), lo=0.0)
    if abs(float(w.sum()) - 1) > 1e-9:
        raise StateError(field, f"must sum to 1, sum to {float(w.sum())!r}")


def _bins(groups: Callable[[dict, int], int]) -> dict[str, Check]:
    """``edges_`` and ``values_`` of ``groups(params, k)`` histograms of ``n_bins`` bins."""
    return {
        "edges_": lambda s, f, p, k: _tensor(s, f, (groups(p, k), p["n_bins"] - 1), lo=0.0, hi=1.0, rows_sorted=True),
        "values_": lambda s, f, p, k: _tensor(s, f, (groups(p, k), p["n_bins"]), lo=0.0, hi=1.0),
    }


def _knots(groups: Callable[[dict, int], int], y_range: tuple[float | None, float | None]) -> dict[str, Check]:
    """``knots_x_``, ``knots_y_`` ``(G, L)`` and ``n_knots_`` ``(G,)`` of ``G = groups(params, k)`` maps."""
    return {
        "knots_x_": lambda s, f, p, k: _tensor(s, f, (groups(p, k), _width(s[f])), rows_sorted=True),
        "knots_y_": lambda s, f, p, k: _tensor(s, f, (groups(p, k), _width(s["knots_x_"])),
                                               lo=y_range[0], hi=y_range[1]),
        "n_knots_": lambda s, f, p, k: _tensor(s, f, (groups(p, k),), dtype=torch.int64, lo=1,
                                               hi=max(_width(s["knots_x_"]), 1)),
    }


def _sigmoid_coef(n_coef: int) -> Check:
    def check(state, field, params, k):
        coef = _tensor(state, field, (_groups(k), n_coef))
        if n_coef == 3 and bool((coef[:, :2] < 0).any()):
            raise StateError(field, "beta calibration's a and b must be >= 0")
    return check


def _bbq_weights(state, field, params, k):
    models = _width(state["n_bins_"], dim=1)
    w = _tensor(state, field, (_groups(k), models), lo=0.0)
    if models == 0 or float((w.sum(1) - 1).abs().max()) > 1e-9:
        raise StateError(field, "each row must sum to 1")


def _bbq_edges(state) -> int:
    return int((state["n_bins_"] - 1).sum())


def _mix(state, field, params, k):
    if _number(state, field, positive=True) >= 1:
        raise StateError(field, f"must be below 1, got {_show(state[field])}")


def _penalties(matrix: bool) -> Check:
    names = ("intercept", "diagonal") + (("off_diagonal",) if matrix else ())

    def check(state, field, params, k):
        reg = state[field]
        numbers = isinstance(reg, dict) and all(not isinstance(v, bool) and isinstance(v, (int, float))
                                                and math.isfinite(v) and v >= 0 for v in reg.values())
        if not numbers or set(reg) != set(names):
            raise StateError(field, f"must map {', '.join(names)} to finite numbers >= 0, got {_show(reg)}")
    return check



def _structured(matrix: bool) -> dict[str, Check]:
    return {"temperature_": _positive, "mix_": _mix, "weight_": _matrix if matrix else _vector, "bias_": _vector,
            "reg_scale_": _positive, "cv_nll_": _held_out_nll("candidate scale"), "reg_": _penalties(matrix),
            "n_iter_": _iterations}


def _lightgbm_models(state, field, params, k):
    models = state[field]
    n = params["n_folds"] or 1
    if not (isinstance(models, list) and len(models) == n
            and all(isinstance(m, str) and m.startswith("tree") for m in models)):
        raise StateError(field, f"must be a list of {n} LightGBM model texts, got {_show(models)}")


_HISTOGRAM = _bins(_hist_groups)

# Registry name -> its fitted fields, in the order they are saved and checked, each with its check.
FIELDS: dict[str, dict[str, Check]] = {
    "temperature": {"temperature_": _positive, "n_iter_": _iterations},
    "vector": {"weight_": _vector, "bias_": _vector, "n_iter_": _iterations},
    "matrix": {"weight_": _matrix, "bias_": _vector, "n_iter_": _iterations},
    "dirichlet": {"weight_": _matrix, "bias_": _vector, "lam_": _non_negative, "mu_": _non_negative,
                  "cv_nll_": _cv_nll, "n_iter_": _iterations},
    "ets": {"temperature_": _positive, "weights_": _ets_weights},
    "histogram": _HISTOGRAM,
    "isotonic": _knots(lambda p, k: 1 if p["irm"] else k, (0.0, 1.0)),
    "spline": {"coef_": lambda s, f, p, k: _tensor(s, f, (p["n_knots"],)), **_knots(lambda p, k: 1, (None, None))},
    "scaling_binning": {"temperature_": _positive, **_bins(lambda p, k: k)},
    "platt": {"coef_": _sigmoid_coef(2), "n_iter_": _iterations},
    "beta": {"coef_": _sigmoid_coef(3), "n_iter_": _iterations},
    "bbq": {"n_bins_": lambda s, f, p, k: _tensor(s, f, (_width(s[f], dim=1),), dtype=torch.int64, lo=1),
            "weights_": _bbq_weights,
            "knots_": lambda s, f, p, k: _tensor(s, f, (_groups(k), _bbq_edges(s)), lo=0.0, hi=1.0, rows_sorted=True),
            "levels_": lambda s, f, p, k: _tensor(s, f, (_groups(k), _bbq_edges(s) + 1), lo=0.0, hi=1.0)},
    "svs": _structured(matrix=False),
    "sms": _structured(matrix=True),
    "histogram_uniform": _HISTOGRAM,
    "cir": _knots(lambda p, k: _groups(k), (0.0, 1.0)),
    "venn_abers": {
        "scores_": lambda s, f, p, k: _tensor(s, f, (_groups(k), _width(s[f])), rows_sorted=True),
        "n_scores_": lambda s, f, p, k: _tensor(s, f, (_groups(k),), dtype=torch.int64, lo=1,
                                                hi=max(_width(s["scores_"]), 1)),
        "p0_": lambda s, f, p, k: _tensor(s, f, (_groups(k), _width(s["scores_"]) + 1), lo=0.0, hi=1.0),
        "p1_": lambda s, f, p, k: _tensor(s, f, (_groups(k), _width(s["scores_"]) + 1), lo=0.0, hi=1.0)},
    "spline_ovr": {"coef_": lambda s, f, p, k: _tensor(s, f, (_groups(k), p["n_knots"])),
                   **_knots(lambda p, k: _groups(k), (None, None))},
    "lightgbm": {"models_": _lightgbm_models},
}


def state_names(name: str) -> tuple[str, ...]:
    """The fitted fields of the calibrator registered as ``name`` (its class's ``_STATE``), in order."""
    return tuple(FIELDS[name])


def check_state(name: str, cal) -> None:
    """Raise :class:`StateError` for the first invalid field of the loaded calibrator ``cal``
    (registry name ``name``), whose hyperparameters have already been checked."""
    fields = FIELDS[name]
    state = {f: getattr(cal, f) for f in (*fields, *COMMON)}
    k = _integer(state, "n_classes_", 2)
    if not isinstance(state["binary_"], bool):
        raise StateError("binary_", f"must be true or false, got {_show(state['binary_'])}")
    if state["binary_"] and k != 2:
        raise StateError("n_classes_", f"must be 2 for binary logits (binary_ is true), got {k}")
    params = cal.get_params()
    for field, check in fields.items():
        check(state, field, params, k)
