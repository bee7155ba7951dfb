"""The checkpoint policy (which epoch's weights a run keeps), the device-side non-finite loss
check, and the losses' per-epoch input validation inside the training loop."""

import json

import pytest
import torch
import torch.nn.functional as F

import calibkit.losses as losses_mod
from calibkit import _validation, rundir
from calibkit.config import TrainConfig
from calibkit.functional import ece
from calibkit.train import train
from calibkit.train.keep import Keeper


def tiny(**kw) -> TrainConfig:
    base = dict(data="digits", model="mlp", epochs=4, batch_size=64, lr=0.05, train_subset=256,
                val_size=100, num_threads=1, device="cpu")
    base.update(kw)
    return TrainConfig(**base)


def test_keeper_by_hand():
    acc, nll, ece_, last = Keeper("best-acc"), Keeper("best-nll"), Keeper("best-ece"), Keeper("last")
    records = [{"val_acc": 0.5, "val_loss": 0.9, "val_ece": 0.20},
               {"val_acc": 0.7, "val_loss": 0.8, "val_ece": 0.05},
               {"val_acc": 0.7, "val_loss": 0.6, "val_ece": 0.10},  # accuracy tie: the earlier epoch stays
               {"val_acc": 0.6, "val_loss": 0.7, "val_ece": 0.01}]
    kept = {k: [k.offer(e, r) for e, r in enumerate(records, 1)] for k in (acc, nll, ece_, last)}
    assert kept[acc] == [True, True, False, False] and acc.epoch == 2
    assert kept[nll] == [True, True, True, False] and nll.epoch == 3
    assert kept[ece_] == [True, True, False, True] and ece_.epoch == 4
    assert kept[last] == [True] * 4 and last.epoch == 4
    resumed = Keeper("best-nll", nll.state_dict())  # a resumed run continues from the saved state
    assert not resumed.offer(5, {"val_loss": 0.65}) and resumed.offer(6, {"val_loss": 0.5}) and resumed.epoch == 6
    with pytest.raises(ValueError) as err:
        Keeper("best")
    assert str(err.value) == ("keep: unknown checkpoint policy 'best'; "
                              "valid: best-acc, best-nll, best-ece, best-miou, last")
    with pytest.raises(ValueError, match="keep: must be one of"):
        tiny(keep="best").validate()


def test_keeper_state_before_and_after_offers():
    fresh = Keeper("best-acc")  # nothing kept yet: epoch 0 (no epoch's record), any first score wins
    assert fresh.state_dict() == {"policy": "best-acc", "score": float("-inf"), "epoch": 0}
    assert fresh.offer(1, {"val_acc": -1e300}) and fresh.epoch == 1
    nll = Keeper("best-nll")
    nll.offer(1, {"val_loss": 0.75})
    assert nll.state_dict() == {"policy": "best-nll", "score": -0.75, "epoch": 1}  # what a checkpoint records
    assert Keeper("last", {}).epoch == 0  # an empty state is a fresh one


@pytest.mark.parametrize("policy", ["best-acc", "best-nll", "best-ece", "last"])
def test_each_policy_keeps_the_weights_it_names(tmp_path, policy):
    out = tmp_path / policy
    # a high learning rate without decay: validation metrics move up and down between epochs
    summary = train(tiny(keep=policy, lr=0.3, schedule="cosine"), out, progress=False, verbose=False)
    history = json.loads((out / rundir.HISTORY).read_text())
    key, best = {"best-acc": ("val_acc", max), "best-nll": ("val_loss", min), "best-ece": ("val_ece", min),
                 "last": ("epoch", max)}[policy]
    values = [h[key] for h in history]
    expected = values.index(best(values)) + 1  # the first epoch reaching the best value
    assert summary["best_epoch"] == expected
    info = rundir.load_info(out)
    assert info["config"]["keep"] == policy and info["best_epoch"] == expected
    # the stored validation logits are those of the kept epoch: they reproduce its record
    logits = rundir.load_logits(out)
    v, y = logits["val_logits"], logits["val_labels"]
    rec = history[expected - 1]
    assert (v.argmax(1) == y).double().mean().item() == pytest.approx(rec["val_acc"], abs=1e-12)
    assert F.cross_entropy(v.double(), y).item() == pytest.approx(rec["val_loss"], rel=1e-9)
    assert float(ece(v.softmax(1), y, n_bins=15)) == pytest.approx(rec["val_ece"], abs=1e-9)
    if policy == "last":  # and model.safetensors holds the final weights
        ck = rundir.read_checkpoint(out / rundir.CHECKPOINT)["model"]
        kept = rundir.read_tensors(out / rundir.MODEL)
        assert all(torch.equal(ck[k], kept[k]) for k in kept)


class _AscentAfter(torch.nn.Module):
    """The real loss for the first ``n`` calls, then its negative: training un-learns, so the
    validation accuracy peaks early by construction."""

    def __init__(self, inner, n):
        super().__init__()
        self.inner, self.n, self.calls = inner, n, 0

    def forward(self, logits, targets, features=None):
        self.calls += 1
        loss = self.inner(logits, targets, features)
        return loss if self.calls <= self.n else -loss


def test_policies_differ_on_a_run_whose_accuracy_peaks_early(tmp_path, monkeypatch):
    real = losses_mod.build
    # 4 steps per epoch: epochs 1-2 learn, epochs 3-4 ascend the loss
    monkeypatch.setattr(losses_mod, "build", lambda spec,
                        num_classes=None: _AscentAfter(real(spec, num_classes=num_classes), 8))
    runs = {p: train(tiny(keep=p, lr=0.3, schedule="cosine"), tmp_path / p, progress=False, verbose=False)
            for p in ("best-acc", "last")}
    history = json.loads((tmp_path / "last" / rundir.HISTORY).read_text())
    accs = [h["val_acc"] for h in history]
    assert max(accs[:2]) > max(accs[2:])  # the scenario: the peak is early
    assert runs["best-acc"]["best_epoch"] == accs.index(max(accs)) + 1 <= 2
    assert runs["last"]["best_epoch"] == 4
    # identical training (the policy only decides what is kept): the same history either way
    other = json.loads((tmp_path / "best-acc" / rundir.HISTORY).read_text())
    assert [h["val_acc"] for h in other] == accs


def test_a_non_finite_loss_names_its_epoch_and_step_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    real = losses_mod.build

    class NaNAt(torch.nn.Module):  # the real loss, but NaN on the 7th call (epoch 2, step 3 of 4)
        def __init__(self, inner):
            super().__init__()
            self.inner, self.calls = inner, 0

        def forward(self, logits, targets, features=None):
            self.calls += 1
            loss = self.inner(logits, targets, features)
            return loss * float("nan") if self.calls == 7 else loss

    monkeypatch.setattr(losses_mod, "build", lambda spec, num_classes=None: NaNAt(real(spec, num_classes=num_classes)))
    out = tmp_path / "run"
    # 3 epochs: milestones at epochs 1 and 2, so epoch 2 runs at 0.05 * 0.1
    with pytest.raises(RuntimeError, match=r"loss is nan at epoch 2, step 3; lower the learning rate \(lr 0\.005\)"):
        train(tiny(epochs=3), out, progress=False, verbose=False)
    assert rundir.read_checkpoint(out / rundir.CHECKPOINT)["epoch"] == 1  # epoch 2 was never saved
    assert len(json.loads((out / rundir.HISTORY).read_text())) == 1


def test_trusted_inputs_skips_value_checks_only():
    bad = torch.tensor([[float("nan"), 0.0]])
    with pytest.raises(ValueError, match="NaN"):
        _validation.check_logits(bad)
    with _validation.trusted_inputs():
        assert _validation.check_logits(bad) is bad  # values are not read...
        with pytest.raises(ValueError, match=r"shape \(N, K\)"):
            _validation.check_logits(torch.zeros(3))  # ...shapes still are
        _validation.check_labels(torch.tensor([5]), num_classes=2, n=1)  # range not read
    assert not _validation.trusting()
    with pytest.raises(ValueError, match="out of range"):
        _validation.check_labels(torch.tensor([5]), num_classes=2, n=1)
