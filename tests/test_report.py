"""The bench report on runs constructed here: table numbers = database numbers, significance, files."""

import re
import subprocess

import numpy as np
import pytest
import torch

from calibkit import rundir
from calibkit.report import BEFORE_COLS, build_report
from calibkit.store import Store, run_key
from tests.conftest import PYTHON

K, N = 5, 800


def _logits(gen, labels, sharpness, noise):
    """Logits whose argmax is right ~75% of the time; ``sharpness`` sets the confidence."""
    base = torch.randn(len(labels), K, generator=gen) * noise
    base[torch.arange(len(labels)), labels] += 1.5
    return base * sharpness


def make_bench(out, methods=("ce", "ls", "focal"), seeds=(0, 1)):
    """A results database whose runs have real logits files: CE over-confident, LS calibrated,
    focal an exact copy of CE (a difference of zero that must not be called significant)."""
    from calibkit.metrics import evaluate

    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(0, K, (N,), generator=gen)
    val_labels = torch.randint(0, K, (N,), generator=gen)
    store = Store(out / "runs.db")
    for seed in seeds:
        for method in methods:
            g = torch.Generator().manual_seed(seed)
            sharp = {"ce": 4.0, "focal": 4.0, "ls": 1.0}.get(method, 2.0)
            test, val = _logits(g, labels, sharp, 1.0), _logits(g, val_labels, sharp, 1.0)
            d = out / "runs" / method / f"seed{seed}"
            d.mkdir(parents=True)
            rundir.write_tensors(d / rundir.LOGITS, {"test_logits": test, "test_labels": labels,
                                                      "val_logits": val, "val_labels": val_labels})
            key = run_key("t", method, seed)
            assert store.claim(key, preset="t", method=method, seed=seed, config={"sharp": sharp})
            store.finish(key, run_dir=str(d), logits_path=str(d / rundir.LOGITS), train_time_s=1.0 + seed,
                         metrics={"before": evaluate(test.softmax(1), labels),
                                  "after": evaluate((test / 2).softmax(1), labels), "temperature": 2.0},
                         ood={"auroc_entropy": 0.7 + 0.01 * seed, "auroc_maxconf": 0.6},
                         robustness={"overall": {"acc": 0.5, "ece": 0.1},
                                     "by_severity": {"1": {"acc": 0.6, "ece": 0.05}, "5": {"acc": 0.4, "ece": 0.2}}})
    store.close()
    return store


def _row(text, label):
    """Cells of the first table's row for ``label`` (columns are separated by 2+ spaces)."""
    for line in text.splitlines():
        if line.startswith(label + "  "):
            return re.split(r"\s{2,}", line.strip())
    raise AssertionError(f"no row {label!r} in\n{text}")


def test_table_numbers_equal_database(tmp_path):
    make_bench(tmp_path)
    rep = build_report(tmp_path, n_boot=200, figures=False)
    rows = Store(tmp_path / "runs.db", readonly=True).runs("t")
    for method, label in (("ce", "CE"), ("ls", "LS")):
        cells = _row(rep["text"], label)
        assert cells[1] == "2"  # seeds
        for j, (key, _, scale, dec) in enumerate(BEFORE_COLS):
            values = [r["metrics"]["before"][key] * scale for r in rows if r["method"] == method]
            expected = f"{np.mean(values):.{dec}f} +- {np.std(values, ddof=1):.{dec}f}"
            assert cells[2 + j] == expected, (method, key)


def test_ece_difference_significance(tmp_path):
    make_bench(tmp_path)
    rep = build_report(tmp_path, n_boot=300, figures=False)
    d = rep["deltas"]
    assert set(d) == {"ls", "focal"}
    # LS is far better calibrated than the over-confident CE: a negative, significant difference.
    assert d["ls"]["diff"] < 0 and d["ls"]["hi"] < 0 and d["ls"]["significant"]
    # Focal here is a copy of CE: zero difference, never significant.
    assert d["focal"]["diff"] == 0 and not d["focal"]["significant"]
    assert _row(rep["text"], "LS")[-1].endswith("*")
    assert not _row(rep["text"], "Focal")[-1].endswith("*")
    # The reported difference is the seed-averaged ECE difference of the database's numbers.
    rows = Store(tmp_path / "runs.db", readonly=True).runs("t")
    ece = {(r["method"], r["seed"]): r["metrics"]["before"]["ece"] for r in rows}
    expected = np.mean([ece["ls", s] - ece["ce", s] for s in (0, 1)])
    assert d["ls"]["diff"] == pytest.approx(expected, abs=1e-9)


def test_report_files_hold_database_numbers(tmp_path, cli_env):
    make_bench(tmp_path)
    out = subprocess.run([PYTHON, "-m", "calibkit", "report", str(tmp_path), "--n-boot", "100"],
                         capture_output=True, text=True, env=cli_env, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = Store(tmp_path / "runs.db", readonly=True).runs("t")
    ce = [r["metrics"]["before"]["ece"] * 100 for r in rows if r["method"] == "ce"]
    cell = f"{np.mean(ce):.2f} ± {np.std(ce, ddof=1):.2f}"
    md = (tmp_path / "report" / "report.md").read_text()
    page = (tmp_path / "report" / "index.html").read_text()
    assert cell in md and cell in page
    assert cell.replace("±", "+-") in out.stdout
    # Self-contained: every figure embedded, none linked; one reliability figure per method + 2 summaries.
    assert page.count("data:image/png;base64,") == 3 + 2
    assert "src=\"figures/" not in page
    for method in ("ce", "ls", "focal"):
        assert (tmp_path / "report" / "figures" / f"reliability_{method}.png").stat().st_size > 1000


def test_report_errors(tmp_path, cli_env):
    out = subprocess.run([PYTHON, "-m", "calibkit", "report", str(tmp_path)], capture_output=True, text=True,
                         env=cli_env, timeout=120)
    assert out.returncode == 1 and "runs.db not found" in out.stderr
    (tmp_path / "runs.db").write_bytes(b"garbage" * 100)
    out = subprocess.run([PYTHON, "-m", "calibkit", "report", str(tmp_path)], capture_output=True, text=True,
                         env=cli_env, timeout=120)
    assert out.returncode == 1 and "not an SQLite database" in out.stderr
    assert (tmp_path / "runs.db").read_bytes() == b"garbage" * 100
    empty = tmp_path / "empty"
    Store(empty / "runs.db").close()
    with pytest.raises(ValueError, match="no runs"):
        build_report(empty)
