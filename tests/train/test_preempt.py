"""A stop request (SIGUSR1 from a scheduler) ends training after the epoch in progress, with a
checkpoint of that epoch, and the resumed run ends with exactly the weights of an uninterrupted one."""

import json
import os
import signal

import pytest
import torch

from calibkit import rundir
from calibkit.config import TrainConfig
from calibkit.train import loop, preempt, train


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
    real, seen = loop._validate, []

    def validate(run):
        seen.append(1)
        if len(seen) == epoch:
            preempt.request()
        return real(run)

    monkeypatch.setattr(loop, "_validate", validate)


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
