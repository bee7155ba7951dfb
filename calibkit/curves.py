"""Two more views of a classifier's confidence: the smooth reliability curve and the risk-coverage curve.

**Smooth reliability curve** (the reliability diagram of smooth ECE, Blasiok & Nakkiran, ICLR
2024). Instead of bins, every point ``t`` of [0, 1] weighs each row by the Gaussian kernel
``K(t, c_i)`` of bandwidth ``s`` reflected at 0 and 1 (``c_i`` the top-label confidence), the same
kernel and the same bandwidth ``s*`` (the fixed point ``smECE_s = s``) as
:func:`calibkit.functional.smooth_ece`. At ``t`` the curve shows the kernel-weighted mean
confidence ``conf(t) = sum_i K c_i / sum_i K`` against the kernel-weighted accuracy
``acc(t) = sum_i K a_i / sum_i K`` (``a_i`` = 1 when the argmax is right), the continuous twin of
a bin's (mean confidence, accuracy); ``density(t) = sum_i K / N`` is how many rows lie near ``t``.
calibkit's choice, not the paper's plotting code: the curve is drawn as ``(t, acc(t))`` with the
width of the line following the density, and the gap ``acc - conf`` shaded. The identity
``smECE = int_0^1 density(t) |conf(t) - acc(t)| dt`` holds by construction (a test checks it
against :func:`calibkit.functional.smooth_ece`).

**Risk-coverage curve**: :func:`calibkit.functional.risk_coverage_curve` (accept the most
confident rows first; the error among the accepted rows against the share accepted), drawn with
its area (AURC) in the legend.

Both drawing functions take a matplotlib ``Axes`` or make an Agg figure, like :mod:`calibkit.plots`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from calibkit._validation import check_probs
from calibkit.functional import aurc, risk_coverage_curve, smooth_ece
from calibkit.functional.binning import top_label
from calibkit.functional.inputs import to_rows
from calibkit.plots import _new_axes

__all__ = ["SmoothCurve", "smooth_reliability_curve", "smooth_reliability_diagram", "risk_coverage_plot"]

#: Rows above this are first summed onto this many equal-width confidence cells (dense outputs).
_MAX_ROWS = 200_000


@dataclass
class SmoothCurve:
    """A smooth reliability curve on ``t`` (numpy float64 arrays of one shape).

    Attributes:
        t: the grid on [0, 1].
        confidence, accuracy: kernel-weighted mean confidence and accuracy at ``t``.
        density: ``sum_i K(t, c_i) / N`` (integrates to 1 over [0, 1]).
        sigma: the kernel's bandwidth (smooth ECE's fixed point ``s*`` unless given).
        smece: ``int density |confidence - accuracy| dt`` (trapezoid rule on ``t``).
        n: rows.
    """

    t: np.ndarray
    confidence: np.ndarray
    accuracy: np.ndarray
    density: np.ndarray
    sigma: float
    smece: float
    n: int


#: An image of the kernel lying farther than this many ``sigma`` from every point of the grid adds
#: exactly 0.0 everywhere: ``exp(-0.5 * 40**2) = exp(-800)`` is below the smallest float64 (about
#: ``exp(-745)``), so the term is skipped and the sum is the same to the last bit.
_VANISHES_AT = 40.0


def _reflected_kernel(t: np.ndarray, c: np.ndarray, sigma: float) -> np.ndarray:
    """``(len(t), len(c))``: the Gaussian of width ``sigma`` reflected at 0 and 1 (images at
    ``c + 2k`` and ``-c + 2k``, as many ``k`` as ``sigma`` needs; those that add exactly 0 to
    every entry skipped, :data:`_VANISHES_AT`)."""
    reach = math.ceil(2.5 * sigma) + 1
    out = np.zeros((len(t), len(c)))
    term = np.empty_like(out)  # each term computed in place: the same operations, no temporaries
    t_lo, t_hi = (float(t.min()), float(t.max())) if len(t) else (0.0, 0.0)
    for k in range(-reach, reach + 1):
        for image in (c + 2 * k, -c + 2 * k):
            if len(image) and max(float(image.min()) - t_hi, t_lo - float(image.max())) > _VANISHES_AT * sigma:
                continue
            np.subtract(t[:, None], image[None, :], out=term)
            np.divide(term, sigma, out=term)
            np.square(term, out=term)
            np.multiply(term, -0.5, out=term)
            np.exp(term, out=term)
            out += term
    return out / (sigma * math.sqrt(2 * math.pi))


def smooth_reliability_curve(probs, labels, sigma: float | None = None, n_points: int = 401) -> SmoothCurve:
    """The smooth reliability curve of the top label (module docstring).

    Args:
        probs: ``(N, K)`` probabilities (or binary ``(N,)``, or dense ``(N, K, ...)``); labels: integer labels.
        sigma: the kernel's bandwidth (default: smooth ECE's fixed point).
        n_points: grid points on [0, 1].
    """
    rows = to_rows(probs, labels)
    p, y = check_probs(rows.probs, rows.labels)
    if sigma is None:
        sigma = float(smooth_ece(p, y, return_sigma=True)[1])
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    conf_t, pred = top_label(p)
    conf = conf_t.double().cpu().numpy()
    correct = (pred == y).double().cpu().numpy()
    n = len(conf)
    weight = np.ones(n)
    if n > _MAX_ROWS:  # dense outputs: rows summed onto fine cells, each cell at its rows' mean confidence
        cells = np.minimum((conf * _MAX_ROWS).astype(np.int64), _MAX_ROWS - 1)
        weight = np.bincount(cells, minlength=_MAX_ROWS).astype(float)
        keep = weight > 0
        conf_sum, correct = np.bincount(cells, conf, _MAX_ROWS)[keep], np.bincount(cells, correct, _MAX_ROWS)[keep]
        weight = weight[keep]
        conf = conf_sum / weight
    t = np.linspace(0.0, 1.0, n_points)
    mass = np.zeros(n_points)
    c_sum = np.zeros(n_points)
    a_sum = np.zeros(n_points)
    for start in range(0, len(conf), 4096):  # bounded memory: (n_points, 4096) at a time
        sl = slice(start, start + 4096)
        k = _reflected_kernel(t, conf[sl], sigma)
        mass += k @ weight[sl]
        c_sum += k @ (conf[sl] * weight[sl])
        a_sum += k @ correct[sl]
    safe = np.where(mass > 0, mass, 1.0)
    confidence, accuracy = c_sum / safe, a_sum / safe
    density = mass / n
    gap = density * np.abs(confidence - accuracy)
    smece = float(np.sum((gap[1:] + gap[:-1]) / 2) * (t[1] - t[0]))
    return SmoothCurve(t, confidence, accuracy, density, float(sigma), smece, n)


def smooth_reliability_diagram(curves: dict, ax=None, title: str | None = None):
    """Smooth reliability curves (``{name: (probs, labels)}`` or ``{name: SmoothCurve}``) on one Axes.

    Each curve is ``(t, accuracy(t))`` drawn where its density is at least 1% of its peak (elsewhere
    too few rows are near ``t`` to say anything); the legend names each curve's smooth ECE and
    bandwidth. Returns the Axes.
    """
    ax = _new_axes(ax)
    ax.plot([0, 1], [0, 1], ls="--", color="0.4", lw=1, label="perfect calibration")
    for name, value in curves.items():
        curve = value if isinstance(value, SmoothCurve) else smooth_reliability_curve(*value)
        seen = curve.density >= 0.01 * curve.density.max()
        acc = np.where(seen, curve.accuracy, np.nan)
        (line,) = ax.plot(curve.t, acc, lw=1.8,
                          label=f"{name}: smECE {100 * curve.smece:.2f}% (sigma {curve.sigma:.3f})")
        ax.fill_between(curve.t, np.where(seen, curve.t, np.nan), acc, color=line.get_color(), alpha=0.12)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy (kernel-smoothed)")
    ax.set_title(title or "Smooth reliability diagram", fontsize=10)
    ax.legend(loc="upper left", fontsize=7, frameon=False)
    return ax


def risk_coverage_plot(curves: dict, ax=None, title: str | None = None):
    """Risk-coverage curves (``{name: (probs, labels)}``) on one Axes, each with its AURC in the legend."""
    ax = _new_axes(ax)
    for name, (p, y) in curves.items():
        cov, risk = (np.asarray(v, dtype=float) for v in risk_coverage_curve(p, y))
        ax.step(cov, 100 * risk, where="post", lw=1.6, label=f"{name}: AURC x100 {100 * float(aurc(p, y)):.2f}")
    ax.set_xlim(0, 1)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("coverage (share of rows accepted, most confident first)")
    ax.set_ylabel("risk: error among accepted rows (%)")
    ax.set_title(title or "Risk-coverage", fontsize=10)
    ax.legend(loc="upper left", fontsize=7, frameon=False)
    return ax
