"""``calibkit bench``: the grid's conformance, and the smoke preset end to end with an interruption."""

import json
import os
import re
import signal
import sqlite3
import subprocess
import time

import numpy as np
import pytest

from calibkit.bench.grid import METHODS, PRESETS, REFERENCE, get_preset, select_methods
from calibkit.bench.twostage import SHIPPED_STORES
from calibkit.store import Store
from tests.conftest import PYTHON, ROOT

GRID = tuple(METHODS)


# The end-to-end test below runs one method of each kind of run, the first in grid order for every
# (kind, trainer method) pair: plain training (CE), mixup, RegMixup, MaC-Cal and CSM (two stages
# on CE's run). Its checks (resuming, provenance, tables = database = report) are the same for
# every method of a kind; that every method of the grid runs in the smoke bench is checked by
# tests/test_readme.py, whose quick start runs all of them and fails on any failed run.
# CSM needs calibkit's shipped Fashion-MNIST generated set; without it the test leaves CSM out, and
# test_missing_csm_store_fails_before_any_run covers the CSM path's error.
CSM_READY = (SHIPPED_STORES["fmnist"] / "store.json").is_file()


def _one_method_per_kind() -> tuple[str, ...]:
    first: dict = {}
    for name, spec in METHODS.items():
        if CSM_READY or name != "csm":
            first.setdefault((spec.kind, spec.method), name)
    return tuple(first.values())


SMOKE_METHODS = _one_method_per_kind()


def _documented_grid() -> list[str]:
    """The first column of the table under "The grid" in docs/bench.md, in order."""
    with open(os.path.join(ROOT, "docs", "bench.md")) as f:
        section = f.read().split("\n## The grid", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, flags=re.M)


def test_grid_is_the_documented_table():
    assert _documented_grid() == list(GRID)
    assert GRID[0] == REFERENCE
    for i, (name, spec) in enumerate(METHODS.items()):  # what a method builds on comes before it
        assert set(spec.needs) <= set(GRID[:i]), name
    assert select_methods(None) == list(GRID)
    # CE is always added (reference, MaC-Cal stage 1, CSM encoder), in grid order.
    assert select_methods(["csm", "ls"]) == ["ce", "ls", "csm"]
    with pytest.raises(ValueError, match="valid methods: ce, ls"):
        select_methods(["nope"])
    with pytest.raises(ValueError, match="valid presets: smoke, default"):
        get_preset("nope")


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_builds_every_run(name):
    """Each (preset, method) gives a valid TrainConfig and a loss that calibkit.losses builds."""
    from calibkit.bench.runner import train_config
    from calibkit.losses import build

    preset = PRESETS[name]
    for method, spec in METHODS.items():
        cfg = train_config(preset, method, seed=preset.seeds[0], csm_data="somewhere")
        assert cfg.data == preset.dataset and cfg.model == preset.model and cfg.method == spec.method
        assert cfg.checkpoint_every == preset.checkpoint_every
        build(preset.loss_for(method), num_classes=10 if name != "cifar100" else 100)


def test_checkpoint_interval_is_a_runtime_setting_of_the_presets(tmp_path):
    """The Fashion-MNIST presets checkpoint every 5 epochs; the interval is not part of the runs'
    records, so bench directories recorded before it existed stay consistent with them."""
    from calibkit.bench.runner import Bench

    assert [PRESETS[n].checkpoint_every for n in ("smoke", "default", "full", "cifar10")] == [1, 5, 5, 1]
    bench = Bench(PRESETS["default"], tmp_path, device="cpu", log=lambda *a, **k: None)
    try:
        record = json.dumps(bench.factory.config_record("ce", 0))
    finally:
        bench.close()
    assert "checkpoint" not in record and '"keep": "best-acc"' in record


def _db_rows(path):
    if not os.path.exists(path):
        return []
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return con.execute("SELECT run_key, status FROM runs").fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        con.close()


def _cells(text, label):
    for line in text.splitlines():
        if line.startswith(label + "  "):
            return re.split(r"\s{2,}", line.strip())
    raise AssertionError(f"no row {label!r} in\n{text}")


def first_table_header(text: str) -> list[str]:
    """Column names of the first plain-text table in ``text`` (a header line over a line of dashes)."""
    lines = text.splitlines()
    for head, rule in zip(lines, lines[1:]):
        if re.fullmatch(r"-+( +-+)+", rule.strip()):
            return re.split(r"\s{2,}", head.strip())
    raise AssertionError("no table in the text")


@pytest.mark.slow
def test_smoke_preset_end_to_end_with_interruption(tmp_path, cli_env):
    cli_env = {**cli_env, "COLUMNS": "200"}  # wide: every table prints in one piece
    out = tmp_path / "bench"
    db = out / "runs.db"
    cmd = [PYTHON, "-m", "calibkit", "bench", "--preset", "smoke", "--out", str(out), "--methods", *SMOKE_METHODS]
    # 1. Start the whole smoke grid and kill it hard once two runs are recorded as done.
    proc = subprocess.Popen(cmd, env=cli_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while sum(s == "done" for _, s in _db_rows(db)) < 2:
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.time() < deadline, "the smoke bench recorded no two runs in 4 minutes"
        time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = {r["run_key"]: r for r in Store(db, readonly=True).runs("smoke")}
    assert len(before) >= 2

    # 2. Start it again: finished runs are skipped (same rows, same timestamps), the rest completes.
    t0 = time.time()
    res = subprocess.run(cmd, env=cli_env, capture_output=True, text=True, timeout=600)
    wall = time.time() - t0
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    store = Store(db, readonly=True)
    rows = store.runs("smoke", status=None)
    assert sorted(r["method"] for r in rows) == sorted(SMOKE_METHODS)
    assert all(r["status"] == "done" for r in rows), [(r["run_key"], r["error"]) for r in rows]
    for key, old in before.items():
        new = store.get(key)
        assert (new["id"], new["finished_at"], new["attempts"], new["metrics"]) == \
            (old["id"], old["finished_at"], old["attempts"], old["metrics"]), key
        assert f"{key}: finished earlier" in res.stdout
    print(f"smoke bench (second part, {len(SMOKE_METHODS) - len(before)} runs): {wall:.0f} s")

    # 3. Every row carries its provenance and numbers.
    for r in rows:
        assert r["config"]["method"] == r["method"] and r["seed"] == 0
        assert r["versions"]["torch"] and "git_commit" in r
        assert set(r["metrics"]["before"]) >= {"acc", "ece", "aece", "cece", "o_ece", "u_ece", "mce", "nll", "brier"}
        assert r["metrics"]["temperature"] > 0
        assert 0 <= r["ood"]["auroc_entropy"] <= 1 and 0 <= r["ood"]["auroc_maxconf"] <= 1
        assert set(r["robustness"]["by_severity"]) == {str(s) for s in PRESETS["smoke"].severities}
        assert os.path.isfile(r["logits_path"]) and r["train_time_s"] > 0

    # 4. The first printed table is the one docs/bench.md shows (same columns); the grid-order table
    # holds the database's numbers, and so do report.md and index.html.
    with open(os.path.join(ROOT, "docs", "bench.md")) as f:
        shown = f.read().split("\n#### What it prints", 1)[1]
    assert first_table_header(res.stdout[res.stdout.index("calibkit bench: preset"):]) == \
        first_table_header(shown)
    grid_part = res.stdout[res.stdout.index("Test set, before temperature scaling (grid order)"):]
    for r in rows:
        label = METHODS[r["method"]].label
        cells = _cells(grid_part, label)
        assert cells[2] == f"{r['metrics']['before']['acc'] * 100:.2f}"
        assert cells[3] == f"{r['metrics']['before']['ece'] * 100:.2f}"
        if r["method"] == REFERENCE:
            assert cells[-1] == "(reference)"
        else:
            assert re.fullmatch(r"[+-]\d+\.\d\d \[[+-]\d+\.\d\d, [+-]\d+\.\d\d\][*!]?", cells[-1]), cells[-1]
    md = (out / "report" / "report.md").read_text()
    page = (out / "report" / "index.html").read_text()
    for r in rows:
        cell = f"{r['metrics']['before']['ece'] * 100:.2f}"
        assert f"| {METHODS[r['method']].label} | 1 | {r['metrics']['before']['acc'] * 100:.2f} | {cell} |" in md
        assert f"<td>{cell}</td>" in page
    # the smoke preset draws the per-method figures of CE and the recommended method only
    # (report_figures = "ce-and-chosen", docs/bench.md "The smoke report")
    use = re.search(r"\*\*Use: (.+?) \+ [a-z_]+\*\*", md).group(1)
    recommended = next(m for m in SMOKE_METHODS if METHODS[m].label == use)
    drawn = {f.stem.removeprefix("reliability_") for f in (out / "report" / "figures").glob("reliability_*.png")}
    assert drawn - {"ce_vs_chosen"} == {REFERENCE, recommended}
    # + the methods x calibrators heatmap + the three evidence figures + the risk-coverage curves
    assert page.count("data:image/png;base64,") == len({REFERENCE, recommended}) + 2 + 1 + 3 + 1

    # 5. `calibkit report` rebuilds the same tables from the database alone.
    rep = subprocess.run([PYTHON, "-m", "calibkit", "report", str(out)], env=cli_env, capture_output=True,
                         text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr
    table = res.stdout[res.stdout.index("Test set, before"):res.stdout.index("report: ")]
    assert table in rep.stdout


def test_bench_refuses_corrupt_database(tmp_path, cli_env):
    out = tmp_path / "bench"
    out.mkdir()
    garbage = np.random.default_rng(0).bytes(5000)
    (out / "runs.db").write_bytes(garbage)
    res = subprocess.run([PYTHON, "-m", "calibkit", "bench", "--preset", "smoke", "--out", str(out),
                          "--methods", "ce"], env=cli_env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "not an SQLite database" in res.stderr and "Traceback" not in res.stderr
    assert (out / "runs.db").read_bytes() == garbage
    assert sorted(os.listdir(out)) == ["runs.db"]


def test_missing_csm_store_fails_before_any_run(tmp_path, cli_env):
    """A grid with CSM but no generated set stops before the first run and creates nothing."""
    out = tmp_path / "bench"
    res = subprocess.run([PYTHON, "-m", "calibkit", "bench", "--preset", "smoke", "--out", str(out), "--methods",
                          "csm", "--csm-store", str(tmp_path / "nowhere")], env=cli_env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 1, res.stdout + res.stderr
    assert res.stderr.count("\n") == 1 and "calibkit csm generate" in res.stderr
    assert res.stdout == "" and not out.exists()


def test_evaluation_sets_are_built_once_per_bench(tmp_path):
    """Every seed shares one EvalData (the test split is not drawn by the seed); other sets get another."""
    from dataclasses import replace

    import torch

    from calibkit.bench.runner import Bench

    preset = replace(PRESETS["smoke"], dataset="digits", seeds=(0, 1), robust_n=50, severities=(1,),
                     train={**PRESETS["smoke"].train, "train_subset": None, "val_size": 100})
    bench = Bench(preset, tmp_path / "b", device="cpu", num_threads=1, log=lambda *a, **k: None)
    try:
        a, b = bench.eval_data(0), bench.eval_data(1)
        assert a is b
        # the same test images as a bundle loaded under seed 1
        from calibkit.data import load

        assert torch.equal(a.bundle.test.images, load("digits", seed=1, val_size=100).test.images)
        assert a.on("ood", "cpu") is a.on("ood", "cpu")  # one copy per device
        other = bench.eval_data(0, preset=replace(preset, robust_n=20))
        assert other is not a and len(other.robust_index()) == 20
    finally:
        bench.close()
