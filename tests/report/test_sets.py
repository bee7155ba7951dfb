"""The report's selective-prediction and conformal-set numbers (calibkit.report.sets)."""

import numpy as np
import pytest
import torch

from calibkit.calibrators import TemperatureScaling
from calibkit.conformal import SplitConformal
from calibkit.functional.selective import augrc, aurc
from calibkit.report.calibrated import CalibratedProbs
from calibkit.report.sets import (
    SetRows,
    calibrator_sets,
    calibrator_sets_table,
    conformal_rows,
    method_sets,
    split_validation,
)
from calibkit.rundir import write_tensors


def _logits(n, k=5, scale=3.0, seed=0):
    """Over-confident logits: labels drawn from softmax(z), logits scale * z."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g) * 1.5
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    return scale * z, y


def test_split_validation_halves():
    fit, cal = split_validation(11, seed=3)
    assert len(fit) == 5 and len(cal) == 6
    assert sorted(np.concatenate([fit, cal]).tolist()) == list(range(11))
    again = split_validation(11, seed=3)
    assert np.array_equal(again[0], fit) and np.array_equal(again[1], cal)
    assert not np.array_equal(split_validation(11, seed=4)[0], fit)
    with pytest.raises(ValueError, match="too few"):
        split_validation(3)


def test_conformal_rows_equal_a_direct_computation():
    vx, vy = _logits(400, seed=1)
    tx, ty = _logits(300, seed=2)
    fit, cal = (torch.as_tensor(i) for i in split_validation(400, 0))
    for name in ("none", "temperature"):
        got = conformal_rows(vx, vy, tx, ty, name, alpha=0.2, seed=0)
        if name == "none":
            pv, pt = vx[cal].double().softmax(1), tx.double().softmax(1)
        else:  # TS fitted on the first half only
            ts = TemperatureScaling().fit(vx[fit].double(), vy[fit])
            pv, pt = ts.predict_proba(vx[cal].double()), ts.predict_proba(tx.double())
        sets = SplitConformal("aps", alpha=0.2, seed=0).fit(pv, vy[cal]).predict_set(pt)
        assert torch.equal(got["size"], sets.sum(1))
        assert torch.equal(got["covered"], sets[torch.arange(300), ty])


def test_coverage_holds_on_exchangeable_data():
    """Validation and test rows drawn from one distribution: APS coverage averages about 1 - alpha,
    after a calibrator fitted on the other half too."""
    cover = []
    for seed in range(20):
        vx, vy = _logits(600, seed=100 + seed)
        tx, ty = _logits(600, seed=200 + seed)
        cover.append(float(conformal_rows(vx, vy, tx, ty, "temperature", alpha=0.1, seed=seed)["covered"]
                           .double().mean()))
    # the mean of 20 coverages of 600 rows: the guarantee is >= 0.9 in expectation; sd of the mean ~ 0.004
    assert np.mean(cover) >= 0.9 - 0.012 and np.mean(cover) <= 0.9 + 1 / 301 + 0.012


def _runs(tmp_path, methods=("ce", "ls"), seeds=(0, 1)):
    """Two methods, seeds sharing one test set: ``ls`` is ``ce`` at a lower temperature."""
    vx, vy = _logits(300, seed=7)
    tx, ty = _logits(400, seed=8)
    summary = {}
    for i, method in enumerate(methods):
        runs = []
        for s in seeds:
            g = torch.Generator().manual_seed(10 * s + i)
            noise = torch.randn(tx.shape, generator=g) * 0.3
            scale = 1.0 if method == "ce" else 0.5
            path = tmp_path / f"{method}_{s}.safetensors"
            write_tensors(path, {"val_logits": scale * (vx + noise[:300]), "val_labels": vy,
                                 "test_logits": scale * (tx + noise), "test_labels": ty})
            runs.append({"run_key": f"{method}/s{s}", "seed": s, "logits_path": str(path), "method": method})
        summary[method] = {"runs": runs, "seeds": list(seeds)}
    return summary


def test_method_sets_values_and_paired_estimates(tmp_path):
    summary = _runs(tmp_path)
    probs = CalibratedProbs()
    cells = method_sets(summary, SetRows(probs, 0.1), n_boot=200)
    assert set(cells) == {"ce", "ls"}
    ce, ls = cells["ce"], cells["ls"]
    assert ce["d_aurc"] is None and ce["d_size"] is None  # the reference itself
    from calibkit.report.calibrated import calibrator_names

    assert set(ls["size"]) == set(calibrator_names()) == set(ls["coverage"])  # every calibrator's sets
    want = np.mean([float(conformal_rows(*(probs.logits(r)[k] for k in ("val_logits", "val_labels", "test_logits",
                                                                         "test_labels")), "vector")["size"]
                          .double().mean()) for r in summary["ls"]["runs"]])
    assert ls["size"]["vector"] == pytest.approx(want)
    for c in ("none", "temperature"):
        want = np.mean([float(aurc(*probs(r, c))) for r in summary["ls"]["runs"]])
        assert ls["aurc"][c] == pytest.approx(want)
        assert ls["augrc"][c] == pytest.approx(np.mean([float(augrc(*probs(r, c))) for r in summary["ls"]["runs"]]))
    # the paired estimates are the seed means of the per-seed differences after TS
    d = np.mean([float(aurc(*probs(a, "temperature")) - aurc(*probs(b, "temperature")))
                 for a, b in zip(summary["ls"]["runs"], summary["ce"]["runs"])])
    assert ls["d_aurc"]["diff"] == pytest.approx(d)
    assert ls["d_size"]["diff"] == pytest.approx(ls["size"]["temperature"] - ce["size"]["temperature"])
    for key in ("d_aurc", "d_size"):
        assert ls[key]["lo"] <= ls[key]["diff"] <= ls[key]["hi"] and ls[key]["levels"] == 1


def test_set_rows_cache_is_used_and_damage_recomputed(tmp_path):
    summary = _runs(tmp_path, methods=("ce",), seeds=(0,))
    row = summary["ce"]["runs"][0]
    cache = tmp_path / "cache"
    first = SetRows(CalibratedProbs(), 0.1, cache).conformal(row, "temperature")
    files = list(cache.iterdir())
    assert len(files) == 1
    files[0].write_bytes(b"damaged")
    again = SetRows(CalibratedProbs(), 0.1, cache).conformal(row, "temperature")
    assert torch.equal(first["size"], again["size"]) and torch.equal(first["covered"], again["covered"])
    other_alpha = SetRows(CalibratedProbs(), 0.2, cache).conformal(row, "temperature")
    assert len(list(cache.iterdir())) == 2 and other_alpha["size"].double().mean() <= first["size"].double().mean()


def test_calibrator_sets_against_ts_and_failures():
    vx, vy = _logits(60, k=5, seed=11)
    tx, ty = _logits(200, k=5, seed=12)
    fitted = {n: c.fit(vx, vy) for n, c in (("temperature", TemperatureScaling()),)}
    probs = {"none": tx.double().softmax(1), "temperature": fitted["temperature"].predict_proba(tx.double())}
    res = calibrator_sets((vx, vy), (tx, ty), probs, alpha=0.1, n_boot=100, seed=0)
    assert res["temperature"]["d_aurc"] is None
    assert res["none"]["d_aurc"]["diff"] == pytest.approx(res["none"]["aurc"] - res["temperature"]["aurc"])
    assert res["none"]["d_size"]["diff"] == pytest.approx(res["none"]["size"] - res["temperature"]["size"])
    assert res["none"]["aurc"] == pytest.approx(float(aurc(probs["none"], ty)))
    # too few validation rows for a conformal split: no sets, named in the table, the rest reported
    small = calibrator_sets((vx[:3], vy[:3]), (tx, ty), probs, n_boot=20)
    assert small["none"]["size"] is None and "too few" in small["none"]["sets_error"]
    text = calibrator_sets_table(small, 0.1)
    assert "No sets" in text and "too few" in text


def test_calibrator_sets_binary_scores():
    g = torch.Generator().manual_seed(5)
    z = torch.randn(400, generator=g) * 2
    y = torch.bernoulli(torch.sigmoid(z), generator=g).long()
    vz, vy, tz, ty = 3 * z[:200], y[:200], 3 * z[200:], y[200:]
    ts = TemperatureScaling().fit(vz, vy)
    res = calibrator_sets((vz, vy), (tz, ty), {"none": torch.sigmoid(tz), "temperature": ts.predict_proba(tz)},
                          n_boot=50)
    for r in res.values():
        assert 1.0 <= r["size"] <= 2.0 and 0.0 <= r["coverage"] <= 1.0
