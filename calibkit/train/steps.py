"""What one training step computes, per training method: the loss of a prepared batch.

The training loop (:mod:`calibkit.train.loop`) is the same for every method; a method only decides
how a batch becomes a loss. Each step object is called as

    loss, logits, target = step(net, x, y, y_cpu, gens)

with ``net(x) -> (logits, features)``, ``x`` the prepared real batch (augmented and normalised),
``y`` its targets on the device, ``y_cpu`` the same targets on the CPU (for draws that happen on
the host, so that no device->host copy is needed), and ``gens`` the epoch's generators
(``gens.aug`` for augmentation and mixing, on the data's device; ``gens.draw`` on the CPU).
``logits`` and ``target`` are the real batch's, for the running training accuracy.

- ``standard``: the configured loss;
- ``mixup``: soft-label cross-entropy on the Mixup batch (the configured loss must be ``ce``);
- ``regmixup``: the configured loss on the clean batch + soft cross-entropy on its Mixup copy,
  one concatenated forward, weight 1;
- ``csm``: the configured loss on the real batch + ``csm_weight * soft_l2`` on ``csm_per_real``
  generated images per real one (CSM's companion set; 2 and weight 1 in the paper), augmented like
  the real ones, one concatenated forward (``csm_loss="ce"``: soft cross-entropy instead of
  ``soft_l2``, a diagnostic option).

A new method adds a class here and an entry in :data:`STEPS`; the loop does not change.
:class:`EpochSums` keeps each step's loss and correct count on the device for the loop, which reads
them once per epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from calibkit import functional as F_
from calibkit.data import mixup, regmixup
from calibkit.errors import UserError
from calibkit.methods.csm import dataset as csm_dataset  # CSMCompanion read at each call, so a replaced one is used


@dataclass
class EpochGenerators:
    """The random streams of one epoch (see ``calibkit.train.loop``): ``aug`` on the data's
    device (augmentation, Mixup), ``draw`` on the CPU (CSM's companion draws)."""

    aug: torch.Generator
    draw: torch.Generator


class Standard:
    def __init__(self, loss_fn, **_):
        self.loss_fn = loss_fn
        self.needs_features = bool(getattr(loss_fn, "needs_features", False))

    def real_loss(self, logits, feats, y):
        return self.loss_fn(logits, y, feats if self.needs_features else None)

    def __call__(self, net, x, y, y_cpu, gens):
        logits, feats = net(x)
        return self.real_loss(logits, feats, y), logits, y


class Mixup(Standard):
    def __init__(self, loss_fn, num_classes: int, mix_alpha: float, **_):
        super().__init__(loss_fn)
        self.num_classes, self.alpha = num_classes, mix_alpha

    def __call__(self, net, x, y, y_cpu, gens):
        x_mix, soft = mixup(x, y, self.num_classes, self.alpha, gens.aug)
        logits, _ = net(x_mix)
        return F_.soft_cross_entropy(logits, soft), logits, soft.argmax(1)


class RegMixup(Mixup):
    def __call__(self, net, x, y, y_cpu, gens):
        b = len(y)
        x_cat, soft = regmixup(x, y, self.num_classes, self.alpha, gens.aug)
        all_logits, feats = net(x_cat)
        logits = all_logits[:b]
        loss = self.real_loss(logits, feats[:b], y) + F_.soft_cross_entropy(all_logits[b:], soft[b:])
        return loss, logits, y


class CSM(Standard):
    """Real batch + the companion's generated images (drawn on the CPU from the real labels)."""

    def __init__(self, loss_fn, companion, inputs, csm_weight: float = 1.0, csm_per_real: int = 2,
                 csm_loss: str = "l2", **_):
        super().__init__(loss_fn)
        self.companion, self.inputs = companion, inputs
        self.weight, self.per_real = csm_weight, csm_per_real
        self.gen_loss = F_.soft_l2 if csm_loss == "l2" else F_.soft_cross_entropy

    def __call__(self, net, x, y, y_cpu, gens):
        b = len(y)
        gen_x, gen_soft = self.companion.draw(y_cpu, gens.draw, per_real=self.per_real)
        gen_x, _ = self.inputs.train_batch(gen_x.to(x.device, non_blocking=True), None, gens.aug)
        all_logits, feats = net(torch.cat([x, gen_x]))
        logits = all_logits[:b]
        gen_loss = self.gen_loss(all_logits[b:], gen_soft.to(x.device))
        loss = self.real_loss(logits, feats[:b], y) + (gen_loss if self.weight == 1.0 else self.weight * gen_loss)
        return loss, logits, y


STEPS: dict[str, type] = {"standard": Standard, "mixup": Mixup, "regmixup": RegMixup, "csm": CSM}


def build_step(cfg, loss_fn, num_classes: int, inputs, seed: int):
    """The step object of ``cfg.method`` (checks that the method and the loss fit together)."""
    if getattr(inputs, "dense", False) and cfg.method != "standard":
        raise UserError(f"method {cfg.method!r} mixes whole images and their labels; segmentation trains with "
                         "method 'standard' (the dense losses apply per pixel)")
    if cfg.method == "mixup" and cfg.loss.split(":")[0].strip().lower() != "ce":
        raise UserError(f"method mixup trains with soft-label cross-entropy; loss must be 'ce', got {cfg.loss!r}")
    mix_alpha = cfg.mix_alpha or (0.2 if cfg.method == "mixup" else 10.0 if num_classes >= 100 else 20.0)
    companion = None
    if cfg.method == "csm":
        companion = csm_dataset.CSMCompanion(cfg.csm_data, num_classes, seed)
    return STEPS[cfg.method](loss_fn, num_classes=num_classes, mix_alpha=mix_alpha, companion=companion,
                             inputs=inputs, csm_weight=cfg.csm_weight, csm_per_real=cfg.csm_per_real,
                             csm_loss=cfg.csm_loss)


class EpochSums:
    """Per-step records of one epoch kept on the device, read once at its end.

    Each step writes its loss, its count (samples, or labelled pixels for dense targets) and its
    correct count into slot ``step`` of preallocated buffers: four kernels, no host sync. A
    non-finite loss propagates into the epoch's sum; its step is the first non-finite slot.
    """

    def __init__(self, steps: int, device):
        self.loss = torch.zeros(steps, dtype=torch.float32, device=device)
        self.count: torch.Tensor | None = None  # dense targets: labelled pixels per step (else ``sizes``, on the host)
        self.correct = torch.zeros(steps, dtype=torch.long, device=device)
        self.sizes: list[int] = []
        self.steps = 0

    def add(self, step: int, loss, logits, target) -> None:
        self.loss[step] = loss.detach()
        hit = logits.detach().argmax(1) == target
        if logits.dim() > 2:  # dense: a target outside [0, K) is void and counts nowhere
            if self.count is None:
                self.count = torch.zeros_like(self.correct)
            labelled = (target >= 0) & (target < logits.shape[1])
            torch.sum(labelled, dim=tuple(range(labelled.dim())), out=self.count[step])
        else:
            self.sizes.append(len(target))
        torch.sum(hit, dim=tuple(range(hit.dim())), out=self.correct[step])  # one kernel, into the slot
        self.steps = step + 1

    def read(self) -> tuple[float, float, float, int, float]:
        """``(loss sum, correct, count, first non-finite step or -1, its loss)`` of the steps so far."""
        loss = self.loss[:self.steps].double().cpu()
        count = (self.count[:self.steps].double().cpu() if self.count is not None
                 else torch.tensor(self.sizes, dtype=torch.float64))
        bad = (~torch.isfinite(loss)).nonzero()
        first = int(bad[0, 0]) if len(bad) else -1
        return (float((loss * count).sum()), float(self.correct[:self.steps].sum()), float(count.sum()), first,
                float(loss[first]) if first >= 0 else 0.0)
