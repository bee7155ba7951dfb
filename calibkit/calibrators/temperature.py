"""Temperature scaling (Guo et al., 2017): one scalar ``T`` for every class and every layout.

``__init__`` stores hyperparameters only, ``fit(logits, labels)`` returns ``self`` and learned
state ends in ``_``. Fitting is done on cached validation logits, never on the test split.
Unlike the other calibrators, it also maps logits to logits (:meth:`TemperatureScaling.transform`)
and takes dense ``(N, K, *spatial)`` layouts.

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

import math
import warnings

import torch

from calibkit._arrays import array_io
from calibkit._validation import as_tensor, check_labels, check_logits, check_n_bins, upcast
from calibkit.calibrators._base import (
    NotFittedError,
    Params,
    _from_dict,
    _plain,
    check_init,
    check_not_probabilities,
)
from calibkit.calibrators._state import COMMON, state_names
from calibkit.errors import UserError
from calibkit.functional.binning import bin_sums, binned_errors, equal_width_bins
from calibkit.metrics import evaluate

__all__ = ["TemperatureScaling", "evaluate_before_after_ts"]


class TemperatureScaling(Params):
    """Temperature scaling: ``transform(z) = z / T`` with one scalar ``T > 0`` (Guo et al., 2017).

    Objectives:

    * ``"nll"`` (default): ``T = argmin_T mean_i [logsumexp(z_i / T) - z_{i, y_i} / T]``.
      In the inverse temperature ``b = 1 / T`` this NLL is convex, with derivative
      ``G(b) = mean_i (E_{softmax(b z_i)}[z_i] - z_{i, y_i})`` and second derivative
      ``mean_i Var_{softmax(b z_i)}[z_i] >= 0``. The solver brackets the root of ``G`` on a
      log-``T`` grid (``T`` from ``t_min`` to ``t_max``), then runs Newton steps in ``b``
      safeguarded by bisection in ``log T`` whenever a step leaves the bracket. Everything is in
      float64. If ``G`` has no root inside the range (e.g. separable data, where NLL keeps
      falling as ``T -> 0``), ``T`` is set to the bound and a warning is issued, never a
      runaway value.
    * ``"ece"``: the grid variant: ``T`` in ``0.1, 0.2, ..., 10.0``, picking the ``T`` with the
      smallest equal-width ECE (``n_bins`` bins); on ties the smallest ``T`` wins.

    Layouts of ``fit``/``transform``/``predict_proba``:

    * ``(N, K)`` logits, ``(N,)`` labels;
    * **binary**: ``(N,)`` logits of the positive class with 0/1 labels. The model is
      ``P(y = 1) = sigmoid(z / T)``: Platt scaling with its slope only, ``sigmoid(a z + c)`` with
      ``a = 1 / T`` and no intercept ``c`` (so ``T`` changes confidence, never the decision
      ``z > 0``). It is the K = 2 fit on the logits ``(0, z)``, since
      ``softmax((0, z) / T)_1 = sigmoid(z / T)``. ``predict_proba`` returns ``(N,)`` positive-class
      probabilities, which every metric accepts;
    * **dense**: ``(N, K, *spatial)`` logits with ``(N, *spatial)`` labels; ``fit`` takes
      ``ignore_index`` and fits on at most ``max_pixels`` valid pixels drawn uniformly without
      replacement (``torch.randperm`` of the valid pixels with a generator seeded by ``seed``),
      all of them when there are fewer.

    Probabilities passed as logits (the pitfall where ``fit`` on softmax outputs returns
    ``T`` near 2.7 or 7.3 without complaint): rows that are all in ``[0, 1]`` and sum to 1 are
    refused with a ``ValueError`` (pass ``log(probs)``); values that merely all lie in ``[0, 1]``
    raise a :class:`~calibkit.calibrators.ProbabilitiesAsLogitsWarning` (see
    :func:`calibkit.calibrators._base.check_not_probabilities`).

    ``fit`` records ``K`` (``n_classes_``; 2 for binary logits) and the layout (``binary_``) like
    every calibrator, and ``transform``/``predict_proba`` refuse logits of another ``K`` or layout
    with a ``ValueError`` (the temperature of one classifier applied to another's logits is a
    silent error; dense ``(N, K, *spatial)`` and ``(N, K)`` logits of the fitted ``K`` are one
    layout).

    Precision: ``transform`` and ``predict_proba`` compute in float64 (the logits upcast exactly,
    divided by ``T``, the softmax or sigmoid in float64) and return the logits' dtype
    (float16/bfloat16 upcast to float32), rounded once from float64, as every calibrator does;
    float64 logits give float64 results.

    Args:
        objective: ``"nll"`` (default) or ``"ece"``.
        n_bins: bins of the ECE objective (default 15).
        t_min, t_max: search range of the NLL solver (default 0.01 to 100).

    Attributes:
        temperature_: the fitted ``T`` (python float).
        n_iter_: solver iterations (NLL) or grid points tried (ECE).
        n_classes_: ``K`` of the fit (2 for binary logits).
        binary_: whether the fitted logits were binary ``(N,)`` scores.
    """

    OBJECTIVES = ("nll", "ece")
    _STATE = state_names("temperature")
    temperature_: float  # fitted state, set by fit
    n_iter_: int

    def __init__(self, objective: str = "nll", n_bins: int = 15, t_min: float = 1e-2, t_max: float = 1e2):
        self.objective = objective
        self.n_bins = n_bins
        self.t_min = t_min
        self.t_max = t_max

    def fit(self, logits, labels, ignore_index: int | None = None, max_pixels: int | None = 1_000_000,
            seed: int = 0, init: TemperatureScaling | None = None) -> TemperatureScaling:
        """Fit ``T`` on validation ``logits`` and integer ``labels``; returns ``self``.

        Args:
            logits: ``(N, K)``, binary ``(N,)`` or dense ``(N, K, *spatial)`` logits.
            labels: ``(N,)`` (``(N, *spatial)`` for dense) integer labels.
            ignore_index: label of samples to leave out (e.g. 255 for void pixels), or ``None``.
            max_pixels: dense input only: fit on at most this many valid pixels (``None``: all).
            seed: seed of the pixel subsample.
            init: ``None`` or a fitted ``TemperatureScaling`` (any ``K``: ``T`` is one scalar) whose
                ``T`` starts the NLL solver's Newton steps (a warm start; the same root to the solver's
                tolerance, in fewer iterations); the ECE grid ignores it.
        """
        check_init(self, init, "temperature_")
        self._check_params()
        if max_pixels is not None and (isinstance(max_pixels, bool) or not isinstance(max_pixels, int)
                                       or max_pixels < 1):
            raise UserError(f"max_pixels must be an integer >= 1 or None, got {max_pixels!r}")
        binary = as_tensor(logits, "logits").dim() == 1
        logits, labels = _fit_rows(logits, labels, ignore_index, max_pixels, seed)
        z = logits.double()
        if self.objective == "nll":
            t0 = None if init is None else init.temperature_
            self.temperature_, self.n_iter_ = _fit_nll(z, labels, self.t_min, self.t_max, t0=t0)
        else:
            self.temperature_, self.n_iter_ = _fit_ece_grid(z, labels, check_n_bins(self.n_bins))
        self.n_classes_, self.binary_ = int(z.shape[1]), binary
        return self

    def _check_params(self) -> None:
        """Raise ``ValueError`` for a bad hyperparameter (what ``fit`` checks first; also run on
        :func:`calibkit.calibrators.load`): ``objective``, ``0 < t_min < t_max``, and ``n_bins``
        where the ECE objective uses it."""
        if self.objective not in self.OBJECTIVES:
            raise UserError(f"unknown objective {self.objective!r}; expected one of {', '.join(self.OBJECTIVES)}")
        if not all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in (self.t_min, self.t_max)) \
                or not 0 < self.t_min < self.t_max:
            raise UserError(f"need 0 < t_min < t_max, got t_min={self.t_min!r}, t_max={self.t_max!r}")
        if self.objective == "ece":
            check_n_bins(self.n_bins)

    def _check_fitted(self):
        if not (hasattr(self, "temperature_") and hasattr(self, "n_classes_")):
            raise NotFittedError("this TemperatureScaling is not fitted yet: call fit(val_logits, val_labels) first")

    def _scaled(self, logits) -> tuple[torch.Tensor, torch.dtype]:
        """``logits / T`` in float64 after the K and layout checks, and the dtype to return."""
        self._check_fitted()
        x = _check_any_logits(logits)
        name = type(self).__name__
        if (x.dim() == 1) != self.binary_:
            fitted = "(N,) binary logits" if self.binary_ else f"(N, {self.n_classes_}) logits"
            raise UserError(f"this {name} was fitted on {fitted}; got shape {tuple(x.shape)}")
        if x.dim() > 1 and x.shape[1] != self.n_classes_:
            raise UserError(f"logits have K = {x.shape[1]} classes but this {name} was fitted on "
                             f"K = {self.n_classes_}")
        return x.double() / self.temperature_, upcast(x).dtype

    @array_io
    def transform(self, logits) -> torch.Tensor:
        """Scaled logits ``logits / T``, same shape as ``logits`` (the fitted ``K`` and layout),
        computed in float64 and returned in the logits' dtype (half upcast to float32); numpy in,
        numpy out (:mod:`calibkit._arrays`)."""
        z, dtype = self._scaled(logits)
        return z.to(dtype)

    @array_io
    def predict_proba(self, logits) -> torch.Tensor:
        """Calibrated probabilities: ``softmax(logits / T)`` over dim 1 (``(N, K)`` or
        ``(N, K, *spatial)``), or ``sigmoid(logits / T)`` for binary ``(N,)`` logits; computed in
        float64, returned in the logits' dtype (half upcast to float32); numpy in, numpy out."""
        z, dtype = self._scaled(logits)
        return (torch.sigmoid(z) if z.dim() == 1 else torch.softmax(z, dim=1)).to(dtype)

    def __repr__(self) -> str:
        fitted = f", temperature_={self.temperature_:.4g}" if hasattr(self, "temperature_") else ""
        return f"TemperatureScaling(objective={self.objective!r}, n_bins={self.n_bins}{fitted})"

    def to_dict(self) -> dict:
        """``{"params": hyperparameters, "state": {"temperature_": T, "n_iter_": n, "n_classes_": K,
        "binary_": bool}}`` (python values)."""
        self._check_fitted()
        return {"params": {k: _plain(v) for k, v in self.get_params(deep=False).items()},
                "state": {k: getattr(self, k) for k in self._STATE + COMMON}}

    @classmethod
    def from_dict(cls, d: dict) -> TemperatureScaling:
        """The calibrator described by :meth:`to_dict`; a state without ``n_classes_`` and
        ``binary_`` (written before they were recorded) is refused: refit and save again."""
        return _from_dict(cls, d, cls._STATE + COMMON)


def _check_any_logits(logits) -> torch.Tensor:
    x = as_tensor(logits, "logits")
    if x.dim() == 1:
        return check_logits(x[:, None].expand(-1, 2))[:, 0]  # same checks (dtype, N, finiteness)
    if x.dim() >= 3:  # the checks of check_logits, without a (pixels, K) copy
        if not x.dtype.is_floating_point:
            raise UserError(f"logits must be a floating-point tensor, got dtype {x.dtype}")
        if x.numel() == 0 or x.shape[1] < 2:
            raise UserError(f"dense logits need N >= 1 and K >= 2 along dim 1, got shape {tuple(x.shape)}")
        lo, hi = torch.aminmax(x)
        if not (bool(torch.isfinite(lo)) and bool(torch.isfinite(hi))):
            raise UserError("logits contains NaN or infinite value(s)")
        return x
    return check_logits(x)


def _fit_rows(logits, labels, ignore_index, max_pixels, seed):
    """Validated ``(M, K)`` logits and ``(M,)`` labels to fit on (binary: the logits ``(0, z)``)."""
    x, y = as_tensor(logits, "logits"), as_tensor(labels, "labels")
    if x.dim() >= 3:
        expected = x.shape[:1] + x.shape[2:]
        if tuple(y.shape) != tuple(expected):
            raise UserError(f"dense logits of shape {tuple(x.shape)} (N, K, *spatial) need labels of shape "
                             f"{tuple(expected)}, got {tuple(y.shape)}")
        flat_y = check_labels(y.reshape(-1), None, None)
        keep = torch.ones_like(flat_y, dtype=torch.bool) if ignore_index is None else flat_y != ignore_index
        idx = keep.nonzero().squeeze(1)
        if max_pixels is not None and idx.numel() > max_pixels:
            gen = torch.Generator().manual_seed(seed)
            pick = torch.randperm(idx.numel(), generator=gen)[:max_pixels].sort().values
            idx = idx[pick.to(idx.device)]
        spatial = flat_y.numel() // x.shape[0]
        x = x.flatten(2)[idx // spatial, :, idx % spatial]  # (M, K), only the chosen pixels copied
        y = flat_y[idx]
    elif ignore_index is not None:
        y = check_labels(y, None, x.shape[0] if x.dim() else None)
        keep = y != ignore_index
        x, y = x[keep], y[keep]
    if x.dim() == 1:  # binary: one logit per sample, P(y = 1) = sigmoid(z / T)
        x = check_logits(torch.stack([torch.zeros_like(x), x], 1)) if x.dtype.is_floating_point else x[:, None]
        x, y = check_logits(x, y)
        check_not_probabilities(x[:, 1], "TemperatureScaling")
        return x, y
    x, y = check_logits(x, y)
    check_not_probabilities(x, "TemperatureScaling")
    return x, y


def _moments(z: torch.Tensor, z2: torch.Tensor, z_y: torch.Tensor, b: float) -> tuple[float, float]:
    """Derivatives of the NLL in ``b = 1/T``: ``G = mean(E_p z - z_y)``, ``H = mean(Var_p z)``.

    ``z2 = z**2`` and ``z_y`` are precomputed; ``Var_p z = E_p z^2 - (E_p z)^2`` (float64; ``H``
    only steers Newton steps, the root is located by the sign of ``G``).
    """
    p = torch.softmax(z * b, dim=1)
    mean_z = torch.linalg.vecdot(p, z)
    var_z = torch.linalg.vecdot(p, z2) - mean_z**2
    return float((mean_z - z_y).mean()), float(var_z.clamp(min=0).mean())


def _fit_nll(z, labels, t_min, t_max, max_iter: int = 100, tol: float = 1e-10, t0: float | None = None):
    # G is increasing in b = 1/T. Bracket: G(b_lo) < 0 < G(b_hi), with b_lo = 1/t_max, b_hi = 1/t_min.
    b_lo, b_hi = 1 / t_max, 1 / t_min
    z2, z_y = z * z, z.gather(1, labels.view(-1, 1)).squeeze(1)
    g_lo, _ = _moments(z, z2, z_y, b_lo)
    if g_lo >= 0:
        warnings.warn(f"temperature scaling: NLL still decreases at T = {t_max}; returning the bound", stacklevel=3)
        return float(t_max), 1
    g_hi, _ = _moments(z, z2, z_y, b_hi)
    if g_hi <= 0:
        warnings.warn(f"temperature scaling: NLL still decreases at T = {t_min} (separable data?); "
                      "returning the bound", stacklevel=3)
        return float(t_min), 2
    b = 1.0 if b_lo < 1.0 < b_hi else math.sqrt(b_lo * b_hi)
    if t0 is not None and b_lo < 1 / t0 < b_hi:  # a warm start (first step from 1 / t0)
        b = 1 / t0
    for it in range(1, max_iter + 1):  # noqa: B007 - the iteration count is returned after the loop
        g, h = _moments(z, z2, z_y, b)
        if g == 0:
            break
        if g < 0:
            b_lo = b
        else:
            b_hi = b
        step = b - g / h if h > 0 else float("nan")
        if abs(step - b) <= tol * b:  # Newton has converged (a zero step lands on a bracket end)
            b = step
            break
        # Newton step when it stays strictly inside the bracket, otherwise bisect in log T.
        b_new = step if b_lo < step < b_hi else math.sqrt(b_lo * b_hi)
        if abs(b_new - b) <= tol * b or (b_hi - b_lo) <= tol * b:
            b = b_new
            break
        b = b_new
    return 1.0 / b, it


def _fit_ece_grid(z, labels, n_bins):
    # argmax does not depend on T > 0, and the top-label confidence is 1 / sum_k exp((z_k - z_max) / T).
    z_max, pred = z.max(dim=1)
    d = z - z_max[:, None]
    correct = pred == labels
    grid = torch.arange(1, 101, dtype=torch.float64) / 10
    errors = []
    for t in grid:
        conf = 1.0 / torch.exp(d / t).sum(1)
        errors.append(float(binned_errors(bin_sums(equal_width_bins(conf, n_bins), conf, correct, n_bins))["ece"]))
    best = min(range(len(grid)), key=lambda i: (errors[i], i))
    return float(grid[best]), len(grid)


def evaluate_before_after_ts(val_logits, val_labels, test_logits, test_labels, n_bins: int = 15,
                             objective: str = "nll") -> dict:
    """Fit temperature scaling on validation logits; evaluate the test predictions before and after.

    The one place where ``calibkit eval`` and the benchmark turn a run's cached logits into its
    before/after-TS metric panels (test softmax taken in float64).

    Args:
        val_logits, val_labels: (N_val, K) and (N_val,), used only to fit ``T``.
        test_logits, test_labels: (N_test, K) and (N_test,), the same K (a ``ValueError`` otherwise).
        n_bins: bins of the binned metrics and of the ``"ece"`` objective.
        objective: ``"nll"`` or ``"ece"`` (see :class:`TemperatureScaling`).

    Returns:
        ``{"temperature": T, "before": evaluate(...), "after": evaluate(...)}``.
    """
    test = upcast(check_logits(test_logits)).double()
    k_val = check_logits(val_logits, name="val_logits").shape[1]
    if test.shape[1] != k_val:  # the temperature of one classifier applied to another's logits
        raise UserError(f"val_logits have {k_val} classes but test_logits have {test.shape[1]}: both must come "
                         "from the same classifier")
    ts = TemperatureScaling(objective=objective, n_bins=n_bins).fit(val_logits, val_labels)
    return {
        "temperature": float(ts.temperature_),
        "before": evaluate(test.softmax(1), test_labels, n_bins=n_bins),
        "after": evaluate(ts.predict_proba(test), test_labels, n_bins=n_bins),
    }
