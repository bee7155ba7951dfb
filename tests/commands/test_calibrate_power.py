"""The power line of ``calibkit calibrate``: the smallest difference from temperature scaling that the
validation split detects, checked against a hand computation from the cross-fitted resamples."""

import json
import math
from statistics import NormalDist

import numpy as np
import pytest
import torch

from calibkit.calibrators.selection import NONE, CrossFitScore, SelectionRule, choose, cross_fit
from calibkit.cli import main
from calibkit.report.posthoc import choice_power, power_text

Z = NormalDist().inv_cdf(0.975) + NormalDist().inv_cdf(0.8)  # 1.959964 + 0.841621


def _hand_se(a: torch.Tensor, b: torch.Tensor) -> float:
    d = [float(x) - float(y) for x, y in zip(a, b)]
    mean = sum(d) / len(d)
    return math.sqrt(sum((v - mean) ** 2 for v in d) / (len(d) - 1))


@pytest.mark.parametrize("select_by", ["nll", "ece"])
def test_calibrate_prints_the_power_of_its_choice(tmp_path, capsys, select_by):
    g = torch.Generator().manual_seed(3)
    z = torch.randn(700, 4, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    z = 2.5 * z
    np.savez(tmp_path / "val.npz", logits=z[:400].numpy(), labels=y[:400].numpy())
    np.savez(tmp_path / "test.npz", logits=z[400:].numpy(), labels=y[400:].numpy())
    names = ["temperature", "vector", "isotonic"]
    rc = main(["calibrate", "--val", str(tmp_path / "val.npz"), "--test", str(tmp_path / "test.npz"), "--out",
               str(tmp_path / "o"), "--n-boot", "10", "--dpi", "10", "--calibrators", ",".join(names),
               "--select-by", select_by])
    assert rc == 0
    text = capsys.readouterr().out
    sel = json.loads((tmp_path / "o" / "report" / "selection.json").read_text())
    other = sel["ranking"][1] if sel["chosen"] == "temperature" else sel["chosen"]
    scores, _ = cross_fit(z[:400], y[:400], names, SelectionRule(select_by=select_by))  # the same resamples
    se = _hand_se(scores[other].samples, scores["temperature"].samples)
    scale, digits, unit = (100, 2, " x100") if select_by == "ece" else (1, 4, "")
    line = [ln for ln in text.splitlines() if ln.startswith("- power:")]
    assert line == [f"- power: with 400 validation rows, the smallest {select_by.upper()}{unit} difference from "
                    f"temperature scaling this validation split detects (two-sided 5%, power 80%) is "
                    f"{scale * Z * se:.{digits}f} (2.80 x the bootstrap standard error {scale * se:.{digits}f} of "
                    f"the cross-fitted {other} minus temperature scaling); a smaller difference that is not "
                    "significant means too little data to tell, not no difference"]


def test_the_power_compares_the_runner_up_when_temperature_scaling_is_chosen():
    e = torch.randn(300, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    base = CrossFitScore(acc=0.9, ece=0.05, nll=0.40, brier=0.2, changed=0.0, samples=0.40 + 0.05 * e)
    ts = CrossFitScore(acc=0.9, ece=0.01, nll=0.30, brier=0.19, changed=0.0, samples=0.30 + 0.01 * e)
    vec = CrossFitScore(acc=0.9, ece=0.02, nll=0.31, brier=0.19, changed=0.0, samples=0.31 + 0.04 * e)
    sel = choose({NONE: base, "temperature": ts, "vector": vec})
    assert sel.chosen == "temperature" and sel.runner_up == "vector"
    power = choice_power(sel)
    se = _hand_se(vec.samples, ts.samples)  # 0.01 + 0.03 e
    assert power["other"] == "vector" and power["se"] == pytest.approx(se, rel=1e-12)
    assert power["detectable"] == pytest.approx(Z * se, rel=1e-12)
    assert f"is {Z * se:.4f} (2.80 x the bootstrap standard error {se:.4f} of the cross-fitted vector" in power_text(
        power, "nll", None)
    chosen = choose({NONE: base, "temperature": ts, "vector": CrossFitScore(**{**vec.__dict__, "nll": 0.2})})
    assert chosen.chosen == "vector" and choice_power(chosen)["other"] == "vector"
    assert choice_power(choose({NONE: base, "vector": vec})) is None  # no temperature scaling: no line
    assert power_text(None, "nll", 10) is None
