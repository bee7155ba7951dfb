"""CalibrationCallback with real Lightning: Trainer.fit on a tiny model, figures checked against
an independent recomputation from the model's validation logits."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("lightning")
import lightning  # noqa: E402

from calibkit.calibrators import TemperatureScaling, VectorScaling  # noqa: E402
from calibkit.calibrators.crossfit import folds  # noqa: E402
from calibkit.errors import UserError  # noqa: E402
from calibkit.functional import ece, nll  # noqa: E402
from calibkit.integrations.lightning import CalibrationCallback  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny fits: OpenMP threads cost more than they give


def _data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g)
    # a noisy 3-class problem: a network trained on it for a few epochs is over-confident
    y = ((x[:, 0] + 0.8 * torch.randn(n, generator=g)) > 0).long() + (x[:, 1] > 0.5).long()
    return torch.utils.data.TensorDataset(x, y)


class Tiny(lightning.LightningModule):
    def __init__(self, tuple_output=False):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(5, 32), nn.ReLU(), nn.Linear(32, 3))
        self.tuple_output = tuple_output

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        z = self(x)
        return (z, y) if self.tuple_output else {"loss": nn.functional.cross_entropy(z, y), "logits": z, "labels": y}

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.05)


def _fit(callback, root, tuple_output=False, epochs=2):
    torch.manual_seed(0)
    module = Tiny(tuple_output)
    train = torch.utils.data.DataLoader(_data(512, 0), batch_size=64, shuffle=True)
    val = torch.utils.data.DataLoader(_data(300, 1), batch_size=64)
    trainer = lightning.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                num_sanity_val_steps=1, callbacks=[callback], default_root_dir=root)
    trainer.fit(module, train, val)
    return module, trainer, val


def test_callback_fits_and_logs_figures_that_match_a_recomputation(tmp_path):
    cb = CalibrationCallback("temperature", n_bins=10, n_folds=3, seed=1)
    module, trainer, val = _fit(cb, tmp_path)
    assert [h["epoch"] for h in cb.history_] == [0, 1]  # one row per validation epoch, sanity check excluded
    last = cb.history_[-1]
    assert last["n"] == 300
    # recompute from the trained model's validation logits (the last validation ran on these weights)
    module.eval()
    with torch.no_grad():
        z = torch.cat([module(x) for x, _ in val]).double()
    y = torch.cat([y for _, y in val])
    assert last["ece_before"] == pytest.approx(float(ece(z.softmax(1), y, n_bins=10)), abs=1e-6)
    assert last["nll_before"] == pytest.approx(float(nll(z.softmax(1), y)), abs=1e-6)
    after = torch.empty_like(z)
    for held in folds(300, 3, 1):
        keep = torch.ones(300, dtype=torch.bool)
        keep[held] = False
        after[held] = TemperatureScaling().fit(z[keep], y[keep]).predict_proba(z[held])
    assert last["ece_after"] == pytest.approx(float(ece(after, y, n_bins=10)), abs=1e-6)
    assert last["nll_after"] == pytest.approx(float(nll(after, y)), abs=1e-6)
    assert cb.calibrator_.temperature_ == pytest.approx(TemperatureScaling().fit(z, y).temperature_, rel=1e-5)
    # the figures were logged through Lightning
    for key in ("ece_before", "ece_after", "nll_before", "nll_after"):
        assert float(trainer.callback_metrics["calibration/" + key]) == pytest.approx(last[key], rel=1e-6)


def test_tuple_outputs_and_a_calibrator_instance(tmp_path):
    template = VectorScaling(max_iter=50)
    cb = CalibrationCallback(template, n_folds=2, prefix="cal/")
    _, trainer, _ = _fit(cb, tmp_path, tuple_output=True, epochs=1)
    assert isinstance(cb.calibrator_, VectorScaling) and cb.calibrator_ is not template
    assert cb.calibrator_.max_iter == 50 and not hasattr(template, "n_classes_")  # the template is never fitted
    assert "cal/ece_after" in trainer.callback_metrics


def test_bad_arguments_and_outputs_are_named():
    with pytest.raises(UserError, match="unknown calibrator 'tempreature'"):
        CalibrationCallback("tempreature")
    with pytest.raises(UserError, match="n_folds must be an integer >= 2"):
        CalibrationCallback(n_folds=1)
    with pytest.raises(UserError, match=r"must return a dict with 'logits' and 'labels'.*\['loss'\]"):
        CalibrationCallback()._read({"loss": torch.tensor(1.0)})
