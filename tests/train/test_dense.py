"""Segmentation pieces of the trainer, data and report: input pipeline, pixel samples, accounting,
checkpoint policy, nested scene subsets and the image-level bootstrap."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from calibkit.data.inputs import INPUTS, SegmentationInputs
from tests.helpers.formats import fake_fmnist


def test_segmentation_inputs_move_masks_and_pad_void(gen):
    x = torch.randint(0, 256, (5, 1, 12, 12), dtype=torch.uint8, generator=gen)
    y = torch.randint(0, 4, (5, 12, 12), dtype=torch.uint8, generator=gen)
    pipe = SegmentationInputs([0.5], [0.25], crop_pad=3, hflip=True)
    assert INPUTS["segmentation"] is SegmentationInputs and pipe.dense
    xs, ys = pipe.train_batch(x, y, torch.Generator().manual_seed(1))
    assert xs.shape == (5, 1, 12, 12) and xs.dtype == torch.float32 and ys.shape == (5, 12, 12)
    assert (ys == 255).any() and set(torch.unique(ys).tolist()) <= {0, 1, 2, 3, 255}
    # evaluation: normalisation only, targets untouched
    torch.testing.assert_close(pipe.eval_batch(x), (x.float() / 255 - 0.5) / 0.25)
    info_pipe = SegmentationInputs.from_info({"mean": [0.5], "std": [0.25], "ignore_index": 7})
    assert info_pipe.ignore_index == 7 and info_pipe.crop_pad == 0 and not info_pipe.hflip


def test_image_level_methods_are_refused_for_segmentation():
    from calibkit.config import TrainConfig
    from calibkit.losses import build
    from calibkit.train.steps import build_step

    pipe = SegmentationInputs([0.5], [0.25])
    for method in ("mixup", "regmixup", "csm"):
        cfg = TrainConfig(method=method, loss="ce")
        with pytest.raises(ValueError, match="segmentation trains with method 'standard'"):
            build_step(cfg, build("ce"), 3, pipe, 0)


def test_training_accuracy_counts_labelled_pixels():
    from calibkit.train.steps import EpochSums

    sums = EpochSums(2, "cpu")
    logits = torch.zeros(2, 3, 2, 2)
    logits[:, 1] = 1.0  # predicts class 1 everywhere
    target = torch.tensor([[[1, 255], [0, 1]], [[255, 255], [1, 2]]])
    sums.add(0, torch.tensor(0.5), logits, target)
    loss_sum, correct, seen, first_bad, _ = sums.read()
    assert seen == 5 and correct == 3 and first_bad == -1  # 5 labelled pixels, 3 of them class 1
    assert loss_sum == pytest.approx(0.5 * 5)
    sums.add(1, torch.tensor(0.25), logits[:1], target[:1])  # 3 labelled pixels, 2 of class 1
    loss_sum, correct, seen, _, _ = sums.read()
    assert (seen, correct) == (8, 5) and loss_sum == pytest.approx(0.5 * 5 + 0.25 * 3)


def test_keep_best_miou():
    from calibkit.train.keep import Keeper

    k = Keeper("best-miou")
    assert [k.offer(e, {"val_miou": v}) for e, v in enumerate([0.2, 0.5, 0.4], start=1)] == [True, True, False]
    assert k.epoch == 2


def test_sample_positions_are_labelled_sorted_and_fixed(gen):
    from calibkit.train.dense import sample_positions

    masks = torch.randint(0, 3, (4, 6, 7), generator=gen)
    masks[masks == 2] = 255
    masks[3] = 255  # an image without labelled pixels
    pos = sample_positions(masks, 10, 255)
    assert pos.shape == (4, 10) and torch.equal(pos, sample_positions(masks, 10, 255))
    for i in range(4):
        p = pos[i][pos[i] >= 0]
        labelled = (masks[i].reshape(-1) != 255).sum().item()
        assert len(p) == min(10, labelled) and (masks[i].reshape(-1)[p] != 255).all()
        assert (p.diff() > 0).all() and (pos[i][len(p):] == -1).all()
    every = sample_positions(masks, 100, 255)  # more than there are: every labelled pixel once
    assert sorted(every[0][every[0] >= 0].tolist()) == torch.nonzero(masks[0].reshape(-1) != 255).squeeze(1).tolist()


def test_scene_subsets_are_nested(tmp_path):
    from calibkit.data import load

    fake_fmnist(str(tmp_path), n_train=60, n_test=12)
    small = load("scenes", data_dir=str(tmp_path), seed=2, val_size=4, train_subset=5)
    large = load("scenes", data_dir=str(tmp_path), seed=2, val_size=4, train_subset=9)
    assert (torch.equal(small.train.images, large.train.images[:5])
            and torch.equal(small.train.labels, large.train.labels[:5]))
    assert torch.equal(small.val.labels, large.val.labels) and small.split["train_subset"] == 5
    with pytest.raises(ValueError, match="train_subset"):
        load("scenes", data_dir=str(tmp_path), train_subset=4001)


def test_grouped_bootstrap_estimate_and_pairing(gen):
    from calibkit.functional import ece
    from calibkit.grouped_bootstrap import paired_grouped_ece_diff

    n, k = 600, 4
    pa = torch.softmax(torch.randn(n, k, generator=gen, dtype=torch.float64) * 3, 1)
    pb = torch.softmax(torch.randn(n, k, generator=gen, dtype=torch.float64), 1)
    labels = torch.randint(0, k, (n,), generator=gen)
    groups = torch.arange(n) // 20  # 30 images of 20 pixels
    res = paired_grouped_ece_diff(pa, pb, labels, groups, n_resamples=200, seed=3)
    assert res["groups"] == 30 and res["samples"].shape == (200,)
    assert res["estimate"] == pytest.approx(float(ece(pa, labels) - ece(pb, labels)), abs=1e-12)
    same = paired_grouped_ece_diff(pa, pa, labels, groups, n_resamples=50)
    assert same["estimate"] == 0 and (same["samples"] == 0).all()
    # a resample is a multiset of whole images: with every image drawn once it is the full estimate,
    # so re-deriving one resample by hand from its image counts gives the reported value
    rng = np.random.default_rng(3)
    counts = np.bincount(rng.integers(0, 30, size=30), minlength=30)
    w = torch.from_numpy(counts[groups.numpy()]).double()
    idx = torch.repeat_interleave(torch.arange(n), w.long())
    by_hand = float(ece(pa[idx], labels[idx]) - ece(pb[idx], labels[idx]))
    assert float(res["samples"][0]) == pytest.approx(by_hand, abs=1e-12)


def test_model_and_data_must_both_be_dense_or_not(tmp_path):
    from calibkit.config import TrainConfig
    from calibkit.train import train

    (tmp_path / "f").mkdir()
    fake_fmnist(str(tmp_path / "f"), n_train=60, n_test=12)
    with pytest.raises(ValueError, match="segmentation data needs a dense model"):
        train(TrainConfig(data="scenes", data_dir=str(tmp_path / "f"), model="resnet8", epochs=1, batch_size=4,
                          train_subset=8, val_size=4, device="cpu"), tmp_path / "a", progress=False, verbose=False)
    with pytest.raises(ValueError, match="needs a classifier"):
        train(TrainConfig(data="digits", model="unet", epochs=1, batch_size=8, device="cpu"), tmp_path / "b",
              progress=False, verbose=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # nothing written


# ------------------------------------------------------------- the trainer's dense hooks, by hand

K_SEG, VOID = 3, 255


class _PixelModel(torch.nn.Module):
    """A 1x1 convolution (every pixel's logits from its own value) that records its batches."""

    def __init__(self, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.conv = torch.nn.Conv2d(1, K_SEG, 1)
        with torch.no_grad():
            self.conv.weight.copy_(torch.randn(K_SEG, 1, 1, 1, generator=g) * 3)
            self.conv.bias.copy_(torch.randn(K_SEG, generator=g))
        self.batches = []

    def forward(self, x):
        self.batches.append(len(x))
        return self.conv(x)


def _scenes(seed, n, side=6):
    """Images and masks that agree with ``_PixelModel(0)`` on ~80% of pixels (so that bins differ in
    the sign of their gap), ~20% void."""
    from calibkit.data import Split

    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 1, side, side), dtype=torch.uint8, generator=g)
    with torch.no_grad():
        pred = _PixelModel(0)(SegmentationInputs([0.5], [0.25]).eval_batch(images)).argmax(1)
    masks = torch.where(torch.rand(n, side, side, generator=g) < 0.8, pred,
                        torch.randint(0, K_SEG, (n, side, side), generator=g)).to(torch.uint8)
    masks[torch.rand(n, side, side, generator=g) < 0.2] = VOID
    return Split(images, masks)


def _all_pixels(model, split):
    """Independent expectation: every pixel's logits at once, and the labelled ones in image order."""
    with torch.no_grad():
        full = model(SegmentationInputs([0.5], [0.25]).eval_batch(split.images)).double()
    labels = split.labels.long()
    keep = labels != VOID
    rows = full.permute(0, 2, 3, 1)[keep]  # (P, K): image by image, row-major positions
    image = torch.arange(len(labels))[:, None, None].expand_as(labels)[keep]
    return full, labels, rows, labels[keep], image


def _fake_run(model, val, test, **kw):
    from calibkit import distributed as D
    from calibkit.config import TrainConfig

    base = dict(model=model, loss_fn=torch.nn.Module(), inputs=SegmentationInputs([0.5], [0.25]),
                bundle=SimpleNamespace(val=val, test=test, num_classes=K_SEG), dd=D.Dist(),
                cfg=TrainConfig(data="scenes", model="unet", epochs=3, keep="best-miou", eval_batch_size=2))
    base.update(kw)
    return SimpleNamespace(**base)


def _evaluator():
    from calibkit.train.dense import DenseEvaluator

    return DenseEvaluator(SegmentationInputs([0.5], [0.25]))


class _Updating(torch.nn.Module):  # AdaFocal's interface: updated on the validation pixel sample
    def __init__(self):
        super().__init__()
        self.updates = []

    def update(self, logits, labels):
        self.updates.append((logits, labels))


def test_sample_positions_without_a_void_label_draw_from_every_pixel(gen):
    from calibkit.train.dense import sample_positions

    masks = torch.full((2, 3, 4), 255)  # 255 is an ordinary label when there is no void
    pos = sample_positions(masks, 5, None)
    assert pos.dtype == torch.int64 and pos.shape == (2, 5) and (pos >= 0).all()
    assert sample_positions(masks, 12, None).tolist() == [list(range(12))] * 2
    assert (sample_positions(masks, 5, 255) == -1).all()


def test_validate_dense_records_every_labelled_pixel_and_updates_on_the_sample():
    from calibkit.metrics import evaluate

    val = _scenes(1, 5)
    model = _PixelModel(0).train()
    full, labels, rows, lab, _ = _all_pixels(model, val)
    want = evaluate(full.softmax(1), labels, ignore_index=VOID)
    model.train().batches.clear()
    plain, plain_eval = _fake_run(model, val, None), _evaluator()
    plain.loss_fn.train()
    record = plain_eval.validate(plain)
    assert set(record) == {"val_loss", "val_acc", "val_ece", "val_miou"}
    for key, name in (("val_loss", "nll"), ("val_acc", "acc"), ("val_ece", "ece"), ("val_miou", "miou")):
        assert record[key] == pytest.approx(want[name], rel=1e-4, abs=1e-6), key
    assert not model.training and not plain.loss_fn.training
    assert model.batches == [2, 2, 1]  # eval_batch_size images per pass
    assert plain_eval.val_positions is None  # no sample drawn for a loss that is not updated
    run, evaluator = _fake_run(model, val, None, loss_fn=_Updating()), _evaluator()
    assert evaluator.validate(run) == record
    (got, got_lab), = run.loss_fn.updates
    torch.testing.assert_close(got.double(), rows, rtol=1e-5, atol=1e-5)
    assert torch.equal(got_lab, lab)
    first = evaluator.val_positions
    evaluator.validate(run)
    assert evaluator.val_positions is first and len(run.loss_fn.updates) == 2  # drawn once, reused


def test_validate_dense_streams_on_the_process_device_and_updates_there(monkeypatch):
    from calibkit import distributed as D
    from calibkit.train import dense

    val = _scenes(1, 5)
    model = _PixelModel(0)
    drawn, calls = [], []
    real_sample, real_stream = dense.sample_positions, dense.stream
    monkeypatch.setattr(dense, "sample_positions", lambda *a: drawn.append(a[1:]) or real_sample(*a))
    result = real_stream(model, val, SegmentationInputs([0.5], [0.25]), 2, "cpu", positions=dense._positions(val, VOID),
                         num_classes=K_SEG)
    drawn.clear()
    monkeypatch.setattr(dense, "stream", lambda *a, **kw: calls.append((a, kw)) or result)
    # a stand-in for the process's accelerator: the streamed pass (faked) and AdaFocal's update go there
    dd = D.Dist(device=torch.device("meta"))
    run, evaluator = _fake_run(model, val, None, loss_fn=_Updating(), dd=dd), _evaluator()
    evaluator.validate(run)
    assert drawn == [(40_000, VOID)]  # ceil(200,000 / 5) per image, void excluded
    (args, kw), = calls
    assert args[3:] == (2, torch.device("meta"), dd) and kw["num_classes"] == K_SEG
    assert kw["positions"] is evaluator.val_positions and args[2] is evaluator.inputs
    (got, got_lab), = run.loss_fn.updates
    assert got.device.type == "meta" and got_lab.device.type == "meta"


def test_positions_spread_the_pixel_budget_over_the_images():
    from calibkit.data import Split
    from calibkit.train import dense

    masks = torch.zeros(5, 2, 3, dtype=torch.uint8)
    masks[:, 0, :] = VOID
    five = Split(torch.zeros(5, 1, 2, 3), masks)
    assert dense._positions(five, VOID, total=12).shape == (5, 3)  # ceil(12 / 5)
    assert dense._positions(five, VOID, total=3).shape == (5, 1)  # at least one per image
    pos = dense._positions(Split(torch.zeros(1, 1, 2, 3), masks[:1]), VOID, total=3)
    assert pos.tolist() == [[3, 4, 5]]  # one image takes the whole budget, labelled pixels only


def test_finish_dense_stores_the_kept_weights_samples_and_all_pixel_metrics(tmp_path, monkeypatch):
    from calibkit import rundir
    from calibkit.calibrators import TemperatureScaling
    from calibkit.metrics import evaluate
    from calibkit.train import dense

    val, test = _scenes(1, 4), _scenes(2, 5)
    kept = _PixelModel(0)
    run = _fake_run(_PixelModel(7), val, test, kept=kept.state_dict(), keeper=SimpleNamespace(epoch=2),
                    kept_record={"val_acc": 0.4, "val_miou": 0.3}, elapsed=12.3)
    lines, drawn, calls = [], [], []
    real_sample, real_stream = dense.sample_positions, dense.stream
    monkeypatch.setattr(dense, "sample_positions", lambda *a: drawn.append(a[1:]) or real_sample(*a))
    monkeypatch.setattr(dense, "stream", lambda *a, **kw: calls.append(a[3:]) or real_stream(*a, **kw))
    summary = _evaluator().finish(run, tmp_path, {"config": "cfg"}, lines.append)
    assert drawn == [(50_000, VOID), (40_000, VOID)]  # val (4 images), test (5)
    assert calls == [(2, run.dd.device, run.dd)] * 2
    _, _, vrows, vlab, vimg = _all_pixels(kept, val)
    full, labels, trows, tlab, timg = _all_pixels(kept, test)
    t = float(TemperatureScaling().fit(vrows.float(), vlab).temperature_)
    before = evaluate(full.softmax(1), labels, ignore_index=VOID)
    after = evaluate((full / t).softmax(1), labels, ignore_index=VOID)
    info = rundir.read_json(tmp_path / rundir.CONFIG)
    assert summary == {k: info.get(k) for k in ("status", "epochs_done", "best_epoch", "best_val_acc", "test_acc",
                                                "test_ece", "wall_time_s")}
    tm = info.pop("test_metrics")
    assert info == {"config": "cfg", "status": "done", "epochs_done": 3, "best_epoch": 2, "best_val_acc": 0.4,
                    "best_val_miou": 0.3, "test_acc": tm["before"]["acc"], "test_ece": tm["before"]["ece"],
                    "test_miou": tm["before"]["miou"], "wall_time_s": 12.3, "ignore_index": VOID,
                    "pixel_sample": {"pixels_per_split": 200_000, "seed": 0, "val": len(vlab), "test": len(tlab)}}
    assert {k: tm[k] for k in ("ts_objective", "n_bins", "n_test_pixels")} == {
        "ts_objective": "nll", "n_bins": 15, "n_test_pixels": len(tlab)}
    assert tm["temperature"] == pytest.approx(t, rel=1e-6) and abs(t - 1) > 0.05
    for key in ("acc", "ece", "nll", "miou", "brier"):
        assert tm["before"][key] == pytest.approx(before[key], rel=1e-4, abs=1e-6), key
        assert tm["after"][key] == pytest.approx(after[key], rel=1e-4, abs=1e-6), key
    stored = rundir.read_tensors(tmp_path / rundir.LOGITS)
    assert set(stored) == {"val_logits", "val_labels", "val_image", "test_logits", "test_labels", "test_image"}
    for split, (rows, lab, img) in (("val", (vrows, vlab, vimg)), ("test", (trows, tlab, timg))):
        torch.testing.assert_close(stored[f"{split}_logits"].double(), rows, rtol=1e-5, atol=1e-5)
        assert torch.equal(stored[f"{split}_labels"], lab) and torch.equal(stored[f"{split}_image"], img)
    b = tm["before"]
    assert lines == [f"done: kept epoch 2 (best-miou; val mIoU 30.00), test pixel acc {b['acc']:.2%}, "
                     f"mIoU {100 * b['miou']:.2f}, ECE {100 * b['ece']:.2f}, 12s -> {tmp_path}"]
    lines.clear()
    run.kept_record = {}  # no validation record kept: the line says 0
    _evaluator().finish(run, tmp_path, {}, lines.append)
    assert "(best-miou; val mIoU 0.00)" in lines[0]


def test_evaluate_dense_streams_with_its_bins_batch_device_and_process(monkeypatch):
    from calibkit import distributed as D
    from calibkit.train import dense

    test = _scenes(3, 5)
    model = _PixelModel(0)
    moved, calls = [], []
    real_to, real_stream = model.to, dense.stream
    monkeypatch.setattr(model, "to", lambda device: moved.append(device) or real_to(device))
    monkeypatch.setattr(dense, "stream", lambda *a, **kw: calls.append((a, kw)) or real_stream(*a, **kw))
    _, _, vrows, vlab, _ = _all_pixels(model, _scenes(1, 4))
    model.batches.clear()
    dd = D.Dist()
    res = dense.evaluate_dense(model, test, SegmentationInputs([0.5], [0.25]), vrows.float(), vlab, n_bins=10,
                               device="cpu", batch_size=2, dd=dd)
    assert moved == ["cpu"] and model.batches == [2, 2, 1]
    (args, kw), = calls
    assert args[3:6] == (2, torch.device("cpu"), dd)
    assert kw["num_classes"] == K_SEG and kw["n_bins"] == 10 and kw["temperatures"][0] == 1.0
    assert res["n_test_pixels"] == int((test.labels != VOID).sum())


def test_load_run_data_checks_the_recorded_validation_split(tmp_path):
    from calibkit.config import TrainConfig
    from calibkit.data import load
    from calibkit.train.dense import load_run_data

    fake_fmnist(str(tmp_path), n_train=60, n_test=12)
    cfg = TrainConfig(data="scenes", model="unet", data_dir=str(tmp_path), seed=2, val_size=4, train_subset=5)
    want = load("scenes", data_dir=str(tmp_path), seed=2, val_size=4, train_subset=5)
    for info in ({"split": dict(want.split)}, {}, {"split": None}, {"split": {"val_checksum": ""}}):
        got = load_run_data(info, cfg)
        assert got.split == want.split and torch.equal(got.val.labels, want.val.labels)
        assert torch.equal(got.train.images, want.train.images)
    with pytest.raises(ValueError) as err:
        load_run_data({"split": {"val_checksum": "abc"}}, cfg)
    assert str(err.value) == (f"the scenes validation split differs from the one this run was trained with "
                              f"(checksum {want.split['val_checksum']} != abc); the data files changed")
