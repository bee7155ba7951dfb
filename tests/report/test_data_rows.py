"""``calibkit.report.data.usable_rows``: a finished row the report cannot read is named (run key, field),
left out with a warning, and the report is built from the others with exactly their numbers."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import warnings

import numpy as np
import pytest

from calibkit.report import build_report
from calibkit.report.data import row_problem, usable_rows
from calibkit.store import Store
from tests.conftest import PYTHON
from tests.report.test_report import _row, make_bench

# (SQL applied to row t/ls/1, the field named in the warning)
CORRUPTIONS = {
    "metric is text": ("UPDATE runs SET metrics = json_set(metrics, '$.before.ece', 'abc')",
                       "metrics.before.ece: expected a finite number, got 'abc'"),
    "metrics not an object": ("UPDATE runs SET metrics = '[1, 2]'", "metrics: expected an object, got [1, 2]"),
    "ood not an object": ("UPDATE runs SET ood = '\"x\"'", "ood: expected an object, got 'x'"),
    "temperature is text": ("UPDATE runs SET metrics = json_set(metrics, '$.temperature', 'hot')",
                            "metrics.temperature: expected a positive number, got 'hot'"),
    "metrics not JSON": ("UPDATE runs SET metrics = '{\"before\": {'",
                         "metrics: not valid JSON (Expecting property name enclosed in double quotes: line 1 column 13 "
                         "(char 12))"),
    "logits file gone": ("UPDATE runs SET logits_path = '/nonexistent/logits.safetensors'",
                         "logits_path: /nonexistent/logits.safetensors not found"),
}


@pytest.fixture(scope="module")
def untouched(tmp_path_factory):
    """A bench of :func:`make_bench` (CE and LS, seeds 0 and 1) whose report caches are filled by one
    build of the untouched runs. Each test below corrupts a copy of it: the caches are keyed by the
    runs' logits (a copied directory refits nothing), so the copy's report recomputes only what the
    corrupted row changes, and every test still builds its own report from its own database."""
    out = tmp_path_factory.mktemp("untouched")
    make_bench(out, methods=("ce", "ls"))  # the LS row to corrupt and the untouched CE rows
    build_report(out, n_boot=50, figures=False, width=0)
    shutil.rmtree(out / "report")  # each copy writes its own
    return out


def _copy(untouched, dest):
    shutil.copytree(untouched, dest, dirs_exist_ok=True)


def _corrupt(out, sql):
    con = sqlite3.connect(out / "runs.db")
    con.execute(sql + " WHERE run_key = 't/ls/1'")
    con.commit()
    con.close()


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_a_corrupt_row_is_named_and_left_out(case, untouched, tmp_path):
    sql, field = CORRUPTIONS[case]
    _copy(untouched, tmp_path)
    _corrupt(tmp_path, sql)
    with pytest.warns(UserWarning) as caught:
        rep = build_report(tmp_path, n_boot=50, figures=False, width=0)
    left_out = [str(w.message) for w in caught if "left out" in str(w.message)]
    assert left_out == [f"t/ls/1: {field}; left out of the report"]
    # LS is reported from its one readable seed, with that seed's numbers; CE untouched
    cells = _row(rep["text"], "LS")
    rows = Store(tmp_path / "runs.db", readonly=True).runs("t", tolerant=True)
    seed0 = [r for r in rows if r["run_key"] == "t/ls/0"][0]
    assert cells[1] == "1" and cells[2] == f"{seed0['metrics']['before']['acc'] * 100:.2f}"
    assert _row(rep["text"], "CE")[1] == "2"
    assert f"t/ls/1: {field}" in (tmp_path / "report" / "report.md").read_text()


def test_a_cell_that_is_not_json_names_the_run_and_column(tmp_path):
    make_bench(tmp_path, methods=("ce",), seeds=(0,))
    con = sqlite3.connect(tmp_path / "runs.db")
    con.execute("UPDATE runs SET ood = 'nope'")
    con.commit()
    con.close()
    store = Store(tmp_path / "runs.db", readonly=True)
    with pytest.raises(ValueError, match=r"^results database: run t/ce/0: ood is not valid JSON \(Expecting value"):
        store.runs("t")
    (row,) = store.runs("t", tolerant=True)
    assert (row["ood"] is None
            and row["corrupt"] == {"ood": "not valid JSON (Expecting value: line 1 column 1 (char 0))"})
    assert row["metrics"]["before"]["ece"] > 0  # the other cells decoded
    store.close()


def test_row_problem_by_hand():
    good = {"status": "done", "run_key": "k", "metrics": {"before": {"ece": 0.1}, "after": {"ece": 0.05},
                                                          "temperature": 1.5}, "ood": None, "robustness": {}}
    assert row_problem(good) is None
    for change, why in ((("metrics", "before"), {"ece": float("nan")}), (("metrics", "temperature"), -1.0),
                        (("metrics", "after"), {"ece": True}), (("robustness", "overall"), [0.5])):
        bad = json.loads(json.dumps(good))
        bad[change[0]][change[1]] = why
        assert row_problem(bad) is not None and row_problem(bad).startswith(".".join(change))
    assert row_problem({**good, "corrupt": {"metrics": "not valid JSON"}}) == "metrics: not valid JSON"
    rows, skipped = usable_rows([good, {**good, "run_key": "x", "metrics": 3}, {"status": "failed", "metrics": 3}])
    assert [r.get("run_key") for r in rows] == ["k", None] and skipped == ["x: metrics: expected an object, got 3"]


def test_when_every_row_is_corrupt_the_error_names_them(tmp_path):
    make_bench(tmp_path, methods=("ce",), seeds=(0,))
    con = sqlite3.connect(tmp_path / "runs.db")
    con.execute("UPDATE runs SET metrics = '[]'")
    con.commit()
    con.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=r"that the report can read \(1 left out: t/ce/0: metrics: expected an "
                                             r"object, got \[\]\)"):
            build_report(tmp_path, n_boot=50, figures=False)


def test_the_cli_warns_in_one_line_and_builds_the_rest(untouched, tmp_path, cli_env):
    _copy(untouched, tmp_path)
    _corrupt(tmp_path, CORRUPTIONS["metric is text"][0])
    res = subprocess.run([PYTHON, "-m", "calibkit", "report", str(tmp_path), "--n-boot", "50", "--quiet"],
                         capture_output=True, text=True, env={**cli_env, "COLUMNS": "200"}, timeout=300)
    assert res.returncode == 0, res.stderr
    # --quiet: the warning is the only line on stderr (no progress lines)
    assert res.stderr.splitlines() == ["calibkit report: warning: t/ls/1: metrics.before.ece: expected a finite "
                                       "number, got 'abc'; left out of the report"]
    assert "report:" in res.stdout and np.isfinite(float(_row(res.stdout, "LS")[2]))


def test_compare_names_a_missing_logits_file_instead_of_calling_the_method_absent(tmp_path, capsys):
    from calibkit.cli import main

    make_bench(tmp_path, methods=("ce", "ls"), seeds=(0,))
    gone = tmp_path / "runs" / "ls" / "seed0" / "logits.safetensors"
    gone.unlink()
    def files():  # (reading a WAL database touches its -wal / -shm files)
        return sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if not p.name.endswith(("-wal", "-shm")))
    before = files()
    assert main(["compare", str(tmp_path), "ls", "ce", "--n-boot", "20"]) == 1
    assert capsys.readouterr().err == (f"calibkit compare: error: no usable finished runs of method 'ls': t/ls/0: "
                                       f"logits_path: {gone} not found\n")
    assert files() == before


def test_compare_warns_about_a_run_it_leaves_out(tmp_path):
    from calibkit.commands.compare import _left_out

    rows = [{"status": "done", "method": "ls", "run_key": "t/ls/0", "logits_path": str(tmp_path / "gone")},
            {"status": "done", "method": "ls", "run_key": "t/ls/1"},
            {"status": "done", "method": "focal", "run_key": "t/focal/0", "logits_path": str(tmp_path / "gone")}]
    with pytest.warns(UserWarning) as seen:
        _left_out(rows, ("ls", "ce"))  # focal is not compared: not named
    assert [str(w.message) for w in seen] == [f"t/ls/0: logits_path: {tmp_path / 'gone'} not found; left out of the "
                                              "comparison"]
