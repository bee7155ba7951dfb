"""One-vs-rest sigmoid maps fitted by logistic regression: Platt scaling (Platt, 1999) and beta
calibration (Kull, Silva Filho and Flach, 2017).

Both fit, for each class ``k``, a binary logistic regression of ``1[y = k]`` on features of that
class's score, **without regularisation** (the maximum-likelihood fit, as scikit-learn's
``LogisticRegression(penalty=None)``), with **hard 0/1 targets** (Platt's smoothed targets
``(N+ + 1) / (N+ + 2)`` and ``1 / (N- + 2)`` are not used: they are a prior for tiny sets, worth
less than 0.02% of a target at 5,000 rows, and hard targets keep the objective the NLL of every
other calibkit calibrator). Prediction: ``q_k = sigmoid(eta_k)``, rows renormalised to sum to 1
(a row of zeros would become uniform).

**Two classes** (binary ``(N,)`` scores, or ``(N, 2)`` logits): one regression, on class 1, and
``q = (1 - q_1, q_1)``; the class-0 regression of one-vs-rest would be its mirror image.

All ``G`` regressions (``G = K``, or 1 for two classes) are fitted at once by Newton's method
(:func:`fit_logistic`): ``O(N G P^2)`` per iteration for ``P`` features, no Python loop over
classes. On separable data (a class's score orders its rows perfectly) the likelihood has no
maximum; the fit then stops after ``max_iter`` iterations with large coefficients.
"""

from __future__ import annotations

import torch

from calibkit.calibrators._base import Calibrator
from calibkit.calibrators._state import state_names
from calibkit.errors import UserError

__all__ = ["PlattScaling", "BetaCalibration", "fit_logistic", "ovr_logits", "log_probs"]


def log_probs(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-probabilities and log-complements of the softmax, finite and accurate near 0 and 1.

    Returns ``(log p, log(1 - p))`` of ``p = softmax(z)``, each ``(N, K)``.

    ``1 - p_k`` is summed from the other classes' terms (for the largest class, without it), so
    no cancellation: ``log(1 - p)`` of a class with ``p = 1 - 1e-20`` is about ``-46``, not ``-inf``.
    """
    m = z.max(1, keepdim=True).values
    e = torch.exp(z - m)
    top = z.argmax(1, keepdim=True)
    others_of_top = e.scatter(1, top, 0.0).sum(1, keepdim=True)
    total = others_of_top + e.gather(1, top)
    rest = (total - e).scatter(1, top, others_of_top)
    tiny = torch.finfo(z.dtype).tiny
    lse = m + torch.log(total)
    return z - lse, torch.log(rest.clamp(min=tiny)) + m - lse


def ovr_logits(z: torch.Tensor) -> torch.Tensor:
    """The one-vs-rest logit of every class of the softmax, ``(N, K)``.

    ``logit(p_k) = log(p_k / (1 - p_k))`` of ``p = softmax(z)``; for the two-class logits
    ``(0, z)`` of a binary score, column 1 is ``z`` itself."""
    log_p, log_q = log_probs(z)
    return log_p - log_q


def _eta(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x * w[:, :, None]).sum(1)  # (G, N)


def _loss(eta: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return (torch.nn.functional.softplus(eta) - t * eta).mean(1)


def fit_logistic(x: torch.Tensor, t: torch.Tensor, mask: torch.Tensor, w0: torch.Tensor, max_iter: int,
                 tol: float = 1e-10) -> tuple[torch.Tensor, int]:
    """``G`` unregularised binary logistic regressions fitted at once by Newton's method.

    Each ``w_g`` minimises ``mean_n softplus(w_g . x_g:n) - t_gn w_g . x_g:n`` (the mean NLL).

    Args:
        x: ``(G, P, N)`` features (an intercept is a row of ones); t: ``(G, N)`` 0/1 targets.
        mask: ``(G, P)`` bool, the features each regression uses (the others stay at 0).
        w0: ``(G, P)`` the start (zero where ``mask`` is False).
        max_iter: Newton iterations at most.

    Newton steps ``-H^-1 g`` per regression (``H`` plus ``1e-12 I``, so a flat direction of
    separable data stays solvable), each halved until the Armijo condition holds for that
    regression (the linear predictor moves linearly with the step, so a trial costs no product
    with ``x``; a regression whose gradient is already within ``tol`` takes no step). Stops when
    every gradient entry is at most ``tol`` or no regression's loss moves by more than ``1e-15``
    relative. Returns ``(w (G, P), iterations)``. Deterministic.
    """
    g, p, n = x.shape
    m = mask.to(x.dtype)
    w = torch.where(mask, w0, 0.0)
    eye = torch.eye(p, dtype=x.dtype, device=x.device)
    eta = _eta(x, w)
    f = _loss(eta, t)
    it = 0
    while it < max_iter:
        mu = torch.sigmoid(eta)
        grad = torch.bmm(x, (mu - t)[:, :, None]).squeeze(2) / n * m
        if float(grad.abs().max()) <= tol:
            break
        it += 1
        h = torch.bmm(x * (mu * (1 - mu))[:, None, :], x.transpose(1, 2)) / n
        h = h * m[:, :, None] * m[:, None, :] + torch.diag_embed(1 - m) + 1e-12 * eye
        d = -torch.linalg.solve(h, grad) * m
        slope = (grad * d).sum(1)
        d_eta = _eta(x, d)
        step = torch.ones(g, dtype=x.dtype, device=x.device)
        todo = grad.abs().amax(1) > tol  # converged regressions take no step
        f_new = f.clone()
        slack = 1e-15 * f.abs()  # rounding of the loss: a step that changes it by less is no increase
        for _ in range(60):
            trial = _loss(eta + step[:, None] * d_eta, t)
            ok = todo & (trial <= f + 1e-4 * step * slope + slack)
            f_new = torch.where(ok, trial, f_new)
            todo = todo & ~ok
            if not bool(todo.any()):
                break
            step = torch.where(todo, step / 2, step)
        step = torch.where(todo, 0.0, step)  # no decrease found: that regression stays put
        w = w + step[:, None] * d
        eta = eta + step[:, None] * d_eta
        moved = float(((f - f_new) / f.abs().clamp(min=1.0)).max())
        f = f_new
        if moved <= 1e-15:
            break
    return w, it


def _check_max_iter(max_iter) -> None:
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise UserError(f"max_iter must be an integer >= 1, got {max_iter!r}")


class _OneVsRestSigmoid(Calibrator):
    """What Platt and beta calibration share: the groups, the targets, the renormalisation."""

    _STATE = state_names("platt")  # beta's fields too

    def __init__(self, max_iter: int = 100):
        self.max_iter = max_iter

    def _check_params(self):
        _check_max_iter(self.max_iter)

    def _features(self, z: torch.Tensor) -> torch.Tensor:  # (G, P, N)
        raise NotImplementedError

    def _fit(self, z, y):
        k = z.shape[1]
        classes = torch.arange(1 if k == 2 else 0, k, device=z.device)
        t = (y[None, :] == classes[:, None]).to(z.dtype)
        x = self._features(z)
        self.coef_, self.n_iter_ = self._solve(x, t)

    def _solve(self, x, t):
        start = self._identity.to(x).expand(x.shape[:2])
        return fit_logistic(x, t, torch.ones(x.shape[:2], dtype=torch.bool, device=x.device), start, self.max_iter)

    def _predict(self, z):
        q = torch.sigmoid(_eta(self._features(z), self.coef_)).T
        if z.shape[1] == 2:
            return torch.cat([1 - q, q], 1)
        s = q.sum(1, keepdim=True)
        return torch.where(s > 0, q / torch.where(s > 0, s, 1.0), torch.full_like(q, 1.0 / q.shape[1]))


class PlattScaling(_OneVsRestSigmoid):
    """Platt scaling, one-vs-rest: ``q_k = sigmoid(a_k s_k + b_k)``, rows renormalised.

    The score ``s_k`` is the class's **one-vs-rest logit** ``log(p_k / (1 - p_k))`` of
    ``p = softmax(z)``. Not the raw logit ``z_k``: logits are defined only up to a per-row shift
    (``softmax(z + c) = softmax(z)``), so ``z_k`` alone does not say how likely class ``k`` is,
    and a map of it would change with the shift. Not ``log p_k``: the one-vs-rest logit is the
    score whose sigmoid is ``p_k`` itself (``a = 1, b = 0`` is the identity map, as in binary
    Platt scaling), and for a binary score ``(0, z)`` it is ``z``, so binary and multiclass
    Platt scaling are one definition. Fit: unregularised logistic regression with hard targets
    (module docstring).

    Args:
        max_iter: Newton iterations (default 100; a regression converges in about 10).

    Attributes:
        coef_: ``(G, 2)`` float64, ``(a_k, b_k)`` per class (``G = K``; 1 for two classes: class 1).
        n_iter_: Newton iterations run.
    """

    _identity = torch.tensor([1.0, 0.0])  # the start: q_k = p_k

    def _features(self, z):
        s = ovr_logits(z).T
        s = s[1:] if z.shape[1] == 2 else s
        return torch.stack([s, torch.ones_like(s)], 1)


class BetaCalibration(_OneVsRestSigmoid):
    """Beta calibration (Kull, Silva Filho and Flach, 2017), one-vs-rest:
    ``logit(q_k) = a_k ln p_k - b_k ln(1 - p_k) + c_k`` with ``p = softmax(z)``, rows renormalised.

    Fitted, as in the paper, by logistic regression on the features ``(ln p_k, -ln(1 - p_k))``
    (unregularised, hard targets; module docstring), with ``a, b >= 0`` enforced the paper's way:
    when the fit gives ``a < 0`` it is refitted without the first feature (``a = 0``); otherwise,
    when it gives ``b < 0``, without the second (``b = 0``), as the authors' ``betacal`` package
    does (``a`` checked first). ``betacal`` does not check the refit; calibkit does: where the kept
    coefficient of a refit is negative too, it is dropped as well and the map is the constant
    ``sigmoid(c)`` (the class's frequency), so ``a, b >= 0`` always holds and every map is
    non-decreasing in ``p``, as the paper requires. ``ln p`` and ``ln(1 - p)``
    are computed from the logits (:func:`log_probs`), finite even where ``p`` rounds to 0 or 1.

    Args:
        max_iter: Newton iterations per fit (default 100).

    Attributes:
        coef_: ``(G, 3)`` float64, ``(a_k, b_k, c_k)`` per class (``G = K``; 1 for two classes).
        n_iter_: Newton iterations run (both fits).
    """

    _identity = torch.tensor([1.0, 1.0, 0.0])  # the start: q_k = p_k

    def _features(self, z):
        log_p, log_q = (v.T for v in log_probs(z))
        if z.shape[1] == 2:
            log_p, log_q = log_p[1:], log_q[1:]
        return torch.stack([log_p, -log_q, torch.ones_like(log_p)], 1)

    def _solve(self, x, t):
        mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        w, it = fit_logistic(x, t, mask, self._identity.to(x).expand(x.shape[:2]), self.max_iter)
        for _ in range(2):  # drop a (or else b) where negative, refit; a second pass drops the other
            negative = w[:, :2] < 0
            drop = negative & ~(negative[:, :1] & torch.tensor([False, True], device=x.device))  # a first
            again = drop.any(1)
            if not bool(again.any()):
                break
            mask[:, :2] &= ~drop
            w2, it2 = fit_logistic(x[again], t[again], mask[again], w[again], self.max_iter)
            w = w.clone()
            w[again] = w2
            it += it2
        return w, it
