"""Stacking calibrators: a mixture of several calibrated distributions, weighted by the log score.

One post-hoc calibrator picked from many throws away what the others know; on validation splits
of a few thousand rows the best one is rarely separable from the rest (``docs/calibrators.md``,
"Regret of the choice"). calibkit's stack keeps several and mixes their probabilities::

    p(x) = sum_j w_j p_j(x),   w_j >= 0,   sum_j w_j = 1,

where ``p_j`` is calibrator ``j`` fitted on the validation rows (``"none"``: the model's own
softmax) and the weights maximise the log score of the **out-of-fold** probabilities (each
validation row predicted by fits that did not see it), as in stacking of predictive
distributions (Wolpert 1992; Breiman 1996; Yao, Vehtari, Simpson & Gelman 2018). With the
components' out-of-fold probabilities of the true class ``P`` ``(N, J)`` the objective
``mean_i log sum_j w_j P_ij`` is concave in ``w``; :func:`mixture_weights` maximises it on the
simplex. At its maximum every component with ``w_j > 0`` has
``mean_i P_ij / p_i = 1`` and every other ``<= 1`` (the KKT conditions; a test checks them).

Decisions of calibkit (the stacking papers fix none of them):

* **the components** (:data:`PARTS`): the uncalibrated model and the smooth maps, temperature,
  vector, matrix and Dirichlet scaling, beta calibration, ETS, SVS and SMS; not the binning maps,
  whose piecewise-constant outputs put exact or near zeros where a mixture should be smooth. A
  component that cannot be fitted (matrix scaling from too few rows, a failed fit) is left out.
* **the optimiser**: an active-set Newton method (:func:`mixture_weights`) from equal weights, to the
  KKT conditions within 1e-10 (the EM iteration of a mixture's weights gets there too, but took
  10,000 iterations and a second on 2,500 rows of 9 nearly collinear components).
* **The stack's own out-of-fold score** (what a selection compares, :func:`cross_fitted_mixture`):
  the rows of each fold are mixed with weights fitted on the out-of-fold probabilities of the other
  folds' rows, so no row's weights were fitted on that row's probability. The components'
  out-of-fold probabilities are those of the other candidates, so scoring the stack fits nothing.
* ``fit`` alone (not through a selection) cross-fits its components itself with
  :func:`calibkit.calibrators.folds.out_of_fold`: the folds and warm starts of a selection.

Saved state (:func:`calibkit.calibrators.save`): ``components_`` (names), ``weights_`` ``(J,)``
and ``parts_``, each fitted component's own ``to_dict`` with its tensors written out as lists (JSON
keeps float64 exactly); :func:`check_stack` validates every component with the checks of its own
kind on load.
"""

from __future__ import annotations

import math

import torch

from calibkit.calibrators._base import Calibrator
from calibkit.calibrators._state import COMMON, StateError, check_state
from calibkit.calibrators.evidence import unestimable
from calibkit.calibrators.folds import folds, out_of_fold, two_column, uncalibrated
from calibkit.calibrators.registry import CALIBRATORS
from calibkit.errors import UserError

__all__ = ["NAME", "PARTS", "StackedCalibration", "mixture_weights", "cross_fitted_mixture", "check_stack"]

NAME = "stack"
NONE = "none"
#: The default components, in the order of the registry (module docstring).
PARTS = (NONE, "temperature", "vector", "matrix", "dirichlet", "beta", "ets", "svs", "sms")
_DTYPES = {"float64": torch.float64, "int64": torch.int64}


def _objective(p: torch.Tensor, w: torch.Tensor) -> float:
    return float((p @ w).log().mean())


def _newton_step(p: torch.Tensor, w: torch.Tensor, g: torch.Tensor, free: torch.Tensor) -> torch.Tensor:
    """The Newton direction of the log score on the free weights, moving along the simplex: with
    ``A = -H = mean_i q_i q_i'`` (``q_i = p_i / (p w)_i``, positive semi-definite), ``A d = g - nu 1``
    and ``sum d = 0``. ``A`` gets a ridge of ``1e-10`` of its mean diagonal, so that components
    that predict alike (a singular ``A``) get a step that splits them; solved by Cholesky
    (deterministic: LAPACK's least squares gave other bits on repeated calls)."""
    q = p[:, free] / (p @ w)[:, None]
    a = (q.T @ q) / p.shape[0]
    k = a.shape[0]
    a = a + (1e-10 * float(a.diagonal().mean()) + 1e-300) * torch.eye(k, dtype=torch.float64)
    chol = torch.linalg.cholesky(a)
    u = torch.cholesky_solve(g[free].view(-1, 1), chol).view(-1)
    v = torch.cholesky_solve(torch.ones(k, 1, dtype=torch.float64), chol).view(-1)
    d = torch.zeros_like(w)
    d[free] = u - (u.sum() / v.sum()) * v
    return d


def mixture_weights(p_true: torch.Tensor, max_iter: int = 500, tol: float = 1e-10) -> torch.Tensor:
    """The simplex weights ``w`` ``(J,)`` maximising ``mean_i log sum_j w_j p_true[i, j]`` (module
    docstring). ``p_true``: ``(N, J)`` probabilities of each row's true class under each component.

    An active-set Newton method: the gradient ``g_j = mean_i p_ij / (p w)_i`` has ``sum_j w_j g_j = 1``,
    and ``w`` is optimal when ``g_j = 1`` on the weights above 0 and ``g_j <= 1`` on those at 0 (the
    KKT conditions, to ``tol``). Each step moves the weights above 0, and those at 0 whose gradient
    is above 1, along the Newton direction within the simplex, shortened until the objective rises."""
    p = torch.as_tensor(p_true).double().clamp(min=torch.finfo(torch.float64).tiny)
    if p.dim() != 2 or p.shape[0] == 0 or p.shape[1] == 0:
        raise UserError(f"mixture_weights takes an (N, J) matrix with N, J >= 1, got shape {tuple(p.shape)}")
    w = torch.full((p.shape[1],), 1.0 / p.shape[1], dtype=torch.float64)
    obj = _objective(p, w)
    for _ in range(max_iter):
        g = (p / (p @ w)[:, None]).mean(0)
        free = (w > 0) | (g > 1 + tol)
        if float((g[free] - 1).abs().max()) <= tol:
            break
        d = _newton_step(p, w, g, free)
        while bool(((w <= 0) & (d < 0)).any()):  # a weight at 0 the step would push below: held at 0
            free &= ~((w <= 0) & (d < 0))
            d = _newton_step(p, w, g, free)
        neg = d < 0
        t = min(1.0, float((w[neg] / -d[neg]).min())) if bool(neg.any()) else 1.0
        while t > 1e-12:
            cand = (w + t * d).clamp(min=0.0)
            cand[neg & (w <= -d * t * (1 + 1e-12))] = 0.0  # the weights the step takes to 0: exactly 0
            cand = cand / cand.sum()
            new = _objective(p, cand)
            if new >= obj:
                break
            t /= 2
        else:
            break  # no rise along the direction: at the optimum to rounding
        w, obj = cand, new
    return w


def _true_class(oof: list[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
    return torch.stack([two_column(p).gather(1, y.view(-1, 1)).squeeze(1) for p in oof], 1)


def cross_fitted_mixture(oof: list[torch.Tensor], y: torch.Tensor, parts: list[torch.Tensor]
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights, mixed)``: the weights fitted on every row's out-of-fold probabilities ``oof`` (one
    ``(N, K)`` tensor per component), and the stack's own out-of-fold probabilities, each part of
    ``parts`` mixed with weights fitted on the other parts' rows (module docstring)."""
    y = torch.as_tensor(y).long()
    p_true = _true_class(oof, y)
    probs = torch.stack([two_column(p) for p in oof])  # (J, N, K)
    mixed = torch.empty_like(probs[0])
    for held in parts:
        keep = torch.ones(len(y), dtype=torch.bool)
        keep[held] = False
        w = mixture_weights(p_true[keep])
        mixed[held] = torch.einsum("j,jnk->nk", w, probs[:, held])
    return mixture_weights(p_true), mixed


def _to_json(cal) -> dict:
    d = cal.to_dict()
    tensors = {k: v for k, v in d["state"].items() if isinstance(v, torch.Tensor)}
    return {"params": d["params"], "state": {k: v for k, v in d["state"].items() if k not in tensors},
            "tensors": {k: {"dtype": str(v.dtype).removeprefix("torch."), "shape": list(v.shape),
                            "data": v.reshape(-1).tolist()} for k, v in tensors.items()}}


def _from_json(name: str, d: dict):
    """The component ``name`` described by :func:`_to_json` (raises :class:`StateError` on a malformed entry)."""
    if name not in CALIBRATORS or name == NAME:
        raise StateError("parts_", f"names an unknown calibrator {name!r}")
    if not (isinstance(d, dict) and set(d) == {"params", "state", "tensors"}
            and all(isinstance(d[k], dict) for k in d)):
        raise StateError("parts_", f"entry {name!r} must hold params, state and tensors")
    tensors = {}
    for field, t in d["tensors"].items():
        ok = (isinstance(t, dict) and t.get("dtype") in _DTYPES and isinstance(t.get("shape"), list)
              and isinstance(t.get("data"), list) and all(isinstance(n, int) and n >= 0 for n in t["shape"])
              and len(t["data"]) == math.prod(t["shape"]))
        if not ok:
            raise StateError("parts_", f"{name}: tensor {field!r} must give a dtype (float64 or int64), a shape "
                                       "and that many numbers")
        try:
            tensors[field] = torch.tensor(t["data"], dtype=_DTYPES[t["dtype"]]).reshape(t["shape"])
        except (TypeError, ValueError, RuntimeError) as exc:
            raise StateError("parts_", f"{name}: tensor {field!r}: {exc}") from None
    cls = CALIBRATORS[name]
    try:
        cal = cls.from_dict({"params": d["params"], "state": {**d["state"], **tensors}})
        cal._check_params()
    except (TypeError, ValueError) as exc:
        raise StateError("parts_", f"{name}: {exc}") from None
    if set(d["state"]) | set(tensors) != set(cls._STATE + COMMON):
        raise StateError("parts_", f"{name}: its state must hold exactly {', '.join(cls._STATE + COMMON)}")
    return cal


class StackedCalibration(Calibrator):
    """A mixture of calibrators weighted by the out-of-fold log score (module docstring).

    Args:
        calibrators: component names (``"none"``: the uncalibrated model, then names of
            :data:`calibkit.calibrators.CALIBRATORS`); None: :data:`PARTS`.
        n_folds: folds of the components' cross-fitting in :meth:`fit` (>= 2).
        seed: seed of the folds.

    Attributes (fitted): ``components_`` (the names kept, in order), ``weights_`` ``(J,)`` float64
    on the simplex, ``parts_`` (each component's saved form).

    Example:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> z = torch.randn(2000, 4, generator=g) * 2
        >>> y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
        >>> st = StackedCalibration(calibrators=("none", "temperature", "vector")).fit(3 * z, y)
        >>> round(float(st.weights_.sum()), 12)
        1.0
    """

    _STATE = ("components_", "weights_", "parts_")

    def __init__(self, calibrators: tuple[str, ...] | None = None, n_folds: int = 5, seed: int = 0):
        self.calibrators = calibrators
        self.n_folds = n_folds
        self.seed = seed

    def _names(self) -> list[str]:
        return list(PARTS if self.calibrators is None else self.calibrators)

    def _check_params(self):
        names = self._names()
        bad = [n for n in names if n != NONE and (n not in CALIBRATORS or n == NAME)]
        if isinstance(self.calibrators, str) or bad or not names or len(set(names)) != len(names):
            raise UserError(f"calibrators must be distinct names of 'none' and {', '.join(CALIBRATORS)}, "
                            f"got {self.calibrators!r}")
        if isinstance(self.n_folds, bool) or not isinstance(self.n_folds, int) or self.n_folds < 2:
            raise UserError(f"n_folds must be an integer >= 2, got {self.n_folds!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise UserError(f"seed must be an integer, got {self.seed!r}")

    def _fit(self, z: torch.Tensor, y: torch.Tensor) -> None:
        parts = folds(z.shape[0], self.n_folds, self.seed)
        fitted, oof = {}, {}
        for name in self._names():
            if name == NONE:
                oof[name] = uncalibrated(z)
                continue
            if unestimable(name, y, z.shape[1]) is not None:
                continue
            try:
                full = CALIBRATORS[name]().fit(z, y)
                oof[name] = out_of_fold(name, z, y, parts, full)
            except (ValueError, RuntimeError):  # a component that cannot be fitted here is left out
                continue
            fitted[name] = full
        weights, _ = cross_fitted_mixture(list(oof.values()), y, parts)
        self._keep(list(oof), weights, fitted)

    def _keep(self, names: list[str], weights: torch.Tensor, fitted: dict) -> None:
        self.components_ = list(names)
        self.weights_ = weights.double().cpu()
        self.parts_ = {n: _to_json(fitted[n]) for n in names if n != NONE}
        self._parts = {n: fitted[n] for n in names if n != NONE}

    @classmethod
    def from_parts(cls, fitted: dict, weights: torch.Tensor, n_classes: int, binary: bool, **params):
        """The stack of the already fitted components ``fitted`` (``{name: calibrator}``, ``"none"``
        mapped to None), in that order, with ``weights``: what a selection builds from its candidates."""
        st = cls(calibrators=tuple(fitted), **params)
        st._check_params()
        st._keep(list(fitted), torch.as_tensor(weights), {n: c for n, c in fitted.items() if n != NONE})
        st.n_classes_, st.binary_ = int(n_classes), bool(binary)
        return st

    def _components(self) -> dict:
        if getattr(self, "_parts", None) is None:  # loaded: rebuilt from the saved form once
            self._parts = {n: _from_json(n, d) for n, d in self.parts_.items()}
        return self._parts

    def _predict(self, z: torch.Tensor) -> torch.Tensor:
        objs = self._components()
        out = torch.zeros_like(z, dtype=torch.float64)
        for name, w in zip(self.components_, self.weights_.tolist()):
            if name == NONE:
                q = torch.softmax(z, 1)
            else:
                cal = objs[name]
                q = two_column(cal.predict_proba(z[:, 1] if cal.binary_ else z))
            out += w * q.to(out.device)
        return out

    def __getstate__(self):  # pickled without the rebuilt components (parts_ holds them)
        return {k: v for k, v in self.__dict__.items() if k != "_parts"}


def check_stack(cal) -> None:
    """Raise :class:`StateError` for the first invalid field of a loaded stack: ``components_``
    distinct known names, ``weights_`` ``(J,)`` float64 on the simplex, ``parts_`` one valid entry
    (by its own kind's checks) per component but ``"none"``, each fitted on the stack's ``K``."""
    state = {f: getattr(cal, f) for f in (*cal._STATE, *COMMON)}
    k, binary = state["n_classes_"], state["binary_"]
    if isinstance(k, bool) or not isinstance(k, int) or k < 2 or not isinstance(binary, bool) or (binary and k != 2):
        raise StateError("n_classes_", f"must be an integer >= 2 (2 for binary logits), got {k!r}")
    names = state["components_"]
    if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)
            and len(set(names)) == len(names)
            and all(n == NONE or (n in CALIBRATORS and n != NAME) for n in names)):
        raise StateError("components_", f"must be a list of distinct calibrator names, got {names!r}")
    w = state["weights_"]
    if not (isinstance(w, torch.Tensor) and w.dtype == torch.float64 and tuple(w.shape) == (len(names),)
            and bool(torch.isfinite(w).all()) and bool((w >= 0).all()) and abs(float(w.sum()) - 1) <= 1e-9):
        raise StateError("weights_", f"must be {len(names)} float64 numbers >= 0 summing to 1")
    parts = state["parts_"]
    if not (isinstance(parts, dict) and set(parts) == set(names) - {NONE}):
        raise StateError("parts_", "must hold one entry per component but 'none'")
    built = {}
    for name, d in parts.items():
        comp = built[name] = _from_json(name, d)
        try:
            check_state(name, comp)
        except StateError as exc:
            raise StateError("parts_", f"{name}: {exc}") from None
        if comp.n_classes_ != k or (comp.binary_ and not binary):
            raise StateError("parts_", f"{name} was fitted on K = {comp.n_classes_}, the stack on K = {k}")
    cal._parts = built  # checked: predict uses them instead of rebuilding them from parts_
