"""How a classification run is measured: every epoch's validation record and the finished run's logits.

A run holds one evaluator, chosen when it is built (:func:`calibkit.train.run.build_run`): a
classification run has a :class:`ClassificationEvaluator`, a segmentation run a
:class:`calibkit.train.dense.DenseEvaluator` (whose splits' logits do not fit in memory). Both
follow :class:`calibkit.train.state.Evaluator`; the epoch loop (:mod:`calibkit.train.loop`) only
calls ``validate`` after every epoch and ``finish`` once at the end.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from calibkit import distributed as D
from calibkit import rundir
from calibkit.functional import ece

if TYPE_CHECKING:
    from calibkit.data.bundle import Split
    from calibkit.train.state import Log, Run

SUMMARY_KEYS = ("status", "epochs_done", "best_epoch", "best_val_acc", "test_acc", "test_ece", "wall_time_s")


def summary(info: dict) -> dict:
    """What :func:`calibkit.train.train` returns: the run record's ``SUMMARY_KEYS`` (None if absent)."""
    return {k: info.get(k) for k in SUMMARY_KEYS}


@torch.no_grad()
def split_logits(run: Run, split: Split) -> torch.Tensor:
    """Logits of a whole split; under DDP each rank computes a chunk and all ranks get every row."""
    idx, _ = D.eval_shard(len(split), run.dd)
    images = split.images[idx] if run.dd.enabled else split.images  # one process: every row in order, no copy
    logits = rundir.predict_logits(run.model, images, run.inputs, run.cfg.eval_batch_size, run.dd.device)
    return D.gather_rows(logits.to(run.dd.device), len(split), run.dd).cpu()


class ClassificationEvaluator:
    """One logit row per image: validation accuracy, NLL and ECE; the splits' logits saved whole."""

    def validate(self, run: Run) -> dict:
        """Validation accuracy, NLL and ECE (15 bins); AdaFocal's per-epoch update (same on every rank).

        The logits are kept in ``run.val_logits``: when the checkpoint policy keeps this epoch,
        :meth:`finish` reuses them instead of a second pass.
        """
        run.model.eval()
        run.loss_fn.eval()
        logits, labels = split_logits(run, run.bundle.val), run.bundle.val.labels
        run.val_logits = logits
        update = getattr(run.loss_fn, "update", None)  # AdaFocal's per-epoch update of its gammas
        if update is not None:
            update(logits.to(run.dd.device), labels.to(run.dd.device))
        return {"val_loss": nn.functional.cross_entropy(logits.double(), labels).item(),
                "val_acc": (logits.argmax(1) == labels).double().mean().item(),
                "val_ece": float(ece(logits.softmax(1), labels, n_bins=15))}

    def finish(self, run: Run, out: Path, info: dict, log: Log) -> dict:
        """The kept weights' validation and test logits, for post-hoc calibration; status done."""
        assert run.kept is not None  # every finished run has kept an epoch's weights
        run.model.load_state_dict(run.kept)
        run.model.eval()
        test = run.bundle.test
        # The kept epoch's validation pass computed the kept weights' logits, in the same batches;
        # a run resumed after that epoch computes them again.
        val_logits = run.kept_val_logits if run.kept_val_logits is not None else split_logits(run, run.bundle.val)
        test_logits = split_logits(run, test)
        test_acc = (test_logits.argmax(1) == test.labels).double().mean().item() if len(test) else None
        test_ece = float(ece(test_logits.softmax(1), test.labels, n_bins=15)) if len(test) else None
        info.update(status="done", epochs_done=run.cfg.epochs, best_epoch=run.keeper.epoch,
                    best_val_acc=run.kept_record.get("val_acc"), test_acc=test_acc, test_ece=test_ece,
                    wall_time_s=run.elapsed)
        if run.dd.is_main:
            rundir.write_tensors(out / rundir.LOGITS, {"val_logits": val_logits, "val_labels": run.bundle.val.labels,
                                                      "test_logits": test_logits, "test_labels": test.labels})
            rundir.write_json(out / rundir.CONFIG, info)
        tested = (f"test acc {test_acc:.2%}, test ECE {100 * test_ece:.2f}"
                  if test_acc is not None and test_ece is not None else "test acc n/a, test ECE n/a")
        log(f"done: kept epoch {run.keeper.epoch} ({run.cfg.keep}; val acc {info['best_val_acc']:.2%}), "
            f"{tested}, {run.elapsed:.0f}s -> {out}")
        return summary(info)
