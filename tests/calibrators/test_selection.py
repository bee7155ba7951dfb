"""The cross-fitted choice of a calibrator on the validation split (calibkit.calibrators.selection)."""

import dataclasses
import re

import pytest
import torch

import calibkit.functional as F
from calibkit.calibrators import CALIBRATORS, TemperatureScaling
from calibkit.calibrators.boost import OPT_IN
from calibkit.calibrators.registry import default_names
from calibkit.calibrators.selection import (
    NONE,
    CrossFitScore,
    SelectionRule,
    choose,
    cross_fit,
    folds,
    mean_scores,
    select_calibrator,
)

ECE = SelectionRule(select_by="ece")  # the ECE rule (the default rule ranks by NLL)


def _overconfident(n=2000, k=5, sharpen=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    return sharpen * z, y


def test_folds_partition_the_rows_near_equally_and_are_seeded():
    parts = folds(103, 5, seed=3)
    joined = torch.cat(parts).sort().values
    assert torch.equal(joined, torch.arange(103))
    assert sorted(len(p) for p in parts) == [20, 20, 21, 21, 21]
    assert all(torch.equal(p, p.sort().values) for p in parts)
    assert all(torch.equal(a, b) for a, b in zip(parts, folds(103, 5, seed=3)))
    assert not all(torch.equal(a, b) for a, b in zip(parts, folds(103, 5, seed=4)))
    with pytest.raises(ValueError, match="at least n_folds = 5"):
        folds(4, 5, 0)


def test_cross_fitted_scores_equal_a_direct_out_of_fold_computation():
    z, y = _overconfident()
    rule = SelectionRule(select_by="ece", n_folds=4, seed=1)
    scores, fitted = cross_fit(z, y, ["temperature"], rule)
    # independent: cold fits per fold, held-out predictions pooled
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(1))
    oof = torch.empty(len(y), z.shape[1], dtype=torch.float64)
    for held in perm.tensor_split(4):
        keep = torch.ones(len(y), dtype=torch.bool)
        keep[held] = False
        oof[held] = TemperatureScaling().fit(z[keep], y[keep]).predict_proba(z[held]).double()
    s = scores["temperature"]
    assert s.ece == pytest.approx(float(F.ece(oof, y)), abs=1e-7)
    assert s.nll == pytest.approx(float(F.nll(oof, y)), abs=1e-7)
    assert s.brier == pytest.approx(float(F.brier(oof, y)), abs=1e-7)
    assert s.acc == float(F.accuracy(torch.softmax(z, 1), y)) and s.changed == 0.0  # TS keeps every prediction
    from calibkit.bootstrap import bootstrap_ci

    direct = bootstrap_ci("ece", oof, y, n_resamples=1000, seed=1).samples
    assert torch.allclose(s.samples, direct, atol=1e-7)  # the rule's resamples: shared draws, seeded by rule.seed
    base = scores[NONE]
    assert base.ece == pytest.approx(float(F.ece(torch.softmax(z, 1), y)), abs=1e-12)
    assert list(scores) == [NONE, "temperature"]
    assert fitted["temperature"].temperature_ == pytest.approx(TemperatureScaling().fit(z, y).temperature_)


def test_overconfident_logits_choose_a_temperature_and_never_the_uncalibrated_model():
    z, y = _overconfident()
    sel = select_calibrator(z, y)
    assert sel.chosen != NONE and sel.scores[sel.chosen].ece < 0.5 * sel.scores[NONE].ece
    assert sel.ranking[0] == sel.chosen and sel.runner_up == sel.ranking[1]
    # every default calibrator is fitted and ranked or excluded; the opt-in ones only when named
    # and the stack of the smooth ones, built from their out-of-fold predictions
    assert set(sel.fitted) == {*default_names(), "stack"} == set(CALIBRATORS) - set(OPT_IN) | {"stack"}
    assert set(sel.ranking) | set(sel.excluded) == {NONE, *default_names(), "stack"}


def _scores(**kw):
    return {name: CrossFitScore(**vals) for name, vals in kw.items()}


BASE = dict(acc=0.92, ece=0.05, nll=0.37, brier=0.12, changed=0.0)


def test_a_calibrator_that_buys_ece_with_accuracy_is_never_chosen():
    # the measured CIFAR-10 DenseNet case: histogram binning had the lowest ECE and lost 5 points
    scores = _scores(none=BASE, temperature=dict(acc=0.92, ece=0.0095, nll=0.2251, brier=0.11, changed=0.0),
                     histogram=dict(acc=0.8746, ece=0.0073, nll=0.22, brier=0.13, changed=0.06))
    sel = choose(scores, ECE)
    assert sel.chosen == "temperature"
    assert "histogram" in sel.excluded and "4.54 points below" in sel.excluded["histogram"]
    # within the tolerance the same map is eligible; a larger tolerance lets it win
    assert choose(scores, SelectionRule(select_by="ece", acc_tolerance=0.05)).chosen == "histogram"


def test_the_nll_guard_applies_to_the_ece_rule_only():
    scores = _scores(none=BASE, temperature=dict(acc=0.92, ece=0.012, nll=0.30, brier=0.11, changed=0.0),
                     spline=dict(acc=0.92, ece=0.008, nll=1.12, brier=0.118, changed=0.0))
    sel = choose(scores, ECE)
    assert sel.chosen == "temperature" and sel.excluded["spline"].startswith(
        "cross-fitted NLL 1.1200 is above temperature's 0.3000 (rule: ")
    assert choose(scores, SelectionRule(select_by="nll")).chosen == "temperature"
    assert choose(scores, SelectionRule(select_by="brier")).ranking == ["temperature", "spline", NONE]


def test_the_uncalibrated_model_wins_when_nothing_helps_and_ties_keep_registry_order():
    scores = _scores(none=dict(BASE, ece=0.004), temperature=dict(BASE, ece=0.006, nll=0.36),
                     vector=dict(BASE, ece=0.006, nll=0.36))
    assert choose(scores, ECE).chosen == NONE
    tied = _scores(none=BASE, temperature=dict(BASE, ece=0.01), vector=dict(BASE, ece=0.01))
    assert choose(tied, ECE).ranking[:2] == ["temperature", "vector"]
    failed = dict(scores, dirichlet=CrossFitScore(error="needs 3 rows"))
    assert choose(failed).excluded["dirichlet"] == "fit failed: needs 3 rows"
    with pytest.raises(ValueError, match="'none'"):
        choose({"temperature": CrossFitScore(**BASE)})


def _with(score, samples):
    from dataclasses import replace

    return replace(score, samples=torch.as_tensor(samples, dtype=torch.float64))


def test_a_challenger_must_beat_temperature_scaling_significantly():
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(400, generator=g, dtype=torch.float64) * 0.002
    ts = CrossFitScore(acc=0.92, ece=0.010, nll=0.30, brier=0.11, changed=0.0)
    close = CrossFitScore(acc=0.92, ece=0.009, nll=0.29, brier=0.11, changed=0.01)
    far = CrossFitScore(acc=0.92, ece=0.004, nll=0.29, brier=0.11, changed=0.01)
    base = CrossFitScore(**BASE)
    # resampled differences: close - ts centred on -0.001 with sd 0.002 (interval holds 0); far - ts on -0.006
    scores = {NONE: _with(base, 0.05 + noise), "temperature": _with(ts, 0.010 + noise),
              "vector": _with(close, 0.009 + 2 * noise), "dirichlet": _with(far, 0.004 + 0.5 * noise)}
    sel = choose({k: scores[k] for k in (NONE, "temperature", "vector")}, ECE)
    assert sel.chosen == "temperature" and sel.default == "temperature"
    assert sel.notes["vector"].startswith("not significantly below temperature: ECE x100 difference -0.1000 [")
    assert sel.ranking == ["temperature", "vector", NONE]
    assert choose(scores, ECE).chosen == "dirichlet"  # wholly below 0: the challenger wins
    # the interval is the basic bootstrap interval of the resampled differences
    from calibkit.bootstrap import bootstrap_interval

    lo, hi = bootstrap_interval(scores["vector"].samples - scores["temperature"].samples, -0.001, 0.95, "basic")
    assert lo < 0 < hi and f"[{100 * lo:+.4f}, {100 * hi:+.4f}], the interval reaches 0" in sel.notes["vector"]


def test_the_default_falls_back_to_the_uncalibrated_model_when_temperature_fails_a_guard():
    scores = _scores(none=dict(BASE, nll=0.04, ece=0.003), temperature=dict(BASE, nll=0.041, ece=0.002),
                     vector=dict(BASE, nll=0.039, ece=0.0025))
    sel = choose(scores, ECE)
    assert sel.default == NONE and "NLL 0.0410 is above the uncalibrated model's 0.0400" in sel.excluded["temperature"]
    assert sel.chosen == "vector"  # point estimates (no resamples): below the default's ECE
    # a default not among the candidates: temperature scaling stands in, and fails the same guard here
    assert choose(scores, SelectionRule(select_by="ece", default="matrix")).default == NONE


def test_the_anchor_is_the_stack_under_nll_then_sms_then_temperature():
    assert SelectionRule().anchor == "stack" and SelectionRule().to_dict()["default"] == "stack"
    scores = _scores(none=BASE, temperature=dict(BASE, nll=0.30), sms=dict(BASE, nll=0.29), stack=dict(BASE, nll=0.28))
    assert choose(scores).default == "stack" and choose(scores).chosen == "stack"
    # the stack failing the accuracy guard: SMS stands in, then temperature scaling
    lossy = dict(scores, stack=_scores(none=BASE, stack=dict(BASE, nll=0.28, acc=BASE["acc"] - 0.006))["stack"])
    sel = choose(lossy)
    assert sel.default == "sms" and sel.chosen == "sms" and "accuracy" in sel.excluded["stack"]
    no_stack = {n: v for n, v in scores.items() if n != "stack"}  # a report that fits single maps only
    assert choose(no_stack).default == "sms" and choose(no_stack).excluded == {}
    only_ts = _scores(none=BASE, temperature=dict(BASE, nll=0.30))
    assert choose(only_ts).default == "temperature"
    assert SelectionRule().describe().startswith(
        "stack (sms then temperature scaling where stack is not fitted or fails a guard) unless another calibrator")


def test_the_anchor_is_sms_under_the_brier_score_with_temperature_standing_in():
    assert SelectionRule(default="sms").anchor == "sms" and SelectionRule(select_by="brier").anchor == "sms"
    assert SelectionRule(select_by="ece").anchor == "temperature"
    # resolved at each read: a replaced rule gets its own rule's anchor, a named default stays
    assert dataclasses.replace(SelectionRule(), select_by="ece").anchor == "temperature"
    assert dataclasses.replace(SelectionRule(default="beta"), select_by="ece").anchor == "beta"
    assert SelectionRule(default=None) == SelectionRule() and SelectionRule(default="sms").to_dict()["default"] == "sms"
    assert SelectionRule().uses_significance and not SelectionRule(significance=False).uses_significance
    sms = SelectionRule(default="sms")
    scores = _scores(none=BASE, temperature=dict(BASE, nll=0.30), sms=dict(BASE, nll=0.29))
    assert choose(scores, sms).default == "sms" and choose(scores, sms).chosen == "sms"
    # SMS losing 0.6 accuracy points in cross-fitting fails the guard: temperature scaling stands in
    lossy = _scores(none=BASE, temperature=dict(BASE, nll=0.30), sms=dict(BASE, nll=0.29, acc=BASE["acc"] - 0.006))
    sel = choose(lossy, sms)
    assert sel.default == "temperature" and sel.chosen == "temperature" and "accuracy" in sel.excluded["sms"]
    # SMS not fitted (a report fitting temperature scaling alone): temperature scaling, nothing excluded
    only_ts = _scores(none=BASE, temperature=dict(BASE, nll=0.30))
    assert choose(only_ts, sms).default == "temperature" and choose(only_ts, sms).excluded == {}
    assert choose(scores, SelectionRule(default=NONE)).default == NONE  # asked for: no stand-in


def test_mean_scores_average_name_by_name():
    a = _scores(none=BASE, temperature=dict(BASE, ece=0.01))
    b = _scores(none=dict(BASE, acc=0.90), temperature=dict(BASE, ece=0.03), vector=BASE)
    m = mean_scores([a, b])
    assert list(m) == [NONE, "temperature"]  # vector is missing from one run
    assert m[NONE].acc == pytest.approx(0.91) and m["temperature"].ece == pytest.approx(0.02)
    assert m[NONE].samples is None
    a2 = {n: _with(v, [1.0, 2.0]) for n, v in a.items()}
    b2 = {n: _with(v, [3.0, 6.0]) for n, v in b.items()}
    assert mean_scores([a2, b2])["temperature"].samples.tolist() == [2.0, 4.0]
    with pytest.raises(ValueError):
        mean_scores([])


def test_rule_checks_its_values():
    for kw, match in (({"select_by": "auroc"}, "select_by"), ({"n_folds": 1}, "n_folds"),
                      ({"acc_tolerance": -0.1}, "acc_tolerance"), ({"acc_tolerance": float("nan")}, "acc_tolerance"),
                      ({"n_bins": 0}, "n_bins")):
        with pytest.raises(ValueError, match=match):
            SelectionRule(**kw)
    assert "5-fold cross-fitted NLL" in SelectionRule().describe()
    assert "5-fold cross-fitted ECE" in ECE.describe()
    assert ECE.describe().startswith("temperature unless another calibrator")
    assert SelectionRule(default="temperature", significance=False).describe().startswith(
        "the lowest 5-fold cross-fitted NLL on the validation split among temperature and the calibrators with")
    assert SelectionRule(default="sms").describe().startswith(
        "sms (temperature scaling where sms is not fitted or fails a guard) unless another calibrator")
    for kw, match in (({"n_boot": 5}, "n_boot"), ({"level": 1.0}, "level")):
        with pytest.raises(ValueError, match=match):
            SelectionRule(**kw)
    assert "NLL" not in SelectionRule(select_by="brier").describe()


def test_binary_scores_are_cross_fitted():
    g = torch.Generator().manual_seed(2)
    s = torch.randn(1500, generator=g, dtype=torch.float64) * 2
    y = torch.bernoulli(torch.sigmoid(s), generator=g).long()
    sel = select_calibrator(3 * s, y, names=["temperature", "isotonic"])
    assert sel.chosen == "temperature"
    assert sel.scores[NONE].ece == pytest.approx(float(F.ece(torch.sigmoid(3 * s), y)), abs=1e-12)


class _Cold:
    """A registered calibrator that follows the minimal protocol (no warm start)."""

    def fit(self, logits, labels):
        self.t_ = float(TemperatureScaling().fit(logits, labels).temperature_)
        return self

    def predict_proba(self, logits):
        return torch.softmax(logits / self.t_, 1)


class _Failing:
    def fit(self, logits, labels):
        raise RuntimeError("no convergence")


def test_registered_calibrators_without_warm_start_or_failing_are_handled(monkeypatch):
    monkeypatch.setitem(CALIBRATORS, "cold", _Cold)
    monkeypatch.setitem(CALIBRATORS, "failing", _Failing)
    z, y = _overconfident(n=800)
    scores, fitted = cross_fit(z, y, ["temperature", "cold", "failing"])
    assert scores["cold"].ece == pytest.approx(scores["temperature"].ece, abs=1e-6)  # the same map, fitted cold
    assert scores["failing"].error == "no convergence" and "failing" not in fitted
    assert choose(scores).excluded["failing"] == "fit failed: no convergence"


@pytest.mark.filterwarnings("ignore:temperature scaling")  # random labels: the temperature runs to its bound
def test_square_maps_are_not_fitted_on_fewer_rows_than_classes_and_say_why():
    from calibkit.calibrators.selection import unfittable

    g = torch.Generator().manual_seed(0)
    z, y = torch.randn(12, 20, generator=g, dtype=torch.float64), torch.randint(0, 20, (12,), generator=g)
    reason = ("not fitted: 12 validation rows for K = 20 classes; its K x K map (420 parameters) cannot be fitted "
              "from fewer rows than classes")
    assert unfittable("matrix", 12, 20) == unfittable("dirichlet", 12, 20) == reason
    assert unfittable("dirichlet", 20, 20) is None and unfittable("vector", 12, 20) is None
    scores, fitted = cross_fit(z, y, ["temperature", "matrix", "dirichlet"], SelectionRule(n_folds=3, n_boot=10))
    assert sorted(fitted) == ["temperature"]
    assert scores["matrix"].error == scores["dirichlet"].error == reason
    sel = choose(scores, SelectionRule(n_folds=3, n_boot=10))
    assert sel.excluded["matrix"] == reason and sel.excluded["dirichlet"] == reason  # no "fit failed" in front
    assert "matrix" not in sel.ranking


def test_matrix_scaling_needs_a_row_per_parameter_and_dirichlet_does_not():
    """Unregularised matrix scaling is refused below K^2 + K rows (calibkit's rule, measured on the
    CIFAR-100 real outputs); Dirichlet calibration, regularised, is fitted from K rows on."""
    from calibkit.calibrators.selection import unfittable

    reason = ("not fitted: 419 validation rows for its 420 unregularised parameters (K = 20): fewer rows than "
              "parameters (calibkit's rule; dirichlet is the regularised K x K map)")
    assert unfittable("matrix", 419, 20) == reason
    assert unfittable("matrix", 420, 20) is None and unfittable("dirichlet", 20, 20) is None
    assert unfittable("sms", 20, 20) is None and unfittable("svs", 20, 20) is None  # regularised, K-sized or fewer
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 20, (100,), generator=g)
    z = torch.randn(100, 20, generator=g, dtype=torch.float64) + 3 * torch.nn.functional.one_hot(y, 20)
    scores, fitted = cross_fit(z, y, ["temperature", "matrix"], SelectionRule(n_folds=3, n_boot=10))
    assert "matrix" not in fitted and scores["matrix"].error == reason.replace("419", "100")


def test_a_printed_comparison_interval_holds_its_estimate_and_keeps_the_decision():
    """Resampled differences far below the estimate put the basic interval [2 d - q_hi, 2 d - q_lo]
    wholly above it (here about [+0.03, +0.03]); the note widens it to hold d = -0.01, so it no
    longer reads "significantly above" for a challenger whose estimate is below the default."""
    from calibkit.calibrators.crossfit import CrossFitScore
    from calibkit.calibrators.selection import _below

    e = torch.linspace(-1, 1, 200, dtype=torch.float64)
    challenger = CrossFitScore(ece=0.04, samples=0.0 + 0.001 * e)
    default = CrossFitScore(ece=0.05, samples=0.05 + 0.0 * e)
    significant, note = _below(challenger, default, ECE, "temperature")
    lo, hi = (float(v) for v in re.search(r"\[([-+0-9.]+), ([-+0-9.]+)\]", note).groups())
    est = float(re.search(r"difference ([-+0-9.]+) \[", note).group(1))
    assert est == pytest.approx(-1.0) and lo <= est <= hi  # ECE x100
    assert lo == pytest.approx(-1.0) and hi > 0 and not significant
    assert note.startswith("not significantly below temperature")
