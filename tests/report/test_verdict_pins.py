"""Pins of the method + calibrator verdict: pair ranking, the cache key, the comparison with CE + TS
and the printed sentence (calibkit.report.verdict)."""

from dataclasses import replace

import pytest
import torch

from calibkit.calibrators.selection import NONE, CrossFitScore, SelectionRule, choose, cross_fit
from calibkit.report.calibrated import CalibratedProbs
from calibkit.report.verdict import choose_pair, recommendation, recommendation_text, run_scores
from calibkit.rundir import write_tensors

pytestmark = pytest.mark.usefixtures("one_thread")


def _sel(values: dict):
    """A method's selection from hand-made NLLs (no resamples: point estimates; the default rule)."""
    scores = {n: CrossFitScore(acc=0.9, ece=0.03, nll=v, brier=0.2, changed=0.0) for n, v in values.items()}
    return choose(scores)


def test_eligible_pairs_are_ranked_lowest_metric_first():
    sels = {"ce": _sel({NONE: 0.60, "temperature": 0.40}), "ls": _sel({NONE: 0.50, "temperature": 0.35}),
            "focal": _sel({NONE: 0.45, "temperature": 0.38}), "mbls": _sel({NONE: 0.70, "temperature": 0.30})}
    got = choose_pair(sels)
    assert got["pair"] == ("mbls", "temperature")
    assert got["ranking"] == [("mbls", "temperature"), ("ls", "temperature"), ("focal", "temperature"),
                              ("ce", "temperature"), ("focal", NONE), ("ls", NONE), ("ce", NONE), ("mbls", NONE)]
    # a tie between two pairs goes to the first method in the summary's order
    tied = {"ce": sels["ce"], "ls": _sel({NONE: 0.5, "temperature": 0.33}),
            "focal": _sel({NONE: 0.5, "temperature": 0.33})}
    assert choose_pair(tied)["ranking"][:2] == [("ls", "temperature"), ("focal", "temperature")]


def _logits(seed, n=900, k=4):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    return z, y


def _run(tmp_path, method, seed, z, y, cut=450):
    path = tmp_path / f"{method}_{seed}.safetensors"
    write_tensors(path, {"val_logits": z[:cut], "val_labels": y[:cut], "test_logits": z[cut:], "test_labels": y[cut:]})
    return {"run_key": f"p/{method}/{seed}", "seed": seed, "logits_path": str(path)}


def test_the_cache_key_holds_the_rule(tmp_path):
    z, y = _logits(0)
    row, cache = _run(tmp_path, "ce", 0, 3 * z, y), tmp_path / "cache"
    by_ece = run_scores(row, CalibratedProbs(), SelectionRule(select_by="ece", n_boot=40), cache_dir=cache)
    by_nll = run_scores(row, CalibratedProbs(), SelectionRule(n_boot=40), cache_dir=cache)
    assert len(list(cache.glob("*.json"))) == 2  # one file per rule
    direct, _ = cross_fit(3 * z[:450], y[:450], rule=SelectionRule(n_boot=40))
    for name in (NONE, "temperature"):
        assert torch.allclose(by_nll[name].samples, direct[name].samples, atol=1e-12)  # NLL resamples, not ECE's
        assert not torch.allclose(by_nll[name].samples, by_ece[name].samples)
    bins = run_scores(row, CalibratedProbs(), SelectionRule(select_by="ece", n_boot=40, n_bins=7), cache_dir=cache)
    assert len(list(cache.glob("*.json"))) == 3 and bins[NONE].ece != by_ece[NONE].ece


def test_ce_with_another_calibrator_is_still_compared_with_ce_and_temperature_scaling(tmp_path):
    summary = {}
    for m, scale in (("ce", 3.0), ("ls", 3.0)):
        runs = []
        for seed in (0, 1):
            z, y = _logits(10 + seed)
            runs.append(_run(tmp_path, m, seed, scale * z, y))
        summary[m] = {"runs": runs, "seeds": [0, 1]}
    # validation by hand: CE's own best calibrator is vector, and LS is no better
    sels = {"ce": _sel({NONE: 0.60, "temperature": 0.40, "vector": 0.30}),
            "ls": _sel({NONE: 0.60, "temperature": 0.45})}
    assert choose_pair(sels)["pair"] == ("ce", "vector")
    rec = recommendation(summary, CalibratedProbs(), sels, n_boot=60)
    assert (rec["method"], rec["calibrator"]) == ("ce", "vector")
    for metric in ("ece", "nll", "acc"):
        d = rec[f"d_{metric}"]
        assert d is not None and d["seeds"] == 2 and d["metric"] == metric  # CE + vector minus CE + TS, on test
    assert "it equals" not in rec["sentence"]
    assert rec["sentence"].startswith("No training-time method beats CE on validation nor in the Holm-corrected "
                                      "confirmatory tests on test; its best calibrator is vector (on test it is")
    text = recommendation_text(rec)
    assert "- Minus CE + temperature scaling (paired by seed, test): ECE x100" in text


def test_the_block_prints_the_rule_the_pair_was_chosen_by():
    lowest = SelectionRule(select_by="brier", n_folds=4, default="temperature", significance=False)
    rec = {"method": "ce", "calibrator": "temperature", "rule": lowest,
           "val": CrossFitScore(acc=0.9, ece=0.02, nll=0.3, brier=0.1234, changed=0.0),
           "default": ("ce", "temperature"),
           "seeds": 2, "ece": None, "nll": None, "acc": None, "d_ece": None, "runner_up": None, "sentence": "S."}
    text = recommendation_text(rec)
    assert text.startswith("**Use: CE + temperature**, chosen on the validation split (cross-fitted BRIER 0.1234).")
    assert ("How: each method's calibrator is the one with the lowest 4-fold cross-fitted validation BRIER without "
            "losing accuracy (0.5 points) (temperature on ties); the pair is the lowest such pair (CE + temperature "
            "on ties).") in text
    assert " or raising NLL" not in text and text.endswith("S.")
    ece = recommendation_text(dict(rec, rule=SelectionRule(select_by="ece")))
    assert "(cross-fitted ECE 2.00 x100)" in ece and " or raising NLL" in ece
    assert "unless another one has a significantly lower 5-fold cross-fitted validation ECE" in ece
    default = recommendation_text(dict(rec, rule=SelectionRule(default="sms"), default=("ce", "sms")))  # the report's
    assert ("How: each method's calibrator is sms (temperature scaling where sms is not fitted or fails a guard) "
            "unless another one has a significantly lower 5-fold cross-fitted validation NLL") in default


def test_a_pair_must_beat_the_default_pair_significantly_under_a_non_default_rule():
    g = torch.Generator().manual_seed(1)
    e = torch.randn(300, generator=g, dtype=torch.float64)
    rule = SelectionRule(select_by="brier", significance=True)

    def sel(brier, sd):
        s = {NONE: CrossFitScore(acc=0.9, ece=0.05, nll=0.5, brier=brier + 0.05, changed=0.0),
             "temperature": CrossFitScore(acc=0.9, ece=0.02, nll=0.4, brier=brier, changed=0.0)}
        return choose({n: replace(v, samples=v.brier + sd * e) for n, v in s.items()}, rule)

    sels = {"ce": sel(0.20, 0.01), "ls": sel(0.19, 0.05), "mbls": sel(0.17, 0.011)}
    got = choose_pair(sels, rule)
    assert got["pair"] == ("mbls", "temperature")  # -0.03 with near-shared noise: significant
    assert got["notes"][("ls", "temperature")].startswith("not significantly below CE + temperature: Brier difference")
