"""The report's caches and its shared fits change no printed number; the caches are keyed by content."""

import os
import shutil

import torch

from calibkit.calibrators.selection import SelectionRule
from calibkit.report import build_report, verdict
from calibkit.report.calibrated import CalibratedProbs, tensor_digest
from calibkit.report.verdict import run_scores
from calibkit.rundir import read_tensors, write_tensors
from tests.report.test_report import make_bench

RULE = SelectionRule(n_boot=40)


def _report_md(out) -> str:
    """report.md without the lines that hold wall times (none are expected; kept out should one appear)."""
    text = (out / "report" / "report.md").read_text()
    return "\n".join(ln for ln in text.splitlines() if "wall time" not in ln.lower())


def test_cached_shared_and_unshared_builds_print_the_same_report(tmp_path, monkeypatch, one_thread):
    """Cold (nothing cached), warm (every cache hit) and cold without the shared fits: identical text and report.md."""
    make_bench(tmp_path / "a", methods=("ce", "ls"), seeds=(0,))
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    cold = build_report(tmp_path / "a", n_boot=20, figures=False, width=0)
    cold_md = _report_md(tmp_path / "a")
    assert any((tmp_path / "a" / "cache" / d).iterdir() for d in ("calibrated", "selection", "sets"))

    calls = []
    real = verdict.cross_fit
    monkeypatch.setattr(verdict, "cross_fit", lambda *a, **k: calls.append(1) or real(*a, **k))
    warm = build_report(tmp_path / "a", n_boot=20, figures=False, width=0)
    assert calls == []  # every run's cross-fitted scores came from the cache
    assert warm["text"] == cold["text"] and _report_md(tmp_path / "a") == cold_md

    # the code path that fits every calibrator a second time for the cross-fitting (no shared fits)
    monkeypatch.setattr(CalibratedProbs, "fitted", lambda self, row: {})
    unshared = build_report(tmp_path / "b", n_boot=20, figures=False, width=0)
    assert len(calls) == 2  # both runs cross-fitted: b's caches were empty
    assert unshared["text"] == cold["text"] and _report_md(tmp_path / "b") == cold_md


def test_the_cross_fitting_reuses_the_report_s_whole_split_fits(tmp_path, one_thread):
    make_bench(tmp_path, methods=("ce",), seeds=(0,))
    from calibkit.report.tuning import load_current_runs

    _, rows = load_current_runs(tmp_path, None, None)
    row = rows[0]
    probs = CalibratedProbs()
    probs(row, "temperature")
    fit = probs.fitted(row)["temperature"]
    t = probs.logits(row)
    from calibkit.calibrators import TemperatureScaling

    again = TemperatureScaling().fit(t["val_logits"].double(), t["val_labels"])
    assert float(fit.temperature_) == float(again.temperature_)  # the same fit on the same rows
    shared = run_scores(row, probs, RULE)
    alone = run_scores(row, CalibratedProbs(), RULE)
    assert shared.keys() == alone.keys()
    for name in shared:
        a, b = shared[name].to_dict(), alone[name].to_dict()
        a.pop("seconds"), b.pop("seconds")
        assert a == b, name


def _row(tmp_path, seed=0, n=400, k=4):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g) * 3
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    path = tmp_path / "logits.safetensors"
    write_tensors(path, {"val_logits": z[:200], "val_labels": y[:200], "test_logits": z[200:], "test_labels": y[200:]})
    return {"run_key": "p/ce/0", "seed": 0, "logits_path": str(path)}


def test_changing_the_rule_or_the_logits_misses_the_cache(tmp_path, monkeypatch):
    row, cache = _row(tmp_path), tmp_path / "cache"
    calls = []
    real = verdict.cross_fit
    monkeypatch.setattr(verdict, "cross_fit", lambda *a, **k: calls.append(1) or real(*a, **k))
    first = run_scores(row, CalibratedProbs(), RULE, cache_dir=cache)
    assert len(calls) == 1
    assert run_scores(row, CalibratedProbs(), RULE, cache_dir=cache)["temperature"].nll == first["temperature"].nll
    assert len(calls) == 1
    # fields that only choose from the scores share them
    run_scores(row, CalibratedProbs(), SelectionRule(n_boot=40, acc_tolerance=0.02, level=0.9), cache_dir=cache)
    assert len(calls) == 1
    # fields the scores depend on do not
    for i, rule in enumerate((SelectionRule(n_boot=40, n_folds=3), SelectionRule(n_boot=40, seed=1),
                              SelectionRule(n_boot=40, n_bins=10), SelectionRule(n_boot=50)), start=2):
        run_scores(row, CalibratedProbs(), rule, cache_dir=cache)
        assert len(calls) == i
    # the same file rewritten with one logit changed and its old size and modification time: a miss
    path, st = row["logits_path"], os.stat(row["logits_path"])
    t = read_tensors(path)
    t["val_logits"][0, 0] += 1.0
    write_tensors(path, t)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.path.getsize(path) == st.st_size
    changed = run_scores(row, CalibratedProbs(), RULE, cache_dir=cache)
    assert len(calls) == 6
    assert changed["temperature"].nll != first["temperature"].nll
    # a copy of the file elsewhere (a copied bench directory, `calibkit compare` on it) is a hit
    shutil.copy(path, tmp_path / "copy.safetensors")
    run_scores(dict(row, logits_path=str(tmp_path / "copy.safetensors")), CalibratedProbs(), RULE, cache_dir=cache)
    assert len(calls) == 6


def test_calibrated_probabilities_follow_the_logits_content(tmp_path):
    row, cache = _row(tmp_path), tmp_path / "cache"
    first, _ = CalibratedProbs(cache)(row, "temperature")
    path, st = row["logits_path"], os.stat(row["logits_path"])
    t = read_tensors(path)
    t["test_logits"] = t["test_logits"] * 2
    write_tensors(path, t)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    got, _ = CalibratedProbs(cache)(row, "temperature")
    want, _ = CalibratedProbs()(row, "temperature")  # no cache at all
    assert torch.equal(got, want) and not torch.equal(got, first)


def test_the_digest_sees_dtype_shape_and_every_byte():
    z = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    base = tensor_digest({"a": z}, ["a"])
    assert tensor_digest({"a": z.clone()}, ["a"]) == base
    assert tensor_digest({"a": z.double()}, ["a"]) != base
    assert tensor_digest({"a": z.reshape(4, 3)}, ["a"]) != base
    bumped = z.clone()
    bumped[2, 3] = torch.nextafter(bumped[2, 3], torch.tensor(100.0))
    assert tensor_digest({"a": bumped}, ["a"]) != base
    assert tensor_digest({"b": z}, ["b"]) != base
