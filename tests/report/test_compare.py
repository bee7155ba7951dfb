"""The comparisons against CE + TS and every calibrator, and ``calibkit compare``, on a real smoke
bench (CE and LS, one seed): every number checked against a computation from the saved logits
written here (numpy ECE / classwise ECE / NLL, each calibrator refitted)."""

import re
import subprocess

import numpy as np
import pytest
import torch

from calibkit.calibrators import CALIBRATORS
from calibkit.report.calibrated import calibrator_names
from calibkit.report.data import BETTER_MARK, WORSE_MARK, direction, fmt_delta
from calibkit.rundir import read_tensors
from calibkit.store import Store
from tests.conftest import PYTHON


def np_ece(p, y, n_bins=15):
    """Top-label ECE, equal-width bins (lo, hi] with 0 in the first: sum_b |sum (correct - conf)| / N."""
    conf, correct = p.max(1), (p.argmax(1) == y).astype(float)
    b = np.searchsorted(np.linspace(0, 1, n_bins + 1)[1:-1], conf, side="left")
    return np.abs(np.bincount(b, correct - conf, n_bins)).sum() / len(y)


def np_cece(p, y, n_bins=15):
    inner = np.linspace(0, 1, n_bins + 1)[1:-1]
    total = 0.0
    for k in range(p.shape[1]):
        b = np.searchsorted(inner, p[:, k], side="left")
        total += np.abs(np.bincount(b, (y == k) - p[:, k], n_bins)).sum() / len(y)
    return total / p.shape[1]


def np_nll(p, y):
    """Mean -log p_y with p clamped at the float64 tiny (docs/metrics.md): binning calibrators give 0."""
    return -np.log(np.maximum(p[np.arange(len(y)), y], np.finfo(np.float64).tiny)).mean()


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    import os

    from tests.conftest import ROOT

    out = tmp_path_factory.mktemp("cmp") / "bench"
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    res = subprocess.run([PYTHON, "-m", "calibkit", "bench", "--preset", "smoke", "--methods", "ce", "ls",
                          "--out", str(out), "--no-report"], capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stderr
    from dataclasses import replace

    from calibkit.bench.presetfile import read_effective, write_effective
    from calibkit.report import build_report

    # every calibrator of the registry, which the tests below check one by one (the smoke preset's
    # own report fits two: report_calibrators, left out of the recorded preset here)
    write_effective(replace(read_effective(out, "smoke"), report_calibrators=None), out)
    rep = build_report(out, n_boot=200, figures=False, width=0)
    rows = {r["method"]: r for r in Store(out / "runs.db", readonly=True).runs("smoke")}
    return out, rep, rows, env


def predictions(row, name):
    """Test probabilities of a run after calibrator ``name`` (none: softmax), refitted here."""
    t = read_tensors(row["logits_path"])
    if name == "none":
        return t["test_logits"].double().softmax(1).numpy(), t["test_labels"].long().numpy()
    cal = CALIBRATORS[name]().fit(t["val_logits"], t["val_labels"].long())
    probs = cal.predict_proba(t["test_logits"].double())
    return torch.as_tensor(probs).double().numpy(), t["test_labels"].long().numpy()


def table(text, title_cell):
    """Rows (label -> cells) of the terminal table whose header starts with ``title_cell``."""
    lines = text.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith(title_cell))
    header = re.split(r"\s{2,}", lines[i].strip())
    out = {}
    for ln in lines[i + 2:]:
        if not ln.strip():
            break
        cells = re.split(r"\s{2,}", ln.strip())
        out[cells[0]] = cells[1:]
    return header, out


@pytest.mark.slow
@pytest.mark.parametrize("name", calibrator_names())  # the registry less its opt-in calibrators
def test_calibrator_table_equals_refits_of_the_saved_logits(bench, name):
    out, rep, rows, _ = bench
    header, ece_rows = table(rep["text"], "Method (ECE)")
    j = header.index(name) - 1
    for method, lab in (("ce", "CE"), ("ls", "LS")):
        p, y = predictions(rows[method], name)
        cell = rep["grid"][method][name]
        assert cell["ece"][0] == pytest.approx(np_ece(p, y), abs=1e-12)
        assert cell["cece"][0] == pytest.approx(np_cece(p, y), abs=1e-9)
        assert cell["nll"][0] == pytest.approx(np_nll(p, y), abs=1e-9)
        assert ece_rows[lab][j].rstrip("<>") == f"{100 * np_ece(p, y):.2f}"


@pytest.mark.slow
def test_temperature_column_equals_the_evaluation_time_numbers(bench):
    _, rep, rows, _ = bench
    for method in ("ce", "ls"):
        after = rows[method]["metrics"]["after"]
        assert rep["grid"][method]["temperature"]["ece"][0] == pytest.approx(after["ece"], abs=1e-12)
        assert rep["grid"][method]["temperature"]["nll"][0] == pytest.approx(after["nll"], abs=1e-12)


@pytest.mark.slow
def test_differences_from_ce_ts_and_their_marks(bench):
    _, rep, rows, _ = bench
    comps = rep["comparisons"]
    ece = {(m, c): np_ece(*predictions(rows[m], c)) for m in ("ce", "ls") for c in ("none", "temperature")}
    assert comps["ls"]["vs_ce_ts"]["diff"] == pytest.approx(ece["ls", "none"] - ece["ce", "temperature"], abs=1e-12)
    assert comps["ls"]["ts_vs_ce_ts"]["diff"] == pytest.approx(ece["ls", "temperature"] - ece["ce", "temperature"],
                                                             abs=1e-12)
    p_ls, y = predictions(rows["ls"], "none")
    p_ce, _ = predictions(rows["ce"], "none")
    acc = lambda p: (p.argmax(1) == y).mean()  # noqa: E731
    assert comps["ls"]["acc_vs_ce"]["diff"] == pytest.approx(acc(p_ls) - acc(p_ce), abs=1e-12)
    for m in ("ce", "ls"):
        for key in ("o_ece", "u_ece"):
            ci = comps[m][key]
            assert ci["value"] == pytest.approx(rows[m]["metrics"]["before"][key], abs=1e-12)
            assert ci["lo"] <= ci["value"] <= ci["hi"] or ci["lo"] == ci["hi"] == 0
    # The smoke preset's CE is badly calibrated before TS (ECE ~ 0.28 against ~ 0.02 after): its
    # difference from CE + TS lies wholly above 0, a significantly *worse* result, marked "!".
    d = comps["ce"]["vs_ce_ts"]
    assert d["lo"] > 0 and d["direction"] == "worse"
    _, ranking = table(rep["text"], "#  Method")
    ce_row = next(cells for cells in ranking.values() if cells[0] == "CE")
    assert ce_row[-2].rstrip("<").endswith(WORSE_MARK) and not ce_row[-2].rstrip("<").endswith(BETTER_MARK)


@pytest.mark.slow
def test_a_corrupt_cache_is_recomputed(bench):
    from calibkit.report import build_report

    out, rep, _, _ = bench
    files = sorted((out / "cache" / "calibrated").glob("*.safetensors"))
    assert len(files) == 2 * (len(calibrator_names()) - 1)  # one per run and calibrator the report fits
    files[0].write_bytes(b"not a safetensors file")
    again = build_report(out, n_boot=20, figures=False, width=0)

    def means(grid):  # (one seed: the std is NaN, which never equals itself)
        return {(m, c, k): v[0] if isinstance(v, tuple) else v
                for m, row in grid.items() for c, cell in row.items() for k, v in cell.items()}
    assert means(again["grid"]) == means(rep["grid"])
    assert read_tensors(files[0])["probs"].dtype == torch.float64  # rewritten


@pytest.mark.slow
def test_compare_command_prints_the_paired_differences(bench):
    out, _, rows, env = bench
    res = subprocess.run([PYTHON, "-m", "calibkit", "compare", str(out), "ls", "ce", "--after", "temperature",
                          "--n-boot", "200"], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    _, got = table(res.stdout, "Metric")
    p_ls, y = predictions(rows["ls"], "temperature")
    p_ce, _ = predictions(rows["ce"], "temperature")
    assert got["ECE"][0] == f"{100 * np_ece(p_ls, y):.2f}" and got["ECE"][1] == f"{100 * np_ece(p_ce, y):.2f}"
    assert got["ECE"][2].startswith(f"{100 * (np_ece(p_ls, y) - np_ece(p_ce, y)):+.2f} [")
    assert got["NLL"][2].startswith(f"{np_nll(p_ls, y) - np_nll(p_ce, y):+.4f} [")
    for bad, msg in ((["xx", "ce"], "no finished runs of method 'xx'"),
                     (["ls", "ce", "--after", "nope"], "unknown calibrator 'nope'")):
        res = subprocess.run([PYTHON, "-m", "calibkit", "compare", str(out), *bad], capture_output=True, text=True,
                             env=env, timeout=300)
        assert res.returncode == 1 and msg in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_direction_and_marks():
    assert direction(-0.03, -0.01) == "better" and direction(0.01, 0.03) == "worse"
    assert direction(-0.01, 0.02) is None and direction(0.0, 0.02) is None  # touching 0: not significant
    assert direction(0.01, 0.03, "acc") == "better" and direction(-0.03, -0.01, "acc") == "worse"
    worse = {"diff": 0.02, "lo": 0.01, "hi": 0.03, "significant": True}
    assert fmt_delta(worse) == "+2.00 [+1.00, +3.00]" + WORSE_MARK
    assert fmt_delta(worse, "acc") == "+2.00 [+1.00, +3.00]" + BETTER_MARK
    assert fmt_delta({**worse, "metric": "acc"}) == "+2.00 [+1.00, +3.00]" + BETTER_MARK


@pytest.mark.parametrize("argv,line", [
    (["ce", "ce"], "A and B are both 'ce': a method compared with itself differs by 0 everywhere; name two "
     "different methods (e.g. ls ce)"),
    (["ls", "ce", "--after", ""],
     "--after: unknown calibrator ''; expected one of " + ", ".join(calibrator_names()[1:])),
])
def test_compare_refuses_a_method_against_itself_and_an_empty_calibrator(argv, line, tmp_path, capsys):
    from calibkit.cli import main

    (tmp_path / "runs.db").write_bytes(b"")  # refused before the database is opened
    assert main(["compare", str(tmp_path), *argv]) == 1
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"calibkit compare: error: {line}"] and captured.out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.db"]
