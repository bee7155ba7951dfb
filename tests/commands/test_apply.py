"""``calibkit apply``: every refusal (one line, exit 1, the input untouched, nothing written) and
float64 output computed independently."""

import json
import os

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from calibkit.calibrators import EnsembleTemperatureScaling, HistogramBinning, TemperatureScaling, VectorScaling, save
from calibkit.cli import main


def _logits(k, n=300, seed=0, binary=False):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    if binary:
        return 3 * (z[:, 1] - z[:, 0]), (y == 1).long()
    return 3 * z, y


@pytest.fixture
def ts10(tmp_path):
    z, y = _logits(10)
    st, js = save(TemperatureScaling().fit(z, y), tmp_path / "ts")
    return tmp_path, js


def _input(tmp, name, **arrays):
    path = tmp / name
    np.savez(path, **{k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in arrays.items()})
    return path


def _refused(capsys, cal, inp, out, want, same=False):
    """``apply`` refuses with exactly ``calibkit apply: error: <want>``; the input is untouched and
    (unless ``out`` is the input itself) nothing is written."""
    before = inp.read_bytes()
    rc = main(["apply", "--calibrator", str(cal), "--input", str(inp), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 1
    assert err == f"calibkit apply: error: {want}\n"
    assert inp.read_bytes() == before
    if not same:
        assert not out.exists()
    assert sorted(p.name for p in inp.parent.iterdir() if p.name.startswith(".")) == []  # no temporary file left


def test_k_mismatch_is_refused_for_temperature_scaling_and_the_others(ts10, capsys):
    tmp, js = ts10
    inp = _input(tmp, "k7.npz", logits=_logits(7)[0])
    _refused(capsys, js, inp, tmp / "o.npz",
             f"{inp} has K = 7 classes but the calibrator {js} was fitted on K = 10")
    z, y = _logits(10)
    _, vjs = save(VectorScaling().fit(z, y), tmp / "vector")
    _refused(capsys, vjs, inp, tmp / "o.npz",
             f"{inp} has K = 7 classes but the calibrator {vjs} was fitted on K = 10")


def test_binary_and_multiclass_layouts_are_refused(ts10, capsys):
    tmp, js = ts10
    zb, yb = _logits(2, binary=True)
    inp = _input(tmp, "binary.npz", logits=zb)
    _refused(capsys, js, inp, tmp / "o.npz",
             f"{inp} holds binary (N,) scores but the calibrator {js} was fitted on (N, 10) logits")
    _, bjs = save(TemperatureScaling().fit(zb, yb), tmp / "ts_binary")
    two = _input(tmp, "two.npz", logits=_logits(2)[0])
    _refused(capsys, bjs, two, tmp / "o.npz",
             f"{two} holds (N, 2) logits but the calibrator {bjs} was fitted on binary (N,) scores")


def _edit_json(js, **changes):
    meta = json.loads(js.read_text())
    for key, value in changes.items():
        if key in ("version",):
            meta[key] = value
        else:
            meta["state"][key] = value
    js.write_text(json.dumps(meta))


@pytest.mark.parametrize("value,shown", [(-1.0, "-1.0"), (0.0, "0.0"), ("2.0", "'2.0'"), (None, "None"),
                                         (float("nan"), "nan"), (True, "True")])
def test_invalid_temperature_in_the_file_is_refused(ts10, capsys, value, shown):
    tmp, js = ts10
    _edit_json(js, temperature_=value)
    inp = _input(tmp, "k10.npz", logits=_logits(10, seed=1)[0])
    _refused(capsys, js, inp, tmp / "o.npz", f"{js}: invalid temperature_: must be a finite number > 0, got {shown}")


def test_nan_weights_in_the_tensor_file_are_refused(tmp_path, capsys):
    z, y = _logits(10)
    inp = _input(tmp_path, "k10.npz", logits=_logits(10, seed=1)[0])
    for cal, field in ((VectorScaling().fit(z, y), "weight_"), (EnsembleTemperatureScaling().fit(z, y), "weights_")):
        st, js = save(cal, tmp_path / field)
        tensors = load_file(str(st))
        tensors[field][1] = float("nan")
        save_file(tensors, str(st))
        _refused(capsys, js, inp, tmp_path / "o.npz", f"{st}: invalid {field}: holds 1 NaN or infinite value(s)")


def test_wrong_shape_and_type_of_state_are_refused(tmp_path, capsys):
    z, y = _logits(10)
    inp = _input(tmp_path, "k10.npz", logits=_logits(10, seed=1)[0])
    st, js = save(VectorScaling().fit(z, y), tmp_path / "vector")
    tensors = load_file(str(st))
    tensors["bias_"] = tensors["bias_"][:7].clone()
    save_file(tensors, str(st))
    _refused(capsys, js, inp, tmp_path / "o.npz",
             f"{st}: invalid bias_: must be a float64 tensor of shape (10,), got float64 of shape (7,)")
    st, js = save(VectorScaling().fit(z, y), tmp_path / "vector2")
    _edit_json(js, n_classes_="10")
    _refused(capsys, js, inp, tmp_path / "o.npz", f"{js}: invalid n_classes_: must be an integer >= 2, got '10'")
    st, js = save(EnsembleTemperatureScaling().fit(z, y), tmp_path / "ets")
    tensors = load_file(str(st))
    tensors["weights_"] = torch.tensor([0.7, 0.6, -0.3], dtype=torch.float64)
    save_file(tensors, str(st))
    _refused(capsys, js, inp, tmp_path / "o.npz", f"{st}: invalid weights_: must be >= 0.0, found -0.3")


def test_unknown_format_version_is_refused(ts10, capsys):
    tmp, js = ts10
    inp = _input(tmp, "k10.npz", logits=_logits(10, seed=1)[0])
    for version in (2, "1", None):
        _edit_json(js, version=version)
        _refused(capsys, js, inp, tmp / "o.npz",
                 f"{js}: unknown format version {version!r}; this calibkit reads version 1")


def test_temperature_file_without_k_is_refused(ts10, capsys):
    tmp, js = ts10
    meta = json.loads(js.read_text())
    del meta["state"]["n_classes_"], meta["state"]["binary_"]
    js.write_text(json.dumps(meta))
    inp = _input(tmp, "k10.npz", logits=_logits(10, seed=1)[0])
    _refused(capsys, js, inp, tmp / "o.npz",
             f"{js}: saved state lacks n_classes_, binary_: written by an older calibkit that did not record the K it "
             "was fitted on; fit it again and save it")


def test_out_equal_to_input_is_refused(ts10, capsys, monkeypatch):
    tmp, js = ts10
    inp = _input(tmp, "k10.npz", logits=_logits(10, seed=1)[0])
    want = f"--out {{out}} is the input file {inp}: writing there would overwrite its logits; choose another path"
    _refused(capsys, js, inp, inp, want.format(out=inp), same=True)
    (tmp / "sub").mkdir()
    monkeypatch.chdir(tmp / "sub")
    rel = os.path.join("..", "k10.npz")
    _refused(capsys, js, inp, rel, want.format(out=rel), same=True)
    link = tmp / "link.npz"
    link.symlink_to(inp)
    _refused(capsys, js, inp, link, want.format(out=link), same=True)
    hard = tmp / "hard.npz"
    os.link(inp, hard)
    _refused(capsys, js, inp, hard, want.format(out=hard), same=True)


def test_writes_float64_probabilities_computed_in_float64(ts10, capsys):
    tmp, js = ts10
    z = _logits(10, seed=1)[0].float()  # float32 logits in the file
    inp = _input(tmp, "k10.npz", logits=z)
    assert main(["apply", "--calibrator", str(js), "--input", str(inp), "--out", str(tmp / "o.npz")]) == 0
    t = json.loads(js.read_text())["state"]["temperature_"]
    x = z.double().numpy() / t
    want = np.exp(x - x.max(1, keepdims=True))
    want /= want.sum(1, keepdims=True)
    with np.load(tmp / "o.npz") as f:
        got = f["probs"]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-17)
    assert (got.astype(np.float32).astype(np.float64) != got).any()  # not float32 values widened


def test_a_folder_as_input_or_out_is_refused(ts10, capsys):
    tmp, js = ts10
    inp = _input(tmp, "k10.npz", logits=_logits(10, seed=1)[0])
    (tmp / "out.npz").mkdir()
    _refused(capsys, js, inp, tmp / "out.npz", f"--out {tmp / 'out.npz'} is a directory, not a file", same=True)
    assert not any((tmp / "out.npz").iterdir())
    (tmp / "in.npz").mkdir()
    rc = main(["apply", "--calibrator", str(js), "--input", str(tmp / "in.npz"), "--out", str(tmp / "o.npz")])
    err = capsys.readouterr().err
    assert rc == 1 and err == f"calibkit apply: error: {tmp / 'in.npz'} is a directory, not a file\n"
    assert not (tmp / "o.npz").exists()


def test_empty_path_options_are_refused(ts10, capsys, monkeypatch):
    tmp, js = ts10
    inp = _input(tmp, "k10.npz", logits=_logits(10, seed=1)[0])
    monkeypatch.chdir(tmp)
    before = sorted(p.name for p in tmp.iterdir())
    for flag in ("--calibrator", "--input", "--out"):
        argv = {"--calibrator": str(js), "--input": str(inp), "--out": "o.npz", flag: ""}
        rc = main(["apply", *[a for kv in argv.items() for a in kv]])
        assert rc == 1
        assert capsys.readouterr().err == f"calibkit apply: error: {flag}: empty path ''; give a file or folder name\n"
        assert sorted(p.name for p in tmp.iterdir()) == before


def test_unknown_state_field_tensor_and_bad_hyperparameter_are_refused(ts10, tmp_path, capsys):
    tmp, js = ts10
    inp = _input(tmp, "k10.npz", logits=_logits(10, seed=1)[0])
    meta = json.loads(js.read_text())
    _edit_json(js, extra_=1)
    _refused(capsys, js, inp, tmp / "o.npz", f"{js}: unknown state field(s) extra_ (a temperature calibrator has "
             "temperature_, n_iter_, n_classes_, binary_)")
    meta["params"]["t_min"] = -1.0
    js.write_text(json.dumps(meta))
    _refused(capsys, js, inp, tmp / "o.npz", f"{js}: invalid hyperparameters (need 0 < t_min < t_max, got "
             "t_min=-1.0, t_max=100.0)")
    z, y = _logits(10)
    st, hjs = save(HistogramBinning().fit(z, y), tmp / "hist")
    tensors = load_file(str(st))
    save_file({**tensors, "extra_": tensors["values_"].clone()}, str(st))
    _refused(capsys, hjs, inp, tmp / "o.npz", f"{st}: unknown tensor(s) extra_: hist.json lists edges_, values_")
