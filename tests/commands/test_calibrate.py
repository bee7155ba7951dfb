"""``calibkit calibrate`` and ``calibkit apply``: the table against separate computations, files, bad input."""

import json

import numpy as np
import pytest
import torch

import calibkit.functional as F
from calibkit.calibrators import CALIBRATORS, TemperatureScaling, load
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


def test_calibrate_ranks_every_calibrator_and_saves_one(files, capsys):
    tmp, (zv, yv), (zt, yt) = files
    out = tmp / "out"
    rc = main(["calibrate", "--val", str(tmp / "val.npz"), "--test", str(tmp / "test.npz"), "--out", str(out),
               "--n-boot", "30", "--save", "isotonic", "--dpi", "20"])
    assert rc == 0
    text = capsys.readouterr().out
    rows = json.loads((out / "report" / "results.json").read_text())
    names = [r["calibrator"] for r in rows]
    assert sorted(names) == sorted(["none"] + list(CALIBRATORS))
    assert [r["ece"] for r in rows] == sorted(r["ece"] for r in rows)  # ranked by test ECE
    by = {r["calibrator"]: r for r in rows}
    ts = TemperatureScaling().fit(zv, yv).predict_proba(zt)
    assert by["temperature"]["ece"] == pytest.approx(float(F.ece(ts, yt)), abs=1e-12)
    assert by["none"]["ece"] == pytest.approx(float(F.ece(torch.softmax(zt, 1), yt)), abs=1e-12)
    assert by["temperature"]["vs_ts"] is None
    for name in CALIBRATORS:
        if name != "temperature":
            p = CALIBRATORS[name]().fit(zv, yv).predict_proba(zt)
            assert by[name]["ece"] == pytest.approx(float(F.ece(p, yt)), abs=1e-12)
            assert by[name]["vs_ts"]["estimate"] == pytest.approx(by[name]["ece"] - by["temperature"]["ece"], abs=1e-12)
    assert "(reference)" in text and "| 1 |" in text
    md = (out / "report" / "calibrators.md").read_text()
    assert "dECE vs TS" in md
    assert all((out / "report" / f"reliability_{n}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names)
    assert all(f"![{n}](reliability_{n}.png)" in md for n in names)
    # --save isotonic, then apply it
    saved = load(out / "isotonic")
    assert torch.equal(saved.predict_proba(zt), CALIBRATORS["isotonic"]().fit(zv, yv).predict_proba(zt))
    rc = main(["apply", "--calibrator", str(out / "isotonic.json"), "--input", str(tmp / "test.npz"),
               "--out", str(tmp / "applied.npz")])
    assert rc == 0
    with np.load(tmp / "applied.npz") as f:
        np.testing.assert_array_equal(f["probs"], saved.predict_proba(zt).numpy())
        np.testing.assert_array_equal(f["labels"], yt.numpy())


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
    cases.append((str(tmp / "junk.npz"), "cannot read"))
    for val, match in cases:
        out = tmp / "never"
        rc = main(["calibrate", "--val", val, "--test", str(tmp / "test.npz"), "--out", str(out), "--n-boot", "5"])
        err = capsys.readouterr().err
        assert rc == 1 and err.count("\n") == 1 and err.startswith("calibkit calibrate: error:"), err
        import re
        assert re.search(match, err), (match, err)
        assert not out.exists()
    for extra, match in ((["--calibrators", "platt"], "unknown calibrator 'platt'; expected one of temperature"),
                         (["--save", "platt"], "--save 'platt': not among"),
                         (["--n-boot", "0"], "--n-boot must be >= 1")):
        rc = main(["calibrate", "--val", str(tmp / "val.npz"), "--test", str(tmp / "test.npz"), "--out",
                   str(tmp / "never"), *extra])
        err = capsys.readouterr().err
        assert rc == 1 and match in err and not (tmp / "never").exists()
    (tmp / "odd.json").write_text(json.dumps({"format": "calibkit-calibrator", "calibrator": "platt"}))
    (tmp / "odd.safetensors").write_bytes(b"")
    for extra, match in ((["--calibrator", str(tmp / "nothing"), "--out", str(tmp / "a.npz")], "not found"),
                         (["--calibrator", str(tmp / "odd"), "--out", str(tmp / "a.npz")], "unknown calibrator 'platt'"),
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
