"""The checkpoint policy: which epoch's weights a run keeps as its result.

Calibration changes a lot over training, so which weights are kept is part of the protocol and is
recorded with every run (``config.keep`` in ``config.json``). The policies:

- ``best-acc``: the epoch with the highest validation accuracy (the shared protocol of the
  calibration literature; ties: the earliest such epoch);
- ``best-nll``: the epoch with the lowest validation negative log-likelihood;
- ``best-ece``: the epoch with the lowest validation ECE (15 equal-width bins);
- ``best-miou``: segmentation only: the highest validation mean IoU (the MbLS segmentation code's
  selection rule);
- ``last``: the weights after the final epoch.

Every policy reads the validation split only; the test split never takes part.
"""

from __future__ import annotations

from calibkit.config import KEEP_POLICIES
from calibkit.errors import UserError

# policy -> (validation record key, sign): the kept epoch maximises sign * record[key]
_SCORE = {"best-acc": ("val_acc", 1.0), "best-nll": ("val_loss", -1.0), "best-ece": ("val_ece", -1.0),
          "best-miou": ("val_miou", 1.0)}


class Keeper:
    """Tracks the epoch a policy keeps.

    Args:
        policy: one of :data:`KEEP_POLICIES`.
        state: a dict from :meth:`state_dict` (resuming), or None.

    >>> k = Keeper("best-nll")
    >>> [k.offer(e, {"val_loss": v}) for e, v in enumerate([0.9, 0.5, 0.7], start=1)]
    [True, True, False]
    >>> k.epoch
    2
    """

    def __init__(self, policy: str, state: dict | None = None):
        if policy not in KEEP_POLICIES:
            raise UserError(f"keep: unknown checkpoint policy {policy!r}; valid: {', '.join(KEEP_POLICIES)}")
        self.policy = policy
        self.score = float(state["score"]) if state else float("-inf")
        self.epoch = int(state["epoch"]) if state else 0

    def offer(self, epoch: int, record: dict) -> bool:
        """Consider the weights after ``epoch`` (1-based) with validation ``record``; True if kept."""
        if self.policy == "last":
            self.score, self.epoch = float(epoch), epoch
            return True
        key, sign = _SCORE[self.policy]
        score = sign * float(record[key])
        if score > self.score:  # strict: ties keep the earlier epoch
            self.score, self.epoch = score, epoch
            return True
        return False

    def state_dict(self) -> dict:
        return {"policy": self.policy, "score": self.score, "epoch": self.epoch}
