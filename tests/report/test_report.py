"""The bench report on runs constructed here: table numbers = database numbers, significance, files."""

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from calibkit import rundir
from calibkit.report import BEFORE_COLS, build_report
from calibkit.report.tables import BEST_MARK, Table, text_table
from calibkit.store import Store, run_key
from tests.conftest import PYTHON, ROOT

ROOT_DIR = Path(ROOT)

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


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One bench of :func:`make_bench` and its report (60 resamples; 0: tables never split), read
    by the tests below that only read it."""
    out = tmp_path_factory.mktemp("bench")
    make_bench(out)
    return out, build_report(out, n_boot=60, figures=False, width=0)


def test_table_numbers_equal_database(built):
    out, rep = built
    rows = Store(out / "runs.db", readonly=True).runs("t")
    for method, label in (("ce", "CE"), ("ls", "LS")):
        cells = _row(rep["text"], label)
        assert cells[1] == "2"  # seeds
        for j, (key, _, scale, dec) in enumerate(BEFORE_COLS):
            values = [r["metrics"]["before"][key] * scale for r in rows if r["method"] == method]
            expected = f"{np.mean(values):.{dec}f} +- {np.std(values, ddof=1):.{dec}f}"
            assert cells[2 + j] == expected, (method, key)


def test_ece_difference_significance(built):
    out, rep = built
    d = rep["deltas"]
    assert set(d) == {"ls", "focal"}
    # LS is far better calibrated than the over-confident CE: a negative, significant difference.
    assert d["ls"]["diff"] < 0 and d["ls"]["hi"] < 0 and d["ls"]["significant"]
    # Focal here is a copy of CE: zero difference, never significant.
    assert d["focal"]["diff"] == 0 and not d["focal"]["significant"]
    assert _row(rep["text"], "LS")[-1].endswith("*")
    assert not _row(rep["text"], "Focal")[-1].endswith("*")
    # The reported difference is the seed-averaged ECE difference of the database's numbers.
    rows = Store(out / "runs.db", readonly=True).runs("t")
    ece = {(r["method"], r["seed"]): r["metrics"]["before"]["ece"] for r in rows}
    expected = np.mean([ece["ls", s] - ece["ce", s] for s in (0, 1)])
    assert d["ls"]["diff"] == pytest.approx(expected, abs=1e-9)


def test_ece_difference_interval_is_the_basic_bootstrap_interval(built):
    """The dECE interval, recomputed resample by resample: the bootstrap seed 0 draws the same
    index sets for every seed's pair (N = 800 rows, 60 resamples: one draw of 60 x 800 indices);
    each resample's difference ece(LS) - ece(CE) is averaged over the seeds, and the interval is
    the basic one, [2 d - q_97.5, 2 d - q_2.5], around the seed-averaged difference d."""
    from calibkit.functional import ece

    out, rep = built
    rows = {(r["method"], r["seed"]): r for r in Store(out / "runs.db", readonly=True).runs("t")}
    idx = torch.randint(0, N, (60, N), generator=torch.Generator().manual_seed(0))
    per_seed, point = [], []
    for seed in (0, 1):
        t = {}
        for m in ("ls", "ce"):
            tensors = rundir.read_tensors(rows[m, seed]["logits_path"])
            t[m] = (tensors["test_logits"].double().softmax(1), tensors["test_labels"].long())
        (pa, y), (pb, _) = t["ls"], t["ce"]
        point.append(float(ece(pa, y) - ece(pb, y)))
        per_seed.append(torch.tensor([float(ece(pa[i], y[i]) - ece(pb[i], y[i])) for i in idx]))
    samples, d = torch.stack(per_seed).mean(0), float(np.mean(point))
    q_lo, q_hi = torch.quantile(samples.double(), torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    got = rep["deltas"]["ls"]
    assert got["diff"] == pytest.approx(d, abs=1e-12)
    assert (got["lo"], got["hi"]) == pytest.approx((2 * d - q_hi, 2 * d - q_lo), abs=1e-9)
    # not the percentile interval (the two differ by the bootstrap's bias estimate)
    assert abs(got["lo"] - q_lo) > 1e-6


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
    # Self-contained: every figure embedded, none linked; one reliability figure per method + 2 summaries
    # + the methods x calibrators heatmap + the recommendation's three evidence figures + the risk-coverage curves.
    assert page.count("data:image/png;base64,") == 3 + 2 + 1 + 3 + 1
    assert "src=\"figures/" not in page
    for method in ("ce", "ls", "focal"):
        png = tmp_path / "report" / "figures" / f"reliability_{method}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    # written atomically: no temporary file left, readable by all (a shared bench directory)
    files = [p for p in (tmp_path / "report").rglob("*") if p.is_file()]
    assert not [p.name for p in files if p.name.startswith(".")]
    assert {p.stat().st_mode & 0o777 for p in files} == {0o644}


def test_report_errors(tmp_path, cli_env):
    out = subprocess.run([PYTHON, "-m", "calibkit", "report", str(tmp_path)], capture_output=True, text=True,
                         env=cli_env, timeout=120)
    assert out.returncode == 1 and "runs.db not found" in out.stderr
    (tmp_path / "runs.db").write_bytes(b"garbage" * 100)
    out = subprocess.run([PYTHON, "-m", "calibkit", "report", str(tmp_path)], capture_output=True, text=True,
                         env=cli_env, timeout=120)
    assert out.returncode == 1 and "not an SQLite database" in out.stderr
    assert (tmp_path / "runs.db").read_bytes() == b"garbage" * 100


def test_report_of_a_store_without_runs(tmp_path):
    # apart from the CLI test above: it runs in-process, where the mutation run maps it to
    # build_report, and without the CLI subprocesses' 3 s
    empty = tmp_path / "empty"
    Store(empty / "runs.db").close()
    with pytest.raises(ValueError, match="no runs"):
        build_report(empty)


def _first_table(text):
    """Header and rows (lists of cells) of the first table printed in ``text``."""
    lines = text.splitlines()
    i = next(i for i in range(len(lines) - 1) if re.fullmatch(r"-+( +-+)+", lines[i + 1]))
    rows = []
    for line in lines[i + 2:]:
        if not line.strip():
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return re.split(r"\s{2,}", lines[i].strip()), rows


def test_ranking_equals_database(tmp_path):
    """The summary ranks by the database's mean ECE, shows its means, and marks each column's best."""
    make_bench(tmp_path, methods=("ce", "ls", "focal", "dfl"))
    rep = build_report(tmp_path, n_boot=100, figures=False, width=0)  # one part: every column
    header, rows = _first_table(rep["text"])
    assert header == ["#", "Method", "Acc", "dAcc vs CE", "ECE", "O-ECE [95% CI]", "U-ECE [95% CI]", "ECE (TS)",
                      "dECE vs CE [95% CI]", "dECE vs CE+TS", "dECE(TS) vs CE+TS"]
    db = Store(tmp_path / "runs.db", readonly=True).runs("t")
    mean = {m: {k: np.mean([r["metrics"][p][k.split(".")[1]] for r in db if r["method"] == m
                            for p in [k.split(".")[0]]]) * 100
                for k in ("before.acc", "before.ece", "after.ece")} for m in ("ce", "ls", "focal", "dfl")}
    labels = {"ce": "CE", "ls": "LS", "focal": "Focal", "dfl": "Dual focal"}
    expected = sorted(mean, key=lambda m: mean[m]["before.ece"])
    assert [r[1] for r in rows] == [labels[m] for m in expected]
    best_ece = min(round(v["before.ece"], 2) for v in mean.values())
    for r, m in zip(rows, expected):
        ece = f"{mean[m]['before.ece']:.2f}"
        # the best (lowest) ECE carries the mark; the others do not
        assert r[4] == (ece + BEST_MARK if round(mean[m]["before.ece"], 2) == best_ece else ece)
        assert r[2].rstrip(BEST_MARK) == f"{mean[m]['before.acc']:.2f}"
        assert r[7].rstrip(BEST_MARK) == f"{mean[m]['after.ece']:.2f}"
    # CE and its exact copy (focal) share a rank; the ranks are competition ranks
    ranks = {r[1]: int(r[0]) for r in rows}
    assert ranks["CE"] == ranks["Focal"] and ranks[labels[expected[0]]] == 1
    # the copy of CE is explained in the notes
    assert "Focal gave exactly CE's test predictions" in rep["text"]


def test_text_tables_fit_the_width_and_keep_every_cell():
    rows = [[f"method{i}"] + [f"{i}.{j:02d} +- 0.{j:02d}" for j in range(12)] for i in range(3)]
    table = Table(["Method"] + [f"col{j}" for j in range(12)], rows)
    whole = text_table(table, None).splitlines()
    assert max(map(len, whole)) > 100
    for width in (60, 80, 100, 120):
        lines = text_table(table, width).splitlines()
        assert max(map(len, lines)) <= width
        # reassemble: each part repeats the label column; together they hold every cell once
        parts = [p.splitlines() for p in "\n".join(lines).split("\n\n")]
        assert len(parts) > 1
        for i, row in enumerate(rows):
            cells = [c for p in parts for c in re.split(r"\s{2,}", p[2 + i].strip())[1:]]
            assert cells == row[1:]
        # balanced: no part is much narrower than the others
        widths = [max(map(len, p)) for p in parts]
        assert min(widths) >= max(widths) - 20


def test_text_only_tables_wrap_their_last_column_to_the_width():
    long = ("5000 images, class-stratified seeded draw from the official training split "
            "(checksum 5be0cf30527254f0)")
    rows = [["seed 0: validation", long], ["test", "10000 images"]]
    table = Table(["item", "value"], rows, key_columns=2)
    assert max(map(len, text_table(table, None).splitlines())) > 80
    for width in (60, 80):
        lines = text_table(table, width).splitlines()
        assert max(map(len, lines)) <= width
        indent = len("seed 0: validation  ")
        # the first row's continuation lines sit under the value column and give back its words
        first = [i for i, ln in enumerate(lines) if ln.startswith("seed 0")][0]
        test_row = [i for i, ln in enumerate(lines) if ln.startswith("test")][0]
        cont = lines[first + 1:test_row]
        assert cont and all(ln.startswith(" " * indent) and ln[indent] != " " for ln in cont)
        words = lines[first][indent:].split() + [w for ln in cont for w in ln.split()]
        assert words == long.split()
        assert lines[test_row].split("  ")[-1].strip() == "10000 images"


def test_compare_equals_the_report_against_ce_and_is_antisymmetric(tmp_path):
    from calibkit.report.calibrated import CalibratedProbs
    from calibkit.report.data import ece_deltas, summarize
    from calibkit.report.paired import compare_methods

    make_bench(tmp_path)
    summary = summarize(Store(tmp_path / "runs.db", readonly=True).runs("t"))
    ref = ece_deltas(summary, n_boot=200)["ls"]
    probs = CalibratedProbs()
    rows = {r["metric"]: r for r in compare_methods(summary, "ls", "ce", probs, n_boot=200)["rows"]}
    d = rows["ece"]["delta"]
    assert (d["diff"], d["lo"], d["hi"]) == pytest.approx((ref["diff"], ref["lo"], ref["hi"]), abs=1e-12)
    back = {r["metric"]: r for r in compare_methods(summary, "ce", "ls", probs, n_boot=200)["rows"]}
    # B - A: the same resamples with the sign flipped, so every interval mirrors
    for key, row in rows.items():
        b = back[key]["delta"]
        assert b["diff"] == pytest.approx(-row["delta"]["diff"], abs=1e-12)
        assert (b["lo"], b["hi"]) == pytest.approx((-row["delta"]["hi"], -row["delta"]["lo"]), abs=1e-12)

def test_protocol_lines_describe_how_each_data_set_draws_its_training_set():
    from calibkit.report.protocol import _split_text

    strat = {"val": 500, "rule": "class-stratified seeded draw", "val_checksum": "aa", "train": 1000,
             "train_subset": 1000, "train_checksum": "bb", "test": 10000}
    val, train, test = _split_text(strat, "fmnist")
    assert val == "500 images, class-stratified seeded draw (checksum aa)"
    assert "class-stratified random subset" in train and "checksum bb" in train
    assert test == "10000 images: the test split, the same for every seed"
    # a subset as large as the training split draws nothing: no checksum, all the images
    _, train, _ = _split_text({**strat, "train_checksum": None}, "fmnist")
    assert train == "1000 images: all the images left for training"
    # scenes are drawn one after another: the first N, never called stratified
    _, train, _ = _split_text({**strat, "train": 48, "train_subset": 48, "train_checksum": None}, "scenes")
    assert train == "48 images: the first 48 of the data set's training split"


def test_a_moved_bench_directory_still_reports(tmp_path):
    """The stored logits paths point into the old place; the report finds them under the new one."""
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    make_bench(old, methods=("ce", "ls"))
    want = build_report(old, n_boot=20, figures=False, width=0)
    old.rename(new)
    got = build_report(new, n_boot=20, figures=False, width=0)
    assert got["deltas"]["ls"]["diff"] == want["deltas"]["ls"]["diff"]
    assert got["grid"]["ls"]["temperature"]["ece"][0] == want["grid"]["ls"]["temperature"]["ece"][0]


class _Identity:
    """A calibrator that changes nothing: its column must equal the uncalibrated one."""

    def fit(self, logits, labels):
        return self

    def predict_proba(self, logits):
        return logits.double().softmax(1)


class _Broken:
    def fit(self, logits, labels):
        raise ValueError("cannot fit this")


def test_the_calibrator_table_loops_over_the_registry_and_survives_a_failing_entry(tmp_path, monkeypatch):
    from calibkit.calibrators import CALIBRATORS
    from calibkit.report.calibrated import calibrator_names

    monkeypatch.setitem(CALIBRATORS, "identity", _Identity)
    monkeypatch.setitem(CALIBRATORS, "broken", _Broken)
    make_bench(tmp_path)
    rep = build_report(tmp_path, n_boot=20, figures=True, width=0)
    for method in ("ce", "ls", "focal"):
        assert rep["grid"][method]["identity"] == rep["grid"][method]["none"]
        assert rep["grid"][method]["broken"] is None
    lines = rep["text"].splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("Method (ECE)"))
    header = re.split(r"\s{2,}", lines[head])
    assert header == ["Method (ECE)", *calibrator_names()] and header[-2:] == ["identity", "broken"]
    ce = re.split(r"\s{2,}", lines[head + 2].strip())
    assert ce[0] == "CE" and ce[-1] == "-" and ce[1].rstrip("<>") == ce[header.index("identity")].rstrip("<>")
    assert "Failed (shown as -): broken on t/ce/0: cannot fit this" in rep["text"]
    assert (tmp_path / "report" / "figures" / "calibrators_ece.png").stat().st_size > 1000
