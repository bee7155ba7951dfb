"""Every registered calibrator on extreme inputs: probabilities at exactly 0 or 1 in float64, huge
logits, ties, a class absent from the validation set.

The registry is looped over, so a calibrator added to it later is checked here without a new test.
Each must give finite rows that sum to 1, no NaN, no uniform row where the model was confident,
and no exact zero it made itself: an exact 0 is allowed only where the input's own softmax already
underflowed to 0 (a logit gap above ~745 in float64) and the calibrator has no ``floor``; a
calibrator with a ``floor`` > 0 gives none at all.

The iterative calibrators are run with their iteration caps lowered (``max_iter`` 10,
``cv_max_iter`` 5): on these logits the L-BFGS of vector, matrix and Dirichlet scaling runs to its
cap of 100 with long backtracking (tens of seconds to minutes each on a shared 2-core machine), and
what is checked here, finite normalised rows, must hold for every iterate, not only at convergence.
A regularisation grid (Dirichlet's ``lambdas``) is cut to its last candidate, for the same reason.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from calibkit.calibrators import CALIBRATORS


def _confident(n: int, k: int, gap: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Over-confident logits: 90% of the rows put ``gap`` on the true class, 8% put ``gap + 30`` on a
    wrong one (confidently wrong), the rest are plain noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, k, (n,), generator=g)
    z = 2 * torch.randn(n, k, generator=g, dtype=torch.float64)
    u = torch.rand(n, generator=g)
    z[torch.arange(n), y] += torch.where(u < 0.9, gap, 0.0).double()
    wrong = u > 0.92
    z[wrong, (y[wrong] + 1) % k] += gap + 30
    return z, y


def _case(name: str):
    k = 5
    if name == "exact_ones":  # gaps > 40: softmax's top entry is exactly 1.0 in float64
        z, y = _confident(300, k, 50.0, 0)
        return z, y, *_confident(150, k, 50.0, 1)
    if name == "huge_logits":  # gaps of ~1e3: exact 0.0 entries as well
        z, y = _confident(300, k, 1e3, 2)
        return z, y, *_confident(150, k, 1e3, 3)
    if name == "ties":  # duplicated rows, and rows whose logits all tie
        z, y = _confident(200, k, 8.0, 4)
        z = torch.cat([z, z, z, torch.zeros(60, k, dtype=torch.float64)])
        y = torch.cat([y, y, y, torch.arange(60) % k])
        zt, yt = _confident(200, k, 8.0, 5)
        return z, y, torch.cat([zt, torch.zeros(5, k, dtype=torch.float64)]), torch.cat([yt, torch.zeros(5).long()])
    assert name == "absent_class"  # class k - 1 never appears in the validation labels
    z, y = _confident(300, k, 6.0, 6)
    keep = y != k - 1
    zt, yt = _confident(150, k, 6.0, 7)
    return z[keep], y[keep], zt, yt


CASES = ["exact_ones", "huge_logits", "ties", "absent_class"]



def _fitted(name, z, y):
    cls = CALIBRATORS[name]
    params = cls().get_params()
    caps = {k: v for k, v in (("max_iter", 10), ("cv_max_iter", 5)) if k in params}
    if "lambdas" in params:  # one candidate of a regularisation grid: the map's form is what is checked
        caps["lambdas"] = tuple(params["lambdas"])[-1:]
    return cls(**caps).fit(z, y)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", list(CALIBRATORS))
def test_every_calibrator_survives_extreme_inputs(name, case):
    z, y, zt, _ = _case(case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = _fitted(name, z, y)
        q = cal.predict_proba(zt)
    p = torch.softmax(zt, 1)
    assert q.shape == p.shape and q.dtype == torch.float64
    assert bool(torch.isfinite(q).all()), f"{name} on {case}: NaN or inf"
    assert float((q.sum(1) - 1).abs().max()) < 1e-9
    assert bool((q >= 0).all())
    confident = p.max(1).values > 0.99
    flat = (q.max(1).values - q.min(1).values) < 1e-12
    assert not bool((flat & confident).any()), f"{name} on {case}: {int((flat & confident).sum())} uniform rows"
    if getattr(cal, "floor", 0) > 0:
        assert bool((q > 0).all()), f"{name} on {case}: {int((q == 0).sum())} exact zeros despite its floor"
    else:
        made = (q == 0) & (p > 0)
        assert not bool(made.any()), f"{name} on {case}: {int(made.sum())} exact zeros the input did not have"


def test_the_extremes_cover_what_they_claim():
    """The cases hold what their names say (else the test above would prove nothing)."""
    z, _, zt, _ = _case("exact_ones")
    assert int((torch.softmax(z, 1) == 1).sum()) > 150 and int((torch.softmax(zt, 1) == 1).sum()) > 75
    z, _, _, _ = _case("huge_logits")
    assert int((torch.softmax(z, 1) == 0).sum()) > 150
    z, y, _, _ = _case("absent_class")
    assert int((y == 4).sum()) == 0
