"""Split conformal prediction sets (LAC/THR, APS, RAPS) and the metrics of set-valued predictions.

A conformal predictor turns ``(N, K)`` class probabilities into a set of classes per row that
contains the true class with probability at least ``1 - alpha``, whatever the model, as long as
the calibration rows and the test rows are exchangeable (e.g. i.i.d.). :class:`SplitConformal`
is fitted on a **calibration split**: labelled rows that were used neither to train the model nor
to fit any calibrator, and that are **never the test rows** the sets are evaluated on (scoring the
sets on the calibration rows themselves measures nothing).

**Scores.** A score ``s(x, k)`` of class ``k`` (lower = more conforming). The classes of a row are
ranked by probability, descending; **ties: lower class index first** (a stable sort), and
``r(k)`` is the **1-based** rank of class ``k``. With ``c(k)`` the sum of the probabilities of the
classes ranked strictly above ``k``, and ``u`` a number in ``[0, 1]`` drawn once per row:

* ``"lac"`` (LAC, Sadinle et al. 2019; also called THR): ``s = 1 - p_k``. No randomisation.
* ``"aps"`` (Romano et al. 2020): ``s = c(k) + u p_k``; ``u = 1`` when ``randomized=False``.
* ``"raps"`` (Angelopoulos et al. 2021): the APS score ``+ lam * max(0, r(k) - k_reg)``.

**Quantile.** With ``n`` calibration scores ``s_i = s(x_i, y_i)``, ``qhat`` is the ``m``-th
smallest of them, ``m = ceil((n + 1)(1 - alpha))`` (the ``m / n`` empirical quantile, no
interpolation). ``m > n`` (``n < (1 - alpha) / alpha``) would give ``qhat = +inf``, every set all
``K`` classes: :func:`conformal_quantile` and :meth:`SplitConformal.fit` refuse fewer than
:func:`min_calibration_rows` scores instead (calibkit's choice; the specification is silent).
``m`` is computed exactly, reading ``alpha`` as the decimal it prints as
(``alpha = 0.1`` is 1/10, so ``n = 9`` gives ``m = 9``, not 10 by rounding).

**Sets.** ``C(x) = {k : s(x, k) <= qhat}``. Then ``P(y in C(x)) >= 1 - alpha`` for an
exchangeable test row, and ``<= 1 - alpha + 1 / (n + 1)`` when the scores have no ties (the
randomised APS/RAPS scores almost surely have none). LAC's set is ``{k : p_k >= 1 - qhat}`` (as
computed: ``1 - p_k <= qhat``). The APS and RAPS scores grow with the rank, so their sets are the
top classes of the ranking; they can be empty (e.g. ``u p_1 > qhat``): calibkit does not add the
top class, which would change the coverage.

**qhat at the score's maximum.** The non-randomised APS score of a class is a cumulative sum of
probabilities, at most 1 (plus RAPS's penalty ``lam * max(0, r - k_reg)``). On a confident model
many calibration scores are exactly 1.0 (the true class's cumulative sum reaches 1 in float64),
and ``qhat`` can land on that value: a class is then in the set when its cumulative sum is
``<= 1.0``, which for the classes past the point where the sum reaches 1 depends on rounding in
the summation order, not on the model. ``fit`` then emits a :class:`QhatAtMaximumWarning` naming
the count of tied calibration scores; the randomised scores (``randomized=True``, APS or RAPS)
almost surely avoid the tie.

**Randomisation.** ``u`` is uniform on ``[0, 1)``, one per row, the same for every class of the
row, drawn by ``numpy.random.default_rng([seed, 0])`` for the calibration rows (in row order) and
``default_rng([seed, 1])`` for the rows of each :meth:`SplitConformal.predict_set` call (a fresh
generator per call, so the same rows give the same sets); pass ``u=`` to choose it.

Example:
    >>> import torch
    >>> cal = torch.softmax(torch.randn(200, 5, generator=torch.Generator().manual_seed(0)), 1)
    >>> y = cal.argmax(1)
    >>> cp = SplitConformal("lac", alpha=0.1).fit(cal, y)
    >>> cp.predict_set(cal[:2]).shape
    torch.Size([2, 5])
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
import torch

from calibkit._arrays import array_io
from calibkit._validation import as_tensor, check_labels, check_probs
from calibkit.calibrators._base import NotFittedError
from calibkit.errors import UserError

__all__ = ["QhatAtMaximumWarning", "SplitConformal", "class_scores", "conformal_quantile", "coverage", "mean_set_size",
           "min_calibration_rows", "TooFewCalibrationRows", "size_stratified_coverage", "class_conditional_coverage",
           "RAPS_LAMBDAS", "RAPS_TUNE_FRACTION"]

_SCORES = ("lac", "aps", "raps")
RAPS_LAMBDAS = (0.001, 0.01, 0.1, 0.2, 0.5)  # the lam candidates when lam is None (smallest first)
RAPS_TUNE_FRACTION = 0.2  # the part of the calibration rows that chooses k_reg / lam when not given


def _check_alpha(alpha) -> Fraction:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)) \
            or not 0 < float(alpha) < 1:
        raise UserError(f"alpha must be a number in (0, 1) (the allowed miscoverage), got {alpha!r}")
    return Fraction(str(float(alpha)))


class TooFewCalibrationRows(UserError):
    """Fewer calibration scores than :func:`min_calibration_rows`: no finite conformal threshold."""


def min_calibration_rows(alpha: float) -> int:
    """The fewest calibration scores whose conformal quantile is finite: ``ceil((1 - alpha) / alpha)``,
    the smallest ``n`` with ``ceil((n + 1)(1 - alpha)) <= n`` (9 for ``alpha = 0.1``, 19 for 0.05),
    computed exactly with ``alpha`` read as the decimal it prints as. (The specification sets no
    minimum; calibkit's choice: docs/metrics.md, "Minimum samples".)"""
    a = _check_alpha(alpha)
    return math.ceil((1 - a) / a)


def _quantile(scores, alpha: float, least: int = 1) -> float:
    """:func:`conformal_quantile` with ``+inf`` for too few scores when ``least`` is 1 (RAPS's
    tuning part, whose infinite quantile is a valid choice of ``k_reg``)."""
    a = _check_alpha(alpha)
    s = as_tensor(scores, "scores").detach().reshape(-1).double().cpu()
    n = s.numel()
    if n == 0:
        raise UserError("scores is empty: no calibration rows")
    if n < least:
        raise TooFewCalibrationRows(f"{n} calibration score(s) for alpha={float(alpha):g}: a conformal quantile "
                                    f"needs at least {least} (below it the threshold is +inf and every set holds "
                                    f"every class); give at least {least} calibration rows or raise alpha")
    if not bool(torch.isfinite(s).all()):
        raise UserError("scores contains NaN or infinite values")
    m = math.ceil((n + 1) * (1 - a))
    return math.inf if m > n else float(torch.sort(s).values[m - 1])


def conformal_quantile(scores, alpha: float) -> float:
    """``qhat``: the ``ceil((n + 1)(1 - alpha))``-th smallest of the ``n`` scores (module docstring).
    ``scores``: ``(n,)`` finite numbers, at least :func:`min_calibration_rows` of them (fewer give
    ``qhat = +inf``, sets of every class, and are refused with a ``UserError``)."""
    return _quantile(scores, alpha, min_calibration_rows(alpha))


@array_io
def class_scores(probs, score: str = "aps", u=None, k_reg: int = 0, lam: float = 0.0) -> torch.Tensor:
    """Scores ``s(x, k)`` of every class, ``(N, K)`` float64 (module docstring).

    ``probs``: ``(N, K)`` probabilities (checked). ``u``: ``(N,)`` numbers in ``[0, 1]`` (APS/RAPS;
    ``None`` = 1, the non-randomised score); ignored by ``"lac"``. ``k_reg``, ``lam``: RAPS only.
    """
    if score not in _SCORES:
        raise UserError(f"score must be one of {', '.join(map(repr, _SCORES))}, got {score!r}")
    p = check_probs(probs).detach().double()
    if score == "lac":
        return 1 - p
    n, k = p.shape
    if u is None:
        uu = torch.ones(n, dtype=torch.float64, device=p.device)
    else:
        uu = as_tensor(u, "u").detach().double().to(p.device)
        if tuple(uu.shape) != (n,):
            raise UserError(f"u must have shape ({n},) (one number per row), got {tuple(uu.shape)}")
        if not bool(((uu >= 0) & (uu <= 1)).all()):
            raise UserError("u must hold numbers in [0, 1]")
    ps, idx = torch.sort(p, dim=1, descending=True, stable=True)  # ties: lower class index first
    above = torch.cumsum(ps, 1)
    above = torch.cat([torch.zeros_like(above[:, :1]), above[:, :-1]], 1)  # c(k): strictly above
    s = above + uu[:, None] * ps
    if score == "raps":
        rank = torch.arange(1, k + 1, dtype=torch.float64, device=p.device)
        s = s + lam * torch.clamp(rank - k_reg, min=0)
    return torch.empty_like(s).scatter_(1, idx, s)


def _true_scores(probs, labels, score, u, k_reg=0, lam=0.0) -> torch.Tensor:
    return class_scores(probs, score, u, k_reg, lam).gather(1, labels[:, None]).squeeze(1)


def _true_ranks(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """1-based rank of the true class (descending probability, lower index first on ties)."""
    idx = torch.sort(p, dim=1, descending=True, stable=True).indices
    return (idx == y[:, None]).int().argmax(1) + 1


class QhatAtMaximumWarning(UserWarning):
    """``qhat`` equals the largest value of a non-randomised APS/RAPS score (module docstring)."""


def _warn_qhat_at_maximum(s: torch.Tensor, qhat: float, score: str, lam: float) -> None:
    """Warn when ``qhat`` is a maximum of the cumulative score: ``1 + lam j`` for an integer ``j >= 0``
    (``j = 0`` for APS), within 1e-9."""
    if not math.isfinite(qhat):
        return
    j = max(0, round((qhat - 1) / lam)) if lam > 0 else 0
    if abs(qhat - (1 + lam * j)) > 1e-9:
        return
    tied = int(((s - qhat).abs() <= 1e-9).sum())
    warnings.warn(f"SplitConformal: qhat = {qhat!r} is the largest value the non-randomised {score.upper()} score "
                  f"takes ({tied} of {s.numel()} calibration scores are equal to it); a class is then in the set "
                  "when its cumulative probability is <= qhat, which depends on the floating-point order of the "
                  "summation; use randomized=True (randomised APS or RAPS), or a larger alpha",
                  QhatAtMaximumWarning, stacklevel=3)


class SplitConformal:
    """Split conformal prediction sets: ``fit`` on a calibration split, ``predict_set`` on new rows.

    Args:
        score: ``"lac"``, ``"aps"`` or ``"raps"`` (module docstring).
        alpha: allowed miscoverage in ``(0, 1)``; the sets cover with probability ``>= 1 - alpha``.
        randomized: APS/RAPS draw ``u ~ U[0, 1)`` per row (default); ``False`` uses ``u = 1``. LAC
            has no randomisation and ignores it.
        k_reg, lam: RAPS only (an integer ``>= 0`` and a number ``>= 0``). When either is ``None``
            (the default), a seeded random ``floor(RAPS_TUNE_FRACTION * n)`` of the calibration
            rows (at least 1) is set aside to choose it and ``qhat`` is fitted on the **other**
            rows only (so the guarantee holds with ``n`` = those rows):
            ``k_reg`` = the ``ceil((n_t + 1)(1 - alpha))``-th smallest 1-based rank of the true
            class on the ``n_t`` tuning rows (capped at ``K``), as Angelopoulos et al. suggest;
            ``lam`` = the value of :data:`RAPS_LAMBDAS` whose sets, with ``qhat`` fitted on the
            tuning rows, have the smallest mean size on the tuning rows (with their calibration
            ``u``; ties: the smaller ``lam``). The split is a permutation drawn by
            ``numpy.random.default_rng([seed, 2])``.
        seed: seeds ``u`` and the RAPS tuning split (module docstring).

    Attributes (after ``fit``):
        ``qhat_``: the threshold (a float, ``+inf`` possible). ``n_classes_``: ``K``.
        ``n_calib_``: the rows ``qhat_`` was fitted on. ``n_tune_``: the RAPS tuning rows (0
        otherwise). ``k_reg_``, ``lam_``: the RAPS parameters used (``None`` for LAC/APS).
    """

    def __init__(self, score: str = "aps", alpha: float = 0.1, randomized: bool = True,
                 k_reg: int | None = None, lam: float | None = None, seed: int = 0):
        self.score = score
        self.alpha = alpha
        self.randomized = randomized
        self.k_reg = k_reg
        self.lam = lam
        self.seed = seed

    def __repr__(self) -> str:
        fitted = f", qhat_={self.qhat_!r}" if hasattr(self, "qhat_") else ""
        return (f"SplitConformal(score={self.score!r}, alpha={self.alpha!r}, randomized={self.randomized!r}, "
                f"k_reg={self.k_reg!r}, lam={self.lam!r}, seed={self.seed!r}{fitted})")

    def _check_params(self) -> None:
        if self.score not in _SCORES:
            raise UserError(f"score must be one of {', '.join(map(repr, _SCORES))}, got {self.score!r}")
        _check_alpha(self.alpha)
        if not isinstance(self.randomized, bool):
            raise UserError(f"randomized must be True or False, got {self.randomized!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise UserError(f"seed must be an integer >= 0, got {self.seed!r}")
        if self.score != "raps" and (self.k_reg is not None or self.lam is not None):
            raise UserError(f"k_reg and lam apply to score='raps' only (score={self.score!r})")
        if self.k_reg is not None and (isinstance(self.k_reg, bool) or not isinstance(self.k_reg, (int, np.integer))
                                       or self.k_reg < 0):
            raise UserError(f"k_reg must be an integer >= 0 or None, got {self.k_reg!r}")
        if self.lam is not None and (isinstance(self.lam, bool) or not isinstance(self.lam, (int, float, np.integer,
                                                                                              np.floating))
                                     or not 0 <= float(self.lam) < math.inf):
            raise UserError(f"lam must be a finite number >= 0 or None, got {self.lam!r}")

    def _u(self, n: int, stream: int) -> torch.Tensor | None:
        if self.score == "lac" or not self.randomized:
            return None
        return torch.from_numpy(np.random.default_rng([int(self.seed), stream]).random(n))

    def fit(self, probs, labels) -> SplitConformal:
        """Fit ``qhat_`` on the calibration split: ``(N, K)`` probabilities and ``(N,)`` labels in
        ``[0, K)`` (never the rows the sets will be evaluated on). Returns ``self``."""
        self._check_params()
        p, y = check_probs(probs, labels)
        p, y = p.detach().double(), y.to(p.device)
        n, k = p.shape
        u = self._u(n, 0)
        self.k_reg_ = self.lam_ = None
        self.n_tune_ = 0
        if self.score == "raps":
            k_reg, lam = self.k_reg, self.lam
            if k_reg is None or lam is None:
                n_t = max(1, math.floor(RAPS_TUNE_FRACTION * n))
                if n - n_t < 1:
                    raise UserError(f"RAPS with k_reg or lam None needs >= 2 calibration rows (a tuning part "
                                     f"and the rest), got {n}; or pass k_reg and lam")
                perm = torch.from_numpy(np.random.default_rng([int(self.seed), 2]).permutation(n)).to(p.device)
                tune, rest = perm[:n_t], perm[n_t:]
                ut = None if u is None else u[tune.cpu()]
                if k_reg is None:
                    q = _quantile(_true_ranks(p[tune], y[tune]).double(), self.alpha)
                    k_reg = k if q == math.inf else min(k, int(q))
                if lam is None:
                    best = None
                    for cand in RAPS_LAMBDAS:
                        sc = class_scores(p[tune], "raps", ut, k_reg, cand)
                        q = _quantile(sc.gather(1, y[tune][:, None]).squeeze(1), self.alpha)
                        size = float((sc <= q).sum(1).double().mean())
                        if best is None or size < best[0]:
                            best = (size, cand)
                    assert best is not None  # RAPS_LAMBDAS is not empty
                    lam = best[1]
                p, y, u = p[rest], y[rest], None if u is None else u[rest.cpu()]
                self.n_tune_ = n_t
            self.k_reg_, self.lam_ = int(k_reg), float(lam)
        s = _true_scores(p, y, self.score, u, self.k_reg_ or 0, self.lam_ or 0.0)
        self.qhat_ = conformal_quantile(s, self.alpha)
        if self.score != "lac" and not self.randomized:
            _warn_qhat_at_maximum(s, self.qhat_, self.score, self.lam_ or 0.0)
        self.n_calib_ = int(s.numel())
        self.n_classes_ = int(k)
        return self

    @array_io
    def predict_set(self, probs, u=None) -> torch.Tensor:
        """Prediction sets, an ``(N, K)`` boolean mask: ``sets[i, k]`` is class ``k`` in row ``i``'s set.

        ``u``: ``(N,)`` numbers in ``[0, 1]`` for the randomised APS/RAPS (default: drawn from
        ``default_rng([seed, 1])``, one per row); refused when the scores are not randomised.
        """
        if not hasattr(self, "qhat_"):
            raise NotFittedError("this SplitConformal is not fitted yet: call fit(probs, labels) on a calibration "
                                 "split first")
        p = check_probs(probs)
        if p.shape[1] != self.n_classes_:
            raise UserError(f"probs have K = {p.shape[1]} classes but this SplitConformal was fitted on "
                             f"K = {self.n_classes_}")
        if u is not None and (self.score == "lac" or not self.randomized):
            raise UserError("u is for the randomised APS/RAPS scores only (score='aps'/'raps', randomized=True)")
        if u is None:
            u = self._u(p.shape[0], 1)
        return class_scores(p, self.score, u, self.k_reg_ or 0, self.lam_ or 0.0) <= self.qhat_


def _sets(sets, labels=None):
    s = as_tensor(sets, "sets")
    if s.dim() != 2 or s.dtype != torch.bool:
        raise UserError(f"sets must be an (N, K) boolean mask, got shape {tuple(s.shape)} and dtype {s.dtype}")
    if s.shape[0] == 0:
        raise UserError("sets is empty (N = 0)")
    if labels is None:
        return s
    return s, check_labels(labels, s.shape[1], s.shape[0]).to(s.device)


def _out(value, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(value, dtype=torch.float64, device=like.device)


@array_io
def coverage(sets, labels) -> torch.Tensor:
    """Fraction of rows whose set contains the label, a 0-dim float64 tensor.
    ``sets``: ``(N, K)`` boolean mask; ``labels``: ``(N,)`` in ``[0, K)``."""
    s, y = _sets(sets, labels)
    return _out(s.gather(1, y[:, None]).double().mean(), s)


@array_io
def mean_set_size(sets) -> torch.Tensor:
    """Mean number of classes per set, a 0-dim float64 tensor."""
    s = _sets(sets)
    return _out(s.sum(1).double().mean(), s)


@array_io
def size_stratified_coverage(sets, labels, alpha: float, bins=None) -> dict:
    """Coverage per set-size bin and the size-stratified coverage violation (SSCV).

    ``SSCV = max_b |coverage_b - (1 - alpha)|`` over the non-empty bins ``b`` (Angelopoulos et
    al. 2021). ``bins``: ``None`` (default) = one bin per size ``0, 1, ..., K``; or a sequence of
    inclusive ``(lo, hi)`` size ranges, disjoint, that must hold every observed size (e.g. the
    paper's ImageNet bins ``((0, 1), (2, 3), (4, 10), (11, 100), (101, 1000))``).

    Returns ``{"bins": [(lo, hi), ...], "count": (B,) int64, "coverage": (B,) float64 (NaN for
    an empty bin), "sscv": 0-dim float64}``.
    """
    a = float(_check_alpha(alpha))
    s, y = _sets(sets, labels)
    size = s.sum(1).cpu()
    hit = s.gather(1, y[:, None]).squeeze(1).double().cpu()
    if bins is None:
        bins = [(j, j) for j in range(s.shape[1] + 1)]
    else:
        try:
            bins = [(int(lo), int(hi)) for lo, hi in bins]
        except (TypeError, ValueError) as exc:
            raise UserError(f"bins must be a sequence of (lo, hi) integer pairs, got {bins!r}") from exc
        ordered = sorted(bins)
        if not bins or any(lo > hi for lo, hi in bins) or any(b[0] <= a_[1] for a_, b in zip(ordered, ordered[1:])):
            raise UserError(f"bins must be non-empty, disjoint (lo, hi) ranges with lo <= hi, got {bins!r}")
    member = torch.stack([(size >= lo) & (size <= hi) for lo, hi in bins], 1)  # (N, B)
    if not bool(member.any(1).all()):
        missing = sorted(set(size[~member.any(1)].tolist()))
        raise UserError(f"set sizes {missing} fall in no bin of {bins}")
    count = member.sum(0)
    cov = (member.double() * hit[:, None]).sum(0) / count.double()  # NaN where count = 0
    worst = (cov[count > 0] - (1 - a)).abs().max()
    return {"bins": bins, "count": count.to(s.device), "coverage": cov.to(s.device), "sscv": _out(worst, s)}


@array_io
def class_conditional_coverage(sets, labels, n_classes: int) -> torch.Tensor:
    """Coverage among the rows of each true class, ``(n_classes,)`` float64 (NaN for a class with no
    row). ``n_classes`` must equal the sets' ``K``."""
    s, y = _sets(sets, labels)
    if isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer)) or n_classes != s.shape[1]:
        raise UserError(f"n_classes must be the sets' number of columns K = {s.shape[1]}, got {n_classes!r}")
    hit = s.gather(1, y[:, None]).squeeze(1).double()
    num = torch.zeros(n_classes, dtype=torch.float64, device=s.device).index_add_(0, y, hit)
    den = torch.zeros(n_classes, dtype=torch.float64, device=s.device).index_add_(0, y, torch.ones_like(hit))
    return num / den
