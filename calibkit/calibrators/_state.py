"""What a loaded calibrator's state must be, field by field (used by :func:`calibkit.calibrators.load`).

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

import torch

__all__ = ["check_state", "StateError"]


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


def _affine(state, k, matrix):
    _tensor(state, "weight_", (k, k) if matrix else (k,))
    _tensor(state, "bias_", (k,))
    _integer(state, "n_iter_", 0)


def _bins(state, k, n_bins):
    _tensor(state, "edges_", (k, n_bins - 1), lo=0.0, hi=1.0, rows_sorted=True)
    _tensor(state, "values_", (k, n_bins), lo=0.0, hi=1.0)


def _hist_groups(params, k):
    return 1 if params.get("multiclass") == "top_label" else k


def _knots(state, groups, knots_y_range):
    x = state["knots_x_"]
    width = x.shape[1] if isinstance(x, torch.Tensor) and x.dim() == 2 else 0
    _tensor(state, "knots_x_", (groups, width), rows_sorted=True)
    _tensor(state, "knots_y_", (groups, width), lo=knots_y_range[0], hi=knots_y_range[1])
    _tensor(state, "n_knots_", (groups,), dtype=torch.int64, lo=1, hi=max(width, 1))


def _temperature(state, params, k):
    _number(state, "temperature_", positive=True)
    _integer(state, "n_iter_", 0)


def _dirichlet(state, params, k):
    _affine(state, k, matrix=True)
    _number(state, "lam_")
    _number(state, "mu_")
    cv = state["cv_nll_"]
    if not isinstance(cv, dict) or not all(isinstance(a, str) and not isinstance(b, bool)
                                           and isinstance(b, (int, float)) and math.isfinite(b)
                                           for a, b in cv.items()):
        raise StateError("cv_nll_", f"must map each 'lam,mu' to a finite held-out NLL, got {_show(cv)}")


def _ets(state, params, k):
    _number(state, "temperature_", positive=True)
    w = _tensor(state, "weights_", (3,), lo=0.0)
    if abs(float(w.sum()) - 1) > 1e-9:
        raise StateError("weights_", f"must sum to 1, sum to {float(w.sum())!r}")


def _scaling_binning(state, params, k):
    _number(state, "temperature_", positive=True)
    _bins(state, k, params["n_bins"])


def _sigmoid(state, params, k, n_coef):
    coef = _tensor(state, "coef_", (1 if k == 2 else k, n_coef))
    if n_coef == 3 and bool((coef[:, :2] < 0).any()):
        raise StateError("coef_", "beta calibration's a and b must be >= 0")
    _integer(state, "n_iter_", 0)


def _bbq(state, params, k):
    groups = 1 if k == 2 else k
    n_bins = state["n_bins_"]
    models = n_bins.shape[0] if isinstance(n_bins, torch.Tensor) and n_bins.dim() == 1 else 0
    n_bins = _tensor(state, "n_bins_", (models,), dtype=torch.int64, lo=1)
    w = _tensor(state, "weights_", (groups, models), lo=0.0)
    if models == 0 or float((w.sum(1) - 1).abs().max()) > 1e-9:
        raise StateError("weights_", "each row must sum to 1")
    n_edges = int((n_bins - 1).sum())
    _tensor(state, "knots_", (groups, n_edges), lo=0.0, hi=1.0, rows_sorted=True)
    _tensor(state, "levels_", (groups, n_edges + 1), lo=0.0, hi=1.0)


def _structured(state, params, k, matrix):
    _number(state, "temperature_", positive=True)
    if _number(state, "mix_", positive=True) >= 1:
        raise StateError("mix_", f"must be below 1, got {_show(state['mix_'])}")
    _affine(state, k, matrix)
    names = ("intercept", "diagonal") + (("off_diagonal",) if matrix else ())
    reg = state["reg_"]
    numbers = isinstance(reg, dict) and all(not isinstance(v, bool) and isinstance(v, (int, float))
                                            and math.isfinite(v) and v >= 0 for v in reg.values())
    if not numbers or set(reg) != set(names):
        raise StateError("reg_", f"must map {', '.join(names)} to finite numbers >= 0, got {_show(reg)}")
    _number(state, "reg_scale_", positive=True)
    cv = state["cv_nll_"]
    if not isinstance(cv, dict) or not all(isinstance(a, str) and not isinstance(b, bool)
                                           and isinstance(b, (int, float)) and math.isfinite(b)
                                           for a, b in cv.items()):
        raise StateError("cv_nll_", f"must map each candidate scale to a finite held-out NLL, got {_show(cv)}")


def _venn_abers(state, params, k):
    groups = 1 if k == 2 else k
    x = state["scores_"]
    width = x.shape[1] if isinstance(x, torch.Tensor) and x.dim() == 2 else 0
    _tensor(state, "scores_", (groups, width), rows_sorted=True)
    _tensor(state, "n_scores_", (groups,), dtype=torch.int64, lo=1, hi=max(width, 1))
    _tensor(state, "p0_", (groups, width + 1), lo=0.0, hi=1.0)
    _tensor(state, "p1_", (groups, width + 1), lo=0.0, hi=1.0)


def _lightgbm(state, params, k):
    models = state["models_"]
    n = params["n_folds"] or 1
    if not (isinstance(models, list) and len(models) == n
            and all(isinstance(m, str) and m.startswith("tree") for m in models)):
        raise StateError("models_", f"must be a list of {n} LightGBM model texts, got {_show(models)}")


_CHECKS = {
    "temperature": _temperature,
    "vector": lambda state, params, k: _affine(state, k, matrix=False),
    "matrix": lambda state, params, k: _affine(state, k, matrix=True),
    "dirichlet": _dirichlet,
    "ets": _ets,
    "histogram": lambda state, params, k: _bins(state, _hist_groups(params, k), params["n_bins"]),
    "histogram_uniform": lambda state, params, k: _bins(state, _hist_groups(params, k), params["n_bins"]),
    "isotonic": lambda state, params, k: _knots(state, 1 if params["irm"] else k, (0.0, 1.0)),
    "spline": lambda state, params, k: (_tensor(state, "coef_", (params["n_knots"],)), _knots(state, 1, (None, None))),
    "scaling_binning": _scaling_binning,
    "platt": lambda state, params, k: _sigmoid(state, params, k, 2),
    "beta": lambda state, params, k: _sigmoid(state, params, k, 3),
    "bbq": _bbq,
    "svs": lambda state, params, k: _structured(state, params, k, matrix=False),
    "sms": lambda state, params, k: _structured(state, params, k, matrix=True),
    "cir": lambda state, params, k: _knots(state, 1 if k == 2 else k, (0.0, 1.0)),
    "venn_abers": _venn_abers,
    "spline_ovr": lambda state, params, k: (_tensor(state, "coef_", (1 if k == 2 else k, params["n_knots"])),
                                            _knots(state, 1 if k == 2 else k, (None, None))),
    "lightgbm": _lightgbm,
}


def check_state(name: str, cal) -> None:
    """Raise :class:`StateError` for the first invalid field of the loaded calibrator ``cal``
    (registry name ``name``), whose hyperparameters have already been checked."""
    state = {k: getattr(cal, k) for k in type(cal)._STATE + ("n_classes_", "binary_")}
    k = _integer(state, "n_classes_", 2)
    if not isinstance(state["binary_"], bool):
        raise StateError("binary_", f"must be true or false, got {_show(state['binary_'])}")
    if state["binary_"] and k != 2:
        raise StateError("n_classes_", f"must be 2 for binary logits (binary_ is true), got {k}")
    _CHECKS[name](state, cal.get_params(), k)
