"""A preset's ``report_calibrators``: the report fits those calibrators only, with the numbers of a full report."""

import pytest
import torch

from calibkit.bench.grid import PRESETS, Preset
from calibkit.bench.presetfile import write_effective
from calibkit.report import build_report
from calibkit.report.calibrated import calibrator_names
from tests.report.test_report import make_bench

SHORT = ("histogram", "temperature")  # given out of order: the report keeps the registry's


def test_the_report_fits_the_preset_s_calibrators_only(tmp_path, one_thread):
    for d in ("short", "full"):
        make_bench(tmp_path / d, methods=("ce", "ls"), seeds=(0,))
    write_effective(Preset(name="t", dataset="fmnist", model="mlp", seeds=(0,), train={}, report_calibrators=SHORT),
                    tmp_path / "short")
    short = build_report(tmp_path / "short", n_boot=20, figures=False, width=0)
    full = build_report(tmp_path / "full", n_boot=20, figures=False, width=0)
    names = ["none", "temperature", "histogram"]
    assert {m: list(cells) for m, cells in short["grid"].items()} == {"ce": names, "ls": names}
    assert all(list(s.scores) == names for s in short["selections"].values())
    assert all(set(c["coverage"]) <= set(names) for c in short["sets"].values())
    assert "Only the preset's report_calibrators: temperature, histogram." in short["text"]
    assert "report_calibrators" not in full["text"] and list(full["grid"]["ce"]) == calibrator_names()
    # each calibrator's numbers do not depend on which others are fitted (one draw of resamples serves all)
    for m in ("ce", "ls"):
        for c in names:
            # (mean, std, n) per metric; one seed: the std is NaN, which never equals itself
            cells = [{k: v[::2] if isinstance(v, tuple) else v for k, v in rep["grid"][m][c].items()}
                     for rep in (short, full)]
            assert cells[0] == cells[1]
            a, b = short["selections"][m].scores[c], full["selections"][m].scores[c]
            assert (a.acc, a.ece, a.nll, a.brier, a.changed) == (b.acc, b.ece, b.nll, b.brier, b.changed)
            assert torch.equal(a.samples, b.samples)
            assert short["sets"][m]["size"][c] == full["sets"][m]["size"][c]


def test_calibrator_names_keep_the_registry_order_and_refuse_unknown_names():
    assert calibrator_names(SHORT) == ["none", "temperature", "histogram"]
    with pytest.raises(ValueError, match="unknown calibrator 'nope'"):
        calibrator_names(["temperature", "nope"])


def test_the_default_preset_reports_every_calibrator():
    assert PRESETS["default"].report_calibrators is None
    smoke = PRESETS["smoke"].report_calibrators
    assert smoke is not None and "temperature" in smoke
