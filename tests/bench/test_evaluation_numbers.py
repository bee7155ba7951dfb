"""Bench numbers pinned to independent computations: robustness means, the dECE interval across
seeds, the fixed robustness subset and the cache of corrupted images."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from calibkit import rundir
from calibkit.bench import evaluation
from calibkit.bench.evaluation import EvalData, robustness_metrics
from calibkit.bootstrap import paired_bootstrap_diff
from calibkit.data import Split
from calibkit.report.data import ece_deltas


def naive_ece(probs: torch.Tensor, labels: torch.Tensor, n_bins: int = 15) -> float:
    """Top-label ECE by a loop over the samples: bin b holds confidences in (b/B, (b+1)/B]."""
    conf, pred = probs.double().max(1)
    count, s_conf, s_acc = [0] * n_bins, [0.0] * n_bins, [0.0] * n_bins
    for c, p, y in zip(conf.tolist(), pred.tolist(), labels.tolist()):
        b = 0
        while b < n_bins - 1 and c > (b + 1) / n_bins:
            b += 1
        count[b] += 1
        s_conf[b] += c
        s_acc[b] += float(p == y)
    return sum(abs(s_acc[b] - s_conf[b]) for b in range(n_bins)) / len(labels)


def test_robustness_means_over_corruptions_then_severities():
    gen = torch.Generator().manual_seed(0)
    n, k = 60, 4
    labels = torch.randint(0, k, (n,), generator=gen)
    # Severities "2" and "10" check the numeric (not string) order; "blur" lacks severity 10, so
    # that severity's mean is over one corruption only.
    keys = ["noise/2", "noise/10", "blur/2"]
    corrupted = {key: torch.full((n, 1, 2, 2), i, dtype=torch.uint8) for i, key in enumerate(keys)}
    logits = {i: torch.randn(n, k, generator=gen) * (1 + 2 * i) for i in range(len(keys))}
    predict = lambda images: logits[int(images[0, 0, 0, 0])]  # noqa: E731
    t = 1.7
    out = robustness_metrics(predict, corrupted, labels, t)

    def cell(i):
        lg = logits[i].double()
        return {"acc": (lg.argmax(1) == labels).double().mean().item(),
                "ece": naive_ece(lg.softmax(1), labels), "ece_ts": naive_ece((lg / t).softmax(1), labels)}

    cells = {key: cell(i) for i, key in enumerate(keys)}
    assert out["n"] == n and out["corruptions"] == ["blur", "noise"]
    for key, want in cells.items():
        name, sev = key.split("/")
        assert out["per"][name][sev] == pytest.approx(want, abs=1e-12)
    assert list(out["by_severity"]) == ["2", "10"]
    for m in ("acc", "ece", "ece_ts"):
        sev2 = (cells["noise/2"][m] + cells["blur/2"][m]) / 2
        sev10 = cells["noise/10"][m]
        assert out["by_severity"]["2"][m] == pytest.approx(sev2, abs=1e-12)
        assert out["by_severity"]["10"][m] == pytest.approx(sev10, abs=1e-12)
        # Overall: the mean of the severity means (not of the three cells).
        assert out["overall"][m] == pytest.approx((sev2 + sev10) / 2, abs=1e-12)
    assert cells["noise/2"]["ece"] != pytest.approx(cells["noise/2"]["ece_ts"], abs=1e-6)


def test_robustness_without_corruptions_is_empty():
    out = robustness_metrics(lambda x: None, {}, torch.zeros(3, dtype=torch.long), 1.0)
    assert out == {"n": 3, "corruptions": [], "per": {}, "by_severity": {}, "overall": {}}


def _data(n_test=20, robust_n=5, severities=(1, 3), cache_dir=None):
    images = torch.arange(n_test * 16, dtype=torch.int64).remainder(256).to(torch.uint8).view(n_test, 1, 4, 4)
    bundle = SimpleNamespace(test=Split(images, torch.arange(n_test) % 3))
    preset = SimpleNamespace(robust_n=robust_n, severities=list(severities), dataset="toy", ood="none")
    return EvalData(preset, bundle, cache_dir=cache_dir)


@pytest.mark.parametrize("robust_n, expected", [(5, 5), (0, 20), (None, 20), (50, 20)])
def test_robust_index_is_a_fixed_sorted_subset(robust_n, expected):
    idx = _data(robust_n=robust_n).robust_index()
    assert len(idx) == expected == len(set(idx.tolist()))
    assert idx.tolist() == sorted(idx.tolist()) and 0 <= idx.min() and idx.max() < 20
    assert torch.equal(idx, _data(robust_n=robust_n).robust_index())  # the same for every run
    if expected < 20:
        assert idx.tolist() != list(range(expected))  # drawn at random, not the first images


def test_corrupted_images_are_cached_and_a_broken_cache_rebuilt(tmp_path, monkeypatch):
    from calibkit.data.corruptions import CORRUPTIONS, corrupt

    cache = tmp_path / "cache" / "sub"  # created with its parents
    data = _data(cache_dir=cache)
    first = data.corrupted()
    idx = data.robust_index()
    assert set(first) == {f"{c}/{s}" for c in CORRUPTIONS for s in (1, 3)}
    for key in ("contrast/3", "gaussian_noise/1"):  # the noise is drawn with seed 0
        name, sev = key.split("/")
        assert torch.equal(first[key], corrupt(data.bundle.test.images[idx], name, int(sev), seed=0))
    files = list(cache.glob("corrupted_toy_n5_s1-3.safetensors"))
    assert len(files) == 1
    # A second bench reads the cache and corrupts nothing.
    calls = []
    monkeypatch.setattr("calibkit.data.corruptions.corrupt", lambda *a, **k: calls.append(a) or a[0].clone())
    again = _data(cache_dir=cache).corrupted()
    assert not calls and set(again) == set(first)
    assert all(torch.equal(again[key], first[key]) for key in first)
    # A truncated cache (a bench killed mid-write) is rebuilt, not trusted.
    files[0].write_bytes(files[0].read_bytes()[:40])
    _data(cache_dir=cache).corrupted()
    assert len(calls) == len(first)


def _summary(tmp_path, probs_by_run, labels):
    summary = {}
    for (method, seed), probs in probs_by_run.items():
        d = tmp_path / method / str(seed)
        d.mkdir(parents=True)
        path = d / rundir.LOGITS
        rundir.write_tensors(path, {"test_logits": probs.log(), "test_labels": labels})
        row = {"run_key": f"t/{method}/{seed}", "seed": seed, "logits_path": str(path), "metrics": {}}
        summary.setdefault(method, {"runs": []})["runs"].append(row)
    return summary


def _probs(gen, labels, sharp):
    x = torch.randn(len(labels), 3, generator=gen, dtype=torch.float64)
    x[torch.arange(len(labels)), labels] += 1.0
    return (x * sharp).softmax(1)


def test_dece_interval_is_the_seed_average_of_paired_resamples(tmp_path):
    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 3, (300,), generator=gen)
    ce0, ce1, m0 = _probs(gen, labels, 4.0), _probs(gen, labels, 4.0), _probs(gen, labels, 1.0)
    # Seed 1 of "m" equals CE's seed 1: its resampled differences are all 0, so the seed average
    # is exactly half of seed 0's (difference and interval both halve).
    summary = _summary(tmp_path, {("ce", 0): ce0, ("ce", 1): ce1, ("m", 0): m0, ("m", 1): ce1,
                                  ("same", 0): ce0, ("same", 1): ce1, ("lone", 7): m0}, labels)
    out = ece_deltas(summary, n_boot=400, seed=3, level=0.9)
    assert set(out) == {"m", "same"}  # CE itself and a method with no seed shared with CE are left out
    p0, p_ce0 = summary["m"]["runs"][0], summary["ce"]["runs"][0]
    pa = torch.from_numpy(np.asarray(rundir.read_tensors(p0["logits_path"])["test_logits"].double().softmax(1)))
    pb = torch.from_numpy(np.asarray(rundir.read_tensors(p_ce0["logits_path"])["test_logits"].double().softmax(1)))
    single = paired_bootstrap_diff(pa, pb, labels, "ece", n_resamples=400, seed=3, level=0.9)
    q_lo, q_hi = torch.quantile(single.samples / 2, torch.tensor([0.05, 0.95], dtype=torch.float64)).tolist()
    want_diff = (naive_ece(m0, labels) - naive_ece(ce0, labels)) / 2
    lo, hi = 2 * want_diff - q_hi, 2 * want_diff - q_lo  # the basic interval around the averaged difference
    m = out["m"]
    assert m["diff"] == pytest.approx(want_diff, abs=1e-9)
    assert m["lo"] == pytest.approx(lo, abs=1e-12) and m["hi"] == pytest.approx(hi, abs=1e-12)
    assert m["lo"] < m["diff"] < m["hi"] and m["seeds"] == 2 and not m["identical"]
    assert m["significant"] == (not lo <= 0 <= hi)
    assert m["hi"] < 0 and m["significant"]  # the sharp CE is far worse calibrated here
    same = out["same"]
    assert same["identical"] and same["diff"] == 0 and same["lo"] == same["hi"] == 0
    assert not same["significant"]


def test_dece_refuses_different_test_sets(tmp_path):
    gen = torch.Generator().manual_seed(1)
    labels = torch.randint(0, 3, (50,), generator=gen)
    summary = _summary(tmp_path, {("ce", 0): _probs(gen, labels, 1.0), ("m", 0): _probs(gen, labels, 1.0)}, labels)
    other = labels.roll(1)
    rundir.write_tensors(summary["m"]["runs"][0]["logits_path"],
                         {"test_logits": _probs(gen, other, 1.0).log(), "test_labels": other})
    with pytest.raises(ValueError, match="different test sets"):
        ece_deltas(summary, n_boot=10)
    assert ece_deltas({"m": summary["m"]}, n_boot=10) == {}


def test_ood_metrics_equal_sklearn_auroc_and_a_hand_fpr():
    from sklearn.metrics import roc_auc_score

    gen = torch.Generator().manual_seed(4)
    test_logits = torch.randn(80, 5, generator=gen) * 3
    ood_logits = torch.randn(60, 5, generator=gen) * 1.5
    out = evaluation.ood_metrics(test_logits, ood_logits, "noise")
    assert (out["dataset"], out["n_in"], out["n_out"]) == ("noise", 80, 60)
    p_in, p_out = test_logits.double().softmax(1), ood_logits.double().softmax(1)
    scores = {"entropy": lambda p: -(p * p.log()).sum(1) / np.log(5), "maxconf": lambda p: 1 - p.max(1).values}
    for tag, f in scores.items():
        s_in, s_out = f(p_in).numpy(), f(p_out).numpy()
        y = np.r_[np.zeros(80), np.ones(60)]
        assert out[f"auroc_{tag}"] == pytest.approx(roc_auc_score(y, np.r_[s_in, s_out]), abs=1e-12)
        # FPR at 95% TPR (OOD = positive): the share of in-distribution scores at or above the
        # threshold that keeps 95% of the OOD scores.
        thr = np.sort(s_out)[::-1][int(np.ceil(0.95 * 60)) - 1]
        assert out[f"fpr95_{tag}"] == pytest.approx(np.mean(s_in >= thr), abs=1e-12)
    assert out["auroc_entropy"] != out["auroc_maxconf"]


def test_test_metrics_before_and_after_temperature_scaling():
    from calibkit.calibrators import TemperatureScaling
    from calibkit.metrics import evaluate

    gen = torch.Generator().manual_seed(5)
    vl, tl = torch.randint(0, 4, (200,), generator=gen), torch.randint(0, 4, (150,), generator=gen)
    val = torch.randn(200, 4, generator=gen) * 4
    val[torch.arange(200), vl] += 3
    test = torch.randn(150, 4, generator=gen) * 4
    test[torch.arange(150), tl] += 3
    out = evaluation.test_metrics({"val_logits": val, "val_labels": vl, "test_logits": test, "test_labels": tl})
    t = float(TemperatureScaling().fit(val, vl).temperature_)
    assert out["temperature"] == pytest.approx(t, rel=1e-9) and out["temperature"] > 1.2
    # Fitted on the validation logits: T minimises their NLL (and not the test logits' NLL).
    nll = lambda z, y, temp: float(torch.nn.functional.cross_entropy(z.double() / temp, y))  # noqa: E731
    assert nll(val, vl, t) <= min(nll(val, vl, t * 1.01), nll(val, vl, t / 1.01))
    assert abs(float(TemperatureScaling().fit(test, tl).temperature_) - t) > 1e-3  # the test's own T differs
    assert out["before"] == pytest.approx(evaluate(test.double().softmax(1), tl), rel=1e-9, abs=1e-12)
    assert out["after"] == pytest.approx(evaluate((test.double() / t).softmax(1), tl), rel=1e-6, abs=1e-9)
    assert out["before"]["ece"] == pytest.approx(naive_ece(test.double().softmax(1), tl), abs=1e-12)
