"""The guards of the bench's methods x calibrators tables: changed predictions and zero-probability NLL rows."""

import functools

import torch

from calibkit.calibrators import CALIBRATORS, IsotonicCalibration
from calibkit.report.calibrated import ZERO_P, CalibratedProbs, calibrator_grid
from calibkit.report.tables import NLL_FLAG, calibrator_tables
from tests.report.test_verdict import _summary


def test_changed_share_and_zero_rows_against_a_direct_computation(tmp_path, monkeypatch):
    # the binning family floors its probabilities by default (no zero rows); the unfloored isotonic
    # map (floor=0, the documented opt-in) still gives some, and exercises the flag
    monkeypatch.setitem(CALIBRATORS, "isotonic", functools.partial(IsotonicCalibration, floor=0.0))
    summary = _summary(tmp_path, sharpen={"ce": 3.0}, seeds=(0, 1))
    probs = CalibratedProbs()
    grid = calibrator_grid(summary, probs)
    for name in ("temperature", "histogram", "isotonic"):
        changed, zeros = [], []
        for row in summary["ce"]["runs"]:
            t = probs.logits(row)
            base = torch.softmax(t["test_logits"].double(), 1).argmax(1)
            cal = CALIBRATORS[name]().fit(t["val_logits"], t["val_labels"].long())
            p = cal.predict_proba(t["test_logits"].double())
            changed.append(float((p.argmax(1) != base).double().mean()))
            zeros.append(int((p.gather(1, t["test_labels"].long().view(-1, 1)) < ZERO_P).sum()))
        cell = grid["ce"][name]
        assert abs(cell["changed"][0] - sum(changed) / 2) < 1e-12 and cell["zero_rows"] == max(zeros)
    assert grid["ce"]["temperature"]["changed"][0] == 0.0 and grid["ce"]["none"]["changed"][0] == 0.0
    tables = calibrator_tables(grid, chosen={"ce": "temperature"})
    assert [t.header[0] for t in tables] == ["Method (ECE)", "Method (cwECE)", "Method (NLL)", "Method (changed %)"]
    nll = dict(zip(tables[2].header[1:], tables[2].rows[0][1:]))
    for name in ("none", "temperature", "histogram", "isotonic"):
        assert nll[name].endswith(NLL_FLAG) == (grid["ce"][name]["zero_rows"] > 0)
    assert grid["ce"]["isotonic"]["zero_rows"] > 0  # the flag is exercised
    assert grid["ce"]["histogram"]["zero_rows"] == 0  # the default floor
    assert all(not t.best for t in tables) and tables[0].row_best == {(0, 2)}  # only the validation choice is marked
