"""A stop request (SIGUSR1 from a scheduler) ends training after the epoch in progress, with a
checkpoint of that epoch, and the resumed run ends with exactly the weights of an uninterrupted one."""

import json
import os
import signal

import pytest
import torch

from calibkit import rundir
from calibkit.config import TrainConfig
from calibkit.train import preempt, train
from calibkit.train.evaluate import ClassificationEvaluator


def tiny(**kw) -> TrainConfig:
    base = dict(data="digits", model="mlp", epochs=4, batch_size=64, lr=0.05, train_subset=256, val_size=100,
                num_threads=1, device="cpu", checkpoint_every=3)
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture
def clean_flag():
    preempt.clear()
    yield
    preempt.clear()


def _request_during(monkeypatch, epoch: int):
    """Ask for a stop while epoch ``epoch`` (1-based) validates, as a signal arriving mid-epoch would."""
    real, seen = ClassificationEvaluator.validate, []

    def validate(self, run):
        seen.append(1)
        if len(seen) == epoch:
            preempt.request()
        return real(self, run)

    monkeypatch.setattr(ClassificationEvaluator, "validate", validate)


def test_stop_request_checkpoints_its_epoch_and_the_resumed_run_is_exact(tmp_path, monkeypatch, clean_flag):
    cfg = tiny()
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    train(cfg, straight, progress=False, verbose=False)
    _request_during(monkeypatch, 2)
    with pytest.raises(preempt.Preempted) as stop:
        train(cfg, stopped, progress=False, verbose=False)
    assert stop.value.epoch == 2
    # epoch 2 is no checkpoint epoch (checkpoint_every=3): the request forced one
    assert rundir.read_checkpoint(stopped / rundir.CHECKPOINT)["epoch"] == 2
    assert json.loads((stopped / rundir.CONFIG).read_text())["status"] == "running"
    assert len(json.loads((stopped / rundir.HISTORY).read_text())) == 2
    assert not (stopped / rundir.LOGITS).exists()
    monkeypatch.undo()
    preempt.clear()
    assert train(cfg, stopped, progress=False, verbose=False)["status"] == "done"
    for name in (rundir.MODEL, rundir.LOGITS):
        a, b = rundir.read_tensors(straight / name), rundir.read_tensors(stopped / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    ha = json.loads((straight / rundir.HISTORY).read_text())
    hb = json.loads((stopped / rundir.HISTORY).read_text())
    assert [h["val_acc"] for h in ha] == [h["val_acc"] for h in hb]


def test_a_request_during_the_last_epoch_just_finishes(tmp_path, monkeypatch, clean_flag):
    _request_during(monkeypatch, 2)
    assert train(tiny(epochs=2), tmp_path / "r", progress=False, verbose=False)["status"] == "done"


def test_sigusr1_requests_a_stop_instead_of_ending_the_process(clean_flag):
    before = signal.getsignal(signal.SIGUSR1)
    try:
        preempt.install()
        assert not preempt.requested()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert preempt.requested()
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_preempted_names_its_epoch_and_run_directory():
    plain, named = preempt.Preempted(3), preempt.Preempted(2, "runs/ce-0")
    assert str(plain) == "stopped on request after epoch 3" and plain.epoch == 3 and plain.run_dir is None
    assert str(named) == "stopped on request after epoch 2 (runs/ce-0)" and named.run_dir == "runs/ce-0"
    assert isinstance(named, BaseException) and not isinstance(named, Exception)  # failure records let it pass


def test_clear_withdraws_a_request(clean_flag):
    preempt.request()
    assert preempt.requested() is True
    preempt.clear()
    assert preempt.requested() is False


@pytest.fixture
def one_process_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_agreed_reduces_the_flag_on_the_cpu_under_gloo(one_process_group, clean_flag):
    from calibkit.distributed import Dist

    # enabled (world 2 says so); gloo reduces CPU tensors whatever the process's device (a meta
    # tensor here would reduce, but its value could not be read)
    dd = Dist(0, 2, torch.device("meta"))
    assert preempt.agreed(dd) is False
    preempt.request()
    assert preempt.agreed(dd) is True
    assert preempt.agreed(Dist()) is True  # a single process reads its own flag, no group needed


def test_agreed_reduces_on_the_process_device_under_nccl(monkeypatch, clean_flag):
    import torch.distributed as dist

    from calibkit.distributed import Dist

    seen = []

    class Reduced(Exception):
        pass

    def all_reduce(t, op=dist.ReduceOp.SUM):
        seen.append(t.device.type)
        raise Reduced

    monkeypatch.setattr(dist, "get_backend", lambda *a: "nccl")
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    with pytest.raises(Reduced):
        preempt.agreed(Dist(0, 2, torch.device("meta")))  # a stand-in for the process's CUDA device
    assert seen == ["meta"]
