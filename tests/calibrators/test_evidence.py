"""Per-class evidence of the validation split (calibkit.calibrators.evidence) and its effect on the choice."""

import warnings

import pytest
import torch

import calibkit.functional as F
from calibkit.calibrators import CALIBRATORS
from calibkit.calibrators.evidence import (
    CLASS_FREE,
    MIN_ROWS_PER_CLASS,
    ClassEvidenceWarning,
    absent_classes,
    class_counts,
    name_classes,
    needs_every_class,
    thin_classes,
    thin_warning,
    unestimable,
    warn_absent,
)
from calibkit.calibrators.selection import NONE, SelectionRule, select_calibrator


def _offset(n, k, absent=(), seed=0, shift=2.5):
    """Logits with a per-class offset that one temperature cannot remove (a per-class map wins on
    validation), labels without the ``absent`` classes."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, k, (n,), generator=g)
    z = torch.randn(n, k, generator=g, dtype=torch.float64)
    z[torch.arange(n), y] += 2.0
    z = z + shift * torch.linspace(1, -1, k, dtype=torch.float64)
    keep = torch.ones(n, dtype=torch.bool)
    for c in absent:
        keep &= y != c
    return z[keep], y[keep]


def test_counts_thin_and_absent_classes_by_hand():
    y = torch.tensor([0, 0, 2, 3, 3, 3])
    assert class_counts(y, 5).tolist() == [2, 0, 1, 3, 0]
    assert thin_classes(y, 5) == [1, 2, 4]  # fewer than MIN_ROWS_PER_CLASS = 2
    assert MIN_ROWS_PER_CLASS == 2
    assert thin_classes(y, 5, minimum=3) == [0, 1, 2, 4]
    assert absent_classes(y, 5) == [1, 4]
    assert name_classes([4]) == "class 4"
    assert name_classes(list(range(12))) == "classes 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 and 2 more"
    text = thin_warning(y, 5, "val.npz")
    assert text.startswith("val.npz: classes 1, 2, 4 of K = 5 have fewer than 2") and "2 without any row" in text
    assert thin_warning(torch.tensor([0, 0, 1, 1]), 2) is None


def test_the_class_free_set_is_exactly_the_calibrators_that_keep_an_absent_class_reachable():
    """Fitted without class 4, the class-free maps still predict it on test rows the uncalibrated model
    gives it; every other calibrator warns that it may not (the rule's premise, per registered name)."""
    zv, yv = _offset(300, 5, absent=(4,), shift=0.0)
    zt, yt = _offset(300, 5, seed=1, shift=0.0)
    base = int((zt.argmax(1) == 4).sum())
    assert base > 30
    assert CLASS_FREE <= set(CALIBRATORS)
    for name, cls in CALIBRATORS.items():
        assert needs_every_class(name) == (name not in CLASS_FREE) == needs_every_class(cls)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if name in CLASS_FREE:
                pred = cls().fit(zv, yv).predict_proba(zt).argmax(1)
                assert int((pred == 4).sum()) >= base // 2, name  # class 4 stays reachable
            else:  # the per-class maps' fits without a class are slow (Dirichlet: a minute): the check alone
                warn_absent(cls(), yv, 5)
        named = [w for w in caught if issubclass(w.category, ClassEvidenceWarning)]
        assert len(named) == (name not in CLASS_FREE), name
        assert all("class 4 of K = 5" in str(w.message) for w in named)
    with pytest.warns(ClassEvidenceWarning, match="HistogramBinning fitted without a row of class 4"):
        CALIBRATORS["histogram"]().fit(zv, yv)  # the hook in Calibrator.fit


def test_unestimable_names_the_absent_classes_for_per_class_maps_only():
    y = torch.tensor([0, 1, 1, 2] * 5)
    assert unestimable("temperature", y, 4) is None
    why = unestimable("dirichlet", y, 4)
    assert why.startswith("not fitted: class 3 of K = 4 has no validation row")
    assert unestimable("dirichlet", y, 3) is None  # every class present (one row is enough to be fitted)


def test_missing_class_k5_leaves_per_class_maps_out_and_keeps_test_accuracy():
    """The reported case's shape: validation without class 4 of 5. Before the rule a per-class map won
    on validation and never predicted class 4 on test; now it is left out with its reason."""
    zv, yv = _offset(600, 5, absent=(4,))
    zt, yt = _offset(600, 5, seed=1)
    names = ["temperature", "vector", "matrix", "dirichlet", "histogram", "spline"]
    sel = select_calibrator(zv, yv, names, SelectionRule(n_boot=200))
    for n in ("vector", "matrix", "dirichlet", "histogram"):
        assert sel.excluded[n].startswith("not fitted: class 4 of K = 5 has no validation row"), n
        assert n not in sel.fitted
    assert sel.chosen in (NONE, "temperature", "spline")
    p = torch.softmax(zt, 1) if sel.chosen == NONE else sel.fitted[sel.chosen].predict_proba(zt)
    acc, acc0 = float(F.accuracy(p, yt)), float(F.accuracy(torch.softmax(zt, 1), yt))
    assert abs(acc - acc0) <= 0.005
    assert int((p.argmax(1) == 4).sum()) > 0


def test_k100_with_five_classes_absent_from_validation():
    absent = (3, 17, 40, 71, 99)
    zv, yv = _offset(1500, 100, absent=absent, seed=2)
    zt, yt = _offset(1500, 100, seed=3)
    sel = select_calibrator(zv, yv, ["temperature", "vector", "histogram"], SelectionRule(n_boot=50))
    for n in ("vector", "histogram"):
        assert sel.excluded[n].startswith("not fitted: classes 3, 17, 40, 71, 99 of K = 100 have no validation row")
    p = torch.softmax(zt, 1) if sel.chosen == NONE else sel.fitted[sel.chosen].predict_proba(zt)
    assert abs(float(F.accuracy(p, yt)) - float(F.accuracy(torch.softmax(zt, 1), yt))) <= 0.005
    for c in absent:  # every absent class stays reachable where the uncalibrated model predicts it
        if int((zt.argmax(1) == c).sum()):
            assert int((p.argmax(1) == c).sum()) > 0, c


def test_cross_fitting_leaves_the_per_class_map_unfitted_so_it_never_warns():
    zv, yv = _offset(300, 5, absent=(1,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        select_calibrator(zv, yv, ["temperature", "vector"], SelectionRule(n_boot=50))
    assert not [w for w in caught if issubclass(w.category, ClassEvidenceWarning)]  # vector is left out, unfitted
