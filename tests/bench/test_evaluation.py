"""What the bench measures on one finished run, on tiny hand-made run directories.

Segmentation runs: the pixel metrics before/after temperature scaling are checked against the
one-shot metrics of the full test logits; the trainer's recorded test metrics are taken only
when they were computed with the bench's settings. Classification runs: a given input
normalisation and batch size reach the forward passes, presets without severities record no
robustness, and the OOD and corrupted sets are copied once per device and read from ``data_dir``.
"""

import math
from types import SimpleNamespace

import pytest
import torch

from calibkit import rundir
from calibkit.bench import evaluation
from calibkit.bench.evaluation import EvalData, evaluate_run
from calibkit.config import TrainConfig
from calibkit.data import Split

pytestmark = pytest.mark.usefixtures("one_thread")

K = 3
VOID = 255
PANEL_KEYS = ("acc", "ece", "cece", "mce", "o_ece", "u_ece", "nll", "brier", "miou")


def _seeded(build, seed):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return build().eval()


def _write_run(run_dir, model, info, logits):
    run_dir.mkdir(parents=True)
    rundir.write_json(run_dir / rundir.CONFIG, info)
    rundir.write_tensors(run_dir / rundir.MODEL, {k: v.contiguous() for k, v in model.state_dict().items()})
    rundir.write_tensors(run_dir / rundir.LOGITS, logits)
    return run_dir


# ---------------------------------------------------------------- segmentation runs


def _unet(seed):
    from calibkit.models import unet

    return _seeded(lambda: unet(num_classes=K, in_channels=1), seed)


def _seg_run(tmp_path, test_metrics=None, name="seg"):
    """A finished segmentation run (U-Net, 6 test images 16x16 with void pixels) and its EvalData."""
    gen = torch.Generator().manual_seed(3)
    images = torch.randint(0, 256, (6, 1, 16, 16), dtype=torch.uint8, generator=gen)
    masks = torch.randint(0, K, (6, 16, 16), generator=gen).to(torch.uint8)
    masks[torch.rand(6, 16, 16, generator=gen) < 0.2] = VOID
    model = _unet(0)
    info = {"config": TrainConfig(data="scenes", model="unet").to_dict(), "status": "done", "num_classes": K,
            "in_channels": 1, "mean": [0.45], "std": [0.2], "modality": "segmentation", "ignore_index": VOID}
    if test_metrics is not None:
        info["test_metrics"] = test_metrics
    val_labels = torch.randint(0, K, (90,), generator=gen)
    val_logits = torch.randn(90, K, generator=gen) * 3
    val_logits[torch.arange(90), val_labels] += 2.0
    keep = masks.reshape(-1) != VOID
    logits = {"val_logits": val_logits, "val_labels": val_labels,
              "test_logits": torch.randn(int(keep.sum()), K, generator=gen),
              "test_labels": masks.reshape(-1)[keep].long()}
    run = _write_run(tmp_path / name, model, info, logits)
    # severities and an OOD set in the preset: a segmentation run still measures neither
    preset = SimpleNamespace(robust_n=4, severities=[1], dataset="scenes", ood="noise")
    bundle = SimpleNamespace(modality="segmentation", test=Split(images, masks), name="scenes")
    return run, EvalData(preset, bundle), info


def _one_shot(model, pipe, split, val_logits, val_labels):
    """Independent expectation: every test pixel's logits at once, then ``metrics.evaluate``."""
    from calibkit.calibrators import TemperatureScaling
    from calibkit.metrics import evaluate

    with torch.no_grad():
        full = model.eval()(pipe.eval_batch(split.images)).double()
    labels = split.labels.long()
    t = float(TemperatureScaling().fit(val_logits, val_labels).temperature_)
    return {"temperature": t, "before": evaluate(full.softmax(1), labels, ignore_index=VOID),
            "after": evaluate((full / t).softmax(1), labels, ignore_index=VOID),
            "test_pixels": int((labels != VOID).sum())}


def test_evaluate_dense_fits_the_temperature_by_the_objective_it_is_given():
    from calibkit.calibrators import TemperatureScaling
    from calibkit.data.inputs import SegmentationInputs
    from calibkit.metrics import evaluate
    from calibkit.train.dense import evaluate_dense

    gen = torch.Generator().manual_seed(8)
    images = torch.randint(0, 256, (3, 1, 16, 16), dtype=torch.uint8, generator=gen)
    masks = torch.randint(0, K, (3, 16, 16), generator=gen).to(torch.uint8)
    masks[:, :3] = VOID
    val_labels = torch.randint(0, K, (120,), generator=gen)
    val_logits = torch.randn(120, K, generator=gen) * 4
    val_logits[torch.arange(120), val_labels] += 1.0
    model, pipe = _unet(1), SegmentationInputs([0.45], [0.2])
    with torch.no_grad():
        full = model(pipe.eval_batch(images)).double()
    labels = masks.long()
    for objective in ("ece", "nll"):
        t = float(TemperatureScaling(objective=objective, n_bins=10).fit(val_logits, val_labels).temperature_)
        res = evaluate_dense(model, Split(images, masks), pipe, val_logits, val_labels, n_bins=10,
                             objective=objective, batch_size=2)
        assert res["temperature"] == pytest.approx(t, rel=1e-12), objective
        want = evaluate((full / t).softmax(1), labels, n_bins=10, ignore_index=VOID)
        for key in ("ece", "nll", "acc"):
            assert res["after"][key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), (objective, key)
    t_nll = float(TemperatureScaling().fit(val_logits, val_labels).temperature_)
    t_ece = float(TemperatureScaling(objective="ece", n_bins=10).fit(val_logits, val_labels).temperature_)
    assert abs(t_ece - t_nll) > 0.05 * t_nll  # the two objectives pick different temperatures here


def _check_dense(out, want, run, n_val):
    assert set(out) == {"metrics", "ood", "robustness", "eval_time_s", "logits_path"}
    assert out["ood"] is None and out["robustness"] is None
    assert out["logits_path"] == str(run / rundir.LOGITS) and 0 <= out["eval_time_s"] < 600
    m = out["metrics"]
    assert set(m) == {"before", "after", "temperature", "test_pixels", "val_pixels"}
    assert m["test_pixels"] == want["test_pixels"] and m["val_pixels"] == n_val
    assert math.isclose(m["temperature"], want["temperature"], rel_tol=1e-9)
    for panel in ("before", "after"):
        assert all(type(v) is float for v in m[panel].values())
        for key in PANEL_KEYS:
            assert math.isclose(m[panel][key], want[panel][key], rel_tol=1e-4, abs_tol=1e-6), (panel, key)


def _count_streams(monkeypatch):
    import calibkit.train.dense as dense

    calls, real = [], dense.evaluate_dense
    monkeypatch.setattr(dense, "evaluate_dense", lambda *a, **k: calls.append(k) or real(*a, **k))
    return calls


def test_segmentation_run_streams_every_test_pixel(tmp_path, monkeypatch):
    from calibkit.data.inputs import SegmentationInputs

    run, data, info = _seg_run(tmp_path)
    calls = _count_streams(monkeypatch)
    out = evaluate_run(run, data)  # the model and its normalisation rebuilt from the run directory
    logits = rundir.load_logits(run)
    pipe = SegmentationInputs(info["mean"], info["std"])
    want = _one_shot(_unet(0), pipe, data.bundle.test, logits["val_logits"], logits["val_labels"])
    assert len(calls) == 1 and calls[0]["device"] == "cpu"
    _check_dense(out, want, run, 90)
    assert out["metrics"]["after"]["nll"] < out["metrics"]["before"]["nll"]  # T was fitted: not 1


def test_segmentation_run_with_a_given_model_and_pipeline(tmp_path):
    from calibkit.data.inputs import SegmentationInputs

    run, data, _ = _seg_run(tmp_path)
    model, pipe = _unet(1), SegmentationInputs([0.6], [0.3])  # not the run's own weights nor statistics
    out = evaluate_run(run, data, model=model, norm=pipe)
    logits = rundir.load_logits(run)
    want = _one_shot(_unet(1), pipe, data.bundle.test, logits["val_logits"], logits["val_labels"])
    _check_dense(out, want, run, 90)
    own = _one_shot(_unet(0), pipe, data.bundle.test, logits["val_logits"], logits["val_labels"])
    assert abs(own["before"]["nll"] - want["before"]["nll"]) > 1e-3  # the weights tell


def test_segmentation_run_with_a_given_pipeline_only(tmp_path):
    from calibkit.data.inputs import SegmentationInputs

    run, data, info = _seg_run(tmp_path)
    pipe = SegmentationInputs([0.1], [0.5])
    out = evaluate_run(run, data, norm=pipe)  # the run's weights, the caller's normalisation
    logits = rundir.load_logits(run)
    want = _one_shot(_unet(0), pipe, data.bundle.test, logits["val_logits"], logits["val_labels"])
    _check_dense(out, want, run, 90)
    own = _one_shot(_unet(0), SegmentationInputs(info["mean"], info["std"]), data.bundle.test,
                    logits["val_logits"], logits["val_labels"])
    assert abs(own["before"]["nll"] - want["before"]["nll"]) > 1e-3  # the normalisation tells


def _recorded(want, objective="nll", n_bins=15):
    """A trainer's record of the test metrics (values shifted so that a recomputation would show)."""
    return {"temperature": want["temperature"] * 1.5, "ts_objective": objective, "n_bins": n_bins,
            "before": {k: v + 0.25 for k, v in want["before"].items()},
            "after": {k: v + 0.5 for k, v in want["after"].items()}, "n_test_pixels": want["test_pixels"] + 7}


def test_segmentation_run_takes_the_trainers_metrics_when_computed_alike(tmp_path, monkeypatch):
    from calibkit.data.inputs import SegmentationInputs

    run, data, info = _seg_run(tmp_path, name="plain")
    logits = rundir.load_logits(run)
    want = _one_shot(_unet(0), SegmentationInputs(info["mean"], info["std"]), data.bundle.test,
                     logits["val_logits"], logits["val_labels"])
    rec = _recorded(want)
    run, data, _ = _seg_run(tmp_path, test_metrics=rec)
    calls = _count_streams(monkeypatch)
    out = evaluate_run(run, data)
    assert not calls  # nothing streamed: the record is the trainer's pass over every test pixel
    m = out["metrics"]
    assert m == {"before": rec["before"], "after": rec["after"], "temperature": rec["temperature"],
                 "test_pixels": rec["n_test_pixels"], "val_pixels": 90}
    assert out["ood"] is None and out["robustness"] is None and out["logits_path"] == str(run / rundir.LOGITS)


@pytest.mark.parametrize("objective, n_bins", [("ece", 15), ("nll", 10), ("nll", None)])
def test_segmentation_run_recomputes_a_record_made_otherwise(tmp_path, monkeypatch, objective, n_bins):
    from calibkit.data.inputs import SegmentationInputs

    run, data, info = _seg_run(tmp_path, name="plain")
    logits = rundir.load_logits(run)
    want = _one_shot(_unet(0), SegmentationInputs(info["mean"], info["std"]), data.bundle.test,
                     logits["val_logits"], logits["val_labels"])
    rec = _recorded(want, objective, n_bins)
    if n_bins is None:
        del rec["n_bins"]
    run, data, info = _seg_run(tmp_path, test_metrics=rec)
    calls = _count_streams(monkeypatch)
    out = evaluate_run(run, data, norm=info)  # the config dict as the normalisation, as the bench passes it
    assert len(calls) == 1
    _check_dense(out, want, run, 90)


# ---------------------------------------------------------------- classification runs


class Recorder(torch.nn.Module):
    """A classifier that records the batch sizes of its forward passes."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.batches = inner, []

    def forward(self, x):
        self.batches.append(len(x))
        return self.inner(x)


def _mlp(seed):
    from calibkit.models import mlp

    return _seeded(lambda: mlp(num_classes=K, in_channels=1), seed)


def _cls_run(tmp_path, severities=(1,)):
    """A finished classifier run (MLP, 12 test images 28x28) and its EvalData (noise OOD set)."""
    gen = torch.Generator().manual_seed(4)
    images = torch.randint(0, 256, (12, 1, 28, 28), dtype=torch.uint8, generator=gen)
    labels = torch.arange(12) % K
    model = _mlp(0)
    info = {"config": TrainConfig(data="digits", model="mlp").to_dict(), "status": "done", "num_classes": K,
            "in_channels": 1, "mean": [0.5], "std": [0.25], "modality": "image"}
    val_labels = torch.arange(40) % K
    val_logits = torch.randn(40, K, generator=gen) * 2
    val_logits[torch.arange(40), val_labels] += 1.5
    logits = {"val_logits": val_logits, "val_labels": val_labels,
              "test_logits": rundir.predict_logits(model, images, info, 64, "cpu"), "test_labels": labels}
    run = _write_run(tmp_path / "cls", model, info, logits)
    preset = SimpleNamespace(robust_n=4, severities=list(severities), dataset="toy", ood="noise")
    bundle = SimpleNamespace(test=Split(images, labels), in_channels=1, image_size=(28, 28), name="toy")
    return run, EvalData(preset, bundle), info


def test_a_given_normalisation_replaces_the_runs_own(tmp_path):
    from calibkit.bench.evaluation import ood_metrics, robustness_metrics

    run, data, info = _cls_run(tmp_path)
    norm = ([0.2], [0.6])
    out = evaluate_run(run, data, norm=norm)  # the model rebuilt from the run, the caller's normalisation
    test_logits = rundir.load_logits(run)["test_logits"]
    model = _mlp(0)
    given = lambda x: rundir.predict_logits(model, x, norm, 64, "cpu")  # noqa: E731
    own = lambda x: rundir.predict_logits(model, x, info, 64, "cpu")  # noqa: E731
    assert out["ood"] == pytest.approx(ood_metrics(test_logits, given(data.ood_images()), "noise"), abs=1e-9)
    labels = data.bundle.test.labels[data.robust_index()]
    t = out["metrics"]["temperature"]
    want = robustness_metrics(given, data.corrupted(), labels, t)
    assert out["robustness"]["overall"] == pytest.approx(want["overall"], abs=1e-9)
    other = robustness_metrics(own, data.corrupted(), labels, t)
    assert abs(other["overall"]["ece"] - want["overall"]["ece"]) > 1e-6  # the normalisation tells


def test_the_batch_size_bounds_every_forward_pass(tmp_path):
    run, data, info = _cls_run(tmp_path)
    model = Recorder(_mlp(0))
    evaluate_run(run, data, model=model, norm=info, batch_size=7)
    n_ood, n_corrupted = len(data.ood_images()), sum(len(v) for v in data.corrupted().values())
    assert max(model.batches) == 7 and sum(model.batches) == n_ood + n_corrupted


def test_presets_without_severities_record_no_robustness(tmp_path, monkeypatch):
    run, data, info = _cls_run(tmp_path, severities=())
    built = []
    monkeypatch.setattr("calibkit.data.corruptions.corrupt", lambda *a, **k: built.append(a) or a[0])
    out = evaluate_run(run, data, model=_mlp(0), norm=info)
    assert out["robustness"] is None and not built and out["ood"]["n_out"] == len(data.ood_images())


def test_the_corrupted_sets_reach_robustness_through_the_bench_wide_copy(tmp_path, monkeypatch):
    run, data, info = _cls_run(tmp_path)
    seen, real = [], evaluation.robustness_metrics
    monkeypatch.setattr(evaluation, "robustness_metrics", lambda p, c, *a: seen.append(c) or real(p, c, *a))
    evaluate_run(run, data, model=_mlp(0), norm=info)
    evaluate_run(run, data, model=_mlp(0), norm=info)  # a second run of the same bench
    # one copy per device for the whole bench, shared with every other reader of that device's set
    assert len(seen) == 2 and seen[0] is seen[1] is data.on("corrupted", "cpu")
    assert set(seen[0]) == set(data.corrupted())


def test_eval_sets_are_moved_to_each_device_asked_for():
    # the meta device stands in for an accelerator: tensors move there without data
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (6, 1, 8, 8), dtype=torch.uint8, generator=gen)
    bundle = SimpleNamespace(test=Split(images, torch.arange(6) % K), in_channels=1, image_size=(8, 8), name="toy")
    data = EvalData(SimpleNamespace(robust_n=3, severities=[2], dataset="toy", ood="noise"), bundle)
    cpu_ood, cpu_cor = data.on("ood", "cpu"), data.on("corrupted", "cpu")
    assert torch.equal(cpu_ood, data.ood_images()) and cpu_ood.device.type == "cpu"
    meta_ood, meta_cor = data.on("ood", "meta"), data.on("corrupted", "meta")
    assert meta_ood.is_meta and meta_ood.shape == cpu_ood.shape
    assert set(meta_cor) == set(cpu_cor) and all(v.is_meta for v in meta_cor.values())
    assert all(v.device.type == "cpu" for v in cpu_cor.values())
    assert data.on("ood", "meta") is meta_ood and data.on("corrupted", torch.device("cpu")) is cpu_cor


def test_an_ood_set_on_disk_is_read_from_data_dir(tmp_path):
    from tests.helpers.formats import fake_fmnist
    arrays = fake_fmnist(str(tmp_path), n_train=20, n_test=5)
    bundle = SimpleNamespace(test=Split(torch.zeros(2, 1, 28, 28, dtype=torch.uint8), torch.arange(2)),
                             in_channels=1, image_size=(28, 28), name="toy")
    preset = SimpleNamespace(robust_n=2, severities=[1], dataset="toy", ood="fmnist")
    ood = EvalData(preset, bundle, data_dir=str(tmp_path)).ood_images()
    want = torch.from_numpy(arrays["test_images"]).to(torch.uint8).unsqueeze(1)  # same size: no resizing
    assert torch.equal(ood, want)


def test_the_robustness_subset_is_the_documented_seed_0_draw():
    # The corrupted-set cache is keyed by data set, size and severities only, so the draw itself must
    # stay as documented (the first n of a seed-0 permutation of the test set, sorted) for cached
    # sets of earlier benches to keep matching their labels.
    images = torch.zeros(20, 1, 2, 2, dtype=torch.uint8)
    bundle = SimpleNamespace(test=Split(images, torch.arange(20) % K))
    data = EvalData(SimpleNamespace(robust_n=6, severities=[1], dataset="toy", ood="noise"), bundle)
    perm = torch.randperm(20, generator=torch.Generator().manual_seed(0))
    assert data.robust_index().tolist() == sorted(perm[:6].tolist())


class FrozenProbe(torch.nn.Module):
    """A classifier without parameters: a fixed linear map kept as a buffer (it still moves with ``.to``)."""

    def __init__(self, weight):
        super().__init__()
        self.register_buffer("weight", weight)

    def forward(self, x):
        return x.flatten(1) @ self.weight


def test_a_classifier_without_parameters_is_evaluated_on_the_given_device(tmp_path):
    from calibkit.bench.evaluation import ood_metrics, robustness_metrics

    run, data, info = _cls_run(tmp_path)
    weight = torch.randn(28 * 28, K, generator=torch.Generator().manual_seed(6)) / 28
    out = evaluate_run(run, data, model=FrozenProbe(weight), norm=info, device="cpu")

    def by_hand(images):  # the normalised images times the fixed map
        return ((images.float() / 255 - 0.5) / 0.25).flatten(1) @ weight

    test_logits = rundir.load_logits(run)["test_logits"]
    assert out["ood"] == pytest.approx(ood_metrics(test_logits, by_hand(data.ood_images()), "noise"), abs=1e-6)
    want = robustness_metrics(by_hand, data.corrupted(), data.bundle.test.labels[data.robust_index()],
                              out["metrics"]["temperature"])
    assert out["robustness"]["overall"] == pytest.approx(want["overall"], abs=1e-6)
