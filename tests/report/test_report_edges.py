"""The report's numbers and text pinned to hand computations: seed aggregation, ranks, formats,
the dECE interval (pixels and images), table layout, the tuning section and the rendered files."""

import math
import re

import numpy as np
import pytest
import torch

from calibkit import rundir
from calibkit.report import data
from calibkit.report.data import fmt, fmt_delta, label, load_probs, mean_std, paired_ece_delta, ranking, summarize


def naive_ece(probs, labels, n_bins=15):
    """Top-label ECE written out: bin b holds confidences in (b/B, (b+1)/B]; sum over bins of
    |sum of correct - sum of confidence| / N."""
    probs, labels = np.asarray(probs, dtype=np.float64), np.asarray(labels)
    conf, pred = probs.max(1), probs.argmax(1)
    b = np.clip(np.ceil(conf * n_bins).astype(int) - 1, 0, n_bins - 1)
    gap = np.bincount(b, (pred == labels).astype(np.float64), n_bins) - np.bincount(b, conf, n_bins)
    return float(np.abs(gap).sum() / len(labels))


def basic(samples, estimate, level):
    """The basic bootstrap interval [2 e - q_hi, 2 e - q_lo] by numpy's (linear) quantiles."""
    q_lo, q_hi = np.quantile(np.asarray(samples, dtype=np.float64), [(1 - level) / 2, (1 + level) / 2])
    return 2 * estimate - q_hi, 2 * estimate - q_lo


# ----------------------------------------------------------------------------- data: aggregation
def _row(method, seed, status="done", **fields):
    return {"run_key": f"t/{method}/{seed}", "method": method, "seed": seed, "status": status, **fields}


def test_summarize_averages_every_number_over_the_finished_seeds():
    rows = [
        _row("ls", 2, metrics={"before": {"ece": 0.30, "acc": 0.7}, "after": {"ece": 0.05}, "temperature": 1.5},
             ood={"auroc_entropy": 0.8, "auroc_maxconf": 0.6}, robustness={"overall": {"acc": 0.4, "ece": 0.2}},
             train_time_s=10.0),
        _row("ls", 0, metrics={"before": {"ece": 0.10, "acc": 0.9}, "after": {"ece": 0.01}, "temperature": 2.5},
             ood={"auroc_entropy": 0.6, "auroc_maxconf": 0.4}, robustness={"overall": {"acc": 0.2, "ece": 0.4}},
             train_time_s=20.0),
        _row("ls", 1, status="failed", metrics={"before": {"ece": 9.0}}),  # not finished: left out
        _row("ce", 5, metrics={"before": {"ece": 0.2}, "temperature": None}, ood=None, robustness=None),
        _row("zz", 0, metrics=None), _row("aa", 0, metrics={"before": {"ece": "n/a"}}),
    ]
    out = summarize(rows)
    # grid order first (CE before LS), then unknown methods sorted by name
    assert list(out) == ["ce", "ls", "aa", "zz"]
    ls = out["ls"]
    assert ls["seeds"] == [0, 2] and [r["seed"] for r in ls["runs"]] == [0, 2]
    s = ls["stats"]
    sd = math.sqrt(2) / 2  # sample std (ddof=1) of two values a, b: |a - b| / sqrt(2)
    want = {"before.ece": (0.2, 0.2 * sd), "before.acc": (0.8, 0.2 * sd), "after.ece": (0.03, 0.04 * sd),
            "after.temperature": (2.0, sd), "extra.auroc_entropy": (0.7, 0.2 * sd),
            "extra.auroc_maxconf": (0.5, 0.2 * sd), "extra.shift_acc": (0.3, 0.2 * sd),
            "extra.shift_ece": (0.3, 0.2 * sd), "extra.train_time_s": (15.0, 10 * sd)}
    assert set(s) == set(want)
    for key, (mean, std) in want.items():
        assert s[key][0] == pytest.approx(mean, abs=1e-12), key
        assert s[key][1] == pytest.approx(std, abs=1e-12), key
        assert s[key][2] == 2
    # one seed: mean alone (std NaN, n 1); missing or non-numeric values give no statistic
    ce = out["ce"]["stats"]
    assert set(ce) == {"before.ece"} and ce["before.ece"][0] == 0.2 and math.isnan(ce["before.ece"][1])
    assert ce["before.ece"][2] == 1
    assert out["zz"]["stats"] == {} and out["aa"]["stats"] == {}
    assert summarize([_row("ce", 0, status="running")]) == {}


def test_mean_std_is_the_sample_std():
    mean, std, n = mean_std([1, 2, 3, 6])
    assert (mean, n) == (3.0, 4)
    assert std == pytest.approx(math.sqrt((4 + 1 + 0 + 9) / 3), abs=1e-12)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one seed: no std computed (numpy would warn of ddof >= n)
        m1, s1, n1 = mean_std([4])
    assert m1 == 4.0 and math.isnan(s1) and n1 == 1


def test_label_and_order_of_unknown_methods():
    assert label("mbls") == "MbLS" and label("fedlas_ls") == "FeDLaS-LS"
    assert label("my_method") == "my_method"


def _stats(**means):
    return {m: {"seeds": [0], "stats": {"before.ece": (v, float("nan"), 1)} if v is not None else {}, "runs": []}
            for m, v in means.items()}


def test_ranking_shares_ranks_on_ties_and_puts_methods_without_the_number_last():
    summary = _stats(ce=0.2, ls=0.1, focal=0.2, mbls=None, dfl=0.05, acls=0.2)
    # competition ranks: DFL 1, LS 2, then three ties at 0.2 share rank 3 (grid order among them)
    assert ranking(summary) == [(1, "dfl"), (2, "ls"), (3, "ce"), (3, "focal"), (3, "acls"), (0, "mbls")]
    # another key: the one method that has it is rank 1, every other one unranked
    summary["focal"]["stats"]["after.ece"] = (0.3, 0.0, 1)
    assert ranking(summary, key="after.ece")[0] == (1, "focal")
    assert [r for r, _ in ranking(summary, key="after.ece")[1:]] == [0] * 5


def test_fmt_and_fmt_delta():
    assert fmt(None, 100, 2) == "-"
    assert fmt((0.12345, 0.0101, 2), 100, 2) == "12.35 +- 1.01"
    assert fmt((0.12345, 0.0101, 2), 1, 3, pm="±") == "0.123 ± 0.010"
    assert fmt((0.12345, 0.0101, 1), 100, 1) == "12.3"  # one seed: no spread
    assert fmt((0.5, float("nan"), 3), 100, 2) == "50.00"  # no spread known
    assert fmt_delta(None) == "-" and fmt_delta({}) == "-"
    d = {"diff": -0.031234, "lo": -0.035, "hi": -0.027, "significant": True}
    assert fmt_delta(d) == "-3.12 [-3.50, -2.70]*"
    assert fmt_delta({"diff": 0.001, "lo": -0.002, "hi": 0.004, "significant": False}) == "+0.10 [-0.20, +0.40]"


# ----------------------------------------------------------------------------- data: probabilities
def _write_run(tmp_path, method, seed, logits, labels, image=None, metrics=None):
    d = tmp_path / method / f"seed{seed}"
    d.mkdir(parents=True)
    tensors = {"test_logits": logits, "test_labels": labels}
    if image is not None:
        tensors["test_image"] = image
    rundir.write_tensors(d / rundir.LOGITS, tensors)
    return _row(method, seed, logits_path=str(d / rundir.LOGITS), run_dir=str(d),
                metrics={} if metrics is None else metrics)


def test_load_probs_is_the_float64_softmax_and_the_temperature(tmp_path):
    logits = torch.tensor([[0.0, 1.0], [2.0, -1.0]])
    labels = torch.tensor([1, 0])
    row = _write_run(tmp_path, "ls", 0, logits, labels, metrics={"temperature": 1.7})
    probs, y, t = load_probs(row)
    e = np.exp(logits.double().numpy())
    assert probs.dtype == np.float64 and np.allclose(probs, e / e.sum(1, keepdims=True), atol=1e-15)
    assert y.tolist() == [1, 0] and t == 1.7
    for metrics in ({}, None, {"temperature": None}):  # no temperature recorded: 1
        assert load_probs({**row, "metrics": metrics})[2] == 1.0
    with pytest.raises(ValueError, match=r"^run t/ls/0 has no logits_path in the database$"):
        load_probs({**row, "logits_path": None})
    assert data.load_groups(row) is None


def _pair_fixture(tmp_path, gen, n=240, images=None):
    labels = torch.randint(0, 3, (n,), generator=gen)
    image = None if images is None else torch.arange(n) // (n // images)
    runs = {}
    for method, sharp in (("ce", 4.0), ("ls", 1.0)):
        for seed in (0, 1, 2):
            x = torch.randn(n, 3, generator=gen)
            x[torch.arange(n), labels] += 1.0
            runs[method, seed] = _write_run(tmp_path, method, seed, x * sharp, labels, image)
    return labels, runs


def test_paired_delta_uses_only_shared_seeds_and_the_requested_level(tmp_path):
    from calibkit.metrics import paired_bootstrap_diff

    gen = torch.Generator().manual_seed(4)
    labels, runs = _pair_fixture(tmp_path, gen)
    a = [runs["ls", 0], runs["ls", 1]]  # LS seeds 0, 1
    b = [runs["ce", 1], runs["ce", 2]]  # CE seeds 1, 2: only seed 1 is shared
    out = paired_ece_delta(a, b, n_boot=70, seed=2, level=0.8)
    pa, _, _ = load_probs(runs["ls", 1])
    pb, _, _ = load_probs(runs["ce", 1])
    diff = naive_ece(pa, labels) - naive_ece(pb, labels)
    samples = paired_bootstrap_diff(torch.from_numpy(pa), torch.from_numpy(pb), labels, "ece", n_resamples=70,
                                    seed=2).samples
    assert len(samples) == 70
    lo, hi = basic(samples, diff, 0.8)
    assert out["seeds"] == 1 and out["diff"] == pytest.approx(diff, abs=1e-12)
    assert (out["lo"], out["hi"]) == pytest.approx((lo, hi), abs=1e-12)
    assert out["significant"] == (not lo <= 0 <= hi) and not out["identical"]
    assert paired_ece_delta(a, [runs["ce", 2]]) is None  # no shared seed


def test_paired_delta_is_significant_when_the_interval_lies_wholly_above_zero(tmp_path):
    # the sharp (over-confident) CE against the soft LS: a method significantly *worse* than the
    # reference has lo > 0 and is marked significant too, by the interval's own bounds
    gen = torch.Generator().manual_seed(4)
    labels, runs = _pair_fixture(tmp_path, gen)
    worse = paired_ece_delta([runs["ce", 0], runs["ce", 1]], [runs["ls", 0], runs["ls", 1]], n_boot=60)
    better = paired_ece_delta([runs["ls", 0], runs["ls", 1]], [runs["ce", 0], runs["ce", 1]], n_boot=60)
    assert worse["lo"] > 0 and worse["significant"]
    assert better["hi"] < 0 and better["significant"]
    assert worse["diff"] == pytest.approx(-better["diff"], abs=1e-12)
    # the table marks the two ways apart
    assert fmt_delta(worse).endswith(data.WORSE_MARK) and fmt_delta(worse).startswith("+")
    assert fmt_delta(better).endswith(data.BETTER_MARK) and fmt_delta(better).startswith("-")


def test_paired_delta_is_identical_only_when_every_seed_is(tmp_path):
    gen = torch.Generator().manual_seed(5)
    labels, runs = _pair_fixture(tmp_path, gen)
    ce = [runs["ce", 0], runs["ce", 1]]
    copy0 = {**runs["ce", 0], "method": "ls"}
    copy1 = {**runs["ce", 1], "method": "ls"}
    # seed 0 differs, seed 1 is a copy / seed 0 a copy, seed 1 differs: neither is identical
    assert not paired_ece_delta([runs["ls", 0], copy1], ce, n_boot=20)["identical"]
    assert not paired_ece_delta([copy0, runs["ls", 1]], ce, n_boot=20)["identical"]
    same = paired_ece_delta([copy0, copy1], ce, n_boot=20)
    assert same["identical"] and same["diff"] == same["lo"] == same["hi"] == 0 and not same["significant"]


def test_pixel_runs_resample_whole_images(tmp_path):
    """Segmentation rows: the difference and its interval come from the image-level bootstrap."""
    from calibkit.grouped_bootstrap import paired_grouped_ece_diff

    gen = torch.Generator().manual_seed(6)
    labels, runs = _pair_fixture(tmp_path, gen, n=240, images=12)
    assert data.load_groups(runs["ls", 0]).tolist() == (torch.arange(240) // 20).tolist()
    a, b = [runs["ls", 0], runs["ls", 1]], [runs["ce", 0], runs["ce", 1]]
    out = paired_ece_delta(a, b, n_boot=90, seed=3, level=0.9)
    per_seed, diffs = [], []
    for s in (0, 1):
        pa, _, _ = load_probs(runs["ls", s])
        pb, _, _ = load_probs(runs["ce", s])
        g = paired_grouped_ece_diff(torch.from_numpy(pa), torch.from_numpy(pb), labels, torch.arange(240) // 20,
                                    n_resamples=90, seed=3)
        per_seed.append(g["samples"].numpy())
        diffs.append(naive_ece(pa, labels) - naive_ece(pb, labels))
    d = float(np.mean(diffs))
    lo, hi = basic(np.mean(per_seed, 0), d, 0.9)
    assert out["diff"] == pytest.approx(d, abs=1e-12) and out["seeds"] == 2
    assert (out["lo"], out["hi"]) == pytest.approx((lo, hi), abs=1e-12)


def test_ece_deltas_pass_resamples_seed_and_level_through(tmp_path):
    gen = torch.Generator().manual_seed(7)
    labels, runs = _pair_fixture(tmp_path, gen)
    summary = {"ce": {"runs": [runs["ce", 0]]}, "ls": {"runs": [runs["ls", 0]]}}
    assert data.ece_deltas({"ls": summary["ls"]}) == {}  # no CE: no column
    got = data.ece_deltas(summary, n_boot=50, seed=9, level=0.6)
    assert set(got) == {"ls"}
    idx = torch.randint(0, 240, (50, 240), generator=torch.Generator().manual_seed(9))
    pa, _, _ = load_probs(runs["ls", 0])
    pb, _, _ = load_probs(runs["ce", 0])
    samples = [naive_ece(pa[i], labels[i]) - naive_ece(pb[i], labels[i]) for i in idx.numpy()]
    d = naive_ece(pa, labels) - naive_ece(pb, labels)
    assert (got["ls"]["lo"], got["ls"]["hi"]) == pytest.approx(basic(samples, d, 0.6), abs=1e-9)


# ----------------------------------------------------------------------------- tables
from calibkit.report import tables  # noqa: E402
from calibkit.report.tables import Table, md_table, text_table  # noqa: E402


def _entry(seeds, **stats):
    return {"seeds": list(seeds), "runs": [], "stats": {k.replace("__", "."): v for k, v in stats.items()}}


def test_ranked_table_cells_and_best_marks():
    nan = float("nan")
    summary = {
        "ce": _entry([0, 1], before__acc=(0.91234, 0.01, 2), before__ece=(0.0812, 0.0, 2),
                     before__o_ece=(0.08, 0.0, 2), before__u_ece=(0.0012, 0.0, 2), after__ece=(0.02, 0.0, 2)),
        "ls": _entry([0, 1], before__acc=(0.91236, 0.01, 2), before__ece=(0.0311, 0.0, 2),
                     before__o_ece=(0.01, 0.0, 2), before__u_ece=(0.0211, 0.0, 2), after__ece=(0.025, 0.0, 2)),
        "focal": _entry([0], before__acc=(0.90, nan, 1), before__ece=(0.0405, nan, 1)),
        "mbls": _entry([0]),
    }
    deltas = {"ls": {"diff": -0.05, "lo": -0.06, "hi": -0.04, "significant": True},
              "focal": {"diff": -0.04, "lo": -0.05, "hi": -0.03, "significant": True}}
    t = tables.ranked_table(summary, deltas)
    assert t.header == ["#", "Method", "Acc", "ECE", "O-ECE", "U-ECE", "ECE (TS)", "dECE vs CE [95% CI]"]
    assert t.key_columns == 2
    assert t.rows == [
        ["1", "LS", "91.24", "3.11", "1.00", "2.11", "2.50", "-5.00 [-6.00, -4.00]*"],
        ["2", "Focal", "90.00", "4.05", "-", "-", "-", "-4.00 [-5.00, -3.00]*"],
        ["3", "CE", "91.23", "8.12", "8.00", "0.12", "2.00", "(reference)"],
        ["-", "MbLS", "-", "-", "-", "-", "-", "-"],
    ]
    # Acc: 91.24 is the highest at the printed precision; ECE and ECE (TS): the lowest; dECE: most
    # negative; O-ECE and U-ECE are never marked
    assert t.best == {(0, 2), (0, 3), (2, 6), (0, 7)}
    # ties at the printed precision are all marked
    summary["ce"]["stats"]["before.acc"] = (0.912401, 0.0, 2)
    assert {(i, j) for i, j in tables.ranked_table(summary, deltas).best if j == 2} == {(0, 2), (2, 2)}
    # a column with a single value marks nothing; two values are compared
    one = tables.ranked_table(summary, {"ls": deltas["ls"]})
    assert not any(j == 7 for _, j in one.best) and (0, 7) in t.best
    # dECE: compared at the printed precision (x100, 2 decimals): -5.00 and -5.00 tie, -5.00 and -4.60 do not
    for ls, focal, marked in ((-0.0500499, -0.0499501, {0, 1}), (-0.05, -0.046, {0})):
        d = {"ls": {**deltas["ls"], "diff": ls}, "focal": {**deltas["focal"], "diff": focal}}
        assert {i for i, j in tables.ranked_table(summary, d).best if j == 7} == marked


def test_grid_tables_columns_for_classification_and_segmentation():
    s = {"ce": _entry([0, 1], before__acc=(0.9, 0.01, 2), before__nll=(0.3456, 0.0123, 2),
                      after__temperature=(1.5, 0.1, 2), after__ece=(0.02, 0.001, 2),
                      extra__train_time_s=(12.34, 1.0, 2)),
         "ls": _entry([0], before__acc=(0.8, float("nan"), 1))}
    d = {"ls": {"diff": 0.01, "lo": -0.01, "hi": 0.02, "significant": False}}
    t1, t2 = tables.grid_tables(s, d, pm="±")
    assert t1.header == (["Method", "n", "Acc", "ECE", "AECE", "cwECE", "O-ECE", "U-ECE", "MCE", "NLL", "Brier"]
                         + ["dECE vs CE [95% CI]"])
    assert t1.rows[0] == ["CE", "2", "90.00 ± 1.00", "-", "-", "-", "-", "-", "-", "0.346 ± 0.012", "-",
                          "(reference)"]
    assert t1.rows[1] == ["LS", "1", "80.00"] + ["-"] * 8 + ["+1.00 [-1.00, +2.00]"]
    # no run measured OOD detection (ood = none): no AUROC columns
    assert t2.header == ["Method", "T", "Acc (TS)", "ECE (TS)", "AECE (TS)", "NLL (TS)",
                         "Shift acc", "Shift ECE", "Train s"]
    assert t2.rows[0] == ["CE", "1.50 ± 0.10", "-", "2.00 ± 0.10", "-", "-", "-", "-", "12.3 ± 1.0"]
    s["ce"]["stats"]["extra.auroc_entropy"] = (0.875, 0.01, 2)  # one run did: both columns, "-" where missing
    t2 = tables.grid_tables(s, d, pm="±")[1]
    assert t2.header == ["Method", "T", "Acc (TS)", "ECE (TS)", "AECE (TS)", "NLL (TS)", "AUROC-H", "AUROC-MSP",
                         "Shift acc", "Shift ECE", "Train s"]
    assert t2.rows[0] == ["CE", "1.50 ± 0.10", "-", "2.00 ± 0.10", "-", "-", "87.5 ± 1.0", "-", "-", "-", "12.3 ± 1.0"]
    del s["ce"]["stats"]["extra.auroc_entropy"]
    assert tables.grid_tables(s, d)[0].rows[0][2] == "90.00 +- 1.00"  # the default spread sign
    # segmentation: mIoU in both tables; only the extra columns some run reports
    s["ce"]["stats"]["before.miou"] = (0.5, 0.0, 2)
    s["ce"]["stats"]["after.miou"] = (0.25, 0.0, 2)
    t1, t2 = tables.grid_tables(s, d)
    assert t1.header[-2:] == ["mIoU", "dECE vs CE [95% CI]"] and t1.rows[0][-2] == "50.00 +- 0.00"
    assert t2.header == ["Method", "T", "Acc (TS)", "ECE (TS)", "AECE (TS)", "NLL (TS)", "mIoU (TS)", "Train s"]
    assert t2.rows[0][-2:] == ["25.00 +- 0.00", "12.3 +- 1.0"]


def test_robustness_table_orders_severities_numerically_and_averages_the_runs_that_have_them():
    def run(by):
        return {"robustness": {"by_severity": by}}
    s = {"ce": {"runs": [run({"2": {"ece": 0.1, "acc": 0.5}, "10": {"ece": 0.3, "acc": 0.2}}),
                         run({"2": {"ece": 0.2, "acc": 0.7}})]},
         "ls": {"runs": [{"robustness": None}, {}]}}
    t = tables.robustness_table(s, pm="±")
    assert t.header == ["Method", "ECE s2", "ECE s10", "Acc s2", "Acc s10"]
    sd = f"{100 * 0.1 / math.sqrt(2):.2f}"
    assert t.rows == [["CE", f"15.00 ± {sd}", "30.00", "60.00 ± " + f"{100 * 0.2 / math.sqrt(2):.2f}", "20.00"],
                      ["LS", "-", "-", "-", "-"]]
    assert tables.robustness_table(s).rows[0][1] == f"15.00 +- {sd}"  # the default spread sign
    assert tables.robustness_table({"ce": {"runs": [{}, {"robustness": {"overall": {}}}]}}) is None


def test_text_table_layout_by_hand():
    t = Table(["Method", "Acc"], [["CE", "1.5"], ["LS±", "10.25"]], best={(1, 1)})
    assert text_table(t).splitlines() == [
        "Method     Acc",  # the mark counts in the column's width
        "------  ------",
        "CE         1.5",
        "LS+-    10.25<",
    ]
    assert text_table(t, 0) == text_table(t, None) == text_table(t)


def test_text_table_parts_are_balanced_not_greedy():
    # label width 3; columns printed 2 + width = 4, 4, 4, 4, 10 wide. Width 19: a greedy fill puts
    # four columns in the first part (3 + 16 = 19) and one in the second (13); the balanced cut is
    # three (15) and two (17).
    header = ["abc", "c1", "c2", "c3", "c4", "c5".rjust(8, "x")]
    t = Table(header, [["r", "1", "2", "3", "4", "5"]])
    parts = [p.splitlines() for p in text_table(t, 19).split("\n\n")]
    assert [p[0] for p in parts] == ["abc  c1  c2  c3", "abc  c4  xxxxxxc5"]
    assert [p[2] for p in parts] == ["r     1   2   3", "r     4         5"]
    # the fewest parts that fit: two parts at width 23 too (3 + 20 = 23 holds the first four)
    assert len(text_table(t, 23).split("\n\n")) == 2
    assert len(text_table(t, 33).split("\n\n")) == 1  # 3 + 30 = 33: one part
    # a column wider than the width on its own still gets a part
    wide = Table(["k", "a", "b" * 30, "c"], [["x", "1", "2", "3"]])
    assert [p.splitlines()[0] for p in text_table(wide, 12).split("\n\n")] == ["k  a", "k  " + "b" * 30, "k  c"]


def test_markdown_table_escapes_pipes_and_bolds_the_best():
    t = Table(["#", "Method", "a|b"], [["1", "x|y", "2.00"], ["2", "z", "3.00"]], best={(0, 2)}, key_columns=2)
    assert md_table(t).splitlines() == ["| # | Method | a\\|b |", "|---|---|--:|", "| 1 | x\\|y | **2.00** |",
                                        "| 2 | z | 3.00 |"]


# ----------------------------------------------------------------------------- tuning section
from calibkit.report import protocol, tuning  # noqa: E402
from calibkit.store import Store  # noqa: E402

# (method, hparams, val acc, val ECE); selections and their criteria below
CANDS = [("ce", {}, 0.80, 0.10)] \
    + [("ls", {"loss.alpha": a}, acc, e) for a, acc, e in ((0.01, 0.895, 0.05), (0.03, 0.905, 0.04),
                                                            (0.05, 0.889, 0.02), (0.1, 0.91, 0.06),
                                                            (0.2, 0.85, 0.01))] \
    + [("focal", {"loss.gamma": g}, 0.9, 0.01 * g) for g in (1.0, 2.0, 3.0, 4.0)] \
    + [("dfl", {"loss.gamma": 1.0}, 0.9, 0.03), ("dfl", {"loss.gamma": 3.0}, 0.885, 0.02),
       # at the edge of the accuracy rule (best - drop - 1e-12, calibkit.bench.tune.select): kept
       ("dfl", {"loss.gamma": 2.0}, 0.9 - 0.01 - 1e-12, 0.025), ("dfl", {"loss.gamma": 5.0}, 0.9 - 0.01, 0.015)] \
    + [("fedlas_ls", {"loss.alpha": a, "loss.beta": b}, 0.9 + 0.001 * i, 0.03 + 0.001 * i)
       for i, (a, b) in enumerate(((0.1, 0.5), (0.05, 0.5), (0.025, 0.5), (0.05, 4.0), (0.1, 4.0)))] \
    + [("maccal", {"maccal.eta": e, "maccal.r_min": r}, 0.9, 0.02)
       for e, r in ((4.0, 0.1), (1.0, 0.1), (2.0, 0.1), (2.0, 0.3), (1.0, 0.3))] \
    + [("zz", {"x.y": 1.0}, 0.99, 0.0)]
SELECTED = {"ls": ({"loss.alpha": 0.03}, 0.02), "focal": ({"loss.gamma": 1.0}, 0.01),
            "fedlas_ls": ({"loss.alpha": 0.1, "loss.beta": 4.0}, 0.01)}


OTHER = {"nll": 0.5, "aece": 0.03, "brier": 0.2, "o_ece": 0.01, "u_ece": 0.02, "n": 100}


def _key(method, hp):
    return f"p/{method}/0/" + ",".join(f"{k}={v:g}" for k, v in sorted(hp.items()))


def make_tuning(out, seed=0):
    with Store(out / "runs.db") as store:
        for method, hp, acc, ece in CANDS:
            key = _key(method, hp)
            assert store.claim(key, table="tuning", preset="p", method=method, seed=seed, hparams=hp,
                                         config={"keep": "best-acc"} if method == "ls" else None)
            # Dual focal (no selection: the default criterion) on 20,000 images: 1.96 standard errors
            # of its accuracy differences (0.61 points) fall below the 1-point floor
            n = {"n": 20_000} if method == "dfl" else {}
            store.finish(key, table="tuning", metrics={"acc": acc, "ece": ece, "test_acc": 0.1, **OTHER, **n},
                                   train_time_s=3.0)
        for method, (hp, drop) in SELECTED.items():
            store.select_candidate("p", method, seed, _key(method, hp), {"max_acc_drop": drop, "metric": "ece"})
        for s, alpha in ((7, 0.01), (5, 0.2)):  # another preset: two seeds, no CE, no selection
            key = f"q/ls/{s}/{alpha}"
            assert store.claim(key, table="tuning", preset="q", method="ls", seed=s, hparams={"loss.alpha": alpha})
            store.finish(key, table="tuning", metrics={"acc": 0.5, "ece": 0.1})


def test_tuning_rows_selection_exclusions_and_edges(tmp_path):
    make_tuning(tmp_path)
    cands = tuning.load_candidates(tmp_path, "p")
    assert len(cands) == len(CANDS) and tuning.load_candidates(tmp_path, "other") == []
    assert tuning.load_candidates(tmp_path / "nothing", "p") == []
    header, rows = tuning.tuning_rows(cands)
    assert header == ["Method", "selected", "val ECE", "val Acc", "candidates", "excluded (acc)", "extended", "note"]
    assert rows == [  # no tuning records (extensions) in this database: "-"
        # LS: drop 0.02, best 0.91: 0.889 and 0.85 fall below 0.89; 0.03 is inside its grid
        ["LS", "alpha=0.03", "4.00", "90.50", "5", "2", "-", ""],
        ["Focal", "gamma=1", "1.00", "90.00", "4", "0", "-", "on the grid edge (loss.gamma)"],
        # no selection: the default criterion's 1-point floor excludes 0.885 (below 0.89), keeps 0.89 - 1e-12
        ["Dual focal", "(no selection yet)", "", "", "4", "1", "-", ""],
        ["FeDLaS-LS", "alpha=0.1, beta=4", "3.40", "90.40", "5", "0", "-", "on the grid edge (loss.alpha, loss.beta)"],
        ["MaC-Cal", "(no selection yet)", "", "", "5", "0", "-", ""],
    ]


def test_tuning_text_and_json(tmp_path):
    import json

    assert tuning.tuning_text(tmp_path, "p") == f"no tuning candidates of preset 'p' in {tmp_path}/runs.db"
    assert tuning.write_tuning_json(tmp_path, "p") is None
    make_tuning(tmp_path)
    lines = tuning.tuning_text(tmp_path, "p").splitlines()
    assert lines[0] == ("selection on the validation split (seed 0; ECE and Acc x100, before temperature scaling; "
                        "CE: val ECE 10.00, val Acc 80.00)")
    assert lines[1].split() == ["Method", "selected", "val", "ECE", "val", "Acc", "candidates", "excluded", "(acc)",
                                "extended", "note"]
    widths = (10, 18, 7, 7, 10, 14, 8, len("on the grid edge (loss.alpha, loss.beta)"))
    cells = ("LS", "alpha=0.03", "4.00", "90.50", "5", "2", "-", "")
    assert lines[2] == "  ".join(c.ljust(w) for c, w in zip(cells, widths))
    assert len(lines) == 2 + 5
    q = tuning.tuning_text(tmp_path, "q").splitlines()
    assert q[0] == "selection on the validation split (seed 5, 7; ECE and Acc x100, before temperature scaling)"
    assert q[2].split() == ["LS", "(no", "selection", "yet)", "2", "0", "-"]
    assert json.loads(tuning.write_tuning_json(tmp_path, "q").read_text())["criterion"] is None
    path = tuning.write_tuning_json(tmp_path, "p")
    assert path == tmp_path / "report" / "tuning.json"
    doc = json.loads(path.read_text())
    assert doc["preset"] == "p" and doc["seed"] == [0]
    assert doc["criterion"] == {"max_acc_drop": 0.02, "metric": "ece"}  # the first selected candidate's
    assert len(doc["candidates"]) == len(CANDS)
    ls = [c for c in doc["candidates"] if c["method"] == "ls"]
    assert [c["selected"] for c in ls] == [False, True, False, False, False]
    assert ls[0]["metrics"] == {"acc": 0.895, "ece": 0.05, **OTHER}  # validation numbers only
    assert ls[0]["keep"] == "best-acc" and doc["candidates"][0]["keep"] is None
    assert ls[0]["train_time_s"] == 3.0 and ls[0]["started_at"] and ls[0]["finished_at"]
    assert ls[0]["hparams"] == {"loss.alpha": 0.01}
    other = tuning.write_tuning_json(tmp_path, "p", tmp_path / "a" / "b" / "c.json")
    assert other == tmp_path / "a" / "b" / "c.json" and json.loads(other.read_text()) == doc
    assert tuning.write_tuning_json(tmp_path, "p") == path  # written again over the first


def test_tuning_panels_follow_the_selection_or_the_defaults(tmp_path):
    make_tuning(tmp_path)
    panels = tuning._panels(tuning.load_candidates(tmp_path, "p"))
    got = [(m, a, [c["hparams"] for c in line], (sel or {}).get("hparams")) for m, a, line, sel in panels]
    ls_sel, fed_sel = {"loss.alpha": 0.03}, {"loss.alpha": 0.1, "loss.beta": 4.0}
    assert got == [
        ("ls", "loss.alpha", [{"loss.alpha": a} for a in (0.01, 0.03, 0.05, 0.1, 0.2)], ls_sel),
        ("focal", "loss.gamma", [{"loss.gamma": g} for g in (1.0, 2.0, 3.0, 4.0)], {"loss.gamma": 1.0}),
        ("dfl", "loss.gamma", [{"loss.gamma": g} for g in (1.0, 2.0, 3.0, 5.0)], None),
        # 2-D: each axis is drawn through the selected value of the other, sorted by its own value
        ("fedlas_ls", "loss.alpha", [{"loss.alpha": a, "loss.beta": 4.0} for a in (0.05, 0.1)], fed_sel),
        ("fedlas_ls", "loss.beta", [{"loss.alpha": 0.1, "loss.beta": b} for b in (0.5, 4.0)], fed_sel),
        # no selection: through the published values (eta 2, r_min 0.1)
        ("maccal", "maccal.eta", [{"maccal.eta": e, "maccal.r_min": 0.1} for e in (1.0, 2.0, 4.0)], None),
        ("maccal", "maccal.r_min", [{"maccal.eta": 2.0, "maccal.r_min": r} for r in (0.1, 0.3)], None),
    ]


def test_tuning_figure_draws_the_candidates(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    assert tuning.write_tuning_figure(tmp_path, "p") is None
    make_tuning(tmp_path)
    figs = []
    monkeypatch.setattr(plt, "close", figs.append)
    path = tuning.write_tuning_figure(tmp_path, "p", dpi=30)
    assert path == tmp_path / "report" / "figures" / "tuning.png" and path.stat().st_size > 1000
    (fig,) = figs
    try:
        panels = tuning._panels(tuning.load_candidates(tmp_path, "p"))
        assert len(panels) == 7
        grid, twins = fig.axes[:8], fig.axes[8:]  # 2 rows of 4 panels, then one twin per panel
        assert len(twins) == 7 and not grid[7].axison and all(ax.axison for ax in grid[:7])
        titles = [ax.get_title() for ax in grid[:7]]
        assert titles == ["LS: alpha", "Focal: gamma", "Dual focal: gamma", "FeDLaS-LS: alpha", "FeDLaS-LS: beta",
                          "MaC-Cal: eta", "MaC-Cal: r_min"]
        ls, ls_acc = grid[0], twins[0]
        curve, *marks = ls.lines
        assert curve.get_linestyle() == "-" and curve.get_marker() == "o"
        assert list(curve.get_xdata()) == [0, 1, 2, 3, 4]
        assert list(curve.get_ydata()) == pytest.approx([5.0, 4.0, 2.0, 6.0, 1.0])
        crosses = [(ln.get_xdata()[0], round(ln.get_ydata()[0], 9)) for ln in marks if ln.get_marker() == "x"]
        assert crosses == [(2, 2.0), (4, 1.0)]  # acc below 91 - 2 points
        stars = [(ln.get_xdata()[0], round(ln.get_ydata()[0], 9)) for ln in marks if ln.get_marker() == "*"]
        assert stars == [(1, 4.0)]
        ce = [ln for ln in marks if ln.get_linestyle() == ":"]
        assert len(ce) == 1 and list(ce[0].get_ydata()) == pytest.approx([10.0, 10.0])
        assert [t.get_text() for t in ls.get_xticklabels()] == ["0.01", "0.03", "0.05", "0.1", "0.2"]
        (acc,) = ls_acc.lines
        assert acc.get_linestyle() == "--" and list(acc.get_ydata()) == pytest.approx([89.5, 90.5, 88.9, 91, 85])
        # the colours the figure's title names: ECE blue, accuracy green; CE's line grey
        assert (to_hex(curve.get_color()), to_hex(acc.get_color())) == (to_hex("tab:blue"), to_hex("tab:green"))
        assert {to_hex(ln.get_color()) for ln in marks if ln.get_marker() == "x"} == {to_hex("tab:red")}
        assert {to_hex(ln.get_color()) for ln in marks if ln.get_marker() == "*"} == {to_hex("tab:orange")}
        assert to_hex(ce[0].get_color()) == to_hex("gray")
        assert ls.get_ylabel() == "val ECE (x100)" and ls_acc.get_ylabel() == "val Acc (%)"
        # the title is the legend of what is checked above
        legend = fig._suptitle.get_text()
        for words in ("Validation ECE (solid, blue) and accuracy (dashed, green)", "star = selected",
                      "x = excluded (outside the accuracy window)", "dotted = CE's ECE"):
            assert words in legend, words
        # the accuracy axis spans the values with 0.2 points to spare, at least 2 points in all
        assert ls_acc.get_ylim() == pytest.approx((85 - 0.2, 91 + 0.2))
        assert twins[1].get_ylim() == pytest.approx((89, 91))  # Focal: all at 90, 2 points tall
        # Dual focal has no selection: no star; the default criterion's floor crosses out 88.5 (below 89)
        dfl = grid[2].lines
        assert not [ln for ln in dfl if ln.get_marker() == "*"]
        assert [(ln.get_xdata()[0]) for ln in dfl if ln.get_marker() == "x"] == [2]
        assert sum(ln.get_linestyle() == ":" for ax in grid[:7] for ln in ax.lines) == 7
    finally:
        plt.close("all")
    # one panel (one method, one searched value): a single axes, not a grid
    figs.clear()
    assert tuning.write_tuning_figure(tmp_path, "q", tmp_path / "q.png", dpi=30) == tmp_path / "q.png"
    try:
        (fig,) = figs
        assert len(fig.axes) == 2 and fig.axes[0].get_title() == "LS: alpha"
        assert list(fig.axes[0].lines[0].get_ydata()) == pytest.approx([10.0, 10.0])
        assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["0.01", "0.2"]
    finally:
        plt.close("all")


def _protocol_ctx(tmp_path, figures=False, keep_ls="best-acc"):
    from types import SimpleNamespace

    split = {"val": 500, "rule": "class-stratified seeded draw", "val_checksum": "aa", "train": 900,
             "train_subset": 1000, "train_checksum": "bb", "test": 10000}
    base = {"data": "debian", "epochs": 5, "model": "mlp", "batch_size": 128, "train_subset": 1000}

    def run(method, seed, cfg, record, status="done", info=True):
        d = tmp_path / "runs" / method / str(seed)
        d.mkdir(parents=True)
        if info:
            rundir.write_json(d / rundir.CONFIG, {"split": {**split, "val_checksum": f"v{seed}"}, "config": cfg})
        return _row(method, seed, status=status, run_dir=str(d), config=record)

    # the first run is not CE's: the budget is compared with CE's run all the same
    rows = [run("mixup", 0, {**base, "epochs": 7, "model": "cnn"},
                {"hparams": {"train.mix_alpha": 0.2}, "loss": "ce", "maccal": {"eta": 2.0}, "csm": {"n": 3},
                 "train_overrides": {"mix_alpha": 0.2, "lr": 0.05, "opt": "sgd", "amp": True}}),
            run("ce", 0, base, {"keep": "best-acc", "loss": "ce"}),
            run("ce", 1, base, {"train": {"keep": "best-acc"}, "loss": "ce"}),
            run("ls", 0, base, {"keep": keep_ls, "hparams": {"loss.alpha": 0.03}, "loss": "ls:alpha=0.03"}),
            run("zz", 0, base, {}, info=False),
            run("mbls", 0, base, {"keep": "last"}, status="failed")]
    return SimpleNamespace(out_dir=tmp_path, preset="p", rows=rows, figdir=tmp_path / "figs", figures=figures,
                           store=None)


def test_protocol_section_states_splits_budget_and_values(tmp_path):
    ctx = _protocol_ctx(tmp_path)
    proto, budget, hp = protocol.protocol_section(ctx)
    assert proto.title == "Protocol"
    same = "every method trains with the same budget as CE (epochs, training images, model)"
    differs = "NOT every method has CE's training budget (see the table)"
    assert proto.text == f"checkpoint policy: best-acc; {differs}"
    table = proto.tables[0]
    assert table.header == ["item", "value"] and table.key_columns == 2
    train = ("900 documents: a class-stratified random subset drawn with the run's seed from the documents left "
             "for training (checksum bb)")
    assert table.rows == [
        ["seed 0: validation", "500 documents, class-stratified seeded draw (checksum v0)"],
        ["seed 0: training", train],
        ["seed 1: validation", "500 documents, class-stratified seeded draw (checksum v1)"],
        ["seed 1: training", train],
        ["test", "10000 documents: the test split, the same for every seed"],
        ["checkpoint policy", "best-acc (one policy for every run)"],
        # preset "p" is none of the shipped ones: no pointer at docs/bench.md's Fashion-MNIST tuning run
        ["hyperparameters", "the preset's values (no tuning run in this directory; `calibkit tune` selects them on "
                            "the validation split)"]]
    assert budget.title == f"Training budget: {differs}" and not budget.terminal
    assert budget.tables[0].header == ["Method", "epochs", "train images", "model", "vs CE", "adds"]
    assert budget.tables[0].rows == [
        ["Mixup", "7", "900", "cnn", "differs: epochs, model", "mixed batches (same count)"],
        ["CE", "5", "900", "mlp", "same as CE", ""],
        ["LS", "5", "900", "mlp", "same as CE", ""],
        ["zz", "?", "?", "?", "differs: epochs, model, batch_size, data, train_subset", ""]]
    assert hp.title == "Hyperparameters per method" and not hp.terminal
    assert hp.tables[0].header == ["Method", "searched values", "loss spec", "other settings", "source"]
    assert hp.tables[0].rows == [
        # mix_alpha is the searched value: not repeated among the other settings
        ["Mixup", "mix_alpha=0.2", "ce", "amp=True, eta=2, lr=0.05, n=3, opt=sgd", "preset"],
        ["CE", "-", "ce", "-", "no search space"],
        ["LS", "alpha=0.03", "ls:alpha=0.03", "-", "preset"],
        ["zz", "-", "", "-", "no search space"]]
    # the same budget for every method is said so; a second policy makes the runs not comparable
    ctx.rows = [r for r in ctx.rows if r["method"] in ("ce", "ls")]
    assert protocol.protocol_section(ctx)[0].text == f"checkpoint policy: best-acc; {same}"
    mixed = _protocol_ctx(tmp_path / "mixed", keep_ls="last")
    assert mixed.rows[3]["config"]["keep"] == "last"
    proto = protocol.protocol_section(mixed)[0]
    assert ["checkpoint policy", "best-acc / last (MIXED: runs are not comparable)"] in proto.tables[0].rows
    assert proto.text == f"checkpoint policy: best-acc / last; {differs}"
    mixed.rows[2]["config"] = {"train": {"keep": "best-loss"}, "loss": "ce"}  # the policy in the train record
    rows = protocol.protocol_section(mixed)[0].tables[0].rows
    assert ["checkpoint policy", "best-acc / best-loss / last (MIXED: runs are not comparable)"] in rows


def test_protocol_section_with_a_tuning_run(tmp_path, monkeypatch):
    make_tuning(tmp_path)
    ctx = _protocol_ctx(tmp_path, figures=True)
    drawn, draw = [], tuning.write_tuning_figure
    monkeypatch.setattr(tuning, "write_tuning_figure", lambda *a, **k: drawn.append(a[:2]) or draw(*a, dpi=30))
    sections = protocol.protocol_section(ctx)
    assert drawn == [(tmp_path, "p")]  # the report's preset only
    assert [s.title for s in sections] == ["Protocol", sections[1].title, "Hyperparameters per method",
                                           "Selection on the validation split (x100, before TS)",
                                           "Validation curves of the tuning run"]
    assert sections[0].tables[0].rows[-1] == [
        "hyperparameters", "selected in this directory by `calibkit tune` on the validation split of seed 0: min "
        "ECE (15 bins, before TS), candidates > 2 accuracy point below the best excluded"]
    assert sections[2].tables[0].rows[2][-1] == "tuned here"  # LS ran with the selected alpha
    sel = sections[3]
    header, rows = tuning.tuning_rows(tuning.load_candidates(tmp_path, "p"))
    assert not sel.terminal and sel.tables[0].rows == rows and sel.tables[0].header == header
    (fig,) = sections[4].figures
    assert not sections[4].terminal and fig.path == ctx.figdir / "tuning.png" and fig.path.is_file()
    assert fig.caption == ("Validation ECE and accuracy against each searched value; the selected candidate is "
                           "marked.")
    ctx.figures = False
    assert len(protocol.protocol_section(ctx)) == 4
    # a selection that is not what the run used: the run's values are the preset's
    ctx.rows[3]["config"]["hparams"] = {"loss.alpha": 0.05}
    assert protocol.protocol_section(ctx)[2].tables[0].rows[2][-1] == "preset"


# ----------------------------------------------------------------------------- rendering
from calibkit.report import render  # noqa: E402
from calibkit.report.figures import Figure  # noqa: E402
from calibkit.report.render import Section  # noqa: E402


def _sections(tmp_path):
    png = tmp_path / "f.png"
    png.write_bytes(b"\x89PNG fake bytes")
    t = Table(["Method", "ECE"], [["A|B", "1.00 ± 0.10"], ["C", "2.00"]], best={(0, 1)})
    return [Section("First `part`", "Mean ± std, **bold** and `code`.\n\nSecond paragraph.", [t]),
            Section("Hidden", "not in the terminal", [t], terminal=False),
            Section("Empty"),
            Section("Short", "long text", terminal_text="short text", anchor="my-anchor"),
            Section("Pictures & more", "", figures=[Figure(png, 'A "quoted" <caption> with `x`')])]


def test_terminal_text(tmp_path):
    s = _sections(tmp_path)
    assert render.to_text("Title", s, None).splitlines() == [
        "Title", "", "First `part`", "Mean +- std, bold and code.", "", "Second paragraph.",
        "Method            ECE", "------  -------------", "A|B     1.00 +- 0.10<", "C                2.00",
        "", "Short", "short text"]
    # wrapped to the width, paragraph by paragraph; two tables are separated by a blank line
    two = [Section("S", "one two three four five six\n\nseven", [Table(["a"], [["1"]]), Table(["b"], [["2"]])])]
    assert render.to_text("", two, 10).splitlines() == ["", "S", "one two", "three four", "five six", "",
                                                        "seven", "a", "-", "1", "", "b", "-", "2"]
    assert render._plain("**a** `b` ±") == "a b +-"


def test_a_markdown_list_keeps_one_item_per_terminal_line():
    text = ("Intro words here:\n- first item of several words\n  - nested item with more words\n"
            "  - short\n\nafter the list")
    out = render._plain(text, 16)
    assert out.splitlines() == ["Intro words", "here:", "- first item of", "  several words",
                                "  - nested item", "    with more", "    words", "  - short", "",
                                "after the list"]
    # the words in their order, every line within the width
    assert out.split() == text.split() and max(map(len, out.splitlines())) <= 16


def test_markdown(tmp_path):
    s = _sections(tmp_path)
    md = render.to_markdown("Title", "Intro.", s)
    assert md.splitlines() == [
        "# Title", "", "Intro.", "",
        # no leading section: the contents come first
        "## Contents", "", "- [First `part`](#first-part)", "- [Hidden](#hidden)", "- [Empty](#empty)",
        "- [Short](#my-anchor)", "- [Pictures & more](#pictures-more)", "",
        "## First `part`", "", "Mean ± std, **bold** and `code`.", "", "Second paragraph.", "",
        "| Method | ECE |", "|---|--:|", "| A\\|B | **1.00 ± 0.10** |", "| C | 2.00 |", "",
        "## Hidden", "", "not in the terminal", "",
        "| Method | ECE |", "|---|--:|", "| A\\|B | **1.00 ± 0.10** |", "| C | 2.00 |", "",
        "## Empty", "",
        "## Short", "", "long text", "",
        "## Pictures & more", "",
        # user text is escaped (no raw HTML in report.md); code spans are kept
        '![A "quoted" &lt;caption> with `x`](figures/f.png)', "", '*A "quoted" &lt;caption&gt; with `x`*']
    assert md.endswith("`x`*\n")


def test_html(tmp_path):
    import base64

    s = _sections(tmp_path)
    assert render.inline('a < b & "c" `x<y>` **bold** *one*') == \
        'a &lt; b &amp; "c" <code>x&lt;y&gt;</code> <strong>bold</strong> *one*'
    assert render.html_table(Table(["k", "v"], [["a", "<1>"]], best={(0, 1)})) == (
        '<table><thead><tr><th class="key">k</th><th>v</th></tr></thead>'
        '<tbody><tr><td class="key">a</td><td class="best">&lt;1&gt;</td></tr></tbody></table>')
    # a label cell can be the best too (both classes); rows follow one another
    assert render.html_table(Table(["k"], [["a"], ["b"]], best={(1, 0)})) == (
        '<table><thead><tr><th class="key">k</th></tr></thead><tbody><tr><td class="key">a</td></tr>'
        '<tr><td class="key best">b</td></tr></tbody></table>')
    page = render.to_html("Title **b** ±", "Intro `c`.\n\n \n\nMore.", s)
    assert page.startswith("<!DOCTYPE html><html><head><meta charset='utf-8'><title>Title b +-</title><style>")
    body = page[page.index("<body>") + 6:page.index("</body>")]
    data = base64.b64encode(b"\x89PNG fake bytes").decode("ascii")
    t = render.html_table(s[0].tables[0])
    assert body == (
        "<h1>Title <strong>b</strong> ±</h1><p>Intro <code>c</code>.</p><p>More.</p>"
        '<nav id="contents"><h2>Contents</h2><ol><li><a href="#first-part">First <code>part</code></a></li>'
        '<li><a href="#hidden">Hidden</a></li><li><a href="#empty">Empty</a></li>'
        '<li><a href="#my-anchor">Short</a></li><li><a href="#pictures-more">Pictures &amp; more</a></li></ol></nav>'
        '<h2 id="first-part">First <code>part</code></h2>'
        "<p>Mean ± std, <strong>bold</strong> and <code>code</code>.</p><p>Second paragraph.</p>" + t
        + '<h2 id="hidden">Hidden</h2><p>not in the terminal</p>' + t
        + '<h2 id="empty">Empty</h2>'
        + '<h2 id="my-anchor">Short</h2><p>long text</p>'
        + '<h2 id="pictures-more">Pictures &amp; more</h2>'
        + f'<figure><img alt="A &quot;quoted&quot; &lt;caption&gt; with `x`" src="data:image/png;base64,{data}">'
        + '<figcaption>A "quoted" &lt;caption&gt; with <code>x</code></figcaption></figure>')
    assert f"<style>{render.STYLE}</style>" in page


def test_leading_sections_come_first_with_their_figures_side_by_side_then_the_contents(tmp_path):
    s = _sections(tmp_path)
    lead = Section("Lead", "the decision", figures=list(s[-1].figures), anchor="lead", lead=True)
    pictures, *rest = s[::-1]  # the leading section is given last: the renderers move it to the top
    page = render.to_html("T", "I.", [*rest[::-1], lead])
    body = page[page.index("<body>") + 6:page.index("</body>")]
    order = [body.index(x) for x in ('<h2 id="lead">', '<div class="lead"><figure>', '<nav id="contents">',
                                     '<h2 id="first-part">')]
    assert order == sorted(order)
    assert '<a href="#lead">' not in body  # the contents list the other sections only
    md = render.to_markdown("T", "I.", [*rest[::-1], lead]).splitlines()
    assert md.index("## Lead") < md.index("## Contents") < md.index("## First `part`")
    assert "- [Lead](#lead)" not in md


# ----------------------------------------------------------------------------- build and figures
from calibkit.report import build  # noqa: E402


def make_runs(out, preset="smoke", methods=("ce", "ls", "focal"), seeds=(0, 1), n=200, pending=(), commit=True):
    """A small results database with real logits files; focal is an exact copy of CE."""
    from calibkit.metrics import evaluate

    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 3, (n,), generator=gen)
    with Store(out / "runs.db") as store:
        for seed in seeds:
            for method in methods:
                g = torch.Generator().manual_seed(seed)
                x = torch.randn(n, 3, generator=g)
                x[torch.arange(n), labels] += 1.0
                test = x * (1.0 if method == "ls" else 4.0)
                d = out / "runs" / method / f"seed{seed}"
                d.mkdir(parents=True)
                rundir.write_tensors(d / rundir.LOGITS, {"test_logits": test, "test_labels": labels})
                key = f"{preset}/{method}/{seed}"
                assert store.claim(key, preset=preset, method=method, seed=seed, config={"loss": method},
                                   git_commit=f"c{seed}{method}" if commit else None,
                                   versions={"torch": f"9.{seed}", "python": "3.0"})
                rob = {"by_severity": {"1": {"acc": 0.5, "ece": 0.1}}} if method == "ls" else None
                store.finish(key, run_dir=str(d), logits_path=str(d / rundir.LOGITS), robustness=rob,
                             metrics={"before": evaluate(test.softmax(1), labels),
                                      "after": evaluate((test / 2).softmax(1), labels), "temperature": 2.0})
        for key in pending:
            assert store.claim(key, preset=preset, method=key.split("/")[1], seed=0)
    return labels


def test_build_report_in_process(tmp_path, monkeypatch):
    make_runs(tmp_path, pending=("smoke/mbls/0", "smoke/acls/0"))
    monkeypatch.setenv("COLUMNS", "70")
    rep = build.build_report(tmp_path, figures=False)
    assert rep["preset"] == "smoke" and set(rep["summary"]) == {"ce", "ls", "focal"}
    assert set(rep["deltas"]) == {"ls", "focal"}
    text = rep["text"]
    lines = text.splitlines()
    assert lines[0] == ("calibkit bench: preset smoke, 6 finished runs, 2 unfinished (smoke/mbls/0 (running), "
                        "smoke/acls/0 (running))")
    # the terminal width (COLUMNS) is the default width: every line of text and tables fits (titles
    # are not wrapped)
    titles = {s.title for s in rep["sections"]}
    assert max(len(ln) for ln in lines[1:] if ln not in titles) <= 70
    # n_boot: the preset's (smoke: 100)
    assert "paired bootstrap (100 resamples)" in text.replace("\n", " ")
    assert "x100, mean over 2 seed(s)." in text.replace("\n", " ")
    rep_dir = tmp_path / "report"
    md = (rep_dir / "report.md").read_text()
    assert md.startswith("# calibkit bench: preset smoke, 6 finished runs\n\nPreset `smoke`: 6 finished runs of 3 "
                         "methods; CE (`ce`) is the reference. Runs: 3 methods (ce, ls, focal), 2 seeds (0, 1), "
                         "epochs not recorded. Git commit `c0ce`; python 3.0, torch 9.0.\n\n"
                         "Unfinished runs: smoke/mbls/0 (running), smoke/acls/0 (running).\n")
    assert "mean over 2 seed(s); 1 = lowest ECE" in md and "paired bootstrap (100 resamples)" in md
    titles = [s.title for s in rep["sections"]]
    assert titles[:5] == ["Ranking by test ECE (before temperature scaling)", "Notes",
                          "Test set, before temperature scaling (grid order)",
                          "After temperature scaling, OOD detection, corrupted test sets, training time",
                          "Corrupted test sets per severity"]
    assert "Focal** gave exactly CE's test predictions in every seed, hence a difference of exactly 0." in md
    assert rep["paths"] == {"report": rep_dir, "md": rep_dir / "report.md", "html": rep_dir / "index.html",
                            "figures": {}}
    assert (rep_dir / "index.html").read_text().count("<h2 ") == len(rep["sections"])
    assert (rep_dir / "figures").is_dir()
    # explicit arguments: n_boot, width 0 (never split), another bootstrap seed
    again = build.build_report(tmp_path, "smoke", n_boot=30, seed=1, figures=False, width=0)
    assert "paired bootstrap (30 resamples)" in again["text"].replace("\n", " ")
    ls = paired_ece_delta(again["summary"]["ls"]["runs"], again["summary"]["ce"]["runs"], n_boot=30, seed=1)
    assert again["deltas"]["ls"] == ls
    assert max(map(len, again["text"].splitlines()[1:])) > 70


def test_build_report_errors_and_preset_choice(tmp_path):
    with Store(tmp_path / "runs.db"):
        pass
    with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path / 'runs.db'))} holds no runs yet$"):
        build.build_report(tmp_path)
    make_runs(tmp_path, preset="first", methods=("ce",), seeds=(0,), commit=False)
    make_runs(tmp_path / "x", preset="x")  # another directory: unrelated
    with Store(tmp_path / "runs.db") as store:
        assert store.claim("second/ce/0", preset="second", method="ce", seed=0)
        # a tuning run of the other preset: not part of this preset's report
        assert store.claim("second/ls/0/a", table="tuning",
                           preset="second", method="ls", seed=0, hparams={"loss.alpha": 0.1})
        store.finish("second/ls/0/a", table="tuning", metrics={"acc": 0.5, "ece": 0.1})
    with pytest.raises(ValueError, match=r"^no runs of preset 'zz' in .*runs\.db; found: first, second$"):
        build.build_report(tmp_path, "zz", figures=False)
    # the latest preset is the default; it has no finished run
    with pytest.raises(ValueError, match=r"^no finished runs of preset 'second' in .*runs\.db$"):
        build.build_report(tmp_path, figures=False)
    import sqlite3

    rep = build.build_report(tmp_path, "first", figures=False, width=0)
    assert not [s for s in rep["sections"] if s.title.startswith("Selection on the validation split")]
    con = sqlite3.connect(tmp_path / "runs.db")
    con.execute("DROP TABLE tuning")  # a database written before tuning existed
    con.commit()
    con.close()
    rep = build.build_report(tmp_path, "first", figures=False, width=0)
    assert rep["preset"] == "first" and rep["deltas"] == {}
    # only the preset's rows: the other preset's unfinished run is not listed
    assert rep["text"].splitlines()[0] == "calibkit bench: preset first, 1 finished runs"
    assert "Git commit `unknown`; python 3.0, torch 9.0." in (tmp_path / "report" / "report.md").read_text()
    con = sqlite3.connect(tmp_path / "runs.db")
    assert "tuning" not in {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    con.close()  # the report opened the database read-only: nothing was added
    assert "paired bootstrap (1000 resamples)" in rep["text"]  # a preset calibkit does not know: 1000
    assert "Corrupted test sets per severity" not in [s.title for s in rep["sections"]]


def test_notes_name_the_margin_of_a_method_that_equals_ce():
    from types import SimpleNamespace

    def ctx(loss, identical=True):
        summary = {"ce": {"runs": [{"config": {}}]}, "m": {"runs": [{"config": {"loss": loss}}]}}
        return SimpleNamespace(summary=summary, deltas={"m": {"identical": identical}, "ce2": {}})

    assert build._margin(ctx("mbls:margin=6,alpha=0.1"), "m") == 6.0
    assert build._margin(ctx(" MbLS : alpha = 0.1 , margin = 4 "), "m") == 4.0
    assert build._margin(ctx("mbls"), "m") == 10.0  # the loss's default
    assert build._margin(ctx("fedlas_mbls:alpha=1"), "m") == 6.0
    assert build._margin(ctx("focal:gamma=2"), "m") is None and build._margin(ctx("ce"), "m") is None
    assert build._margin(ctx("nosuchloss"), "m") is None and build._margin(ctx("mbls:margin=x"), "m") is None
    assert build._margin(ctx(None), "m") is None
    assert build.notes_section(ctx("mbls", identical=False)) == []
    (note,) = build.notes_section(ctx("mbls:margin=6"))
    assert note.title == "Notes"
    assert note.text == ("**m** gave exactly CE's test predictions in every seed, hence a difference of exactly 0. "
                         "Its loss adds a penalty only where a logit (or a logit gap) exceeds the margin 6; the "
                         "logits never grew that large in this preset's training, so the penalty was 0 at every "
                         "step and the run trained exactly as CE did. Longer training (e.g. preset `default`) "
                         "reaches the margin.")
    (plain,) = build.notes_section(ctx("focal"))
    assert plain.text == "**m** gave exactly CE's test predictions in every seed, hence a difference of exactly 0."
    two = ctx("focal")
    two.summary["m2"] = {"runs": [{"config": {"loss": "ls"}}]}
    two.deltas["m2"] = {"identical": True}
    (both,) = build.notes_section(two)
    assert both.text.split("\n\n") == [plain.text, plain.text.replace("**m**", "**m2**")]


def test_report_figures_draw_the_summary_numbers(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    labels = make_runs(tmp_path, methods=("ce", "ls"), seeds=(0, 3))
    figs = []
    monkeypatch.setattr(plt, "close", figs.append)
    # every method's figure asked for: the runs' preset, smoke, draws CE's and the recommended one's
    rep = build.build_report(tmp_path, n_boot=20, width=0, all_figures=True)
    try:
        paths = rep["paths"]["figures"]
        assert sorted(paths) == ["ece_before_after_ts", "ou_ece", "reliability_ce", "reliability_ls"]
        assert all(p.parent == tmp_path / "report" / "figures" and p.stat().st_size > 1000 for p in paths.values())
        section = next(s for s in rep["sections"] if s.title == "Figures")
        assert not section.terminal and section.text.endswith("One seed per method (the lowest).")
        ou, ts, rel_ce, rel_ls = figs
        summary = rep["summary"]

        def stat(m, key):
            return 100 * summary[m]["stats"][key][0]

        # O-ECE bars from 0, U-ECE bars stacked on them: each bar's top is the ECE
        (ax,) = ou.axes
        bars = ax.patches
        assert [b.get_height() for b in bars] == pytest.approx(
            [stat("ce", "before.o_ece"), stat("ls", "before.o_ece"), stat("ce", "before.u_ece"),
             stat("ls", "before.u_ece")])
        assert [b.get_y() for b in bars] == pytest.approx([0, 0, stat("ce", "before.o_ece"),
                                                           stat("ls", "before.o_ece")])
        assert [b.get_y() + b.get_height() for b in bars[2:]] == pytest.approx(
            [stat("ce", "before.ece"), stat("ls", "before.ece")], abs=1e-9)
        assert [t.get_text() for t in ax.get_xticklabels()] == ["CE", "LS"]
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["O-ECE (over-confidence)",
                                                                        "U-ECE (under-confidence)"]
        # the colours the caption names: O-ECE red, U-ECE blue; before TS grey, after TS green
        assert [to_hex(b.get_facecolor()) for b in bars] == [to_hex("tab:red")] * 2 + [to_hex("tab:blue")] * 2
        assert ax.get_ylabel() == "ECE x100 (O-ECE + U-ECE)"
        assert ax.get_title() == "Over- and under-confidence on the test set, before TS"
        # before / after TS: side by side around each method's position
        (ax,) = ts.axes
        bars = ax.patches
        assert [(round(b.get_x(), 9), round(b.get_width(), 9)) for b in bars] == [(-0.4, 0.4), (0.6, 0.4),
                                                                                   (0.0, 0.4), (1.0, 0.4)]
        assert [b.get_height() for b in bars] == pytest.approx(
            [stat("ce", "before.ece"), stat("ls", "before.ece"), stat("ce", "after.ece"), stat("ls", "after.ece")])
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["before TS", "after TS"]
        assert [to_hex(b.get_facecolor()) for b in bars] == [to_hex("tab:gray")] * 2 + [to_hex("tab:green")] * 2
        assert ax.get_ylabel() == "ECE x100" and ax.get_title() == "Test ECE before and after temperature scaling"
        figures = {f.path.stem: f for s in rep["sections"] for f in s.figures}
        assert "(x100, mean over 2 seed(s))" in figures["ou_ece"].caption
        assert "(x100, mean over 2 seed(s))" in figures["ece_before_after_ts"].caption
        # the reliability figure of a method: its lowest seed, before and after TS (T = 2)
        from calibkit.plots import confidence_histogram, reliability_diagram

        run = summary["ls"]["runs"][0]
        assert run["seed"] == 0
        logits = rundir.read_tensors(run["logits_path"])["test_logits"].double()
        ref, axes = plt.subplots(1, 3)
        reliability_diagram(logits.softmax(1).numpy(), labels.numpy(), ax=axes[0], title="LS (seed 0): before TS",
                            band=True, band_kind="consistency")
        reliability_diagram((logits / 2).softmax(1).numpy(), labels.numpy(), ax=axes[1],
                            title="LS (seed 0): after TS (T = 2.00)", band=True, band_kind="consistency")
        confidence_histogram(logits.softmax(1).numpy(), labels.numpy(), ax=axes[2],
                             title="LS (seed 0): confidence, before TS")
        for got, want in zip(rel_ls.axes, axes):
            assert got.get_title() == want.get_title()
            assert len(got.patches) == len(want.patches) > 0
            assert np.allclose([p.get_height() for p in got.patches], [p.get_height() for p in want.patches],
                               atol=1e-12)
            assert np.allclose([p.get_x() for p in got.patches], [p.get_x() for p in want.patches], atol=1e-12)
            # the lines too: the diagonal, and the histogram's mean confidence and accuracy
            assert [list(ln.get_xdata()) for ln in got.lines] == [list(ln.get_xdata()) for ln in want.lines]
            # and the consistency band of the reliability diagrams (exact quantiles: the same band)
            bands = [[p.vertices.tolist() for c in ax.collections for p in c.get_paths()] for ax in (got, want)]
            assert bands[0] == bands[1]
        assert len(rel_ls.axes[0].collections) == len(rel_ls.axes[1].collections) == 1
        assert figures["reliability_ls"].caption == (
            "LS (seed 0): reliability diagrams of the test set before and after temperature scaling (T = 2.00, "
            "fitted on the validation set), with the 90% consistency band of a calibrated model (where its bars "
            "would lie, per bin; a bar outside is evidence of miscalibration), and the histogram of its confidences.")
    finally:
        plt.close("all")
    # the smoke preset's choice without a recommendation (no validation logits): CE's figure only
    rep = build.build_report(tmp_path, n_boot=20, width=0)
    assert sorted(rep["paths"]["figures"]) == ["ece_before_after_ts", "ou_ece", "reliability_ce"]
    assert not (tmp_path / "report" / "figures" / "reliability_ls.png").exists()
    section = next(s for s in rep["sections"] if s.title == "Figures")
    assert section.text.endswith(" Drawn for CE only (no recommendation): the preset's `report_figures = "
                                 "\"ce-and-chosen\"`; `calibkit report DIR --all-figures` draws every method's.")
    plt.close("all")
    # no figures: no section, nothing drawn
    figs.clear()
    rep = build.build_report(tmp_path, n_boot=20, width=0, figures=False)
    assert not figs and "Figures" not in [s.title for s in rep["sections"]]


def test_dece_defaults_are_1000_resamples_seed_0_and_a_95_percent_interval(tmp_path):
    gen = torch.Generator().manual_seed(8)
    labels, runs = _pair_fixture(tmp_path, gen, n=60)
    a, b = [runs["ls", 0]], [runs["ce", 0]]
    idx = torch.randint(0, 60, (1000, 60), generator=torch.Generator().manual_seed(0))
    pa, _, _ = load_probs(runs["ls", 0])
    pb, _, _ = load_probs(runs["ce", 0])
    samples = [naive_ece(pa[i], labels[i]) - naive_ece(pb[i], labels[i]) for i in idx.numpy()]
    want = basic(samples, naive_ece(pa, labels) - naive_ece(pb, labels), 0.95)
    got = paired_ece_delta(a, b)
    assert (got["lo"], got["hi"]) == pytest.approx(want, abs=1e-9)
    got = data.ece_deltas({"ce": {"runs": b}, "ls": {"runs": a}})["ls"]
    assert (got["lo"], got["hi"]) == pytest.approx(want, abs=1e-9)


def test_text_table_ties_keep_the_narrower_first_part_and_label_columns_count():
    # two label columns (1 + 2 + 1 = 4 wide) and three columns printed 4 wide each: at width 12 a
    # part holds two columns; [c1] [c2 c3] and [c1 c2] [c3] tie, and the first found is kept
    t = Table(["k", "l", "c1", "c2", "c3"], [["a", "b", "1", "2", "3"]], key_columns=2)
    parts = [p.splitlines() for p in text_table(t, 12).split("\n\n")]
    assert [p[0] for p in parts] == ["k  l  c1", "k  l  c2  c3"]
    assert [p[2] for p in parts] == ["a  b   1", "a  b   2   3"]
    assert len(text_table(t, 11).split("\n\n")) == 3  # 4 + 8 = 12 does not fit 11
    assert len(text_table(t, 16).split("\n\n")) == 1


def test_text_only_tables_wrap_at_the_width_exactly():
    t = Table(["a", "bb", "value"], [["x", "yy", "aaaa bbbb cccc dddd e"], ["z", "", ""]], key_columns=3)
    # 1 + 2 + 21 + two gaps = 28: fits 28 on one line per row, trailing blanks stripped
    assert text_table(t, 28).splitlines() == ["a  bb  value", "-  --  " + "-" * 21, "x  yy  aaaa bbbb cccc dddd e",
                                              "z"]
    # at 27 the last column wraps at 27 - 7 = 20 characters, continuation under the column
    assert text_table(t, 27).splitlines() == ["a  bb  value", "-  --  " + "-" * 20, "x  yy  aaaa bbbb cccc dddd",
                                              "       e", "z"]
    # the wrapped column is never narrower than 20 characters
    assert text_table(t, 10).splitlines()[1:4] == ["-  --  " + "-" * 20, "x  yy  aaaa bbbb cccc dddd", "       e"]
    one = Table(["text"], [["aaaa bbbb cccc dddd eeee"]])
    assert text_table(one, 10).splitlines() == ["text", "-" * 20, "aaaa bbbb cccc dddd", "eeee"]
    labels = Table(["k", "v"], [["a", "x"], ["b", "longer"]], key_columns=2)
    assert text_table(labels).splitlines() == ["k  v", "-  ------", "a  x", "b  longer"]


def test_tuning_reads_never_write_the_database(tmp_path):
    import sqlite3

    make_tuning(tmp_path)
    con = sqlite3.connect(tmp_path / "runs.db")
    con.execute("DROP TABLE tuning")  # a database written before tuning existed
    con.commit()
    con.close()
    assert tuning.load_candidates(tmp_path, "p") == []
    con = sqlite3.connect(tmp_path / "runs.db")
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    con.close()
    assert "tuning" not in tables and "runs" in tables


def test_split_lines_without_a_rule_or_a_known_data_set():
    val, train, test = protocol._split_text({"val": 10, "train": 20, "test": 30})
    assert (val, train, test) == ("10 images, ?", "20 images: all the images left for training",
                                  "30 images: the test split, the same for every seed")


def test_section_texts_define_every_abbreviation_of_their_tables(tmp_path):
    make_runs(tmp_path)
    rep = build.build_report(tmp_path, n_boot=20, figures=False, width=0)
    sec = {s.title: s for s in rep["sections"]}
    ranking = sec["Ranking by test ECE (before temperature scaling)"]
    assert ranking.anchor == "ranking" and 'id="ranking"' in (tmp_path / "report" / "index.html").read_text()
    for phrase in ("x100, mean over 2 seed(s); 1 = lowest ECE.", "highest Acc, lowest ECE",
                   "ECE after temperature scaling (`ECE (TS)`), most negative difference from CE.",
                   "O-ECE + U-ECE = ECE", "`dECE vs CE` = paired bootstrap (20 resamples)",
                   "from CE, 95% basic bootstrap interval; `*` = the 95% interval lies wholly on the better side of 0",
                   "`!` = wholly on the worse side (significantly worse)"):
        assert phrase in ranking.text, phrase
    assert "95% basic interval, * = significantly better, ! = significantly worse." in ranking.terminal_text
    before = sec["Test set, before temperature scaling (grid order)"]
    for phrase in ("Mean ± std over seeds (`n` = seeds)", "x100, NLL and Brier as they are.", "AECE = equal-mass",
                   "cwECE = classwise ECE", "MCE = maximum calibration error."):
        assert phrase in before.text, phrase
    after = sec["After temperature scaling, OOD detection, corrupted test sets, training time"]
    for phrase in ("Temperature T fitted on the validation set by NLL.",
                   "Shift = mean over corruptions and severities.", "Train s = training wall time in seconds."):
        assert phrase in after.text, phrase
    # these runs recorded no OOD measurement: no AUROC columns, and the text says why
    assert "AUROC-H" not in after.tables[0].header and "No OOD set (`ood = none`)" in after.text
    assert [h for h in after.tables[0].header if "±" in h] == []
    robust = sec["Corrupted test sets per severity"]
    assert not robust.terminal and robust.text == "Mean over corruptions (x100)."
    assert robust.tables[0].rows[1][1] == "10.00 ± 0.00"  # LS, both seeds at 0.1
    assert before.tables[0].rows[0][2].count("±") == 1


def test_without_a_terminal_or_columns_the_width_is_100(tmp_path, monkeypatch):
    import os

    make_runs(tmp_path)
    monkeypatch.delenv("COLUMNS", raising=False)

    def no_terminal(*a):
        raise OSError("not a terminal")

    monkeypatch.setattr(os, "get_terminal_size", no_terminal)
    text = build.build_report(tmp_path, n_boot=20, figures=False)["text"]
    assert text == build.build_report(tmp_path, n_boot=20, figures=False, width=100)["text"]
    assert text != build.build_report(tmp_path, n_boot=20, figures=False, width=101)["text"]


def test_text_only_tables_that_fit_are_printed_verbatim():
    t = Table(["k", "v"], [["a", "x\ty"]], key_columns=2)  # 1 + 3 + one gap = 6 wide
    assert text_table(t, 6).splitlines() == ["k  v", "-  ---", "a  x\ty"]


def test_protocol_section_without_a_ce_run(tmp_path):
    ctx = _protocol_ctx(tmp_path)
    ctx.rows = [r for r in ctx.rows if r["method"] != "ce"]
    proto, budget, _ = protocol.protocol_section(ctx)
    # nothing to compare with: no split lines (they come from CE's runs), no budget difference
    assert [r[0] for r in proto.tables[0].rows] == ["checkpoint policy", "hyperparameters"]
    assert [r[4] for r in budget.tables[0].rows] == ["same as CE"] * 3


def test_summary_figures_of_methods_without_numbers(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from calibkit.report.figures import summary_figures

    figs = []
    monkeypatch.setattr(plt, "close", figs.append)
    try:
        out = summary_figures({"ce": {"seeds": [0], "stats": {"before.ece": (0.1, 0.0, 1)}}}, tmp_path)
        assert "(x100, mean over 1 seed(s))" in out[1].caption
        before, after = figs[1].axes[0].patches
        assert before.get_height() == pytest.approx(10.0) and np.isnan(after.get_height())  # no number: no bar
        figs.clear()
        out = summary_figures({}, tmp_path)  # nothing to show: one seed assumed in the captions
        assert "(x100, mean over 1 seed(s))" in out[0].caption and not figs[0].axes[0].patches
    finally:
        plt.close("all")


def _drawn(monkeypatch):
    """Figures handed to ``plt.close`` by the report (kept open for inspection)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = []
    monkeypatch.setattr(plt, "close", figs.append)
    return plt, figs


def test_method_figure_three_panels_in_a_row_and_zero_probabilities(tmp_path, monkeypatch):
    import warnings

    from calibkit.report.figures import method_figure

    plt, figs = _drawn(monkeypatch)
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(50, 3, generator=gen, dtype=torch.float64)
    logits[::5, 2] = -1e4  # probability exactly 0 after the softmax
    labels = torch.randint(0, 2, (50,), generator=gen)
    rundir.write_tensors(tmp_path / "logits.safetensors", {"test_logits": logits, "test_labels": labels})
    row = {"logits_path": str(tmp_path / "logits.safetensors"), "metrics": {"temperature": 2.0}, "method": "ce",
           "seed": 0}
    assert (logits.softmax(1) == 0).sum() == 10
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # exact zeros are clipped before the logarithm: no warning
            fig = method_figure(row, tmp_path / "ce.png")
        (drawn,) = figs
        axes = drawn.axes
        assert len(axes) == 3 and all(ax.patches for ax in axes)  # before TS, after TS, histogram: none empty
        boxes = [ax.get_position() for ax in axes]
        assert (all(abs(b.y0 - boxes[0].y0) < 1e-9 for b in boxes)
                and boxes[0].x1 < boxes[1].x0 < boxes[1].x1 < boxes[2].x0)
        w, h = drawn.get_size_inches()
        assert w / 3 >= 4 and h >= 4  # each panel is a readable square-ish plot
        assert fig.path.stat().st_size > 1000
    finally:
        plt.close("all")


def test_bar_charts_keep_their_legend_beside_the_bars_and_their_captions_true(tmp_path, monkeypatch):
    from matplotlib import style
    from matplotlib.colors import to_hex

    from calibkit.report.figures import summary_figures

    plt, figs = _drawn(monkeypatch)
    names = [f"m{i}" for i in range(30)]
    summary = {m: {"seeds": [0], "stats": {"before.o_ece": (0.02 + i / 1000, 0.0, 1), "before.u_ece": (0.01, 0.0, 1),
                                           "before.ece": (0.03, 0.0, 1), "after.ece": (0.01, 0.0, 1)}}
               for i, m in enumerate(names)}
    try:
        with style.context("ggplot"):  # a user style with another colour cycle: the captions' colours hold
            summary_figures(summary, tmp_path)
            ou, ts = figs
        bars = ou.axes[0].patches
        assert {to_hex(b.get_facecolor()) for b in bars[30:]} == {to_hex("tab:blue")}  # U-ECE: blue, as captioned
        for fig in (ou, ts):
            ax = fig.axes[0]
            assert fig.get_size_inches()[0] >= 0.5 * len(names)  # at least half an inch per method
            # long method names: labels slanted and ending at their tick, so they do not collide
            for t in ax.get_xticklabels():
                assert 0 < t.get_rotation() < 90 and t.get_horizontalalignment() == "right"
            fig.canvas.draw()
            renderer = fig.canvas.get_renderer()
            axes_box, legend_box = ax.get_window_extent(renderer), ax.get_legend().get_window_extent(renderer)
            # the legend stands beside the bars, just right of the axes, level with their top
            assert axes_box.x1 <= legend_box.x0 <= axes_box.x1 + 0.05 * axes_box.width
            assert legend_box.y1 <= axes_box.y1 + 1 and legend_box.y1 >= axes_box.y1 - 0.1 * axes_box.height
    finally:
        plt.close("all")
