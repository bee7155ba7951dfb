"""What every calibrator shares: input checks, the binary layout, the output dtype, saving state.

A calibrator's ``__init__`` stores hyperparameters only, each under the name of its parameter
(:func:`param_names` reads the names from the signature, as scikit-learn's ``get_params`` does); ``fit``
validates its inputs here, works on float64 ``(N, K)`` logits and stores its learned state in
``_``-suffixed attributes (the names in ``_STATE``); ``predict_proba`` validates again and maps
logits of the fitted ``K`` to probabilities.

Layouts:

* ``(N, K)`` logits with ``(N,)`` integer labels in ``[0, K)``;
* **binary** ``(N,)`` positive-class logits with 0/1 labels: fitted as the two-class logits
  ``(0, z)`` (``softmax((0, z))_1 = sigmoid(z)``); ``predict_proba`` returns ``(N,)``
  positive-class probabilities. A calibrator fitted on one layout refuses the other.

Probabilities passed as logits: a matrix whose entries all lie in ``[0, 1]`` and whose rows all
sum to 1 (within the tolerance of :func:`calibkit._validation.prob_sum_tol`) is refused with a
``ValueError`` (pass ``log(probs)``: ``softmax(log p) = p``); inputs whose entries all lie in
``[0, 1]`` otherwise (e.g. sigmoid outputs given as binary scores) only raise a
:class:`ProbabilitiesAsLogitsWarning`, since such logits are possible, if rare. Constant inputs
(every entry equal, e.g. all zeros) are neither.
"""

from __future__ import annotations

import inspect
import warnings
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

import torch

from calibkit._arrays import array_io
from calibkit._validation import as_tensor, check_labels, check_logits, prob_sum_tol, upcast
from calibkit.calibrators._state import COMMON
from calibkit.calibrators.evidence import warn_absent
from calibkit.errors import UserError

__all__ = ["NotFittedError", "ProbabilitiesAsLogitsWarning", "Calibrator", "Params", "check_not_probabilities",
           "check_init", "fit_inputs", "lbfgs", "lbfgs_ftol", "param_names"]


class NotFittedError(ValueError, AttributeError):
    """Raised when a calibrator is used before ``fit``."""


class ProbabilitiesAsLogitsWarning(UserWarning):
    """The logits passed to a calibrator all lie in ``[0, 1]``: they may be probabilities."""


def check_not_probabilities(x: torch.Tensor, owner: str) -> None:
    """Refuse probability rows passed as logits, warn about values that all lie in ``[0, 1]``.

    ``x``: ``(N, K)`` rows (``(N,)`` for binary scores). See the module docstring.
    """
    lo, hi = torch.aminmax(x)
    if not (bool(lo >= 0) and bool(hi <= 1)) or bool(lo == hi):  # constant logits (e.g. zeros): no signal either way
        return
    if x.dim() == 2:
        worst = float((upcast(x).double().sum(1) - 1).abs().max())
        if worst <= prob_sum_tol(x.dtype):
            raise UserError(f"{owner}: the logits look like probabilities (every entry in [0, 1] and every row "
                             "sums to 1); calibrators take logits: pass log(probs) instead (softmax(log p) = p)")
        hint = "pass log(probs)"
    else:
        hint = "pass logit(p) = log(p / (1 - p))"
    warnings.warn(f"{owner}: every logit lies in [0, 1]; if these are probabilities, {hint} instead",
                  ProbabilitiesAsLogitsWarning, stacklevel=4)


def _rows(logits, owner: str) -> tuple[torch.Tensor, bool]:
    """Validated ``(N, K)`` logits (binary ``(N,)`` -> ``(0, z)``) and whether the input was binary."""
    x = as_tensor(logits, "logits")
    if x.dim() == 1:
        if not x.dtype.is_floating_point:
            raise UserError(f"logits must be a floating-point tensor, got dtype {x.dtype}")
        return check_logits(torch.stack([torch.zeros_like(x), x], 1)), True
    if x.dim() != 2:
        raise UserError(f"{owner} takes (N, K) logits or (N,) binary positive-class logits, got shape "
                         f"{tuple(x.shape)} (dense layouts: use TemperatureScaling)")
    return check_logits(x), False


def fit_inputs(logits, labels, owner: str) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``(z, y, binary)``: float64 ``(N, K)`` logits, int64 labels in ``[0, K)``, the layout flag."""
    x, binary = _rows(logits, owner)
    check_not_probabilities(x[:, 1] if binary else x, owner)
    y = check_labels(labels, x.shape[1], x.shape[0]).to(x.device)
    return upcast(x).double(), y, binary


def _value_and_grad(loss_fn, x: torch.Tensor, closed_form: bool) -> tuple[float, torch.Tensor]:
    if closed_form:  # loss_fn gives (value, gradient) itself
        f, g = loss_fn(x)
        return float(f), g
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        f = loss_fn(x)
        (g,) = torch.autograd.grad(f, x)
    return float(f.detach()), g


def _direction(g: torch.Tensor, pairs: list, h: torch.Tensor | None) -> torch.Tensor:
    """``-H g`` by the two-loop recursion; the initial inverse Hessian is ``gamma diag(1 / h)`` (``h``:
    ``None`` for the identity), ``gamma = s.y / y.(y / h)`` of the newest pair; without pairs
    ``-g / h`` scaled to an L1 norm of at most 1."""
    d = -g
    alphas = []
    for s, yv, rho in reversed(pairs):
        a = rho * float(s @ d)
        alphas.append(a)
        d = d - a * yv
    if pairs:
        s, yv, _ = pairs[-1]
        hy = yv if h is None else yv / h
        d = (d if h is None else d / h) * (float(s @ yv) / float(yv @ hy))
    else:
        d = d if h is None else d / h
        d = d / max(1.0, float(d.abs().sum()))
    for (s, yv, rho), a in zip(pairs, reversed(alphas)):
        d = d + (a - rho * float(yv @ d)) * s
    return d


#: :func:`lbfgs`'s default relative-decrease tolerance (``1e-12``), changed within :func:`lbfgs_ftol`.
_FTOL: ContextVar[float] = ContextVar("lbfgs_ftol", default=1e-12)


@contextmanager
def lbfgs_ftol(ftol: float):
    """Within the block, :func:`lbfgs` (without an ``ftol`` of its own) stops when an iteration lowers
    the loss by at most ``ftol`` relative instead of ``1e-12``: cross-fitting's fold fits
    (:data:`calibkit.calibrators.folds.FOLD_FTOL`)."""
    token = _FTOL.set(ftol)
    try:
        yield
    finally:
        _FTOL.reset(token)


def lbfgs(loss_fn, x0: torch.Tensor, max_iter: int, tol: float = 1e-7, history: int = 20,
          closed_form: bool = False, precondition: torch.Tensor | None = None,
          ftol: float | None = None) -> tuple[torch.Tensor, int]:
    """Minimise ``loss_fn(x)`` (a differentiable scalar of a flat float64 tensor) from ``x0`` with
    L-BFGS; returns the minimiser and the number of iterations run. Deterministic.

    Directions by the two-loop recursion over the last ``history`` pairs (initial scaling
    ``s.y / y.y``; the first step is scaled to a unit L1 norm), steps by backtracking from 1
    until the Armijo condition ``f(x + t d) <= f(x) + 1e-4 t g.d`` holds (pairs with ``s.y <= 0``
    are skipped, so the curvature stays positive). Stops after ``max_iter`` iterations, when the
    largest gradient entry is at most ``tol``, or when an iteration lowers the loss by at most
    ``ftol`` relative (``None``: ``1e-12``, or the value set by :func:`lbfgs_ftol`).
    (``torch.optim.LBFGS`` is avoided: building it imports ``torch._dynamo``, which costs seconds
    in every process.)

    ``closed_form``: ``loss_fn(x)`` returns ``(value, gradient)`` itself (no autograd; the same
    iterates up to rounding). ``precondition``: a positive ``(n,)`` tensor ``h`` (the diagonal of
    an approximate Hessian): the initial inverse Hessian of each two-loop recursion becomes
    ``gamma diag(1 / h)``, ``gamma = s.y / y.(y / h)`` (and the first step ``-g / h``, scaled to
    an L1 norm of at most 1). It changes the path, not the stopping rule (on the gradient itself)
    nor the minimiser of a strictly convex loss; ``None``: the plain iteration above.
    """
    ftol = _FTOL.get() if ftol is None else ftol
    x = x0.detach().clone()
    f, g = _value_and_grad(loss_fn, x, closed_form)
    pairs: list[tuple[torch.Tensor, torch.Tensor, float]] = []
    it = 0
    while it < max_iter and float(g.abs().max()) > tol:
        it += 1
        d = _direction(g, pairs, precondition)
        gd = float(g @ d)
        if not gd < 0:  # not a descent direction: restart from the gradient
            pairs.clear()
            d = _direction(g, pairs, precondition)
            gd = float(g @ d)
        t = 1.0
        while True:
            x_new = x + t * d
            f_new, g_new = _value_and_grad(loss_fn, x_new, closed_form)
            if f_new <= f + 1e-4 * t * gd:
                break
            t *= 0.5
            if t < 1e-20:
                return x, it
        s, yv = x_new - x, g_new - g
        sy = float(s @ yv)
        if sy > 1e-12 * float(s.norm() * yv.norm()):
            pairs.append((s, yv, 1.0 / sy))
            del pairs[:-history]
        drop = f - f_new
        x, f, g = x_new, f_new, g_new
        if drop <= ftol * max(1.0, abs(f)):
            break
    return x, it


def check_init(cal, init, fitted: str = "n_classes_") -> None:
    """Refuse a warm-start ``init`` that is not ``None`` or a fitted calibrator of ``cal``'s class
    (fitted: it has the attribute ``fitted``).

    The class must match exactly: a subclass's state need not mean the same thing. ``K`` and the
    layout are checked by ``fit`` once the logits are read.
    """
    if init is None:
        return
    name = type(cal).__name__
    if type(init) is not type(cal):
        raise UserError(f"init must be a fitted {name} (a warm start reuses its state), got {type(init).__name__}")
    if not hasattr(init, fitted):
        raise UserError(f"init is an unfitted {name}: fit it first (a warm start reuses its state)")


def param_names(cls: type) -> tuple[str, ...]:
    """The hyperparameter names of calibrator class ``cls``: the parameters of its ``__init__``, in
    order (``self`` left out), which ``__init__`` stores under the same names.

    The one source of ``get_params``, ``repr``, the ``params`` of ``to_dict`` and of a saved
    file, and the names ``from_dict`` accepts: a new hyperparameter is one new ``__init__``
    argument. A class without an ``__init__`` of its own or its bases' has none; ``*args`` or ``**kwargs`` raise
    ``TypeError`` (they name no hyperparameter).
    """
    params = list(inspect.signature(cls).parameters.values())  # the constructor's, without self
    loose = [p.name for p in params if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if loose:
        raise TypeError(f"{cls.__name__}.__init__ takes *{loose[0]}: a calibrator's hyperparameters must be named")
    return tuple(p.name for p in params)


def _plain(v):
    """A hyperparameter as JSON can hold it (tuples -> lists)."""
    return list(v) if isinstance(v, tuple) else v


_P = TypeVar("_P", bound="Params")


class Params:
    """scikit-learn's estimator protocol for hyperparameters: ``get_params``, ``set_params``.

    With these ``sklearn.base.clone`` works (it rebuilds ``type(c)(**c.get_params(deep=False))``
    and checks that each value is passed through unchanged), and so do scikit-learn's tools that
    read or set hyperparameters (grid search over a calibrator's arguments). ``__init__`` must
    store each argument unchanged under its own name (:func:`param_names`); checks run in ``fit``.
    Pickling needs nothing more: hyperparameters and fitted state are plain attributes (python
    values and CPU or device tensors). scikit-learn itself is not needed to use them.
    """

    def get_params(self, deep: bool = True) -> dict:
        """The hyperparameters, ``{name: value}`` in ``__init__`` order (:func:`param_names`).

        ``deep=True`` also lists the parameters of any hyperparameter that has ``get_params``
        itself, as ``name__sub`` (scikit-learn's convention; no built-in calibrator has one).
        """
        out = {}
        for k in param_names(type(self)):
            v = getattr(self, k)
            out[k] = v
            if deep and hasattr(v, "get_params") and not isinstance(v, type):
                out.update({f"{k}__{sub}": sv for sub, sv in v.get_params(deep=True).items()})
        return out

    def set_params(self: _P, **params: Any) -> _P:
        """Set hyperparameters by name (``name__sub`` reaches into a nested one); returns ``self``.

        An unknown name raises :class:`~calibkit.errors.UserError` listing the valid ones. Values
        are checked when ``fit`` runs, as scikit-learn does; the fitted state is left as it is
        (refit to use the new values).
        """
        valid = param_names(type(self))
        nested: dict[str, dict] = {}
        for key, value in params.items():
            name, _, sub = key.partition("__")
            if name not in valid:
                raise UserError(f"{type(self).__name__} has no hyperparameter {name!r}; valid: "
                                f"{', '.join(valid) or '(none)'}")
            if sub:
                nested.setdefault(name, {})[sub] = value
            else:
                setattr(self, name, value)
        for name, sub_params in nested.items():
            getattr(self, name).set_params(**sub_params)
        return self


class Calibrator(Params):
    """The shared protocol (one level of inheritance, no behaviour beyond checks and state I/O).

    Subclasses store each ``__init__`` argument under its own name (the hyperparameters,
    :func:`param_names`), set ``_STATE`` (fitted attribute names, ending in ``_``; a registered
    calibrator reads them from :data:`calibkit.calibrators._state.FIELDS`, where each is declared
    once with its check: ``_STATE = state_names("name")``) and implement
    ``_fit(z, y)`` and ``_predict(z)`` on float64 ``(N, K)`` logits, the latter returning float64
    ``(N, K)`` probabilities.
    """

    _STATE: tuple[str, ...] = ()

    def fit(self, val_logits, val_labels, init=None):
        """Fit on validation ``(N, K)`` logits (or ``(N,)`` binary logits) and labels; returns ``self``.

        ``init``: ``None``, or an already fitted calibrator of the same class, the same ``K`` and
        layout (e.g. fitted on the whole validation set before cross-fitting on its folds): the
        iterative calibrators start from its state (a warm start, see :meth:`_fit_from`), the
        others ignore it. Any other ``init`` raises ``ValueError``.
        """
        name = type(self).__name__
        check_init(self, init)
        z, y, binary = fit_inputs(val_logits, val_labels, name)
        self._check_params()
        if init is None:  # a warm start is a fold of a checked fit (cross-fitting): warned once, there
            warn_absent(self, y, z.shape[1])
            self._fit(z, y)
        else:
            if init.n_classes_ != z.shape[1] or init.binary_ != binary:
                fitted = "(N,) binary logits" if init.binary_ else f"K = {init.n_classes_}"
                got = "(N,) binary logits" if binary else f"K = {z.shape[1]}"
                raise UserError(f"init was fitted on {fitted} but this {name} is fitted on {got}")
            self._fit_from(z, y, init)
        self.n_classes_ = int(z.shape[1])
        self.binary_ = binary
        return self

    def _fit(self, z: torch.Tensor, y: torch.Tensor) -> None:
        """Fit on float64 ``(N, K)`` logits ``z`` and labels ``y`` (checked); each subclass implements it."""
        raise NotImplementedError

    def _predict(self, z: torch.Tensor) -> torch.Tensor:
        """Float64 ``(N, K)`` probabilities of float64 ``(N, K)`` logits; each subclass implements it."""
        raise NotImplementedError

    def _fit_from(self, z, y, init) -> None:
        """``_fit`` started from the fitted ``init`` (checked: same class, ``K`` and layout).

        The default ignores ``init``: a calibrator without an iterative optimiser has no starting
        point to reuse. Iterative calibrators override it.
        """
        self._fit(z, y)

    def _check_params(self) -> None:
        """Raise ``ValueError`` for bad hyperparameters (override where there are any to check)."""

    def _check_fitted(self) -> None:
        if not hasattr(self, "n_classes_"):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet: "
                                 "call fit(val_logits, val_labels) first")

    @array_io
    def predict_proba(self, logits) -> torch.Tensor:
        """Calibrated probabilities ``(N, K)`` (binary: ``(N,)`` positive-class probabilities), on the
        logits' device, in their dtype (float16/bfloat16 upcast to float32); a numpy array for
        numpy (or list) logits, a tensor for a tensor (:mod:`calibkit._arrays`)."""
        self._check_fitted()
        name = type(self).__name__
        x, binary = _rows(logits, name)
        if binary != self.binary_:
            fitted = "(N,) binary logits" if self.binary_ else f"(N, {self.n_classes_}) logits"
            raise UserError(f"this {name} was fitted on {fitted}; got shape {tuple(as_tensor(logits, 'logits').shape)}")
        if x.shape[1] != self.n_classes_:
            raise UserError(f"logits have K = {x.shape[1]} classes but this {name} was fitted on K = {self.n_classes_}")
        self._state_on(x.device)
        q = self._predict(upcast(x).double())
        q = q.to(dtype=upcast(x).dtype, device=x.device)
        return q[:, 1] if binary else q

    def _state_on(self, device) -> None:
        """Move tensor state to ``device`` (fitted on one device, used on another)."""
        for k in self._STATE:
            v = getattr(self, k)
            if isinstance(v, torch.Tensor) and v.device != torch.device(device):
                setattr(self, k, v.to(device))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params(deep=False).items())
        fitted = f", fitted on K={self.n_classes_}" if hasattr(self, "n_classes_") else ""
        return f"{type(self).__name__}({args}{fitted})"

    def to_dict(self) -> dict:
        """``{"params": hyperparameters, "state": fitted state}``; tensors as float64/int64 CPU
        tensors, the rest as JSON-ready python values (see :func:`calibkit.calibrators.save`)."""
        self._check_fitted()
        state = {}
        for k in self._STATE + COMMON:
            v = getattr(self, k)
            state[k] = v.detach().cpu().contiguous() if isinstance(v, torch.Tensor) else v
        return {"params": {k: _plain(v) for k, v in self.get_params(deep=False).items()}, "state": state}

    @classmethod
    def from_dict(cls, d: dict):
        """The calibrator described by :meth:`to_dict` (fitted when ``d`` holds a state)."""
        return _from_dict(cls, d, cls._STATE + COMMON)


def _from_dict(cls, d: dict, state_names: tuple[str, ...]):
    if not isinstance(d, dict) or "params" not in d:
        raise UserError(f"{cls.__name__}.from_dict needs a dict with 'params' (and 'state'), got {type(d).__name__}")
    params = dict(d["params"])
    unknown = sorted(set(params) - set(param_names(cls)))
    if unknown:
        raise UserError(f"{cls.__name__}: unknown hyperparameter(s) {', '.join(unknown)}")
    obj = cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in params.items()})
    state = d.get("state") or {}
    missing = [k for k in state_names if k not in state]
    if state and missing:
        raise UserError(f"{cls.__name__}: saved state lacks {', '.join(missing)}")
    for k in state_names if state else ():
        setattr(obj, k, state[k])
    return obj
