"""``calibkit calibrate`` and ``calibkit apply``: the table against separate computations, files, bad input."""

import json
import re
import warnings

import numpy as np
import pytest
import torch

import calibkit.functional as F
from calibkit.calibrators import CALIBRATORS, TemperatureScaling, load
from calibkit.calibrators.stack import StackedCalibration
from calibkit.cli import main


def _split(seed=0, n=600, k=4):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    z = 2.5 * z
    return (z[: n // 2], y[: n // 2]), (z[n // 2:], y[n // 2:])


@pytest.fixture
def files(tmp_path):
    (zv, yv), (zt, yt) = _split()
    np.savez(tmp_path / "val.npz", logits=zv.numpy(), labels=yv.numpy())
    np.savez(tmp_path / "test.npz", logits=zt.numpy(), labels=yt.numpy())
    return tmp_path, (zv, yv), (zt, yt)


def test_calibrate_reports_every_calibrator_and_saves_one(files, capsys):
    tmp, (zv, yv), (zt, yt) = files
    out = tmp / "out"
    rc = main(["calibrate", "--val", str(tmp / "val.npz"), "--test", str(tmp / "test.npz"), "--out", str(out),
               "--n-boot", "30", "--save", "isotonic", "--dpi", "20"])
    assert rc == 0
    text = capsys.readouterr().out
    rows = json.loads((out / "report" / "results.json").read_text())
    names = [r["calibrator"] for r in rows]
    from calibkit.calibrators.boost import OPT_IN

    # registry order (never ranked), then the stack of the smooth ones
    assert names == ["none"] + [n for n in CALIBRATORS if n not in OPT_IN] + ["stack"]
    assert "lightgbm" in OPT_IN and "lightgbm" not in names  # opt-in: fitted only when named
    sel = json.loads((out / "report" / "selection.json").read_text())
    assert [r["calibrator"] for r in rows if r["selected"]] == [sel["chosen"]]
    by = {r["calibrator"]: r for r in rows}
    ts = TemperatureScaling().fit(zv, yv).predict_proba(zt)
    assert by["temperature"]["ece"] == pytest.approx(float(F.ece(ts, yt)), abs=1e-12)
    assert by["none"]["ece"] == pytest.approx(float(F.ece(torch.softmax(zt, 1), yt)), abs=1e-12)
    assert by["temperature"]["vs_ts"] is None
    for name in names[1:]:
        if name != "temperature":  # the stack, built from the candidates, equals one fitted alone
            p = (StackedCalibration() if name == "stack" else CALIBRATORS[name]()).fit(zv, yv).predict_proba(zt)
            assert by[name]["ece"] == pytest.approx(float(F.ece(p, yt)), abs=1e-12)
            assert by[name]["vs_ts"]["estimate"] == pytest.approx(by[name]["ece"] - by["temperature"]["ece"], abs=1e-12)
    assert "(reference)" in text and "| 1 |" not in text and "| rank |" not in text
    assert text.index("## Recommendation") < text.index("## Validation") < text.index("## Test split")
    assert f"**Use: {sel['chosen']}**" in text and f"**{sel['chosen']}** (chosen)" in text
    md = (out / "report" / "calibrators.md").read_text()
    assert "dECE vs TS" in md
    # figures and sets of the uncalibrated model, TS and the chosen calibrator only (--full-report: all)
    shown = [n for n in names if n in ("none", "temperature", sel["chosen"])]
    assert sorted(p.name for p in (out / "report").glob("reliability_*.png")) == sorted(
        f"reliability_{n}.png" for n in shown)
    assert all((out / "report" / f"reliability_{n}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in shown)
    assert all(f"![{n}](reliability_{n}.png)" in md for n in shown)
    # selective prediction and APS sets against a direct computation for TS
    from calibkit.report.sets import conformal_rows

    sets = json.loads((out / "report" / "sets.json").read_text())
    assert sets["alpha"] == 0.1 and list(sets["calibrators"]) == shown
    direct = conformal_rows(zv, yv, zt, yt, "temperature", alpha=0.1, seed=0)
    assert sets["calibrators"]["temperature"]["size"] == pytest.approx(float(direct["size"].double().mean()))
    assert sets["calibrators"]["temperature"]["aurc"] == pytest.approx(float(F.aurc(ts, yt)))
    assert "Selective prediction and conformal sets" in text and "dsize vs TS" in md
    # --save isotonic, then apply it
    saved = load(out / "isotonic")
    assert torch.equal(saved.predict_proba(zt), CALIBRATORS["isotonic"]().fit(zv, yv).predict_proba(zt))
    rc = main(["apply", "--calibrator", str(out / "isotonic.json"), "--input", str(tmp / "test.npz"),
               "--out", str(tmp / "applied.npz")])
    assert rc == 0
    with np.load(tmp / "applied.npz") as f:
        np.testing.assert_array_equal(f["probs"], saved.predict_proba(zt).numpy())
        np.testing.assert_array_equal(f["labels"], yt.numpy())


def test_full_report_has_every_calibrators_sets_and_figure(files):
    tmp, _, _ = files
    out = tmp / "full"
    assert main(["calibrate", "--val", str(tmp / "val.npz"), "--test", str(tmp / "test.npz"), "--out", str(out),
                 "--n-boot", "10", "--dpi", "20", "--calibrators", "temperature,vector,isotonic", "--full-report"]) == 0
    names = ["none", "temperature", "vector", "isotonic"]
    assert list(json.loads((out / "report" / "sets.json").read_text())["calibrators"]) == names
    assert sorted(p.name for p in (out / "report").glob("reliability_*.png")) == sorted(
        f"reliability_{n}.png" for n in names)


def test_probs_files_and_other_formats(files, capsys):
    from safetensors.torch import save_file

    tmp, (zv, yv), (zt, yt) = files
    save_file({"probs": torch.softmax(zv, 1), "labels": yv}, str(tmp / "val.safetensors"))
    torch.save({"logits": zt, "labels": yt}, tmp / "test.pt")
    rc = main(["calibrate", "--val", str(tmp / "val.safetensors"), "--test", str(tmp / "test.pt"), "--out",
               str(tmp / "o"), "--n-boot", "10", "--calibrators", "temperature,vector"])
    assert rc == 0
    assert "(300 rows, probs)" in capsys.readouterr().out
    by = {r["calibrator"]: r for r in json.loads((tmp / "o" / "report" / "results.json").read_text())}
    ts = TemperatureScaling().fit(torch.softmax(zv, 1).log(), yv).predict_proba(zt)  # logits = log(probs)
    assert by["temperature"]["ece"] == pytest.approx(float(F.ece(ts, yt)), abs=1e-12)
    assert sorted(by) == ["none", "temperature", "vector"]
    # apply without labels in the input
    np.savez(tmp / "new.npz", logits=zt.numpy())
    main(["calibrate", "--val", str(tmp / "val.npz"), "--test", str(tmp / "test.npz"), "--out", str(tmp / "o2"),
          "--n-boot", "10", "--calibrators", "vector", "--save", "vector"])
    assert main(["apply", "--calibrator", str(tmp / "o2" / "vector"), "--input", str(tmp / "new.npz"),
                 "--out", str(tmp / "new_cal.npz")]) == 0
    with np.load(tmp / "new_cal.npz") as f:
        assert sorted(f.files) == ["probs"]


def _bad(tmp, name, **arrays):
    np.savez(tmp / name, **arrays)
    return str(tmp / name)


def test_bad_input_one_line_exit_1_nothing_written(files, capsys):
    tmp, (zv, yv), (zt, yt) = files
    nan = zv.clone()
    nan[0, 0] = float("nan")
    cases = [
        (_bad(tmp, "nokeys.npz", labels=yv.numpy()), "no 'logits' or 'probs' entry"),
        (_bad(tmp, "nolabels.npz", logits=zv.numpy()), "no 'labels' entry"),
        (_bad(tmp, "nan.npz", logits=nan.numpy(), labels=yv.numpy()), "NaN or infinite"),
        (_bad(tmp, "range.npz", logits=zv.numpy(), labels=(yv + 1).numpy()), "labels out of range: found 4"),
        (_bad(tmp, "k3.npz", logits=zv[:, :3].numpy(), labels=(yv % 3).numpy()), "has K = 3 but .* has K = 4"),
        (_bad(tmp, "badprobs.npz", probs=np.full((300, 4), 0.3), labels=yv.numpy()), "rows must sum to 1"),
        (str(tmp / "missing.npz"), "not found"),
    ]
    (tmp / "x.csv").write_text("1,2")
    cases.append((str(tmp / "x.csv"), "unsupported file type .csv"))
    (tmp / "junk.npz").write_bytes(b"junk")
    cases.append((str(tmp / "junk.npz"), r"junk.npz: not a readable .npz file \(not an intact zip archive"))
    for val, match in cases:
        out = tmp / "never"
        rc = main(["calibrate", "--val", val, "--test", str(tmp / "test.npz"), "--out", str(out), "--n-boot", "10"])
        err = capsys.readouterr().err
        assert rc == 1 and err.count("\n") == 1 and err.startswith("calibkit calibrate: error:"), err
        import re
        assert re.search(match, err), (match, err)
        assert not out.exists()
    for extra, match in ((["--calibrators", "nope"], "unknown calibrator 'nope'; expected one of temperature"),
                         (["--save", "nope"], "--save 'nope': not among")):  # --n-boot 0: argparse's (its test)
        rc = main(["calibrate", "--val", str(tmp / "val.npz"), "--test", str(tmp / "test.npz"), "--out",
                   str(tmp / "never"), *extra])
        err = capsys.readouterr().err
        assert rc == 1 and match in err and not (tmp / "never").exists()
    (tmp / "odd.json").write_text(json.dumps({"format": "calibkit-calibrator", "calibrator": "nope"}))
    (tmp / "odd.safetensors").write_bytes(b"")
    for extra, match in ((["--calibrator", str(tmp / "nothing"), "--out", str(tmp / "a.npz")], "not found"),
                         (["--calibrator", str(tmp / "odd"), "--out", str(tmp / "a.npz")], "unknown calibrator 'nope'"),
                         (["--calibrator", str(tmp / "nothing"), "--out", str(tmp / "a.txt")], "must name an .npz")):
        rc = main(["apply", "--input", str(tmp / "test.npz"), *extra])
        err = capsys.readouterr().err
        assert rc == 1 and match in err and not (tmp / "a.npz").exists()


def test_binary_scores(tmp_path, capsys):
    g = torch.Generator().manual_seed(7)
    s = torch.randn(800, generator=g, dtype=torch.float64) * 2
    y = torch.bernoulli(torch.sigmoid(s), generator=g).long()
    np.savez(tmp_path / "val.npz", probs=torch.sigmoid(3 * s[:400]).numpy(), labels=y[:400].numpy())  # 1-D probs
    np.savez(tmp_path / "test.npz", logits=(3 * s[400:]).numpy(), labels=y[400:].numpy())
    rc = main(["calibrate", "--val", str(tmp_path / "val.npz"), "--test", str(tmp_path / "test.npz"), "--out",
               str(tmp_path / "o"), "--n-boot", "10", "--calibrators", "temperature,isotonic", "--dpi", "20"])
    assert rc == 0
    by = {r["calibrator"]: r for r in json.loads((tmp_path / "o" / "report" / "results.json").read_text())}
    ts = TemperatureScaling().fit(torch.logit(torch.sigmoid(3 * s[:400])), y[:400])  # logits = logit(probs)
    assert by["temperature"]["ece"] == pytest.approx(float(F.ece(ts.predict_proba(3 * s[400:]), y[400:])), abs=1e-12)
    np.savez(tmp_path / "k2.npz", logits=np.stack([np.zeros(400), 3 * s[400:].numpy()], 1), labels=y[400:].numpy())
    rc = main(["calibrate", "--val", str(tmp_path / "val.npz"), "--test", str(tmp_path / "k2.npz"), "--out",
               str(tmp_path / "never")])
    assert rc == 1 and "binary (N,)" in capsys.readouterr().err and not (tmp_path / "never").exists()


def _run_calibrate(tmp, val, test, out, *extra):
    rc = main(["calibrate", "--val", str(val), "--test", str(test), "--out", str(out), "--n-boot", "20", "--dpi", "20",
               *extra])
    assert rc == 0
    return json.loads((out / "report" / "selection.json").read_text())


def test_the_choice_never_reads_the_test_rows(files, capsys):
    """Poisoned test rows (labels reversed, logits scrambled) leave the choice and its scores unchanged."""
    tmp, _, (zt, yt) = files
    k = zt.shape[1]
    np.savez(tmp / "poison.npz", logits=(-zt[torch.randperm(len(yt))]).numpy(), labels=((k - 1) - yt).numpy())
    a = _run_calibrate(tmp, tmp / "val.npz", tmp / "test.npz", tmp / "a")
    b = _run_calibrate(tmp, tmp / "val.npz", tmp / "poison.npz", tmp / "b")
    for sel in (a, b):  # fit times differ from run to run; every number and decision must not
        for score in sel["scores"].values():
            score.pop("seconds")
    assert a == b
    assert a["rule"] == {"select_by": "nll", "acc_tolerance": 0.005, "n_folds": 5, "n_bins": 15, "seed": 0,
                         "default": "stack", "level": 0.95, "n_boot": 1000, "significance": True}


def test_a_calibrator_that_loses_accuracy_is_not_chosen_even_with_the_lowest_test_ece(tmp_path, capsys):
    """Many classes and few validation rows per class: one-vs-rest isotonic regression changes
    predictions and loses accuracy; under the default rule it is excluded, whatever its ECE.
    (Histogram binning is top-label by default and keeps every prediction.)"""
    g = torch.Generator().manual_seed(5)
    z = torch.randn(3000, 20, generator=g, dtype=torch.float64) * 1.5
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    z = 2 * z
    np.savez(tmp_path / "v.npz", logits=z[:1500].numpy(), labels=y[:1500].numpy())
    np.savez(tmp_path / "t.npz", logits=z[1500:].numpy(), labels=y[1500:].numpy())
    sel = _run_calibrate(tmp_path, tmp_path / "v.npz", tmp_path / "t.npz", tmp_path / "o",
                         "--calibrators", "temperature,isotonic")
    hist, base = sel["scores"]["isotonic"], sel["scores"]["none"]
    assert hist["acc"] < base["acc"] - 0.005 and hist["changed"] > 0.05  # the constructed case holds
    assert sel["chosen"] == "temperature" and "isotonic" in sel["excluded"]
    rows = {r["calibrator"]: r for r in json.loads((tmp_path / "o" / "report" / "results.json").read_text())}
    base_pred = torch.softmax(z[1500:], 1).argmax(1)
    hp = CALIBRATORS["isotonic"]().fit(z[:1500], y[:1500]).predict_proba(z[1500:])
    assert rows["isotonic"]["changed"] == pytest.approx(float((hp.argmax(1) != base_pred).double().mean()), abs=1e-12)
    acc = float((hp.argmax(1) == y[1500:]).double().mean())
    assert rows["isotonic"]["d_acc"] == pytest.approx(acc - float((base_pred == y[1500:]).double().mean()), abs=1e-12)
    assert rows["temperature"]["changed"] == 0.0 and rows["temperature"]["d_acc"] == 0.0


def test_zero_probability_rows_flag_the_nll(files, capsys):
    from calibkit.report.posthoc import NLL_FLAG, guard_stats

    labels = torch.tensor([0, 1, 1, 0])
    probs = torch.tensor([[0.9, 0.1], [1.0, 0.0], [0.2, 0.8], [0.5, 0.5]], dtype=torch.float64)
    g = guard_stats(probs, torch.tensor([0, 1, 1, 0]), labels, base_acc=1.0)
    terms = [-np.log(0.9), -np.log(np.finfo(np.float64).tiny), -np.log(0.8), -np.log(0.5)]
    assert g["zero_rows"] == 1 and g["zero_share"] == pytest.approx(terms[1] / sum(terms))
    assert g["changed"] == 0.25 and g["d_acc"] == pytest.approx(-0.25)
    tmp, _, _ = files
    _run_calibrate(tmp, tmp / "val.npz", tmp / "test.npz", tmp / "o", "--calibrators", "temperature,histogram")
    rows = {r["calibrator"]: r for r in json.loads((tmp / "o" / "report" / "results.json").read_text())}
    text = capsys.readouterr().out
    if rows["histogram"]["zero_rows"]:
        assert f"{NLL_FLAG}{rows['histogram']['zero_rows']} (" in text
    assert rows["temperature"]["zero_rows"] == 0


def test_select_by_and_tolerance_options(files, capsys):
    tmp, _, _ = files
    sel = _run_calibrate(tmp, tmp / "val.npz", tmp / "test.npz", tmp / "o", "--select-by", "nll", "--folds", "3",
                         "--acc-tolerance", "2")
    assert sel["rule"]["select_by"] == "nll" and sel["rule"]["n_folds"] == 3 and sel["rule"]["acc_tolerance"] == 0.02
    # the default rule: the stack unless an eligible challenger's cross-fitted NLL is significantly lower
    nll = {n: sel["scores"][n]["nll"] for n in sel["ranking"]}
    assert sel["default"] == "stack" and sel["rule"]["significance"] is True
    lower = [n for n in sel["ranking"] if nll[n] < nll["stack"] - 1e-12]
    winners = [n for n in lower if n not in sel["notes"]]  # a note: not significantly below the stack
    assert sel["chosen"] == (min(winners, key=nll.__getitem__) if winners else "stack")
    capsys.readouterr()
    for extra, match in ((["--folds", "1"], "--folds: must be an integer in [2, "),
                         (["--acc-tolerance", "nan"], "--acc-tolerance: must be a number in [0, 100]"),
                         (["--acc-tolerance", "-1"], "--acc-tolerance: must be a number in [0, 100]"),
                         (["--alpha", "1"], "--alpha: must be a number in (0, 1)"),
                         (["--alpha", "nan"], "--alpha: must be a number in (0, 1)"),
                         (["--alpha", "0"], "--alpha: must be a number in (0, 1)")):
        with pytest.raises(SystemExit) as exc:  # refused while the command line is parsed
            main(["calibrate", "--val", str(tmp / "val.npz"), "--test", str(tmp / "test.npz"), "--out",
                  str(tmp / "never"), *extra])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and f"calibkit calibrate: error: argument {match}" in err
        assert not (tmp / "never").exists()


def test_empty_paths_are_refused_before_anything_is_written(files, capsys, monkeypatch):
    tmp, _, _ = files
    monkeypatch.chdir(tmp)  # an empty --out used to write report/ here
    before = sorted(p.name for p in tmp.iterdir())
    for extra, want in (([["--out", ""]], "--out: empty path ''; give a file or folder name"),
                        ([["--val", " "]], "--val: empty path ' '; give a file or folder name"),
                        ([["--test", ""]], "--test: empty path ''; give a file or folder name")):
        argv = {"--val": "val.npz", "--test": "test.npz", "--out": "o"}
        argv.update(dict(extra))
        rc = main(["calibrate", *[a for kv in argv.items() for a in kv], "--n-boot", "10"])
        assert rc == 1 and capsys.readouterr().err == f"calibkit calibrate: error: {want}\n"
        assert sorted(p.name for p in tmp.iterdir()) == before


# ------------------------------------------------------------ damaged, ambiguous and borderline inputs


def _rejects(tmp, val, want, capsys):
    """``calibrate --val VAL`` fails with exactly ``calibkit calibrate: error: <want>``, nothing written."""
    out = tmp / "never"
    rc = main(["calibrate", "--val", str(val), "--test", str(tmp / "test.npz"), "--out", str(out), "--n-boot", "10"])
    assert rc == 1 and capsys.readouterr().err == f"calibkit calibrate: error: {want}\n"
    assert not out.exists()


def test_damaged_files_folders_and_ambiguous_arrays_are_one_line_each(files, capsys):
    tmp, (zv, yv), _ = files
    noise = tmp / "noise.npz"
    noise.write_bytes(np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8).tobytes())
    _rejects(tmp, noise, f"{noise}: not a readable .npz file (not an intact zip archive: truncated, corrupt or "
                         "another format)", capsys)
    torch.save({"logits": zv, "labels": yv}, tmp / "whole.pt")
    data = (tmp / "whole.pt").read_bytes()
    half = tmp / "half.pt"
    half.write_bytes(data[: len(data) // 2])
    _rejects(tmp, half, f"{half}: truncated or corrupt .pt file (its zip archive has no central directory)", capsys)
    torch.save({"logits": zv.numpy(), "labels": yv}, tmp / "pickled.pt")  # a numpy array is a pickled object
    out = tmp / "never"
    rc = main(["calibrate", "--val", str(tmp / "pickled.pt"), "--test", str(tmp / "test.npz"), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 1 and "pickled.pt: holds pickled Python objects other than tensors" in err and "weights_only" in err
    folder = tmp / "somedir"
    folder.mkdir()
    _rejects(tmp, folder, f"{folder} is a directory, not a file", capsys)
    k0 = _bad(tmp, "k0.npz", logits=np.zeros((300, 0)), labels=yv.numpy())
    _rejects(tmp, k0, f"{k0}: 'logits' has no classes (0 columns), shape (300, 0); expected (N, K) with K >= 2 "
                      "classes, or binary positive-class scores as a 1-D (N,) array", capsys)
    k1 = _bad(tmp, "k1.npz", probs=np.ones((300, 1)), labels=np.zeros(300, np.int64))
    _rejects(tmp, k1, f"{k1}: 'probs' has a single column, shape (300, 1); expected (N, K) with K >= 2 "
                      "classes, or binary positive-class scores as a 1-D (N,) array", capsys)
    both = _bad(tmp, "both.npz", logits=zv.numpy(), probs=torch.softmax(zv, 1).numpy(), labels=yv.numpy())
    _rejects(tmp, both, f"{both}: holds both 'logits' and 'probs'; keep one of them (calibkit never guesses which "
                        "one you meant), or name one with --logits-key / --probs-key", capsys)
    huge = yv.numpy().astype(np.uint64)
    huge[7] = 2**64 - 1
    big = _bad(tmp, "big.npz", logits=zv.numpy(), labels=huge)
    _rejects(tmp, big, f"{big}: labels holds {2**64 - 1}, above the int64 range: not a class index", capsys)


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
def test_unsigned_labels_are_read_as_int64(files, dtype):
    from safetensors.torch import save_file

    from calibkit.commands.calibrate import read_scores

    tmp, (zv, yv), _ = files
    path = _bad(tmp, "u.npz", logits=zv.numpy(), labels=yv.numpy().astype(dtype))
    x, y, _ = read_scores(path)
    assert y.dtype == torch.int64 and torch.equal(y, yv) and torch.equal(x, zv)
    save_file({"logits": zv, "labels": torch.from_numpy(yv.numpy().astype(dtype))}, str(tmp / "u.safetensors"))
    assert torch.equal(read_scores(tmp / "u.safetensors")[1], yv)


def test_validation_labels_of_one_class_are_a_warning_naming_the_file():
    from types import SimpleNamespace

    from calibkit.commands.calibrate import _warn_one_class

    args = SimpleNamespace(val_name="dir/val.npz")
    with pytest.warns(UserWarning) as seen:  # a warning, not a refusal: every calibrator can still be fitted
        _warn_one_class(args, torch.full((40,), 2), 4)
    assert [str(w.message) for w in seen] == [
        "dir/val.npz: validation labels hold one class (2) only: every calibrator is fitted and chosen without an "
        "example of the other 3 class(es), so the fits and the choice say little; use a validation split with "
        "every class"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_one_class(args, torch.tensor([0, 1, 1]), 4)  # two classes: quiet


def test_the_same_data_for_val_and_test_is_a_warning(tmp_path, capsys):
    from types import SimpleNamespace

    from calibkit.commands.calibrate import _warn_same_data

    (zv, yv), _ = _split(n=80)
    np.savez(tmp_path / "val.npz", logits=zv.numpy(), labels=yv.numpy())
    rc = main(["calibrate", "--val", str(tmp_path / "val.npz"), "--test", str(tmp_path / "val.npz"), "--out",
               str(tmp_path / "o"), "--calibrators", "temperature", "--n-boot", "10", "--dpi", "10"])
    assert rc == 0 and (tmp_path / "o" / "report" / "calibrators.md").exists()  # a warning, not a refusal
    val = tmp_path / "val.npz"
    assert capsys.readouterr().err.splitlines() == [
        f"calibkit calibrate: warning: --val {val} and --test {val} are the same file: calibration and evaluation "
        "use the same data, so the test numbers are not held out"]
    (tmp_path / "copy.npz").write_bytes(val.read_bytes())
    (tmp_path / "link.npz").symlink_to(val)
    for test, what in (("link.npz", "are the same file"), ("copy.npz", "hold identical logits and labels")):
        args = SimpleNamespace(val=str(val), test=str(tmp_path / test))
        with pytest.warns(UserWarning, match=f"^--val {re.escape(str(val))} and --test .*{test} {what}: calibration "
                                             "and evaluation use the same data, so the test numbers are not held out$"):
            _warn_same_data(args, SimpleNamespace(val=(zv, yv), test=(zv.clone(), yv.clone())))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_same_data(SimpleNamespace(val=str(val), test="t.npz"),  # other labels
                        SimpleNamespace(val=(zv, yv), test=(zv, (yv + 1) % 4)))


def test_fewer_rows_than_classes_warns_and_leaves_the_square_maps_unfitted(tmp_path, capsys):
    g = torch.Generator().manual_seed(0)
    k = 30
    for name, n in (("val", 20), ("test", 40)):
        np.savez(tmp_path / f"{name}.npz", logits=torch.randn(n, k, generator=g, dtype=torch.float64).numpy(),
                 labels=torch.randint(0, k, (n,), generator=g).numpy())
    argv = ["calibrate", "--val", str(tmp_path / "val.npz"), "--test", str(tmp_path / "test.npz"), "--out",
            str(tmp_path / "o"), "--calibrators", "temperature,matrix,dirichlet", "--n-boot", "10", "--dpi", "10"]
    assert main(argv + ["--save", "dirichlet"]) == 1
    assert capsys.readouterr().err == (
        "calibkit calibrate: error: --save 'dirichlet': not fitted: 20 validation rows for K = 30 classes; its K x K "
        "map (930 parameters) cannot be fitted from fewer rows than classes\n")
    assert not (tmp_path / "o").exists()
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines()[0] == (
        f"calibkit calibrate: warning: {tmp_path / 'val.npz'}: 20 validation rows for K = 30 classes (fewer than 2 "
        "per class): the calibrators with K or K x K parameters (vector: 2K; matrix, dirichlet: K^2 + K) cannot be "
        "fitted reliably, and their fits may be slow; not fitted: matrix, dirichlet (the validation table says why)")
    reason = "not fitted: 20 validation rows for K = 30 classes; its K x K map (930 parameters) cannot be fitted " \
             "from fewer rows than classes"
    assert f"| matrix | - | - | - | - | - | excluded: {reason} |" in captured.out
    assert f"| dirichlet | - | - | - | - | - | excluded: {reason} |" in captured.out
    rows = json.loads((tmp_path / "o" / "report" / "results.json").read_text())
    assert [r["calibrator"] for r in rows] == ["none", "temperature"]
    sel = json.loads((tmp_path / "o" / "report" / "selection.json").read_text())
    assert sel["excluded"]["matrix"] == reason and sel["scores"]["dirichlet"]["error"] == reason


def test_jobs_share_the_fits_between_processes_with_the_same_numbers(files, capsys):
    """``--jobs 2`` fits the candidates in two processes; every number and the choice are those of ``--jobs 1``."""
    tmp = files[0]
    runs = {}
    for jobs in ("1", "2"):
        out = tmp / f"jobs{jobs}"
        sel = _run_calibrate(tmp, tmp / "val.npz", tmp / "test.npz", out, "--jobs", jobs,
                             "--calibrators", "temperature,vector,dirichlet,histogram,isotonic")
        for score in sel["scores"].values():
            score.pop("seconds")
        rows = json.loads((out / "report" / "results.json").read_text())
        for row in rows:
            row.pop("seconds")
        runs[jobs] = sel, rows
    assert runs["1"] == runs["2"]


def test_the_stacks_sets_refit_the_components_it_was_built_from(files, monkeypatch):
    """--calibrators temperature,vector,stack: the sets' half refit of the stack mixes those two maps
    and the uncalibrated model, as the chosen stack does, not the nine default components."""
    import calibkit.report.sets as sets_module

    real, refits = sets_module._fit_half, []

    def spy(calibrator, x, y, jobs, stack_parts=None):
        cal = real(calibrator, x, y, jobs, stack_parts)
        refits.append((calibrator, getattr(cal, "components_", None)))
        return cal

    monkeypatch.setattr(sets_module, "_fit_half", spy)
    tmp, (zv, yv), (zt, yt) = files
    _run_calibrate(tmp, tmp / "val.npz", tmp / "test.npz", tmp / "o", "--calibrators", "temperature,vector,stack",
                   "--full-report")
    parts = ["none", "temperature", "vector"]
    assert ("stack", parts) in refits and all(c != "stack" or p == parts for c, p in refits)
    sets = json.loads((tmp / "o" / "report" / "sets.json").read_text())["calibrators"]
    direct = sets_module.conformal_rows(zv, yv, zt, yt, "stack", alpha=0.1, seed=0, stack_parts=tuple(parts))
    assert sets["stack"]["size"] == pytest.approx(float(direct["size"].double().mean()), abs=1e-12)
    assert sets["stack"]["coverage"] == pytest.approx(float(direct["covered"].double().mean()), abs=1e-12)
