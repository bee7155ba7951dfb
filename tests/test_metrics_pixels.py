"""The streaming accumulator on pixels (dense inputs): equal to the one-shot metrics on the
concatenated valid pixels, memory independent of the number of pixels, synchronised under DDP,
and the device path of the accumulator driven with CPU tensors."""

import os

import pytest
import torch
import torch.multiprocessing as mp

import calibkit.functional as F
import calibkit.functional.panel as P
from calibkit.metrics import PANEL, CalibrationAccumulator, evaluate
from tests.helpers.ports import free_port as _free_port

# the fine histogram merges nearby confidences into one tie block: AECE and the selective areas
# (a tie between a right and a wrong pixel is ranked as a random order) are approximations there
APPROX = ("aece", "aurc", "eaurc", "augrc")
EXACT = [k for k in PANEL if k not in APPROX] + ["miou"]


def _batches(seed, n_batches=5, k=4, h=6, w=8, void=0.25):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        n = int(torch.randint(1, 4, (1,), generator=g))
        logits = torch.randn(n, k, h, w, generator=g, dtype=torch.float64) * 3
        labels = torch.randint(0, k, (n, h, w), generator=g)
        labels[torch.rand(n, h, w, generator=g) < void] = 255
        out.append((torch.softmax(logits, 1), labels))
    return out


def _one_shot(batches):
    rows = torch.cat([p.movedim(1, -1).reshape(-1, p.shape[1]) for p, _ in batches])
    y = torch.cat([lab.reshape(-1) for _, lab in batches])
    keep = y != 255
    probs, labels = rows[keep], y[keep]
    ref = evaluate(probs, labels)
    ref["miou"] = F.mean_iou(probs, labels, probs.shape[1]).item()
    return ref, probs, labels


def test_streaming_pixels_equal_one_shot_on_valid_pixels():
    batches = _batches(0)
    ref, _, _ = _one_shot(batches)
    fixed = CalibrationAccumulator(n_bins=15, ignore_index=255)  # auto -> fixed state for dense input
    exact = CalibrationAccumulator(n_bins=15, ignore_index=255, state="exact")
    for p, y in batches:
        fixed.update(p, y)
        exact.update(p, y)
    got, got_exact = fixed.compute(), exact.compute()
    assert fixed._layout.hist and not exact._layout.hist
    for key in EXACT:
        assert got[key] == pytest.approx(ref[key], abs=1e-12), key
        assert got_exact[key] == pytest.approx(ref[key], abs=1e-12), key
    for key in APPROX:
        assert got_exact[key] == pytest.approx(ref[key], abs=1e-12), key
    # fixed-histogram AECE: an approximation (fine bins kept whole), documented to be close
    assert got["aece"] == pytest.approx(ref["aece"], abs=5e-3)
    # the areas move by at most 1/N per merged pair of nearby confidences; this set has few
    for key in ("aurc", "eaurc", "augrc"):
        assert got[key] == pytest.approx(ref[key], abs=1e-3), key


def test_fixed_state_selective_areas_exact_when_fine_bins_hold_one_confidence():
    # confidences on a grid of 1/40 + a few ties: every fine bin holds at most one distinct value
    g = torch.Generator().manual_seed(3)
    top = torch.randint(22, 40, (2, 9, 7), generator=g).double() / 40
    probs = torch.stack([top, 1 - top], 1)
    labels = torch.randint(0, 2, (2, 9, 7), generator=g)
    labels[0, :2] = 255
    got = CalibrationAccumulator(n_bins=10, ignore_index=255, state="fixed").update(probs, labels).compute()
    keep = labels != 255
    rows = probs.movedim(1, -1)[keep]
    for key, fn in (("aurc", F.aurc), ("eaurc", F.eaurc), ("augrc", F.augrc)):
        assert got[key] == pytest.approx(float(fn(rows, labels[keep])), abs=1e-12), key


def test_fixed_state_memory_does_not_grow_with_pixels():
    acc = CalibrationAccumulator(n_bins=15, ignore_index=255)
    sizes = []
    for p, y in _batches(1, n_batches=2) + _batches(2, n_batches=6, h=20, w=20):
        acc.update(p, y)
        sizes.append(acc.state_bytes())
    assert len(set(sizes)) == 1  # constant after the first batch
    from calibkit.functional.binning import FINE_BINS

    k, b = 4, 15
    assert sizes[0] == 8 * (5 + 3 * b + 3 * k * b + 3 * FINE_BINS + k * k + 5)
    # the exact state keeps 3 numbers per sample (confidence, correctness, weight) instead
    exact = CalibrationAccumulator(n_bins=15, ignore_index=255, state="exact")
    for p, y in _batches(3, n_batches=3):
        exact.update(p, y)
    assert sum(t.numel() for t in exact._conf) == exact.n


def test_dense_after_classification_batch_is_refused_in_auto_state(gen):
    acc = CalibrationAccumulator(ignore_index=255)
    acc.update(torch.softmax(torch.randn(10, 4, generator=gen), 1), torch.randint(0, 4, (10,), generator=gen))
    p, y = _batches(4, n_batches=1)[0]
    with pytest.raises(ValueError, match="state='fixed'"):
        acc.update(p, y)


def test_all_void_batch_is_skipped():
    p, y = _batches(5, n_batches=1)[0]
    acc = CalibrationAccumulator(ignore_index=255)
    acc.update(p, torch.full_like(y, 255))
    assert acc.n == 0
    acc.update(p, y)
    assert acc.n == int((y != 255).sum())


@pytest.fixture
def torch_path(monkeypatch):
    monkeypatch.setattr(P, "_FORCE_TORCH_PATH", True)


@pytest.mark.parametrize("state", ["exact", "fixed"])
def test_accumulator_device_path_equals_cpu_path(torch_path, state):
    batches = _batches(6)
    P._FORCE_TORCH_PATH = False
    cpu = CalibrationAccumulator(ignore_index=255, state=state)
    for p, y in batches:
        cpu.update(p, y)
    ref = cpu.compute()
    P._FORCE_TORCH_PATH = True
    dev = CalibrationAccumulator(ignore_index=255, state=state)
    for p, y in batches:
        dev.update(p, y)
    assert dev._weight[0] is not None if state == "exact" else True  # ignored pixels weighted 0, not removed
    got = dev.compute()
    assert set(got) == set(ref)
    for key in ref:
        assert got[key] == pytest.approx(ref[key], abs=1e-12), key


def test_accumulator_device_path_defers_checks_to_compute(torch_path):
    acc = CalibrationAccumulator()
    acc.update(torch.tensor([[0.7, 0.3]]), torch.tensor([0]))
    acc.update(torch.tensor([[0.9, 0.3]]), torch.tensor([1]))  # row sums to 1.2: no error yet
    with pytest.raises(ValueError, match="sum to 1.*reset"):
        acc.compute()
    acc = CalibrationAccumulator()
    acc.update(torch.tensor([[0.7, 0.3]]), torch.tensor([3]))
    with pytest.raises(ValueError, match="labels out of range: found 3"):
        acc.compute()


def _worker(rank, world, port, batches, out):
    import torch.distributed as dist

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        acc = CalibrationAccumulator(n_bins=15, num_classes=4, ignore_index=255, state="fixed")
        for p, y in batches[rank::world]:  # uneven: rank 0 gets 3 batches, rank 1 gets 2
            acc.update(p, y)
        out[rank] = acc.sync().compute()
    finally:
        dist.destroy_process_group()


def test_pixel_accumulator_syncs_under_two_gloo_processes():
    batches = _batches(7)
    ref = CalibrationAccumulator(ignore_index=255, state="fixed")
    for p, y in batches:
        ref.update(p, y)
    ref = ref.compute()
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(2, _free_port(), batches, out), nprocs=2, join=True)
        results = dict(out)
    for rank in (0, 1):
        for key in ref:
            assert results[rank][key] == pytest.approx(ref[key], abs=1e-12), (rank, key)
