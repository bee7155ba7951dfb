"""Segmentation end to end: the seg-smoke preset through train, bench, report, eval and plot.

The streamed pixel metrics are checked against the one-shot metrics of the full test logits, and
the stored pixel samples against the logits at the drawn positions.
"""

import math

import pytest
import torch

from calibkit.bench.attempts import Counts
from calibkit.bench.grid import PRESETS
from calibkit.store import Store
from tests.helpers.formats import fake_fmnist


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, one_thread):
    from calibkit.bench.runner import Bench
    from calibkit.report import build_report

    root = tmp_path_factory.mktemp("seg")
    (root / "fmnist").mkdir()
    fake_fmnist(str(root / "fmnist"), n_train=60, n_test=12)
    out = root / "bench"
    bench = Bench(PRESETS["seg-smoke"], out, data_dir=str(root / "fmnist"), device="cpu", log=lambda *a: None)
    try:
        counts = bench.run()
    finally:
        bench.close()
    return {"root": root, "out": out, "counts": counts, "report": build_report(out, "seg-smoke")}


@pytest.mark.slow
def test_seg_smoke_runs_every_method(smoke):
    assert smoke["counts"] == Counts(done=3, skipped=0, failed=0)
    rows = Store(smoke["out"] / "runs.db", readonly=True).runs("seg-smoke")
    assert sorted(r["method"] for r in rows) == ["ce", "fedlas_mbls", "mbls"]
    for r in rows:
        m = r["metrics"]
        assert 0 <= m["before"]["miou"] <= 1 and 0 <= m["before"]["ece"] <= 1 and m["temperature"] > 0
        assert r["ood"] is None and r["robustness"] is None


@pytest.mark.slow
def test_streamed_pixel_metrics_equal_one_shot_metrics(smoke):
    from calibkit.calibrators import TemperatureScaling
    from calibkit.data.inputs import inputs_from_info
    from calibkit.metrics import evaluate
    from calibkit.rundir import load_logits, load_run, predict_logits
    from calibkit.train.dense import _positions, load_run_data

    run_dir = smoke["out"] / "runs" / "seg-smoke" / "mbls" / "seed0"
    model, cfg, info = load_run(run_dir)
    bundle = load_run_data(info, cfg)
    inputs = inputs_from_info(info)
    full = predict_logits(model, bundle.test.images, inputs, 64)  # (N, K, H, W): small enough here
    labels = bundle.test.labels.long()
    stored = info["test_metrics"]
    one_shot = evaluate(full.double().softmax(1), labels, ignore_index=255)
    t = stored["temperature"]
    after = evaluate((full.double() / t).softmax(1), labels, ignore_index=255)
    for key in ("acc", "ece", "cece", "mce", "o_ece", "u_ece", "nll", "brier", "miou"):
        assert math.isclose(stored["before"][key], one_shot[key], rel_tol=1e-4, abs_tol=1e-6), key
        assert math.isclose(stored["after"][key], after[key], rel_tol=1e-4, abs_tol=1e-6), key
    assert abs(stored["before"]["aece"] - one_shot["aece"]) < 5e-3  # fixed-histogram AECE
    assert stored["n_test_pixels"] == int((labels != 255).sum())
    # T was fitted on the stored validation pixel sample, by NLL
    logits = load_logits(run_dir)
    fit = TemperatureScaling().fit(logits["val_logits"], logits["val_labels"]).temperature_
    assert math.isclose(fit, t, rel_tol=1e-9)
    # the stored test sample holds the logits of the drawn pixels, image by image
    pos = _positions(bundle.test, 255)
    k = full.shape[1]
    want_rows, want_lab, want_img = [], [], []
    for i in range(len(bundle.test)):
        p = pos[i][pos[i] >= 0]
        want_rows.append(full[i].reshape(k, -1)[:, p].T)
        want_lab.append(labels[i].reshape(-1)[p])
        want_img.append(torch.full((len(p),), i))
    torch.testing.assert_close(logits["test_logits"], torch.cat(want_rows), rtol=1e-5, atol=1e-5)
    assert torch.equal(logits["test_labels"], torch.cat(want_lab))
    assert torch.equal(logits["test_image"], torch.cat(want_img))


@pytest.mark.slow
def test_seg_report_eval_and_plot(smoke, tmp_path):
    from calibkit.cli import main
    from calibkit.commands.eval import evaluate_run

    text = (smoke["out"] / "report" / "report.md").read_text()
    headers = [line for line in text.splitlines() if line.startswith("| Method")]
    assert len(headers) >= 2 and all("mIoU" in h for h in headers[:2])
    assert "AUROC" not in headers[1] and "Shift" not in headers[1]  # no OOD/shift for segmentation
    run_dir = smoke["out"] / "runs" / "seg-smoke" / "ce" / "seed0"
    res = evaluate_run(run_dir)
    assert res["unit"] == "pixels" and "miou" in res["before"]
    other = evaluate_run(run_dir, n_bins=10)  # not the trainer's settings: streams the test images again
    assert other["before"]["acc"] == pytest.approx(res["before"]["acc"], rel=1e-9)
    assert other["before"]["miou"] == pytest.approx(res["before"]["miou"], rel=1e-9)
    assert main(["plot", str(run_dir), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "reliability.png").is_file() and (tmp_path / "reliability_ts.png").is_file()
