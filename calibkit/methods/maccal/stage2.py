"""MaC-Cal stage 2 on cached features: retrain a linear head under adaptive DropConnect masks.

The keep-rate rule and the epoch selection are driven by the predictor that is deployed
(:func:`calibkit.methods.maccal.masking.deployed_proba`), so that what the rule steers is what
the user gets. See :mod:`calibkit.methods.maccal` and ``docs/maccal.md``.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from calibkit.errors import UserError, UserRuntimeError
from calibkit.functional import ece
from calibkit.methods.maccal.defaults import DEFAULTS
from calibkit.methods.maccal.masking import (
    check_int,
    check_keep_rate,
    deployed_proba,
    masked_linear,
    update_keep_rate,
)

__all__ = ["DEFAULTS", "fit_masked_head", "check_features"]


def check_features(name: str, feats: torch.Tensor, labels: torch.Tensor, dim: int, num_classes: int) -> None:
    """Raise ``ValueError`` unless ``feats`` is a finite ``(N, dim)`` float tensor, N >= 1, with
    ``(N,)`` integer labels in ``[0, num_classes)``."""
    if not isinstance(feats, torch.Tensor) or not isinstance(labels, torch.Tensor):
        raise UserError(f"{name} features and labels must be torch tensors")
    if feats.dim() != 2 or feats.shape[1] != dim:
        raise UserError(f"{name}_feats must have shape (N, {dim}) to match the head, got {tuple(feats.shape)}")
    if feats.shape[0] == 0:
        raise UserError(f"{name}_feats is empty (N = 0)")
    if not feats.is_floating_point() or not bool(torch.isfinite(feats).all()):
        raise UserError(f"{name}_feats must be finite floating-point values (found NaN/inf or integers)")
    if labels.dim() != 1 or labels.shape[0] != feats.shape[0]:
        raise UserError(f"{name}_labels must have shape ({feats.shape[0]},), got {tuple(labels.shape)}")
    if labels.is_floating_point() or labels.dtype == torch.bool:
        raise UserError(f"{name}_labels must be integer class indices, got dtype {labels.dtype}")
    lo, hi = int(labels.min()), int(labels.max())
    if lo < 0 or hi >= num_classes:
        raise UserError(f"{name}_labels out of range [0, {num_classes - 1}]: found {lo}..{hi}")


def _check_hparams(r_init, eta, r_min, epochs, batch_size, mc_samples) -> float:
    check_int(epochs, "epochs", 1)
    check_int(batch_size, "batch_size", 1)
    check_int(mc_samples, "mc_samples", 0)
    r = check_keep_rate(r_init, "r_init")
    if r < check_keep_rate(r_min, "r_min"):
        raise UserError(f"r_init ({r}) must be >= r_min ({r_min})")
    if not (float(eta) >= 0.0):
        raise UserError(f"eta must be >= 0, got {eta}")
    return r


@torch.no_grad()
def _scores(probs: torch.Tensor, labels: torch.Tensor, n_bins: int, prefix: str = "val_") -> dict:
    """NLL, mean confidence ``c``, accuracy ``a`` and ECE of probabilities ``(N, K)``."""
    conf, pred = probs.max(dim=1)
    nll = -torch.log(probs.double().gather(1, labels[:, None]).clamp_min(1e-300)).mean()
    return {f"{prefix}loss": float(nll), f"{prefix}conf": float(conf.double().mean()),
            f"{prefix}acc": float((pred == labels).double().mean()),
            f"{prefix}ece": float(ece(probs, labels, n_bins=n_bins))}


def _train_epoch(model: nn.Linear, opt, feats, labels, r: float, gen, batch_size: int, loss_fn,
                 grad_clip) -> float:
    """One pass over the shuffled training features with a fresh mask per mini-batch; mean loss."""
    model.train()
    needs_features = bool(getattr(loss_fn, "needs_features", False))
    n = feats.shape[0]
    perm = torch.randperm(n, generator=gen, device=feats.device)
    loss_sum = 0.0
    for start in range(0, n, batch_size):
        idx = perm[start:start + batch_size]
        x, y = feats[idx], labels[idx]
        logits = masked_linear(x, model.weight, model.bias, r, gen)
        loss = loss_fn(logits, y, x) if needs_features else loss_fn(logits, y)
        if not torch.isfinite(loss):
            raise UserRuntimeError(f"stage-2 loss is {float(loss.detach())} (keep rate {r:.3f}); "
                                   f"lower the learning rate (lr {opt.param_groups[0]['lr']:.4g})")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip:  # None or 0 disables clipping, as in the trainer
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        loss_sum += float(loss.detach()) * idx.numel()
    model.eval()
    return loss_sum / n


def _checked_inputs(head: nn.Linear, train_feats, train_labels, val_feats, val_labels):
    """The features and labels checked against ``head`` and moved to its device (features in its
    dtype, labels as int64)."""
    if not isinstance(head, nn.Linear):
        raise UserError(f"head must be an nn.Linear, got {type(head).__name__}")
    K, D = head.weight.shape
    check_features("train", train_feats, train_labels, D, K)
    check_features("val", val_feats, val_labels, D, K)
    device, dtype = head.weight.device, head.weight.dtype
    return (train_feats.to(device, dtype), train_labels.to(device).long(),
            val_feats.to(device, dtype), val_labels.to(device).long())


def _trainable_copy(head: nn.Linear, loss_fn, lr, momentum, weight_decay, epochs):
    """A trainable copy of ``head``, SGD over it (and the loss's own parameters), cosine schedule."""
    model = copy.deepcopy(head).eval()
    for p in model.parameters():  # the caller may have frozen the stage-1 model, head included
        p.requires_grad_(True)
    params = list(model.parameters()) + (list(loss_fn.parameters()) if isinstance(loss_fn, nn.Module) else [])
    opt = torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    return model, opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)


def fit_masked_head(head: nn.Linear, train_feats: torch.Tensor, train_labels: torch.Tensor,
                    val_feats: torch.Tensor, val_labels: torch.Tensor, *,
                    r_init: float = DEFAULTS["r_init"], eta: float = DEFAULTS["eta"],
                    r_min: float = DEFAULTS["r_min"], epochs: int = DEFAULTS["epochs"],
                    lr: float = DEFAULTS["lr"], momentum: float = DEFAULTS["momentum"],
                    weight_decay: float = DEFAULTS["weight_decay"],
                    batch_size: int = DEFAULTS["batch_size"], grad_clip: float | None = DEFAULTS["grad_clip"],
                    n_bins: int = DEFAULTS["n_bins"], seed: int = DEFAULTS["seed"],
                    mc_samples: int = DEFAULTS["mc_samples"], loss_fn: Callable | None = None,
                    progress: Callable[[dict], None] | None = None):
    """Stage 2 of MaC-Cal: retrain a copy of ``head`` under masks whose keep rate follows the
    deployed predictor's confidence-accuracy gap.

    For each epoch ``e = 1..epochs``: train the copy for one pass with ``masked_linear`` at
    keep rate ``r_e`` (one fresh mask per mini-batch); then score the **deployed predictor**
    ``p_e = deployed_proba(val_feats, W_e, b_e, r_e, mc_samples, seed)`` on the validation
    split -- mean confidence ``c_e``, accuracy ``a_e``, ECE -- and set
    ``r_{e+1} = clip(r_e - eta * (c_e - a_e), r_min, 1)``. ``r_1 = r_init``. The returned head
    is the copy of the epoch with the lowest validation ECE of ``p_e`` (first on ties), to be
    deployed at the keep rate ``r_e`` it was trained (and scored) under. The stage-1 head
    (epoch 0, scored by the same predictor at ``r_init``) is recorded but is not a candidate.

    Args:
        head: stage-1 ``nn.Linear(D, K)``; copied, not modified.
        train_feats: ``(N, D)`` cached training features (no augmentation, eval mode).
        train_labels: ``(N,)`` integer labels.
        val_feats, val_labels: ``(M, D)``, ``(M,)`` validation split.
        r_init, eta, r_min: keep-rate rule.
        epochs: number of stage-2 epochs (>= 1).
        lr, momentum, weight_decay: SGD; the lr follows a cosine to 0 over ``epochs``.
        batch_size: mini-batch size; grad_clip: global gradient-norm clip (None or 0 = off).
        n_bins: bins of the validation ECE used for model selection.
        seed: seeds the shuffling and the training masks (a generator on the features' device)
            and, offset, the deployed predictor's masks.
        mc_samples: ``S >= 1``: the deployed predictor averages ``S`` seeded masked heads;
            ``0``: the deterministic unmasked head is deployed (and then drives the rule).
        loss_fn: ``loss_fn(logits, targets) -> scalar``; default cross-entropy. A calibkit loss
            with ``needs_features`` also receives the features; one with ``update``
            (AdaFocal) is updated on the validation logits after every epoch.
        progress: optional callback receiving each epoch's history record.

    Returns:
        ``(best_head, history)``: ``best_head`` a new ``nn.Linear`` in eval mode, no gradients;
        ``history`` a dict: ``records`` (one per epoch, epoch 0 = stage-1 head: ``epoch``,
        ``keep_rate`` (used in the epoch and by its deployed predictor), ``next_keep_rate``,
        ``train_loss``, ``lr``, ``val_loss`` (NLL), ``val_conf``, ``val_acc``, ``val_ece`` of
        the deployed predictor, ``unmasked_val_conf``, ``unmasked_val_ece`` of the bare head,
        ``time_s``), ``best_epoch``, ``best_keep_rate``, ``best_val_ece``, ``keep_rates``
        (r_1..r_E) and ``wall_time_s``.
    """
    r = _check_hparams(r_init, eta, r_min, epochs, batch_size, mc_samples)
    train_feats, train_labels, val_feats, val_labels = _checked_inputs(head, train_feats, train_labels,
                                                                       val_feats, val_labels)
    device = head.weight.device
    loss_fn = loss_fn if loss_fn is not None else F.cross_entropy

    gen = torch.Generator(device=device).manual_seed(int(seed))
    model, opt, sched = _trainable_copy(head, loss_fn, lr, momentum, weight_decay, epochs)

    def score(keep_rate: float) -> dict:
        return _score_deployed(model, val_feats, val_labels, keep_rate, mc_samples, seed, n_bins)

    t_start = time.perf_counter()
    records = [{"epoch": 0, "keep_rate": r, "next_keep_rate": r, "train_loss": None, "lr": None,
                "time_s": 0.0, **score(r)}]
    if progress:
        progress(records[0])
    best: dict[str, Any] = {"ece": math.inf, "state": None, "epoch": None, "r": None}
    for epoch in range(1, epochs + 1):
        lr_now = opt.param_groups[0]["lr"]
        train_loss = _train_epoch(model, opt, train_feats, train_labels, r, gen, batch_size, loss_fn, grad_clip)
        sched.step()
        stats = score(r)
        if hasattr(loss_fn, "update"):
            with torch.no_grad():
                loss_fn.update(model(val_feats), val_labels)
        r_next = update_keep_rate(r, stats["val_conf"], stats["val_acc"], eta, r_min)
        records.append({"epoch": epoch, "keep_rate": r, "next_keep_rate": r_next, "train_loss": train_loss,
                        "lr": lr_now, "time_s": time.perf_counter() - t_start, **stats})
        if progress:
            progress(records[-1])
        if stats["val_ece"] < best["ece"]:
            best = {"ece": stats["val_ece"], "epoch": epoch, "r": r,
                    "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
        r = r_next

    return _best_head_and_history(head, best, records, t_start)


def _score_deployed(model: nn.Linear, val_feats: torch.Tensor, val_labels: torch.Tensor, keep_rate: float,
                    mc_samples: int, seed: int, n_bins: int) -> dict:
    """The validation scores of the deployed predictor at ``keep_rate``, with the bare head's
    confidence and ECE beside them."""
    with torch.no_grad():
        probs = deployed_proba(val_feats, model.weight, model.bias, keep_rate, mc_samples, seed)
        bare = torch.softmax(model(val_feats).float(), dim=1)
    bare_scores = _scores(bare, val_labels, n_bins, prefix="unmasked_val_")
    return {**_scores(probs, val_labels, n_bins),
            "unmasked_val_conf": bare_scores["unmasked_val_conf"],
            "unmasked_val_ece": bare_scores["unmasked_val_ece"]}


def _best_head_and_history(head: nn.Linear, best: dict, records: list[dict], t_start: float):
    """A frozen copy of ``head`` holding the best epoch's weights, and the history dict that
    :func:`fit_masked_head` documents."""
    best_head = copy.deepcopy(head)
    best_head.load_state_dict(best["state"])
    best_head.eval().requires_grad_(False)
    history = {"records": records, "best_epoch": best["epoch"], "best_keep_rate": best["r"],
               "best_val_ece": best["ece"], "keep_rates": [rec["keep_rate"] for rec in records[1:]],
               "wall_time_s": time.perf_counter() - t_start}
    return best_head, history
