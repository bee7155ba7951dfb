"""save / load: file pairs, bad and missing files."""

import json

import pytest
import torch

from calibkit.calibrators import IsotonicCalibration, TemperatureScaling, load, save
from calibkit.calibrators._state import COMMON, FIELDS, state_names
from calibkit.calibrators.io import paths
from calibkit.calibrators.registry import CALIBRATORS


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
    assert meta["params"] == {"irm": False, "floor": 1e-6} and meta["state"] == {"n_classes_": 4, "binary_": False}
    assert meta["tensors"] == ["knots_x_", "knots_y_", "n_knots_"]
    ts_st, ts_js = save(TemperatureScaling().fit(z, cal.predict_proba(z).argmax(1)), tmp_path / "ts")
    assert json.loads(ts_js.read_text())["tensors"] == [] and load(ts_st).temperature_ > 0


def test_bad_files(tmp_path):
    cal, z = _fitted()
    st, js = save(cal, tmp_path / "iso")
    with pytest.raises(FileNotFoundError, match="calibrator file not found: .*nope.json"):
        load(tmp_path / "nope")
    meta = json.loads(js.read_text())
    for broken, match in ((dict(meta, calibrator="nope"), "unknown calibrator 'nope'; expected one of temperature"),
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


def _pair(tmp_path, name):
    from calibkit.calibrators import CALIBRATORS

    g = torch.Generator().manual_seed(0)
    z = torch.randn(300, 4, generator=g, dtype=torch.float64) * 3
    y = torch.multinomial(torch.softmax(z / 3, 1), 1, generator=g).squeeze(1)
    return save(CALIBRATORS[name]().fit(z, y), tmp_path / name)


def _tensor_edit(st, field, fn):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(st))
    tensors[field] = fn(tensors[field])
    save_file(tensors, str(st))


def _nan_at(index):
    def fn(t):
        t = t.clone()
        t[index] = float("nan")
        return t
    return fn


# (calibrator, field, edit of the saved tensor or JSON value, the message after "invalid <field>: ")
TENSOR_CASES = [
    ("matrix", "weight_", _nan_at((0, 1)), "holds 1 NaN or infinite value(s)"),
    ("dirichlet", "bias_", lambda t: t.float(), "must be a float64 tensor of shape (4,), got float32 of shape (4,)"),
    ("histogram", "edges_", lambda t: t.flip(1), "must be non-decreasing along each row"),
    ("histogram", "values_", lambda t: t + 2, "must be in [0.0, 1.0], found"),
    ("scaling_binning", "edges_", lambda t: t[:, :5].clone(),
     "must be a float64 tensor of shape (4, 14), got float64 of shape (4, 5)"),
    ("isotonic", "n_knots_", lambda t: t + 1000, "must be in [1, "),
    ("isotonic", "knots_y_", lambda t: -t - 1, "must be in [0.0, 1.0], found"),
    ("spline", "coef_", lambda t: torch.cat([t, t]),
     "must be a float64 tensor of shape (6,), got float64 of shape (12,)"),
    ("spline", "knots_x_", _nan_at((0, 3)), "holds 1 NaN or infinite value(s)"),
    ("beta", "coef_", lambda t: -t.abs() - 1, "beta calibration's a and b must be >= 0"),
    ("bbq", "knots_", lambda t: t.flip(1), "must be non-decreasing along each row"),
    ("bbq", "weights_", lambda t: t * 2, "each row must sum to 1"),
    ("sms", "weight_", _nan_at((0, 1)), "holds 1 NaN or infinite value(s)"),
]


@pytest.mark.parametrize("name,field,edit,message", TENSOR_CASES)
def test_load_refuses_an_invalid_tensor_naming_the_file_and_the_field(tmp_path, name, field, edit, message):
    st, js = _pair(tmp_path, name)
    load(js)  # valid as saved
    _tensor_edit(st, field, edit)
    with pytest.raises(ValueError) as info:
        load(js)
    assert str(info.value).startswith(f"{st}: invalid {field}: {message}")
    assert "\n" not in str(info.value)


JSON_CASES = [
    ("dirichlet", ("state", "lam_"), -1.0, "invalid lam_: must be a finite number >= 0, got -1.0"),
    ("dirichlet", ("state", "cv_nll_"), "x",
     "invalid cv_nll_: must map each 'lam,mu' to a finite held-out NLL, got 'x'"),
    ("ets", ("state", "temperature_"), [2.0], "invalid temperature_: must be a finite number > 0, got [2.0]"),
    ("vector", ("state", "n_iter_"), -3, "invalid n_iter_: must be an integer >= 0, got -3"),
    ("vector", ("state", "binary_"), "no", "invalid binary_: must be true or false, got 'no'"),
    ("vector", ("state", "n_classes_"), 1, "invalid n_classes_: must be an integer >= 2, got 1"),
    ("histogram", ("params", "n_bins"), 0, "invalid hyperparameters (n_bins must be"),
    ("vector", ("params", "max_iter"), "many",
     "invalid hyperparameters (max_iter must be an integer >= 1, got 'many')"),
    ("temperature", ("params", "t_min"), -1.0, "invalid hyperparameters (need 0 < t_min < t_max, got t_min=-1.0, "),
    ("temperature", ("params", "objective"), "mse", "invalid hyperparameters (unknown objective 'mse'"),
    ("temperature", ("state", "extra_"), 1, "unknown state field(s) extra_ (a temperature calibrator has "),
    ("vector", ("state",), [], 'invalid "state": must be a JSON object, got []'),
    ("vector", ("tensors",), "weight_", 'invalid "tensors": must be a JSON list of names, got "weight_"'),
    ("svs", ("state", "reg_"), {"intercept": -1.0, "diagonal": 0.0},
     "invalid reg_: must map intercept, diagonal to finite numbers >= 0, got "),
    ("sms", ("state", "mix_"), 1.5, "invalid mix_: must be below 1, got 1.5"),
    ("platt", ("params", "max_iter"), 0, "invalid hyperparameters (max_iter must be an integer >= 1, got 0)"),
    ("bbq", ("params", "c"), 0.5, "invalid hyperparameters (c must be >= 1"),
]


@pytest.mark.parametrize("name,where,value,message", JSON_CASES)
def test_load_refuses_an_invalid_json_field_naming_the_file_and_the_field(tmp_path, name, where, value, message):
    st, js = _pair(tmp_path, name)
    meta = json.loads(js.read_text())
    if len(where) == 1:
        meta[where[0]] = value
    else:
        meta[where[0]][where[1]] = value
    js.write_text(json.dumps(meta))
    with pytest.raises(ValueError) as info:
        load(js)
    assert str(info.value).startswith(f"{js}: {message}")


def test_load_refuses_a_tensor_the_json_does_not_list(tmp_path):
    from safetensors.torch import load_file, save_file

    st, js = _pair(tmp_path, "histogram")
    tensors = load_file(str(st))
    save_file({**tensors, "extra_": tensors["values_"].clone()}, str(st))
    with pytest.raises(ValueError) as info:
        load(js)
    assert str(info.value) == f"{st}: unknown tensor(s) extra_: histogram.json lists edges_, values_"


def test_load_refuses_binary_state_with_k_other_than_2(tmp_path):
    st, js = _pair(tmp_path, "temperature")
    meta = json.loads(js.read_text())
    meta["state"]["binary_"] = True
    js.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"invalid n_classes_: must be 2 for binary logits \(binary_ is true\), got 4"):
        load(js)


def test_each_calibrators_state_is_the_one_declared_in_fields():
    assert list(FIELDS) == list(CALIBRATORS)  # one declaration per registered calibrator, in registry order
    for name, cls in CALIBRATORS.items():
        assert cls._STATE == state_names(name) == tuple(FIELDS[name]), name
        assert all(f.endswith("_") for f in cls._STATE) and not set(cls._STATE) & set(COMMON), name
