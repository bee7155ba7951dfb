"""The bench's verdict (calibkit.report.verdict): calibrators and the method + calibrator pair chosen on validation."""

import json

import pytest
import torch

from calibkit.calibrators.selection import NONE, CrossFitScore, Selection, SelectionRule, choose, cross_fit, mean_scores
from calibkit.report.calibrated import CalibratedProbs
from calibkit.report.verdict import (
    DEFAULT_RULE,
    choose_pair,
    method_selections,
    recommendation,
    recommendation_text,
    run_scores,
    validation_table,
)
from calibkit.rundir import write_tensors


def _logits(seed, sharpen, n=1200, k=4):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    return sharpen * z, y


def _summary(tmp_path, sharpen=None, seeds=(0, 1), poison_test=False):
    """CE over-confident (logits x3), LS nearly calibrated (x1.1): every run's val and test logits on disk."""
    sharpen = sharpen or {"ce": 3.0, "ls": 1.1}
    summary = {}
    for method, s in sharpen.items():
        runs = []
        for seed in seeds:
            z, y = _logits(100 + seed, s)  # the same images per seed for every method: paired by seed
            test_z = -z[600:] if poison_test else z[600:]
            path = tmp_path / f"{method}_{seed}.safetensors"
            write_tensors(path, {"val_logits": z[:600], "val_labels": y[:600], "test_logits": test_z,
                                 "test_labels": y[600:]})
            runs.append({"run_key": f"p/{method}/{seed}", "seed": seed, "logits_path": str(path)})
        summary[method] = {"runs": runs, "seeds": list(seeds)}
    return summary


def test_method_selection_equals_the_rule_on_seed_averaged_cross_fitted_scores(tmp_path):
    summary = _summary(tmp_path)
    probs = CalibratedProbs()
    sels = method_selections(summary, probs)
    for method, entry in summary.items():
        runs = [probs.logits(r) for r in entry["runs"]]
        # the report's rule (SMS unless significantly beaten) over the report's calibrators (no stack)
        direct = choose(mean_scores([cross_fit(t["val_logits"], t["val_labels"], probs.names[1:], DEFAULT_RULE)[0]
                                     for t in runs]), DEFAULT_RULE)
        assert sels[method].chosen == direct.chosen and sels[method].ranking == direct.ranking
        assert sels[method].scores[NONE].ece == pytest.approx(direct.scores[NONE].ece, abs=1e-12)
    assert sels["ce"].chosen != NONE  # over-confident CE needs a calibrator


def test_the_recommendation_never_reads_the_test_split(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    clean, poisoned = _summary(a), _summary(b, poison_test=True)
    pa, pb = CalibratedProbs(), CalibratedProbs()
    # anchored at temperature scaling: the pair must beat CE + TS significantly on validation
    sig = SelectionRule(default="temperature", significance=True)
    ra = recommendation(clean, pa, method_selections(clean, pa, sig), sig, n_boot=50)
    rb = recommendation(poisoned, pb, method_selections(poisoned, pb, sig), sig, n_boot=50)
    assert (ra["method"], ra["calibrator"], ra["runner_up"]) == (rb["method"], rb["calibrator"], rb["runner_up"])
    assert ra["ece"]["value"] != rb["ece"]["value"]  # the test numbers did change
    # LS (x1.1) and CE (x3) are both calibrated by a temperature: nothing beats CE + TS significantly
    assert (ra["method"], ra["calibrator"], ra["default"]) == ("ce", "temperature", ("ce", "temperature"))
    assert ra["seeds"] == 2 and ra["d_ece"] is None
    assert ra["val_pair"] == rb["val_pair"] == ("ce", "temperature")  # the validation choice
    assert ra["sentence"].startswith("No training-time method beats CE + temperature scaling, on validation nor in "
                                     "the Holm-corrected confirmatory tests on test")
    text = recommendation_text(ra)
    assert text.startswith("**Use: CE + temperature**") and "Runner-up on validation" in text
    assert "Minus CE + temperature" not in text  # it is CE + TS


def test_the_sentence_follows_the_paired_test_difference():
    from calibkit.report.verdict import sentence

    rec = {"method": "mbls", "calibrator": "temperature"}
    for lo, hi, levels, words in ((-0.02, -0.01, 2, "significantly lower test ECE than CE + temperature scaling "
                                                    "(intervals cover seeds and test samples)"),
                                  (0.01, 0.02, 1, "significantly above CE + temperature scaling's (intervals cover "
                                                  "test samples only)"),
                                  (-0.01, 0.01, 1, "not distinguishable from CE + temperature scaling")):
        d = {"diff": (lo + hi) / 2, "lo": lo, "hi": hi, "levels": levels, "metric": "ece"}
        assert words in sentence(dict(rec, d_ece=d))
    assert "its best calibrator is vector" in sentence({"method": "ce", "calibrator": "vector", "d_ece": None})


ECE = SelectionRule(select_by="ece")  # the ECE rule (the default rule ranks by NLL)


def _sel(acc, nll, ece, chosen="temperature"):
    scores = {NONE: CrossFitScore(acc=acc, ece=0.08, nll=nll + 0.1, brier=0.2, changed=0.0),
              "temperature": CrossFitScore(acc=acc, ece=ece, nll=nll, brier=0.19, changed=0.0)}
    return choose(scores, ECE)


def test_the_pair_keeps_ce_accuracy_and_nll_and_must_beat_ce_significantly():
    sels = {"ce": _sel(0.90, 0.30, 0.010), "ls": _sel(0.88, 0.29, 0.004), "focal": _sel(0.897, 0.29, 0.006),
            "mbls": _sel(0.91, 0.45, 0.002)}
    # ls loses 2 points of CE's 90% (> 0.5); mbls's NLL is above CE + TS's 0.30; no resamples: point estimates
    got = choose_pair(sels, ECE)
    assert got["default"] == ("ce", "temperature") and got["pair"] == ("focal", "temperature")
    assert got["ranking"] == [("focal", "temperature"), ("ce", "temperature")]
    assert choose_pair(sels, SelectionRule(select_by="nll"))["pair"] == ("focal", "temperature")
    assert choose_pair({"ls": sels["ls"]}, ECE) is None  # no CE runs: no baseline to guard against
    # with resamples, focal's 0.4-point edge within noise of +-1 point does not displace CE + TS
    from dataclasses import replace

    g = torch.Generator().manual_seed(0)
    noise = torch.randn(300, generator=g, dtype=torch.float64) * 0.005
    for m in ("ce", "focal"):
        s = sels[m].scores
        s["temperature"] = replace(s["temperature"], samples=s["temperature"].ece + noise * (2 if m == "focal" else 1))
        s[NONE] = replace(s[NONE], samples=s[NONE].ece + noise)
    got = choose_pair(sels, ECE)
    assert got["pair"] == ("ce", "temperature")
    assert got["notes"][("focal", "temperature")].startswith(
        "not significantly below CE + temperature: ECE x100 difference ")


def test_cross_fitted_scores_are_cached_and_a_damaged_cache_is_recomputed(tmp_path):
    summary = _summary(tmp_path, sharpen={"ce": 3.0}, seeds=(0,))
    row, cache = summary["ce"]["runs"][0], tmp_path / "cache"
    first = run_scores(row, CalibratedProbs(), cache_dir=cache)
    files = list(cache.glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["temperature"]["ece"] == first["temperature"].ece
    files[0].write_text("{not json")
    again = run_scores(row, CalibratedProbs(), cache_dir=cache)
    assert again["temperature"].ece == first["temperature"].ece
    assert json.loads(files[0].read_text())["temperature"]["ece"] == first["temperature"].ece


def test_validation_table_marks_the_chosen_calibrator_and_brackets_the_excluded():
    s = choose({NONE: CrossFitScore(acc=0.9, ece=0.05, nll=0.4, brier=0.2, changed=0.0),
                "temperature": CrossFitScore(acc=0.9, ece=0.01, nll=0.3, brier=0.19, changed=0.0),
                "histogram": CrossFitScore(acc=0.8, ece=0.005, nll=0.35, brier=0.2, changed=0.1)})
    t = validation_table({"ce": s})  # the default rule chooses by NLL: the table shows NLL
    assert t.header[0] == "Method (val NLL, cross-fitted)"
    assert t.rows == [["CE", "0.4000", "0.3000", "(0.3500)"]] and t.row_best == {(0, 2)} and not t.best
    assert isinstance(s, Selection)
    by_ece = choose(s.scores, SelectionRule(select_by="ece"))
    t = validation_table({"ce": by_ece})
    assert t.header[0] == "Method (val ECE x100, cross-fitted)" and t.rows == [["CE", "5.00", "1.00", "(0.50)"]]


def test_a_run_above_the_row_cap_is_cross_fitted_on_a_draw_shared_by_every_run_of_that_size(tmp_path, monkeypatch):
    from calibkit.report import verdict

    assert verdict.selection_rows(600, cap=600) is None
    rows = verdict.selection_rows(600, cap=250)
    assert rows.shape == (250,) and torch.equal(rows, rows.unique()) and 0 <= int(rows.min()) and int(rows.max()) < 600
    assert torch.equal(rows, verdict.selection_rows(600, cap=250))  # a function of the row count: runs stay paired
    assert not torch.equal(rows, verdict.selection_rows(601, cap=250)[:250])
    monkeypatch.setattr(verdict, "MAX_SELECTION_ROWS", 250)
    row = _summary(tmp_path, sharpen={"ce": 3.0}, seeds=(0,))["ce"]["runs"][0]
    got = run_scores(row, CalibratedProbs())
    t = CalibratedProbs().logits(row)
    want, _ = cross_fit(t["val_logits"][rows], t["val_labels"][rows].long())
    full, _ = cross_fit(t["val_logits"], t["val_labels"].long())
    for name in ("none", "temperature", "vector"):
        assert got[name].ece == pytest.approx(want[name].ece, abs=1e-12) and got[name].ece != full[name].ece


def test_a_recommended_pair_worse_than_ce_ts_in_another_metric_says_so():
    from calibkit.report.verdict import _trade_off

    worse_ece = {"diff": 0.0068, "lo": 0.0043, "hi": 0.0122, "metric": "ece"}
    unclear_ece = {"diff": 0.0010, "lo": -0.0020, "hi": 0.0040, "metric": "ece"}
    better_nll = {"diff": -0.0132, "lo": -0.0187, "hi": -0.0076, "metric": "nll"}
    line = _trade_off({"d_ece": worse_ece, "d_nll": better_nll}, "nll")
    assert line.startswith("- Trade-off: on test this pair is significantly worse than CE + temperature scaling "
                           "in ECE x100 +0.68 [+0.43, +1.22]")
    assert "while the choice is by NLL" in line
    assert _trade_off({"d_ece": unclear_ece, "d_nll": better_nll}, "nll") is None  # not significant: no line
    assert _trade_off({"d_ece": worse_ece, "d_nll": better_nll}, "ece") is None  # the rule's own metric: no line
    worse_nll = {"diff": 0.01, "lo": 0.002, "hi": 0.02, "metric": "nll"}
    assert "in NLL +0.0100 [+0.0020, +0.0200]" in _trade_off({"d_ece": unclear_ece, "d_nll": worse_nll}, "ece")
