"""AURC and AUGRC of many bootstrap resamples at once, from count vectors, without copying rows.

A resample of ``N`` test rows is its count vector ``W`` (``W_i`` = how often row ``i`` was drawn,
:func:`calibkit.bootstrap.count_draws`). Its AURC and AUGRC follow the conventions of
:mod:`calibkit.functional.selective`: rows ranked by confidence, descending, and rows of equal
confidence form one group whose rows are accepted in a uniformly random order (the expectation
over tie-breakings). A drawn row's copies have one confidence, so in the resample they are tied
with each other and with any original row of equal confidence: the resample's groups are the
original groups ``g`` with ``m_g = sum_{i in g} W_i`` rows and ``e_g = sum_{i in g} W_i err_i``
errors (a group with ``m_g = 0`` is absent).

With ``P_g`` and ``E_g`` the cumulative rows and errors up to and including group ``g`` and
``r_g = e_g / m_g``, the ``j``-th accepted row of group ``g`` brings the expected number of errors
``E_{g-1} + j r_g``, so

* ``AURC = (1/M) sum_g sum_{j=1}^{m_g} (E_{g-1} + j r_g) / (P_{g-1} + j)
  = (1/M) sum_g [E_{g-1} dH_g + r_g (m_g - P_{g-1} dH_g)]``, with ``dH_g = H(P_g) - H(P_{g-1})``,
  ``H`` the harmonic numbers and ``M = sum_i W_i``
  (``sum_j j / (P + j) = m - P sum_j 1 / (P + j)``);
* ``AUGRC = (1/M^2) sum_g [m_g E_{g-1} + e_g (m_g + 1) / 2]``.

With every ``W_i = 1`` these are :func:`calibkit.functional.selective.aurc` and ``augrc`` of the
full data (the tests check both, and the resampled values against the functions on explicitly
resampled rows). Cost: one sort of the confidences, then ``O(R N)`` per chunk of resamples.
"""

from __future__ import annotations

import torch

from calibkit.errors import UserError
from calibkit.resampling import count_draws

__all__ = ["SelectiveRows", "resampled_selective"]


class SelectiveRows:
    """The sorted groups of one model's test rows: confidences ``conf`` ``(N,)`` and 0/1 errors ``err`` ``(N,)``.

    ``aurc(W)`` and ``augrc(W)`` give the ``(R,)`` float64 values for an ``(R, N)`` count matrix
    whose columns follow the original row order (module docstring).
    """

    def __init__(self, conf, err):
        conf = torch.as_tensor(conf).detach().cpu().double().reshape(-1)
        err = torch.as_tensor(err).detach().cpu().double().reshape(-1)
        if conf.shape != err.shape or conf.numel() == 0:
            raise UserError(f"conf and err must be non-empty and of one shape, got {tuple(conf.shape)} and "
                             f"{tuple(err.shape)}")
        self.order = torch.argsort(-conf, stable=True)
        c = conf[self.order]
        new_group = torch.cat([torch.ones(1, dtype=torch.bool), c[1:] != c[:-1]])
        self.n_groups = int(new_group.sum())
        self.group = torch.cumsum(new_group.long(), 0) - 1  # group of each sorted row
        self.err = err[self.order]
        self.n = conf.numel()

    def _groups(self, W) -> tuple[torch.Tensor, torch.Tensor]:
        w = torch.as_tensor(W, dtype=torch.float64)[:, self.order]
        e = w * self.err
        if self.n_groups == self.n:  # no tied confidences: every row is its own group
            return w, e
        m = torch.zeros(w.shape[0], self.n_groups, dtype=torch.float64)
        return m.index_add_(1, self.group, w), torch.zeros_like(m).index_add_(1, self.group, e)

    def aurc(self, W) -> torch.Tensor:
        m, e = self._groups(W)
        total = m.sum(1)
        steps = 1.0 / torch.arange(1, int(total.max()) + 1, dtype=torch.float64)
        harmonic = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(steps, 0)])
        p = m.cumsum(1)  # whole numbers, exact in float64
        h = harmonic[p.long()]
        # P_{g-1} is the previous column of P (0 before the first group), so H(P_{g-1}) is h shifted:
        # one gather of the harmonic numbers instead of two, the same values
        dh = torch.empty_like(h)
        dh[:, 0] = h[:, 0]
        torch.sub(h[:, 1:], h[:, :-1], out=dh[:, 1:])
        rate = e / m.clamp(min=1)  # an absent group (m_g = 0) has e_g = 0, so its rate is 0
        # (E_{g-1} dH + rate (m - P_{g-1} dH)) summed over the groups, each product and sum in place
        # (the (R, G) temporaries were most of the time); the same operations, so the same bits
        after = p.sub_(m).mul_(dh)  # P_{g-1} dH
        after = torch.sub(m, after, out=after).mul_(rate)
        e_prev = e.cumsum(1).sub_(e)
        return e_prev.mul_(dh).add_(after).sum(1) / total

    def augrc(self, W) -> torch.Tensor:
        m, e = self._groups(W)
        total = m.sum(1)
        e_prev = e.cumsum(1) - e
        return (m * e_prev + e * (m + 1) / 2).sum(1) / total ** 2


def resampled_selective(rows: list[SelectiveRows], n_resamples: int = 1000, seed: int = 0,
                        metrics=("aurc", "augrc")) -> dict:
    """``{metric: (len(rows), R)}`` float64 tensors for ``metrics`` (``"aurc"``, ``"augrc"``): every
    model's values on the same resamples as the panel metrics' bootstrap with this ``seed``
    (:func:`calibkit.bootstrap.count_draws`); the models must share their test rows (one ``N``)."""
    if not rows or len({r.n for r in rows}) != 1:
        raise UserError("resampled_selective needs at least one model, all with the same number of test rows")
    unknown = set(metrics) - {"aurc", "augrc"}
    if unknown:
        raise UserError(f"unknown metric(s) {sorted(unknown)}; expected aurc, augrc")
    out: dict[str, list[list[torch.Tensor]]] = {m: [[] for _ in rows] for m in metrics}
    for _, W in count_draws(rows[0].n, n_resamples, seed):
        for i, r in enumerate(rows):
            for m in metrics:
                out[m][i].append(getattr(r, m)(W))
    return {k: torch.stack([torch.cat(v) for v in vals]) for k, vals in out.items()}
