"""The confirmatory comparisons and the power line of the bench report (calibkit.report.confirm)."""

from dataclasses import replace
from statistics import NormalDist

import pytest
import torch

from calibkit.bootstrap import bootstrap_interval
from calibkit.calibrators.selection import NONE, CrossFitScore, SelectionRule, choose
from calibkit.report.calibrated import CalibratedProbs
from calibkit.report.confirm import (
    basic_p_value,
    confirmatory,
    confirmatory_lines,
    detectable,
    holm,
    null_p_values,
    p_text,
    power_line,
    validation_power,
)
from calibkit.rundir import write_tensors

pytestmark = pytest.mark.usefixtures("one_thread")  # small tensors: threads cost more than the work


def test_holm_equals_a_hand_computation():
    # sorted 0.01, 0.03, 0.04 with m = 3: 3 x 0.01 = 0.03; 2 x 0.03 = 0.06; 1 x 0.04 = 0.04 -> max(0.06, 0.04)
    got = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": None})
    assert got["a"] == pytest.approx(0.03) and got["b"] == pytest.approx(0.06) and got["c"] == pytest.approx(0.06)
    assert got["d"] is None
    assert holm({"a": 0.5, "b": 0.7}) == {"a": 1.0, "b": 1.0}  # capped at 1
    assert holm({"x": 0.02}) == {"x": 0.02}  # one hypothesis: unadjusted


def test_the_p_value_inverts_the_basic_interval():
    g = torch.Generator().manual_seed(3)
    for centre in (-0.30, -0.12, 0.0, 0.05, 0.25):
        samples = centre + 0.1 * torch.randn(4000, generator=g, dtype=torch.float64)
        p = basic_p_value(samples, centre)
        for level in (0.8, 0.9, 0.95, 0.99):
            lo, hi = bootstrap_interval(samples, centre, level, "basic")
            excludes = hi < 0 or lo > 0
            if abs(p - (1 - level)) > 0.01:  # away from the boundary the two agree exactly
                assert excludes == (p < 1 - level), (centre, level, p, lo, hi)
    assert basic_p_value(torch.zeros(10), 0.0) == 1.0


def test_detectable_is_z_alpha_plus_z_power_standard_errors():
    z = NormalDist().inv_cdf
    assert detectable(0.01) == pytest.approx((z(0.975) + z(0.8)) * 0.01)
    assert detectable(0.01) == pytest.approx(0.0280, abs=1e-4)  # 2.80 se at 5% and 80%
    assert detectable(0.01, alpha=0.01, power=0.9) == pytest.approx((2.5758 + 1.2816) * 0.01, abs=1e-5)


def _null_p_values(n_methods, n_rows, n_boot, sim):
    return null_p_values(n_methods, n_rows, n_boot, seed=1000 + sim)


def test_the_paired_nll_bootstrap_is_the_mean_of_resampled_row_differences():
    from calibkit.metrics import paired_bootstrap_diff

    g = torch.Generator().manual_seed(0)
    a, b = torch.softmax(torch.randn(50, 3, generator=g), 1), torch.softmax(torch.randn(50, 3, generator=g), 1)
    y = torch.randint(0, 3, (50,), generator=g)
    res = paired_bootstrap_diff(a, b, y, "nll", n_resamples=100, seed=0)
    d = (-a.double().gather(1, y.view(-1, 1)).log() + b.double().gather(1, y.view(-1, 1)).log()).squeeze(1)
    assert res.estimate == pytest.approx(float(d.mean()), abs=1e-6)
    assert float(res.samples.mean()) == pytest.approx(float(d.mean()), abs=3 * float(d.std()) / 50 ** 0.5)


def test_the_family_wise_error_rate_on_null_methods_is_five_percent_within_monte_carlo_error():
    sims, rejected_holm, rejected_raw = 400, 0, 0
    for sim in range(sims):
        ps = _null_p_values(4, 200, 300, sim)
        rejected_holm += any(p <= 0.05 for p in holm(ps).values())
        rejected_raw += any(p <= 0.05 for p in ps.values())
    sd = (0.05 * 0.95 / sims) ** 0.5
    assert abs(rejected_holm / sims - 0.05) <= 3 * sd  # 0.05 +- 0.033
    # the uncorrected family errs far more often: the correction is what holds the rate
    assert rejected_raw / sims > 0.05 + 3 * sd


def _write(tmp_path, method, seed, val, test):
    path = tmp_path / f"{method}_{seed}.safetensors"
    write_tensors(path, {"val_logits": val[0], "val_labels": val[1], "test_logits": test[0], "test_labels": test[1]})
    return {"run_key": f"p/{method}/{seed}", "seed": seed, "logits_path": str(path)}


def _bench(tmp_path, seeds=(0, 1)):
    """CE's logits are the truth plus noise (after any temperature, a worse NLL); LS's are the truth."""
    summary = {"ce": {"runs": [], "seeds": list(seeds)}, "ls": {"runs": [], "seeds": list(seeds)},
               "focal": {"runs": [], "seeds": list(seeds)}}
    for seed in seeds:
        g = torch.Generator().manual_seed(50 + seed)
        z = torch.randn(2200, 4, generator=g, dtype=torch.float64) * 2
        y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
        noisy = z + 1.5 * torch.randn(z.shape, generator=g, dtype=torch.float64)
        other = z + 1.5 * torch.randn(z.shape, generator=g, dtype=torch.float64)
        for m, logits in (("ce", noisy), ("ls", z), ("focal", other)):
            summary[m]["runs"].append(_write(tmp_path, m, seed, (logits[:200], y[:200]), (logits[200:], y[200:])))
    return summary


def _hand_selections(ce_nll, ls_nll, focal_nll):
    """Validation scores made by hand, without resamples: the validation choice is CE + TS."""
    def sel(nll):
        return choose({NONE: CrossFitScore(acc=0.8, ece=0.05, nll=nll + 0.2, brier=0.3, changed=0.0),
                       "temperature": CrossFitScore(acc=0.8, ece=0.02, nll=nll, brier=0.28, changed=0.0)})

    return {"ce": sel(ce_nll), "ls": sel(ls_nll), "focal": sel(focal_nll)}


def test_a_method_confirmed_better_on_test_makes_the_recommendation_say_so(tmp_path):
    from calibkit.report.verdict import choose_pair, recommendation, recommendation_text

    summary, probs = _bench(tmp_path), CalibratedProbs()
    sels = _hand_selections(0.50, 0.55, 0.56)  # on validation LS looks worse than CE: the validation pair is CE + TS
    assert choose_pair(sels)["pair"] == ("ce", "temperature")
    conf = confirmatory(summary, probs, sels, "nll", n_boot=300)
    ls, focal = conf["tests"]["ls"], conf["tests"]["focal"]
    assert ls["confirmed"] == "better" and ls["p_holm"] <= 0.05 and ls["diff"] < 0
    assert focal["confirmed"] is None  # the same noise as CE: not different
    assert (ls["p_holm"], focal["p_holm"]) == tuple(holm({"ls": ls["p"], "focal": focal["p"]}).values())
    rec = recommendation(summary, probs, sels, n_boot=300)
    assert (rec["method"], rec["calibrator"], rec["basis"]) == ("ls", "temperature", "confirmatory")
    assert rec["sentence"].startswith("LS + temperature beats CE + temperature scaling on test")
    assert "No training-time method beats" not in rec["sentence"]
    text = recommendation_text(rec)
    assert "**Use: LS + temperature**, confirmed better than CE + temperature scaling on the test split" in text
    assert "No training-time method beats" not in text and "confirmed better" in "\n".join(confirmatory_lines(conf))
    # the validation line says what validation chose, so the recommended pair is never its bare "runner-up"
    from calibkit.report.data import label

    ru_method, ru_cal = rec["runner_up"]
    assert f"- Validation's own choice: CE + temperature; runner-up there: {label(ru_method)} + {ru_cal}" in text
    assert "Runner-up on validation" not in text


def test_without_a_confirmed_method_the_block_says_nothing_beats_ce_on_either_split(tmp_path):
    from calibkit.report.verdict import recommendation

    summary, probs = _bench(tmp_path), CalibratedProbs()
    for runs in (summary["ls"]["runs"],):  # LS becomes a copy of focal's noisy model
        runs[:] = [dict(r, logits_path=f["logits_path"]) for r, f in zip(runs, summary["focal"]["runs"])]
    rec = recommendation(summary, probs, _hand_selections(0.50, 0.55, 0.56), n_boot=300)
    assert (rec["method"], rec["calibrator"], rec["basis"]) == ("ce", "temperature", "validation")
    assert not any(t["confirmed"] == "better" for t in rec["confirmatory"]["tests"].values())
    assert rec["sentence"] == ("No training-time method beats CE + temperature scaling, on validation nor in the "
                               "Holm-corrected confirmatory tests on test: train with CE and apply temperature "
                               "scaling.")


def test_the_power_line_equals_a_hand_computation():
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(500, generator=g, dtype=torch.float64)
    ce = choose({NONE: CrossFitScore(acc=0.9, ece=0.05, nll=0.40, brier=0.2, changed=0.0),
                 "temperature": CrossFitScore(acc=0.9, ece=0.01, nll=0.30, brier=0.19, changed=0.0,
                                              samples=0.30 + 0.01 * noise)})
    ls = choose({NONE: CrossFitScore(acc=0.9, ece=0.05, nll=0.40, brier=0.2, changed=0.0),
                 "temperature": CrossFitScore(acc=0.9, ece=0.01, nll=0.31, brier=0.19, changed=0.0,
                                              samples=0.31 + 0.03 * noise)})
    power = validation_power({"ce": ce, "ls": ls}, ("ce", "temperature"), ("ls", "temperature"))
    se = float((0.02 * noise).std())  # (0.31 + 0.03 e) - (0.30 + 0.01 e) = 0.01 + 0.02 e
    assert power["se"] == pytest.approx(se, rel=1e-9)
    assert power["detectable"] == pytest.approx((1.959964 + 0.841621) * se, rel=1e-5)
    rec = {"power": power, "rule": SelectionRule(), "val_rows": 500, "seeds": 2}
    line = power_line(rec)
    assert f"is {(1.959964 + 0.841621) * se:.4f} (2.80 x the bootstrap standard error {se:.4f})" in line
    assert line.startswith("- Power: with 500 validation rows and 2 seed(s), the smallest NLL difference")
    assert validation_power({"ce": ce}, ("ce", "temperature"), None) is None


@pytest.mark.parametrize("select_by", ["nll", "brier", "ece"])
def test_the_power_line_is_printed_for_every_rule(select_by):
    g = torch.Generator().manual_seed(2)
    e = torch.randn(400, generator=g, dtype=torch.float64)
    rule = SelectionRule(select_by=select_by)

    def sel(value, sd):
        scores = {NONE: CrossFitScore(acc=0.9, ece=0.06, nll=0.50, brier=0.25, changed=0.0),
                  "temperature": CrossFitScore(acc=0.9, ece=value, nll=value + 0.2 if select_by == "nll" else 0.3,
                                               brier=value + 0.1, changed=0.0)}
        scores = {n: replace(s, samples=getattr(s, select_by) + sd * e) for n, s in scores.items()}
        return choose(scores, rule)

    sels = {"ce": sel(0.020, 0.004), "ls": sel(0.021, 0.010)}
    from calibkit.report.verdict import choose_pair

    pair = choose_pair(sels, rule)
    assert pair["pair"] == ("ce", "temperature") and pair["ranking"][1] == ("ls", "temperature")
    power = validation_power(sels, pair["pair"], pair["ranking"][1])
    diffs = [0.001 + 0.006 * float(v) for v in e]  # (0.021 + 0.010 e) - (0.020 + 0.004 e)
    mean = sum(diffs) / len(diffs)
    se = (sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)) ** 0.5
    scale, digits, unit = (100, 2, " x100") if select_by == "ece" else (1, 4, "")
    line = power_line({"power": power, "rule": rule, "val_rows": 400, "seeds": 1, "runner_up": pair["ranking"][1]})
    assert line.startswith(f"- Power: with 400 validation rows and 1 seed(s), the smallest {select_by.upper()}{unit} "
                           "difference between pairs")
    assert (f"is {scale * (1.959964 + 0.841621) * se:.{digits}f} (2.80 x the bootstrap standard error "
            f"{scale * se:.{digits}f})") in line
    lone = power_line({"power": None, "rule": rule, "val_rows": 400, "seeds": 1, "runner_up": None})
    assert lone.startswith("- Power: no other pair is eligible on validation")


def test_a_zero_bootstrap_p_value_prints_the_bound_its_resamples_give():
    # one resample of 1000 at or below 2 est: the smallest nonzero p-value, 2 / 1000
    samples = torch.cat([torch.tensor([-1.0]), torch.linspace(1.5, 2.0, 999)])
    assert basic_p_value(samples, 0.5) == pytest.approx(2 / 1000)
    assert basic_p_value(samples[1:], 0.5) == 0  # none: the estimate 0 says only "below 2 / B"
    assert p_text("p", 0.0, 1000) == "p < 0.002"
    assert p_text("Holm p", 0.0, 1000, 14) == "Holm p < 0.028"  # Holm multiplies by at most 14
    assert p_text("Holm p", 0.0, 10, 14) == "Holm p < 1"
    assert p_text("p", 0.436, 1000) == "p = 0.436" and p_text("p", 0.0, None) == "p = 0"
