"""``calibkit calibrate`` in one step (--from FILE --split, --from a val_*/test_* file, --run DIR),
``--save`` without a name, the HTML page, and ``calibkit apply`` on what it saved."""

import json

import numpy as np
import pytest
import torch

import calibkit.functional as F
from calibkit.calibrators import load
from calibkit.cli import main
from calibkit.commands.calibsources import split_rows

FAST = ["--calibrators", "temperature,vector", "--n-boot", "20", "--dpi", "10", "--folds", "3",
        "--num-threads", "1"]


def _scores(n=300, k=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    return 2.5 * z, y  # over-confident: temperature scaling has something to fix


def test_the_split_is_stratified_seeded_disjoint_and_complete():
    y = torch.tensor([0] * 50 + [1] * 30 + [2] * 3 + [3] * 1)
    vi, ti = split_rows(y, 0.5, seed=4)
    assert sorted(torch.cat([vi, ti]).tolist()) == list(range(len(y)))  # every row once
    # round(0.5 * n_c), halves up: a class of one row goes to validation
    assert {c: int((y[vi] == c).sum()) for c in range(4)} == {0: 25, 1: 15, 2: 2, 3: 1}
    assert torch.equal(split_rows(y, 0.5, seed=4)[0], vi)  # seeded
    assert not torch.equal(split_rows(y, 0.5, seed=5)[0], vi)
    vi, _ = split_rows(y, 0.2, seed=0)
    assert {c: int((y[vi] == c).sum()) for c in range(3)} == {0: 10, 1: 6, 2: 1}  # a class of 3 keeps one each side


def test_from_one_file_with_split_saves_the_chosen_calibrator_and_apply_uses_it(tmp_path, capsys):
    z, y = _scores()
    np.savez(tmp_path / "outputs.npz", logits=z.numpy(), labels=y.numpy())
    assert main(["calibrate", "--from", str(tmp_path / "outputs.npz"), "--split", "0.5", "--seed", "3",
                 "--save", *FAST]) == 0
    printed = capsys.readouterr().out
    out = tmp_path / "outputs-calibration"  # the default --out
    chosen = json.loads((out / "report" / "selection.json").read_text())["chosen"]
    assert chosen == "temperature"  # the over-confident logits need a temperature
    vi, ti = split_rows(y, 0.5, seed=3)
    cal = load(out / chosen)  # saved under its own name, refitted here on the validation part alone
    from calibkit.calibrators import TemperatureScaling

    assert cal.temperature_ == pytest.approx(TemperatureScaling().fit(z[vi], y[vi]).temperature_, rel=1e-9)
    rows = {r["calibrator"]: r for r in json.loads((out / "report" / "results.json").read_text())}
    assert rows["none"]["ece"] == pytest.approx(float(F.ece(torch.softmax(z[ti], 1), y[ti])), abs=1e-12)
    assert f"calibkit apply --calibrator {out / chosen}" in printed
    html = (out / "report" / "index.html").read_text()
    assert html.count("<img") == 2 and "Before: the uncalibrated model" in html and "After: the chosen" in html
    assert "<table>" in html and "calibkit calibrate: use temperature" in html
    # apply, given the output folder (one calibrator saved there): the probabilities and the before/after table
    assert main(["apply", "--calibrator", str(out), "--input", str(tmp_path / "outputs.npz"), "--out",
                 str(tmp_path / "cal.npz")]) == 0
    lines = capsys.readouterr().out.splitlines()
    p = np.load(tmp_path / "cal.npz")["probs"]
    assert np.allclose(p, cal.predict_proba(z).numpy(), atol=1e-15, rtol=0)
    before, after = (line.split() for line in lines[-2:])
    assert before[0] == "before" and after[0] == "after"
    assert float(before[1]) == pytest.approx(100 * float(F.ece(torch.softmax(z, 1), y)), abs=0.005)
    assert float(after[1]) == pytest.approx(100 * float(F.ece(torch.from_numpy(p), y)), abs=0.005)
    assert float(after[2]) == pytest.approx(float(F.nll(torch.from_numpy(p), y)), abs=5e-5)
    assert float(after[1]) < float(before[1])


def _run_dir(path, n=240, k=3):
    """A finished run's directory as training writes it (calibkit.train.evaluate: rundir.write_tensors)."""
    from calibkit import rundir

    (zv, yv), (zt, yt) = _scores(n, k, seed=1), _scores(n, k, seed=2)
    path.mkdir(parents=True)
    rundir.write_tensors(path / rundir.LOGITS, {"val_logits": zv.float(), "val_labels": yv,
                                                "test_logits": zt.float(), "test_labels": yt})
    rundir.write_json(path / rundir.CONFIG, {"status": "done", "epochs": 1})
    return (zv.float().double(), yv), (zt.float().double(), yt)


def test_a_run_directory_is_read_with_its_own_splits(tmp_path, capsys):
    run = tmp_path / "runs" / "smoke" / "ce" / "0"
    (zv, yv), (zt, yt) = _run_dir(run)
    assert main(["calibrate", "--run", str(run), "--save", "best", *FAST]) == 0  # best: the chosen one
    assert "val_logits" in capsys.readouterr().out
    chosen = json.loads((run / "calibration" / "report" / "selection.json").read_text())["chosen"]
    assert load(run / "calibration" / chosen).n_classes_ == 3
    rows = {r["calibrator"]: r for r in json.loads((run / "calibration" / "report" / "results.json").read_text())}
    assert rows["none"]["ece"] == pytest.approx(float(F.ece(torch.softmax(zt, 1), yt)), abs=1e-12)
    from calibkit.calibrators import TemperatureScaling

    ts = TemperatureScaling().fit(zv, yv).predict_proba(zt)
    assert rows["temperature"]["ece"] == pytest.approx(float(F.ece(ts, yt)), abs=1e-9)
    # a bench folder, not a run: the error names the runs below it
    rc = main(["calibrate", "--run", str(tmp_path / "runs"), *FAST])
    err = capsys.readouterr().err
    assert rc == 1 and "no logits.safetensors there, so not a finished calibkit run" in err and str(run) in err


def test_missing_entries_are_listed_and_key_options_name_them(tmp_path, capsys):
    z, y = _scores(n=120)
    np.savez(tmp_path / "f.npz", scores=z.numpy(), target=y.numpy())
    assert main(["calibrate", "--from", str(tmp_path / "f.npz"), "--split", "0.5", *FAST]) == 1
    assert capsys.readouterr().err == (
        f"calibkit calibrate: error: {tmp_path / 'f.npz'}: no 'logits' or 'probs' entry (found: scores, target); "
        "name the entry with --logits-key (logits) or --probs-key (probabilities)\n")
    assert main(["calibrate", "--from", str(tmp_path / "f.npz"), "--split", "0.5", "--logits-key", "scores",
                 *FAST]) == 1
    assert capsys.readouterr().err == (
        f"calibkit calibrate: error: {tmp_path / 'f.npz'}: no 'labels' entry (found: scores, target); name the "
        "labels' entry with --labels-key\n")
    np.savez(tmp_path / "vt.npz", val_scores=z[:60].numpy(), val_target=y[:60].numpy(),
             test_scores=z[60:].numpy(), test_target=y[60:].numpy())
    assert main(["calibrate", "--from", str(tmp_path / "vt.npz"), "--logits-key", "scores", "--labels-key", "target",
                 "--out", str(tmp_path / "o"), *FAST]) == 0
    rows = {r["calibrator"]: r for r in json.loads((tmp_path / "o" / "report" / "results.json").read_text())}
    assert rows["none"]["ece"] == pytest.approx(float(F.ece(torch.softmax(z[60:], 1), y[60:])), abs=1e-12)
    np.savez(tmp_path / "run.npz", val_logits=z[:60].numpy(), val_labels=y[:60].numpy())
    assert main(["calibrate", "--from", str(tmp_path / "run.npz"), "--split", "0.5", *FAST]) == 1
    assert capsys.readouterr().err.endswith("; it holds val_*/test_* entries: give it alone as --from FILE (without "
                                            "--split), or --run for a run's logits.safetensors\n")
    assert not (tmp_path / "o" / "temperature.json").exists()  # no --save: nothing saved


@pytest.mark.parametrize("argv, want", [
    ([], "give exactly one input: --val FILE --test FILE, --from FILE [--split FRACTION], or --run DIR (none was "
         "given)"),
    (["--from", "a.npz", "--run", "r"], "give exactly one input: --val FILE --test FILE, --from FILE [--split "
                                        "FRACTION], or --run DIR (got --from and --run)"),
    (["--val", "a.npz"], "--test is missing: --val and --test go together (or use --from FILE --split FRACTION for "
                         "one file)"),
    (["--run", "r", "--split", "0.5"], "--split goes with --from FILE (one file to split into validation and test "
                                       "rows)"),
    # --split 1 stops at argparse (tests/commands/test_numeric_options.py)
    (["--from", "a.npz", "--logits-key", "a", "--probs-key", "b"], "give --logits-key or --probs-key, not both "
                                                                    "(one entry holds the scores)"),
])
def test_the_sources_are_checked_before_anything_is_read(tmp_path, capsys, monkeypatch, argv, want):
    monkeypatch.chdir(tmp_path)
    assert main(["calibrate", *argv]) == 1
    assert capsys.readouterr().err == f"calibkit calibrate: error: {want}\n"
    assert list(tmp_path.iterdir()) == []
