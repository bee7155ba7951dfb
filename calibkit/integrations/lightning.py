"""A Lightning callback that fits a post-hoc calibrator on the validation loop's outputs.

Importable only when Lightning is installed (``pip install "calibkit[lightning]"``); Lightning is
not a dependency of calibkit.

:class:`CalibrationCallback` collects the logits and labels that ``validation_step`` returns,
and at the end of each validation epoch (the sanity check excluded) it

1. fits a fresh copy of the calibrator on all of them: ``callback.calibrator_``, ready for
   :class:`calibkit.integrations.model.CalibratedModel` or :func:`calibkit.calibrators.save`;
2. logs ECE and NLL of the validation outputs before calibration and after it, as
   ``calibration/ece_before``, ``calibration/ece_after``, ``calibration/nll_before``,
   ``calibration/nll_after`` (``prefix`` changes ``calibration/``). The "after" figures are
   **out of fold**: the rows are cut into ``n_folds`` parts by a seeded permutation and each part is
   predicted by a calibrator fitted on the others, so they are not flattered by scoring the
   calibrator on the rows it was fitted on. (Evaluate on a test split for a final figure.)

What ``validation_step`` must return: a dict holding the batch's logits and integer labels
(under ``logits_key`` and ``labels_key``, default ``"logits"`` and ``"labels"``; a ``"loss"`` may
sit beside them), or a ``(logits, labels)`` tuple. Logits: ``(n, K)``, or ``(n,)`` positive-class
logits of a binary model. They are detached and kept on the CPU (float64 after fitting starts).

One process: under several processes (DDP) each rank fits on the validation rows it saw and logs
its own figures; gather the outputs yourself for a global fit.

Example:
    >>> from calibkit.integrations.lightning import CalibrationCallback           # doctest: +SKIP
    >>> cb = CalibrationCallback("temperature")                                   # doctest: +SKIP
    >>> lightning.Trainer(callbacks=[cb]).fit(module, train_loader, val_loader)   # doctest: +SKIP
    >>> cb.calibrator_.temperature_, cb.history_[-1]["ece_after"]                 # doctest: +SKIP
"""

from __future__ import annotations

from calibkit.extras import MissingExtra

try:
    from lightning.pytorch.callbacks import Callback
except ImportError as exc:  # absent or broken install
    raise MissingExtra("calibkit.integrations.lightning needs Lightning: pip install 'calibkit[lightning]'") from exc

import torch

from calibkit.calibrators.crossfit import folds
from calibkit.calibrators.registry import CALIBRATORS
from calibkit.errors import UserError
from calibkit.functional import ece, nll

__all__ = ["CalibrationCallback"]


def _uncalibrated(z: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(z) if z.dim() == 1 else torch.softmax(z, dim=1)


class CalibrationCallback(Callback):
    """Fit a calibrator on the validation outputs and log ECE/NLL before and after (module docstring).

    Args:
        calibrator: a name of :data:`calibkit.calibrators.CALIBRATORS` (default ``"temperature"``) or a
            calibrator instance, whose hyperparameters are copied (it is never fitted itself).
        n_bins: bins of the logged ECE.
        n_folds: parts of the out-of-fold "after" figures (>= 2).
        seed: seed of the permutation that cuts the parts.
        logits_key, labels_key: where the dict returned by ``validation_step`` holds them.
        prefix: start of the logged names.

    Attributes:
        calibrator_: the calibrator fitted at the last validation epoch end (``None`` before).
        history_: one dict per validation epoch: ``epoch``, ``n`` (rows), ``ece_before``,
            ``ece_after``, ``nll_before``, ``nll_after`` (python floats).
    """

    def __init__(self, calibrator="temperature", n_bins: int = 15, n_folds: int = 5, seed: int = 0,
                 logits_key: str = "logits", labels_key: str = "labels", prefix: str = "calibration/"):
        super().__init__()
        if isinstance(calibrator, str):
            if calibrator not in CALIBRATORS:
                raise UserError(f"unknown calibrator {calibrator!r}; expected one of {', '.join(CALIBRATORS)}")
            calibrator = CALIBRATORS[calibrator]()
        if not (hasattr(calibrator, "fit") and hasattr(calibrator, "get_params")):
            raise UserError(f"calibrator must be a calibrator name or instance, got {type(calibrator).__name__}")
        if isinstance(n_folds, bool) or not isinstance(n_folds, int) or n_folds < 2:
            raise UserError(f"n_folds must be an integer >= 2, got {n_folds!r}")
        self.template = calibrator
        self.n_bins, self.n_folds, self.seed = n_bins, n_folds, seed
        self.logits_key, self.labels_key, self.prefix = logits_key, labels_key, prefix
        self.calibrator_ = None
        self.history_: list[dict] = []
        self._logits: list[torch.Tensor] = []
        self._labels: list[torch.Tensor] = []

    def _fresh(self):
        return type(self.template)(**self.template.get_params(deep=False))

    def _read(self, outputs) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(outputs, dict) and self.logits_key in outputs and self.labels_key in outputs:
            z, y = outputs[self.logits_key], outputs[self.labels_key]
        elif isinstance(outputs, (tuple, list)) and len(outputs) == 2:
            z, y = outputs
        else:
            found = sorted(outputs) if isinstance(outputs, dict) else type(outputs).__name__
            raise UserError(f"CalibrationCallback: validation_step must return a dict with '{self.logits_key}' and "
                            f"'{self.labels_key}' (or a (logits, labels) tuple); got {found}")
        if not (isinstance(z, torch.Tensor) and isinstance(y, torch.Tensor)):
            raise UserError("CalibrationCallback: the logits and labels returned by validation_step must be tensors")
        return z.detach().cpu(), y.detach().cpu()

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._logits, self._labels = [], []

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if trainer.sanity_checking:
            return
        z, y = self._read(outputs)
        self._logits.append(z)
        self._labels.append(y)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or not self._logits:
            return
        z, y = torch.cat(self._logits).double(), torch.cat(self._labels).long()
        self._logits, self._labels = [], []
        row = {"epoch": int(trainer.current_epoch), "n": int(y.numel()), **self.evaluate(z, y)}
        self.calibrator_ = self._fresh().fit(z, y)
        self.history_.append(row)
        for key in ("ece_before", "ece_after", "nll_before", "nll_after"):
            pl_module.log(self.prefix + key, row[key])

    def evaluate(self, z: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """ECE and NLL of logits ``z`` and labels ``y`` before calibration and out of fold after it."""
        if y.numel() < self.n_folds:
            raise UserError(f"CalibrationCallback: {y.numel()} validation rows cannot be cut into "
                            f"n_folds={self.n_folds} parts")
        after = torch.empty(z.shape, dtype=torch.float64)
        for held in folds(y.numel(), self.n_folds, self.seed):
            keep = torch.ones(y.numel(), dtype=torch.bool)
            keep[held] = False
            after[held] = self._fresh().fit(z[keep], y[keep]).predict_proba(z[held]).double()
        before = _uncalibrated(z)
        return {"ece_before": float(ece(before, y, n_bins=self.n_bins)),
                "ece_after": float(ece(after, y, n_bins=self.n_bins)),
                "nll_before": float(nll(before, y)), "nll_after": float(nll(after, y))}
