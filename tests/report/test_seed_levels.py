"""The report's paired differences choose one or two bootstrap levels by the number of shared
seeds: checked against the resampling written out here (numpy ECE and accuracy on the drawn test
indices, the documented seed draw), plus the notes sentence and the ``compare`` header that say
which was used."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from calibkit import rundir
from calibkit.report import build
from calibkit.report.calibrated import NONE, CalibratedProbs
from calibkit.report.data import ece_deltas, interval_note, paired_ece_delta
from calibkit.report.paired import compare_methods, compare_text, comparisons, paired_delta

N, K = 120, 3


def np_ece(p, y, n_bins=15):
    """Top-label ECE, equal-width bins (lo, hi] with 0 in the first: sum_b |sum (correct - conf)| / N."""
    conf, correct = p.max(1), (p.argmax(1) == y).astype(float)
    b = np.searchsorted(np.linspace(0, 1, n_bins + 1)[1:-1], conf, side="left")
    return np.abs(np.bincount(b, correct - conf, n_bins)).sum() / len(y)


def np_acc(p, y):
    return float((p.argmax(1) == y).mean())


def basic(samples, estimate, level):
    q_lo, q_hi = np.quantile(np.asarray(samples, dtype=np.float64), [(1 - level) / 2, (1 + level) / 2])
    return 2 * estimate - q_hi, 2 * estimate - q_lo


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """CE (sharp, over-confident) and LS (soft) runs of seeds 0..3 on one test set; the sharpness
    moves with the seed, so the seeds' differences differ."""
    root = tmp_path_factory.mktemp("seeds")
    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(0, K, (N,), generator=gen)
    val_labels = torch.randint(0, K, (N,), generator=gen)
    out = {}
    for method, sharp in (("ce", 3.0), ("ls", 1.0)):
        for seed in range(4):
            def logits(y, sharp=sharp, seed=seed):
                x = torch.randn(len(y), K, generator=gen, dtype=torch.float64)
                x[torch.arange(len(y)), y] += 1.0
                return x * sharp * (1 + 0.3 * seed)
            d = root / method / str(seed)
            d.mkdir(parents=True)
            path = d / rundir.LOGITS
            rundir.write_tensors(path, {"test_logits": logits(labels), "test_labels": labels,
                                        "val_logits": logits(val_labels), "val_labels": val_labels})
            out[method, seed] = {"run_key": f"t/{method}/{seed}", "method": method, "seed": seed, "status": "done",
                                 "logits_path": str(path), "metrics": {}}
    return labels.numpy(), out


def probs_of(row):
    return rundir.read_tensors(row["logits_path"])["test_logits"].double().softmax(1).numpy()


def by_hand(rows_a, rows_b, labels, metric, n_boot, seed, level, two_levels):
    """The seed-averaged paired difference and its basic interval, resample by resample."""
    idx = torch.randint(0, N, (n_boot, N), generator=torch.Generator().manual_seed(seed)).numpy()
    per_seed, est = [], []
    for a, b in zip(rows_a, rows_b):
        pa, pb = probs_of(a), probs_of(b)
        per_seed.append([metric(pa[i], labels[i]) - metric(pb[i], labels[i]) for i in idx])
        est.append(metric(pa, labels) - metric(pb, labels))
    per_seed = np.array(per_seed)  # (S, R)
    s = len(rows_a)
    if two_levels:
        draws = np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0]).integers(0, s, size=(n_boot, s))
        thetas = [per_seed[draws[r], r].mean() for r in range(n_boot)]
    else:
        thetas = per_seed.mean(0)
    d = float(np.mean(est))
    return d, basic(thetas, d, level)


@pytest.mark.parametrize("seeds,levels", [((0,), 1), ((0, 1), 1), ((0, 1, 2), 2), ((0, 1, 2, 3), 2)])
def test_dece_resamples_seeds_from_three_shared_seeds_on(runs, seeds, levels):
    labels, rows = runs
    a, b = [rows["ls", s] for s in seeds], [rows["ce", s] for s in seeds]
    got = paired_ece_delta(a, b, n_boot=60, seed=4, level=0.9)
    d, (lo, hi) = by_hand(a, b, labels, np_ece, 60, 4, 0.9, levels == 2)
    assert got["levels"] == levels and got["seeds"] == len(seeds)
    assert got["diff"] == pytest.approx(d, abs=1e-12)
    assert (got["lo"], got["hi"]) == pytest.approx((lo, hi), abs=1e-12)
    assert got["significant"] == (not lo <= 0 <= hi)


def test_only_shared_seeds_count_towards_the_levels(runs):
    _, rows = runs
    a = [rows["ls", s] for s in (0, 1, 2)]
    b = [rows["ce", s] for s in (1, 2, 3)]  # two shared seeds: one level
    got = paired_ece_delta(a, b, n_boot=30)
    assert (got["seeds"], got["levels"]) == (2, 1)


def test_paired_delta_chooses_levels_like_the_dece_column_for_every_metric(runs):
    labels, rows = runs
    probs = CalibratedProbs()
    for seeds in ((0, 1), (0, 1, 2)):
        a, b = [rows["ls", s] for s in seeds], [rows["ce", s] for s in seeds]
        acc = paired_delta(a, b, probs, "acc", n_boot=50, seed=2, level=0.8)
        d, (lo, hi) = by_hand(a, b, labels, np_acc, 50, 2, 0.8, len(seeds) >= 3)
        assert acc["levels"] == (2 if len(seeds) >= 3 else 1) and acc["seeds"] == len(seeds)
        assert acc["diff"] == pytest.approx(d, abs=1e-12)
        assert (acc["lo"], acc["hi"]) == pytest.approx((lo, hi), abs=1e-12)
        ece = paired_delta(a, b, probs, "ece", n_boot=50, seed=2, level=0.8)
        ref = paired_ece_delta(a, b, n_boot=50, seed=2, level=0.8)
        assert (ece["diff"], ece["lo"], ece["hi"], ece["levels"]) == pytest.approx(
            (ref["diff"], ref["lo"], ref["hi"], ref["levels"]), abs=1e-12)


def test_calibrators_on_the_same_runs_stay_one_level(runs):
    # CE against CE + TS: the same runs on both sides, a comparison of post-hoc calibrators on one
    # model per seed; even with four seeds the interval resamples the test set only
    labels, rows = runs
    probs = CalibratedProbs()
    ce = [rows["ce", s] for s in range(4)]
    got = paired_delta(ce, ce, probs, "ece", NONE, "temperature", n_boot=40, seed=1)
    assert (got["seeds"], got["levels"]) == (4, 1)
    idx = torch.randint(0, N, (40, N), generator=torch.Generator().manual_seed(1)).numpy()
    per_seed, est = [], []
    for row in ce:
        pa, pb = probs(row, NONE)[0].numpy(), probs(row, "temperature")[0].numpy()
        per_seed.append([np_ece(pa[i], labels[i]) - np_ece(pb[i], labels[i]) for i in idx])
        est.append(np_ece(pa, labels) - np_ece(pb, labels))
    d = float(np.mean(est))
    assert got["diff"] == pytest.approx(d, abs=1e-12)
    assert (got["lo"], got["hi"]) == pytest.approx(basic(np.mean(per_seed, 0), d, 0.95), abs=1e-12)
    # copies of the runs (equal run keys) count as the same runs too
    copies = [dict(r) for r in ce]
    assert paired_ece_delta(ce, copies, n_boot=20)["levels"] == 1


def test_the_two_level_interval_is_wider_here_than_the_fixed_model_one(runs):
    # the seeds' differences spread (sharpness grows with the seed): drawing seeds widens the interval
    _, rows = runs
    a, b = [rows["ls", s] for s in range(4)], [rows["ce", s] for s in range(4)]
    two = paired_ece_delta(a, b, n_boot=200, seed=0)
    labels = runs[0]
    _, (lo1, hi1) = by_hand(a, b, labels, np_ece, 200, 0, 0.95, False)
    assert two["levels"] == 2 and two["hi"] - two["lo"] > hi1 - lo1


def test_compare_reports_its_levels_and_says_what_the_interval_covers(runs):
    _, rows = runs

    def summary(seeds):
        return {m: {"runs": [rows[m, s] for s in seeds], "seeds": list(seeds)} for m in ("ce", "ls")}

    probs = CalibratedProbs()
    res3 = compare_methods(summary((0, 1, 2)), "ls", "ce", probs, n_boot=20)
    assert res3["levels"] == 2 and all(r["delta"]["levels"] == 2 for r in res3["rows"])
    head3 = compare_text(res3, n_boot=20, width=None).split("\n\n")[0]
    assert ("two-level paired bootstrap (20 resamples): each resample draws 3 of the shared seeds 0, 1, 2 with "
            "replacement and one test-set resample applied to every drawn run, so the interval covers seed and "
            "test-set variation") in head3
    res2 = compare_methods(summary((0, 1)), "ls", "ce", probs, n_boot=20)
    assert res2["levels"] == 1 and all(r["delta"]["levels"] == 1 for r in res2["rows"])
    head2 = compare_text(res2, n_boot=20, width=None).split("\n\n")[0]
    assert ("seed-averaged over seeds 0, 1; fewer than 3 shared seeds, so the interval covers test-set noise only, "
            "not training randomness") in head2
    same = compare_methods(summary((0, 1, 2)), "ce", "ce", probs, n_boot=20)
    assert same["levels"] == 1
    assert "the same runs on both sides, so the interval covers test-set noise only" in compare_text(same, n_boot=20)


# ----------------------------------------------------------------------------- the notes sentence
TWO = ("The paired intervals resample the 3 seeds each comparison shares as well as the test samples (a two-level "
       "bootstrap), so they cover the variation between training seeds and test-set noise.")
ONE = ("Fewer than 3 seeds are shared, so the paired intervals resample the test set of these trained models only: "
       "they cover test-set noise, not the variation between training seeds, and a significant difference is "
       "evidence about these models, not about the methods. With 3 or more shared seeds the seeds are resampled too.")
SAME = "A method compared with itself after a calibrator (the same runs on both sides) resamples the test set only."


def test_interval_note_texts():
    d = {"seeds": 3, "levels": 2}
    assert interval_note({}) is None and interval_note({"ls": {"identical": False}}) is None
    assert interval_note({"ls": d, "focal": d}) == TWO
    assert interval_note({"ls": {"seeds": 2, "levels": 1}}) == ONE
    assert interval_note({"ls": {"seeds": 1, "levels": 1}}, {"ls": {"acc_vs_ce": None}}) == ONE
    assert interval_note({"ls": d}, {"ce": {"vs_ce_ts": {"seeds": 3, "levels": 1}}}) == TWO + " " + SAME
    assert interval_note({"ls": d, "focal": {"seeds": 5, "levels": 2}}).startswith(
        "The paired intervals resample the 3 to 5 seeds each comparison shares")
    mixed = interval_note({"ls": d, "focal": {"seeds": 2, "levels": 1}})
    assert mixed == ("The paired intervals of LS (3 shared seeds) resample the seeds as well as the test samples and "
                     "cover seed and test-set variation; those of Focal (fewer than 3 shared seeds) cover test-set "
                     "noise only, so a significant difference there is evidence about the trained models compared, "
                     "not about the methods.")


@pytest.mark.parametrize("seeds,text", [((0, 1), ONE), ((0, 1, 2), TWO + " " + SAME)])
def test_report_notes_say_what_the_intervals_cover(runs, seeds, text):
    _, rows = runs
    summary = {m: {"runs": [rows[m, s] for s in seeds], "seeds": list(seeds)} for m in ("ce", "ls")}
    deltas = ece_deltas(summary, n_boot=20)
    comps = comparisons(summary, CalibratedProbs(), n_boot=20)
    assert deltas["ls"]["levels"] == (2 if len(seeds) >= 3 else 1)
    ctx = SimpleNamespace(summary=summary, deltas=deltas, comps=comps)
    (note,) = build.notes_section(ctx)
    assert note.title == "Notes" and note.text == text
