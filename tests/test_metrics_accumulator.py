"""CalibrationAccumulator beyond the one-device, one-process case: ``sync`` under two ranks run
in this process, the device of every piece of state (checked on PyTorch's ``meta`` device,
which has shapes and dtypes but no data), the state kinds' memory, and the exact error messages."""

import math
import re
import threading

import numpy as np
import pytest
import torch
import torch.distributed as dist

import calibkit.functional.panel as P
from calibkit.functional.binning import FINE_BINS
from calibkit.metrics import PANEL, CalibrationAccumulator, evaluate


def _data(gen, n, k=5, dtype=torch.float64):
    probs = torch.softmax(torch.randn(n, k, generator=gen, dtype=torch.float64) * 2.5, 1).to(dtype)
    return probs, torch.randint(0, k, (n,), generator=gen)


def _dense(gen, n=3, k=4, h=5, w=6):
    probs = torch.softmax(torch.randn(n, k, h, w, generator=gen, dtype=torch.float64) * 3, 1)
    return probs, torch.randint(0, k, (n, h, w), generator=gen)


class ThreadedGroup:
    """``torch.distributed``'s collectives for ``world`` ranks run as threads of this process.

    Behaves like a gloo group for what ``sync`` uses: every rank must pass tensors of one shape
    and dtype, ``all_reduce`` sums (default) or takes the maximum, ``all_gather`` fills a list
    of ``world`` tensors shaped like the input, and every collective must name this group.
    """

    def __init__(self, world):
        self.world = world
        self.barrier = threading.Barrier(world, timeout=20)
        self.slots = [None] * world
        self.local = threading.local()

    def _exchange(self, t, group):
        if group is not self:
            raise RuntimeError("collective called without the group it was given")
        self.slots[self.local.rank] = t.clone()
        self.barrier.wait()
        got = list(self.slots)
        self.barrier.wait()
        if any(g.shape != t.shape or g.dtype != t.dtype for g in got):
            raise RuntimeError("ranks passed tensors of different shapes or dtypes")
        return got

    def all_reduce(self, t, op=dist.ReduceOp.SUM, group=None):
        got = torch.stack(self._exchange(t, group))
        if op == dist.ReduceOp.SUM:
            t.copy_(got.sum(0))
        elif op == dist.ReduceOp.MAX:
            t.copy_(got.amax(0))
        else:
            raise RuntimeError(f"unsupported reduce op {op!r}")

    def all_gather(self, out, t, group=None):
        got = self._exchange(t, group)
        if len(out) != self.world or any(o.shape != t.shape for o in out):
            raise RuntimeError("all_gather needs world_size output tensors shaped like the input")
        for o, g in zip(out, got):
            o.copy_(g)

    def get_world_size(self, group=None):
        if group is not self:
            raise RuntimeError("get_world_size called without the group")
        return self.world

    def run(self, fns):
        """Run ``fns[r]()`` as rank ``r``, all at once; returns their results (re-raising errors)."""
        results, errors = [None] * self.world, [None] * self.world

        def target(r):
            self.local.rank = r
            try:
                results[r] = fns[r]()
            except BaseException as e:  # noqa: BLE001 - handed to the test thread below
                errors[r] = e
                self.barrier.abort()

        threads = [threading.Thread(target=target, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for e in errors:
            if e is not None and not isinstance(e, threading.BrokenBarrierError):
                raise e
        for e in errors:
            if e is not None:
                raise e
        return results


@pytest.fixture
def group(monkeypatch):
    g = ThreadedGroup(2)
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    for name in ("all_reduce", "all_gather", "get_world_size"):
        monkeypatch.setattr(dist, name, getattr(g, name))
    return g


def _assert_panel(got, ref):
    assert set(got) == set(ref)
    for key in ref:
        assert got[key] == pytest.approx(ref[key], abs=1e-12), key


@pytest.mark.parametrize("torch_path", [False, True])
def test_sync_of_two_ranks_equals_evaluate_on_all_samples(gen, group, monkeypatch, torch_path):
    # Uneven shards (the per-sample arrays are padded to the longest rank) and ignored samples;
    # on the device path those stay in the state with weight 0, and the deferred checks travel too.
    monkeypatch.setattr(P, "_FORCE_TORCH_PATH", torch_path)
    probs, labels = _data(gen, 500)
    labels[::7] = -1
    keep = labels != -1
    ref = evaluate(probs[keep], labels[keep])
    shards = [(0, 170), (170, 500)]

    def rank(lo, hi):
        acc = CalibrationAccumulator(ignore_index=-1)
        acc.update(probs[lo:hi], labels[lo:hi])
        return acc.sync(group=group).compute()

    for got in group.run([lambda s=s: rank(*s) for s in shards]):
        assert tuple(got) == PANEL
        _assert_panel(got, ref)


def test_sync_combines_the_deferred_checks_by_maximum(gen, group, monkeypatch):
    monkeypatch.setattr(P, "_FORCE_TORCH_PATH", True)
    probs, labels = _data(gen, 40, k=3)
    bad = probs.clone()
    bad[0] = torch.tensor([0.6, 0.3, 0.3], dtype=probs.dtype)  # sums to 1.2: on the device path only compute() tells

    def rank(p):
        acc = CalibrationAccumulator(n_bins=5).update(p, labels).sync(group=group)
        try:
            return acc.compute()
        except ValueError as e:
            return str(e)

    good = group.run([lambda: rank(probs), lambda: rank(probs)])
    _assert_panel(good[0], evaluate(torch.cat([probs, probs]), torch.cat([labels, labels]), n_bins=5))
    for msg in group.run([lambda: rank(probs), lambda: rank(bad)]):  # both ranks see rank 1's error
        assert isinstance(msg, str) and "sum to 1" in msg


@pytest.mark.parametrize("state", ["exact", "fixed"])
def test_sync_with_a_rank_without_data(gen, group, state):
    probs, labels = _data(gen, 60, k=4)

    def rank(has_data):
        acc = CalibrationAccumulator(n_bins=6, num_classes=4, state=state)
        if has_data:
            acc.update(probs, labels)
        acc.sync(group=group)
        return acc

    full, empty = group.run([lambda: rank(True), lambda: rank(False)])
    ref = CalibrationAccumulator(n_bins=6, state=state).update(probs, labels).compute()
    _assert_panel(empty.compute(), ref)
    _assert_panel(full.compute(), ref)
    assert empty._sums.device.type == "cpu" and empty._check.device.type == "cpu"
    # the state the empty rank allocated is of the same kind: it merges with a fresh one
    more = CalibrationAccumulator(n_bins=6, state=state).update(probs, labels)
    _assert_panel(empty.merge(more).compute(),
                  CalibrationAccumulator(n_bins=6, state=state).update(torch.cat([probs, probs]),
                                                                       torch.cat([labels, labels])).compute())


def test_sync_without_data_allocates_on_the_cpu_whatever_the_default_device(monkeypatch):
    g = ThreadedGroup(1)
    for name in ("all_reduce", "all_gather", "get_world_size"):
        monkeypatch.setattr(dist, name, getattr(g, name))
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    acc = CalibrationAccumulator(num_classes=3, state="exact")
    g.local.rank = 0  # one rank, run in this thread: the default-device mode is per thread
    with torch.device("meta"):  # gloo needs CPU tensors: the empty rank's state must not follow the default
        acc.sync(group=g)
    assert acc._sums.device.type == "cpu" and acc._check.device.type == "cpu"


def test_sync_without_data_needs_num_classes_and_a_state(group):
    msg = ("sync() on a rank without data needs num_classes and state='exact' or 'fixed' in the constructor")
    for acc in (CalibrationAccumulator(state="exact"), CalibrationAccumulator(num_classes=3)):
        g = ThreadedGroup(1)
        with pytest.raises(ValueError, match="^" + re.escape(msg) + "$"):
            acc.sync(group=g)


def _devices(acc):
    tensors = [acc._sums, acc._check, *acc._conf, *acc._correct, *[w for w in acc._weight if w is not None]]
    return {t.device.type for t in tensors}


@pytest.mark.parametrize("dense", [False, True])
def test_state_lives_on_the_first_batch_device(gen, monkeypatch, dense):
    # meta tensors take the device path like CUDA ones; a later batch from another device is moved
    monkeypatch.setattr(P, "_FORCE_TORCH_PATH", True)  # the CPU batch too, so it carries weights
    p, y = _dense(gen) if dense else _data(gen, 30, k=4)
    y = y.clone()
    y.view(-1)[::5] = 255
    acc = CalibrationAccumulator(n_bins=5, ignore_index=255, state="exact")
    acc.update(p.to("meta"), y.to("meta"))
    assert _devices(acc) == {"meta"}
    acc.update(p, y)
    assert _devices(acc) == {"meta"} and len(acc._conf) == len(acc._weight) == 2
    assert all(w is not None for w in acc._weight)
    # merge: the other accumulator's state (CPU) is moved to this one's device
    other = CalibrationAccumulator(n_bins=5, ignore_index=255, state="exact").update(p, y)
    acc.merge(other)
    assert _devices(acc) == {"meta"} and len(acc._weight) == 3 and all(w is not None for w in acc._weight)


def test_auto_state_follows_the_first_batch_on_any_device(gen):
    p, y = _dense(gen)
    acc = CalibrationAccumulator(n_bins=5).update(p.to("meta"), y.to("meta"))
    assert acc._layout.hist and acc._layout.confusion and acc._conf == []


def test_state_bytes_by_hand(gen):
    k, b = 3, 5
    assert CalibrationAccumulator(n_bins=b).state_bytes() == 0
    probs, labels = _data(gen, 20, k=k)
    exact = CalibrationAccumulator(n_bins=b).update(probs, labels)
    # float64 sums (N, correct, NLL, Brier, dense count; 3 x B bins; 3 x K x B classwise), the
    # 5 float64 checks, and per sample a float64 confidence and a bool correctness
    assert exact.state_bytes() == 8 * (5 + 3 * b + 3 * k * b + 5) + 20 * (8 + 1)
    # the fixed state on (N, K) input: the fine histogram and the K x K confusion matrix instead
    fixed = CalibrationAccumulator(n_bins=b, state="fixed").update(probs, labels)
    size = 8 * (5 + 3 * b + 3 * k * b + 3 * FINE_BINS + k * k + 5)
    assert fixed.state_bytes() == size
    fixed.update(*_data(gen, 50, k=k))
    assert fixed.state_bytes() == size and fixed._conf == []


def test_one_shot_evaluate_on_pixels_gives_the_exact_aece():
    # confidences 0.5001 ... 0.5016 share one fine bin of the fixed-histogram state (the
    # accumulator's "auto" state for pixels), so its AECE differs from the exact one
    c = 0.5 + 1e-4 * torch.arange(1, 17, dtype=torch.float64)
    p = torch.stack([c, 1 - c]).reshape(1, 2, 4, 4)
    y = torch.tensor([0, 1]).repeat_interleave(4).repeat(2).reshape(1, 4, 4)
    rows, flat = p.movedim(1, -1).reshape(-1, 2), y.reshape(-1)
    exact = evaluate(rows, flat, n_bins=4)["aece"]
    assert evaluate(p, y, n_bins=4)["aece"] == pytest.approx(exact, abs=1e-12)
    assert abs(CalibrationAccumulator(n_bins=4).update(p, y).compute()["aece"] - exact) > 0.1


def test_num_classes_given_to_the_constructor_is_enforced(gen):
    with pytest.raises(ValueError, match=r"probs has K = 3 classes but this accumulator holds K = 4"):
        CalibrationAccumulator(num_classes=4).update(*_data(gen, 10, k=3))


def test_error_messages(gen):
    with pytest.raises(ValueError, match=r"^state must be one of auto, exact, fixed, got 'bogus'$"):
        CalibrationAccumulator(state="bogus")
    with pytest.raises(ValueError, match=r"^no samples accumulated \(N = 0\): call update\(\) with data first$"):
        CalibrationAccumulator().compute()
    acc = CalibrationAccumulator().update(*_data(gen, 10, k=4))
    msg = ("this accumulator was set up for (N, K) inputs by its first batch and keeps 2 numbers per sample; "
           "for pixels (dense inputs) use a new one, or state='fixed'")
    with pytest.raises(ValueError, match="^" + re.escape(msg) + "$"):
        acc.update(*_dense(gen))
    with pytest.raises(ValueError, match=r"^cannot merge accumulators with K = 4 and K = 3$"):
        acc.merge(CalibrationAccumulator().update(*_data(gen, 10, k=3)))
    with pytest.raises(ValueError, match=r"^cannot merge accumulators with n_bins 15 and 7$"):
        acc.merge(CalibrationAccumulator(n_bins=7).update(*_data(gen, 10, k=4)))
    fixed = CalibrationAccumulator(state="fixed").update(*_data(gen, 10, k=4))
    with pytest.raises(ValueError, match=r"^cannot merge an exact-state accumulator with a fixed-state \(pixel\) one$"):
        acc.merge(fixed)


# -- calibkit.functional.metrics ---------------------------------------------------------------

import calibkit.functional as F  # noqa: E402


def test_functional_defaults_are_15_bins(gen):
    probs, _ = _data(gen, 400)
    labels = torch.multinomial(probs, 1, generator=gen).squeeze(1)  # calibrated: over- and under-confident bins
    for fn in (F.adaptive_ece, F.rmsce, lambda p, y, **kw: torch.stack(F.over_under_ece(p, y, **kw))):
        default, b15, b16 = fn(probs, labels), fn(probs, labels, n_bins=15), fn(probs, labels, n_bins=16)
        assert torch.equal(default, b15) and not torch.equal(default, b16)


@pytest.mark.parametrize("torch_path", [False, True])
def test_ignore_index_everywhere_equals_dropping_the_samples(gen, monkeypatch, torch_path):
    monkeypatch.setattr(P, "_FORCE_TORCH_PATH", torch_path)
    probs, labels = _data(gen, 300)
    labels[::4] = 255
    keep = labels != 255
    for fn in (F.nll, F.brier, F.accuracy, F.ece, F.adaptive_ece, F.classwise_ece):
        got = fn(probs, labels, ignore_index=255)
        assert float(got) == pytest.approx(float(fn(probs[keep], labels[keep])), abs=1e-12), fn.__name__
    # a single kept sample is enough
    one = torch.full_like(labels, 255)
    one[7] = labels[8] if labels[8] != 255 else 0
    for fn in (F.nll, F.ece, F.accuracy):
        assert float(fn(probs, one, ignore_index=255)) == pytest.approx(float(fn(probs[7:8], one[7:8])), abs=1e-12)
    msg = r"^no samples to evaluate: every label equals ignore_index=255$"
    for fn in (F.nll, F.brier, F.ece, F.accuracy):
        with pytest.raises(ValueError, match=msg):
            fn(probs, torch.full_like(labels, 255), ignore_index=255)


def test_bad_n_bins_is_reported_before_ignored_labels(gen):
    probs, labels = _data(gen, 20)
    labels[0] = 255  # valid once ignored: the error is about n_bins, not about the label
    with pytest.raises(ValueError, match="n_bins"):
        F.ece(probs, labels, n_bins=0, ignore_index=255)


def test_ood_scores_errors_name_the_argument():
    good, bad = torch.rand(5), torch.rand(2, 2)
    for fn in (F.ood_auroc, F.fpr_at_95_tpr):
        with pytest.raises(ValueError, match=r"^scores_in must have shape \(N,\), got \(2, 2\)$"):
            fn(bad, good)
        with pytest.raises(ValueError, match=r"^scores_out must have shape \(N,\), got \(2, 2\)$"):
            fn(good, bad)
        with pytest.raises(ValueError, match="^scores_in: cannot convert"):
            fn(object(), good)
        with pytest.raises(ValueError, match="^scores_out: cannot convert"):
            fn(good, object())
    with pytest.raises(ValueError, match="^probs must be numeric"):
        F.entropy_score(np.array([["a", "b"]]))


def test_integer_scores_equal_float_scores():
    s_in, s_out = torch.tensor([0, 1, 1, 3]), torch.tensor([1, 2, 4])
    assert float(F.ood_auroc(s_in, s_out)) == pytest.approx(float(F.ood_auroc(s_in.double(), s_out.double())))
    # by hand: pairs (out > in) + 1/2 ties over 12: out 1 beats 0, ties two 1s; 2 beats 0,1,1; 4 beats all
    assert float(F.ood_auroc(s_in, s_out)) == pytest.approx((1 + 1 + 3 + 4) / 12)


def test_fpr_threshold_with_tpr_times_n_rounding_up():
    # 0.28 * 25 = 7.000000000000001 in floating point: 7 of 25 OOD samples already reach TPR 0.28,
    # so t is the 7th largest OOD score (19), not the 8th (18)
    s_out = torch.arange(1, 26, dtype=torch.float64)
    s_in = torch.tensor([18.5, 19.0, 30.0, 0.0, 0.0])
    assert float(F.fpr_at_95_tpr(s_in, s_out, tpr=0.28)) == pytest.approx(2 / 5)
    # tpr = 1: t is the smallest OOD score (1): in-distribution scores >= 1 count
    assert float(F.fpr_at_95_tpr(s_in, s_out, tpr=1.0)) == pytest.approx(3 / 5)
    for tpr in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match=rf"^tpr must be in \(0, 1\], got {tpr}$"):
            F.fpr_at_95_tpr(s_in, s_out, tpr=tpr)


def test_ood_scores_of_binary_probabilities():
    # (N,) positive-class probabilities are the two-class rows (1 - p, p)
    p = torch.tensor([0.5, 0.9, 0.2, 1.0], dtype=torch.float64)
    two = torch.stack([1 - p, p], 1)
    torch.testing.assert_close(F.entropy_score(p), F.entropy_score(two))
    torch.testing.assert_close(F.max_confidence_score(p), 1 - torch.maximum(p, 1 - p))
    h = -(0.9 * math.log(0.9) + 0.1 * math.log(0.1)) / math.log(2)  # by hand, normalised by log 2
    assert float(F.entropy_score(p)[1]) == pytest.approx(h, abs=1e-12)
    assert F.entropy_score(p)[0] == 1.0 and F.entropy_score(p)[3] == 0.0


@pytest.fixture
def small_blocks(monkeypatch):
    """CPU blocks of 1 KiB (a few rows), so small batches span many blocks and the accumulator
    defers their full part to helper threads (at two threads or more); and the sort-based part
    split over two threads from 16 tie blocks on."""
    from calibkit import _panel_state
    from calibkit.functional import panel_cpu

    monkeypatch.setattr(panel_cpu, "_BLOCK_BYTES", 1 << 10)
    monkeypatch.setattr(_panel_state, "_SPLIT_BLOCKS", 16)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_deferred_batches_give_the_one_thread_state_exactly(gen, small_blocks):
    # Helper threads compute the classwise sums, NLL and Brier of each batch while the caller goes
    # on; the state they settle into is bit-for-bit the one-thread state, whatever reads it first
    # (compute, n, merge, a later update).
    batches = [_data(gen, n, k=6, dtype=dtype) for n, dtype in ((700, torch.float32), (333, torch.float64))]

    def state(threads):
        torch.set_num_threads(threads)
        acc = CalibrationAccumulator()
        for p, y in batches:
            acc.update(p, y)
        return acc

    one = state(1)
    assert not one._pending
    for threads in (2, 3):
        acc = state(threads)
        assert len(acc._pending) == 1  # the last batch; a later update settled the first
        assert acc.n == 1033 and not acc._pending
        assert torch.equal(acc._sums, one._sums)
        assert acc.compute() == one.compute()
        fresh = state(threads)  # compute() on unsettled batches: the sort-based part first, then the sums
        assert fresh.compute() == one.compute() and not fresh._pending
        merged = CalibrationAccumulator().merge(state(threads))  # merge settles the other side
        assert torch.equal(merged._sums, one._sums)


@pytest.mark.parametrize("ignored", [False, True])
def test_evaluate_is_the_same_at_any_thread_count(gen, small_blocks, ignored):
    probs, labels = _data(gen, 2000, k=9, dtype=torch.float32)
    probs = torch.cat([probs, probs[:300]])  # tied confidences too
    labels = torch.cat([labels, labels[:300]])
    if ignored:  # rows dropped before the passes
        labels[::5] = -1
    got = {}
    for threads in (1, 2, 4):
        torch.set_num_threads(threads)
        got[threads] = evaluate(probs, labels, ignore_index=-1 if ignored else None)
    assert got[1] == got[2] == got[4]


def test_a_bad_block_raises_in_update_and_stops_the_helpers(gen, small_blocks):
    from calibkit.functional import panel_cpu

    probs, labels = _data(gen, 600, k=6, dtype=torch.float32)
    torch.set_num_threads(2)
    acc = CalibrationAccumulator().update(probs, labels)
    assert acc._pending and acc.n == 600  # reading n settles the batch and joins its helper
    bad = probs.clone()
    bad[550, 0] = float("nan")  # in a late block: the helpers have started by then
    started = threading.active_count()
    with pytest.raises(ValueError, match="NaN or infinite"):
        acc.update(bad, labels)
    assert threading.active_count() == started  # cancelled and joined, none left running
    assert acc.n == 600 and acc.compute() == CalibrationAccumulator().update(probs, labels).compute()
    assert panel_cpu._BLOCK_BYTES == 1 << 10
