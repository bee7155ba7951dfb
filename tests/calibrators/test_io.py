"""save / load: file pairs, bad and missing files."""

import json

import pytest
import torch

from calibkit.calibrators import IsotonicCalibration, TemperatureScaling, load, save
from calibkit.calibrators.io import paths


def _fitted():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(200, 4, generator=g, dtype=torch.float64) * 3
    return IsotonicCalibration().fit(z, torch.multinomial(torch.softmax(z / 3, 1), 1, generator=g).squeeze(1)), z


def test_paths():
    assert [p.name for p in paths("a/cal")] == ["cal.safetensors", "cal.json"]
    assert paths("a/cal.json") == paths("a/cal.safetensors") == paths("a/cal")
    assert [p.name for p in paths("a/v1.2")] == ["v1.2.safetensors", "v1.2.json"]


def test_sidecar_describes_the_calibrator(tmp_path):
    cal, z = _fitted()
    _, js = save(cal, tmp_path / "sub" / "iso")
    meta = json.loads(js.read_text())
    assert meta["format"] == "calibkit-calibrator" and meta["calibrator"] == "isotonic"
    assert meta["params"] == {"irm": False} and meta["state"] == {"n_classes_": 4, "binary_": False}
    assert meta["tensors"] == ["knots_x_", "knots_y_", "n_knots_"]
    ts_st, ts_js = save(TemperatureScaling().fit(z, cal.predict_proba(z).argmax(1)), tmp_path / "ts")
    assert json.loads(ts_js.read_text())["tensors"] == [] and load(ts_st).temperature_ > 0


def test_bad_files(tmp_path):
    cal, z = _fitted()
    st, js = save(cal, tmp_path / "iso")
    with pytest.raises(FileNotFoundError, match="calibrator file not found: .*nope.json"):
        load(tmp_path / "nope")
    meta = json.loads(js.read_text())
    for broken, match in ((dict(meta, calibrator="platt"), "unknown calibrator 'platt'; expected one of temperature"),
                          (dict(meta, format="x"), "not a calibkit calibrator file"),
                          (dict(meta, tensors=meta["tensors"] + ["extra_"]), "lacks the tensor"),
                          (dict(meta, state={}), "saved state lacks")):
        js.write_text(json.dumps(broken))
        with pytest.raises(ValueError, match=match):
            load(js)
    js.write_text("{not json")
    with pytest.raises(ValueError, match="invalid JSON"):
        load(js)
    js.write_text(json.dumps(meta))
    st.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="cannot read the calibrator's tensors"):
        load(st)
    st.unlink()
    with pytest.raises(FileNotFoundError, match="iso.safetensors"):
        load(js)
    with pytest.raises(ValueError, match="not a registered calibrator"):
        save(object(), tmp_path / "x")
