"""MaC-Cal: masked classifier retraining (Pattern Recognition 2026), calibkit's version.

Two stages. Stage 1 is any ordinary calibkit run (backbone + linear head trained jointly, any
loss; default cross-entropy). Stage 2, implemented here, freezes the backbone and retrains only
the linear head under random masks whose keep (retention) rate adapts to the gap between the
validation confidence and accuracy.

What the paper establishes, and what calibkit decided
------------------------------------------------------
The paper states the two stages, the random masking of the classifier's parameters and that the
keep rate is adjusted from the deviation between confidence and accuracy. **The published
keep-rate update rule is not public.** The rule below is calibkit's own, documented choice
(``docs/maccal.md``), not a reproduction of the authors' code:

* every optimisation step draws an i.i.d. mask ``M ~ Bernoulli(r)`` of the head's weight shape
  ``(K, D)``, shared by the whole mini-batch, and uses ``W_eff = (M * W) / r`` (DropConnect
  style, so ``E[W_eff] = W``); the bias is never masked;
* after every stage-2 epoch, on the validation split and with the **unmasked** head:
  ``c = mean_i max_k p_ik`` (mean confidence), ``a = mean_i [argmax_k p_ik == y_i]`` (accuracy),
  then ``r <- clip(r - eta * (c - a), r_min, 1)``: over-confidence (c > a) masks more, which
  regularises the head; under-confidence (c < a) masks less;
* the epoch with the lowest validation ECE (15 equal-width bins) is kept.

Stage-2 optimiser (the paper is silent; calibkit's decision): SGD, lr 0.01, momentum 0.9,
weight decay 5e-4, cosine annealing of the lr to 0 over the stage-2 epochs (stepped once per
epoch), batch 128, gradient clipping at global norm 2 (the shared protocol of this
literature), loss = cross-entropy unless another calibkit loss is given.

Inference uses the full unmasked head (deterministic). Optionally, ``mc_samples > 0`` averages
the *probabilities* of that many masked heads drawn at the best epoch's keep rate.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "DEFAULTS",
    "bernoulli_mask",
    "masked_linear",
    "update_keep_rate",
    "mc_predict_proba",
    "mc_logits",
    "head_logits",
    "fit_masked_head",
    "extract_features",
    "run_maccal",
]

# Stage-2 defaults: the spec's (r_init, eta, r_min, epochs) plus calibkit's optimiser decision.
DEFAULTS = {
    "r_init": 0.9,
    "eta": 1.0,
    "r_min": 0.1,
    "epochs": 20,
    "lr": 0.01,
    "momentum": 0.9,
    "weight_decay": 5e-4,
    "batch_size": 128,
    "grad_clip": 2.0,
    "n_bins": 15,
    "seed": 0,
}


def _check_keep_rate(keep_rate: float, name: str = "keep_rate") -> float:
    if isinstance(keep_rate, bool) or not isinstance(keep_rate, (int, float)):
        raise ValueError(f"{name} must be a number in (0, 1], got {keep_rate!r}")
    keep_rate = float(keep_rate)
    if not (0.0 < keep_rate <= 1.0) or math.isnan(keep_rate):
        raise ValueError(f"{name} must lie in (0, 1], got {keep_rate}")
    return keep_rate


def bernoulli_mask(shape, keep_rate: float, generator: torch.Generator | None = None,
                   device=None, dtype=torch.float32) -> torch.Tensor:
    """An i.i.d. Bernoulli(keep_rate) 0/1 mask.

    Args:
        shape: shape of the mask, e.g. the head's weight shape ``(K, D)``.
        keep_rate: probability ``r`` in (0, 1] that an entry is kept (is 1).
        generator: source of randomness (its device must match ``device``); ``None`` uses the
            global generator.
        device, dtype: of the returned mask.

    Returns:
        Tensor of ``shape`` with entries in {0, 1}; all ones when ``keep_rate == 1``.
    """
    keep_rate = _check_keep_rate(keep_rate)
    if keep_rate == 1.0:
        # Exact no-op: do not consume random numbers either, so r = 1 is plain training.
        return torch.ones(shape, device=device, dtype=dtype)
    u = torch.rand(shape, generator=generator, device=device, dtype=torch.float32)
    return (u < keep_rate).to(dtype)


def masked_linear(features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  keep_rate: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Linear layer with a fresh DropConnect mask on the weight matrix.

    ``logits = features @ ((M * W) / r).T + b`` with ``M ~ Bernoulli(r)`` i.i.d. of shape
    ``(K, D)``, drawn anew on every call and shared by the ``N`` rows of ``features``. The
    ``1/r`` scaling makes the expected logit equal to the unmasked one:
    ``E[logits] = features @ W.T + b``. The bias is not masked. Gradients reach ``weight``
    only through kept entries (scaled by ``1/r``).

    Args:
        features: ``(N, D)`` penultimate features.
        weight: ``(K, D)`` head weight.
        bias: ``(K,)`` head bias or ``None``.
        keep_rate: ``r`` in (0, 1].
        generator: randomness for the mask (on ``weight``'s device).

    Returns:
        ``(N, K)`` logits.

    >>> f = torch.ones(1, 2); w = torch.tensor([[1.0, 2.0]]); b = torch.zeros(1)
    >>> masked_linear(f, w, b, 1.0)
    tensor([[3.]])
    """
    if features.dim() != 2 or weight.dim() != 2 or features.shape[1] != weight.shape[1]:
        raise ValueError(
            f"features (N, D) and weight (K, D) must agree on D, got {tuple(features.shape)} "
            f"and {tuple(weight.shape)}"
        )
    mask = bernoulli_mask(weight.shape, keep_rate, generator, weight.device, weight.dtype)
    return F.linear(features, weight * mask / float(keep_rate), bias)


def update_keep_rate(r: float, conf: float, acc: float, eta: float = 1.0, r_min: float = 0.1) -> float:
    """calibkit's keep-rate rule: ``r' = clip(r - eta * (conf - acc), r_min, 1)``.

    Over-confidence (``conf > acc``) lowers the keep rate (more masking); under-confidence
    raises it. This is calibkit's documented rule; the paper's own rule is not public.

    Args:
        r: current keep rate in (0, 1].
        conf: mean max-probability on the validation split, in [0, 1].
        acc: validation accuracy, in [0, 1].
        eta: step size (>= 0).
        r_min: floor of the keep rate, in (0, 1].

    >>> round(update_keep_rate(0.9, conf=0.95, acc=0.85, eta=1.0, r_min=0.1), 6)
    0.8
    >>> update_keep_rate(0.9, conf=0.5, acc=0.9)
    1.0
    """
    r = _check_keep_rate(r, "r")
    r_min = _check_keep_rate(r_min, "r_min")
    for name, v in (("conf", conf), ("acc", acc)):
        if not (0.0 <= float(v) <= 1.0):
            raise ValueError(f"{name} must lie in [0, 1], got {v}")
    if not (float(eta) >= 0.0):
        raise ValueError(f"eta must be >= 0, got {eta}")
    return float(min(1.0, max(r_min, r - float(eta) * (float(conf) - float(acc)))))


@torch.no_grad()
def mc_predict_proba(features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     keep_rate: float, mc_samples: int,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """Monte-Carlo average of probabilities over masked heads.

    ``p = (1/S) sum_s softmax(masked_linear(features, W, b, r))`` with ``S = mc_samples``
    independent masks (each mask shared by all ``N`` rows, as in training). Probabilities are
    averaged, never logits.

    Args:
        features: ``(N, D)``; weight ``(K, D)``; bias ``(K,)`` or None.
        keep_rate: ``r`` in (0, 1]; mc_samples: ``S >= 1``.

    Returns:
        ``(N, K)`` float32 probabilities (rows sum to 1).
    """
    if isinstance(mc_samples, bool) or not isinstance(mc_samples, int) or mc_samples < 1:
        raise ValueError(f"mc_samples must be an integer >= 1, got {mc_samples!r}")
    total = None
    for _ in range(mc_samples):
        p = torch.softmax(masked_linear(features, weight, bias, keep_rate, generator).float(), dim=1)
        total = p if total is None else total + p
    return total / mc_samples


def mc_logits(probs: torch.Tensor) -> torch.Tensor:
    """Logits stored for Monte-Carlo inference: ``log(max(p, tiny))``.

    Because the rows of ``probs`` sum to 1, ``softmax(log p) = p`` exactly (up to the clamp at
    float32's tiny), so every reader that applies softmax to stored logits recovers the
    averaged probabilities.
    """
    return torch.log(probs.float().clamp_min(torch.finfo(torch.float32).tiny))


@torch.no_grad()
def head_logits(features: torch.Tensor, head: nn.Linear, mc_samples: int = 0, keep_rate: float | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Inference logits of a MaC-Cal head on features.

    Args:
        features: ``(N, D)``.
        head: the stage-2 ``nn.Linear(D, K)``.
        mc_samples: 0 (default) = the full unmasked head, deterministic: ``head(features)``.
            ``S > 0`` = Monte-Carlo: ``mc_logits(mc_predict_proba(features, W, b, keep_rate, S))``,
            i.e. the log of the probabilities averaged over ``S`` masks.
        keep_rate: the keep rate of the masks (required when ``mc_samples > 0``).
        generator: randomness of the Monte-Carlo masks.

    Returns:
        ``(N, K)`` float32 logits; ``softmax`` of them is the prediction.
    """
    if isinstance(mc_samples, bool) or not isinstance(mc_samples, int) or mc_samples < 0:
        raise ValueError(f"mc_samples must be an integer >= 0, got {mc_samples!r}")
    if mc_samples == 0:
        return head(features).float()
    if keep_rate is None:
        raise ValueError("keep_rate is required for Monte-Carlo inference (mc_samples > 0)")
    return mc_logits(mc_predict_proba(features, head.weight, head.bias, keep_rate, mc_samples, generator))


@torch.no_grad()
def _val_stats(head: nn.Linear, feats: torch.Tensor, labels: torch.Tensor, n_bins: int) -> dict:
    """Mean confidence, accuracy and ECE of the *unmasked* head on (feats, labels)."""
    from calibkit.functional import ece  # metrics layer; imported here to keep import time low

    logits = head(feats).float()
    probs = torch.softmax(logits, dim=1)
    conf, pred = probs.max(dim=1)
    return {
        "val_loss": float(F.cross_entropy(logits.double(), labels)),
        "val_conf": float(conf.double().mean()),
        "val_acc": float((pred == labels).double().mean()),
        "val_ece": float(ece(probs, labels, n_bins=n_bins)),
    }


def fit_masked_head(head: nn.Linear, train_feats: torch.Tensor, train_labels: torch.Tensor,
                    val_feats: torch.Tensor, val_labels: torch.Tensor, *,
                    r_init: float = DEFAULTS["r_init"], eta: float = DEFAULTS["eta"],
                    r_min: float = DEFAULTS["r_min"], epochs: int = DEFAULTS["epochs"],
                    lr: float = DEFAULTS["lr"], momentum: float = DEFAULTS["momentum"],
                    weight_decay: float = DEFAULTS["weight_decay"],
                    batch_size: int = DEFAULTS["batch_size"], grad_clip: float | None = DEFAULTS["grad_clip"],
                    n_bins: int = DEFAULTS["n_bins"], seed: int = DEFAULTS["seed"],
                    loss_fn: Callable | None = None, progress: Callable[[dict], None] | None = None):
    """Stage 2 of MaC-Cal on cached features: retrain a linear head under adaptive masks.

    The head is copied (``head`` itself is left untouched), trained for ``epochs`` epochs with
    ``masked_linear`` at the current keep rate ``r`` (one fresh mask per mini-batch), and after
    each epoch the unmasked copy is scored on the validation features:
    ``c, a, ECE``; then ``r <- update_keep_rate(r, c, a, eta, r_min)``. The returned head is the
    copy at the stage-2 epoch with the lowest validation ECE (first such epoch on ties); the
    stage-1 head itself (epoch 0) is recorded for reference but is not a candidate.

    Args:
        head: stage-1 ``nn.Linear(D, K)``; copied, not modified.
        train_feats: ``(N, D)`` cached training features (no augmentation, eval mode).
        train_labels: ``(N,)`` int64.
        val_feats, val_labels: ``(M, D)``, ``(M,)`` validation split.
        r_init, eta, r_min: keep-rate rule (see module docstring).
        epochs: number of stage-2 epochs (>= 1).
        lr, momentum, weight_decay: SGD; the lr follows a cosine to 0 over ``epochs``.
        batch_size: mini-batch size; grad_clip: global gradient-norm clip (None or 0 = off).
        n_bins: bins of the validation ECE used for model selection.
        seed: seeds the shuffling and the masks (a generator on the features' device).
        loss_fn: ``loss_fn(logits, targets) -> scalar``; default cross-entropy. A calibkit loss
            module with ``needs_features`` also receives the features as third argument; one with ``update``
            (AdaFocal) is updated on the validation logits after every epoch.
        progress: optional callback receiving each epoch's history record.

    Returns:
        ``(best_head, history)``: ``best_head`` is a new ``nn.Linear`` in eval mode;
        ``history`` is a dict with ``records`` (one per epoch, epoch 0 = stage-1 head:
        ``epoch, keep_rate`` (used during the epoch), ``next_keep_rate``, ``val_loss`` (NLL),
        ``val_conf``, ``val_acc``, ``val_ece``, ``train_loss``, ``lr``, ``time_s``), ``best_epoch``,
        ``best_keep_rate`` (the rate the best head was trained under), ``keep_rates`` (the
        trajectory r_1..r_E), and ``wall_time_s``.
    """
    if not isinstance(head, nn.Linear):
        raise ValueError(f"head must be an nn.Linear, got {type(head).__name__}")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be an integer >= 1, got {epochs!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    r = _check_keep_rate(r_init, "r_init")
    _check_keep_rate(r_min, "r_min")
    if r < r_min:
        raise ValueError(f"r_init ({r}) must be >= r_min ({r_min})")
    if not (float(eta) >= 0.0):
        raise ValueError(f"eta must be >= 0, got {eta}")
    K, D = head.weight.shape
    for name, f, y in (("train", train_feats, train_labels), ("val", val_feats, val_labels)):
        if f.dim() != 2 or f.shape[1] != D:
            raise ValueError(f"{name}_feats must have shape (N, {D}) to match the head, got {tuple(f.shape)}")
        if y.dim() != 1 or y.shape[0] != f.shape[0]:
            raise ValueError(f"{name}_labels must have shape ({f.shape[0]},), got {tuple(y.shape)}")
        if f.shape[0] == 0:
            raise ValueError(f"{name}_feats is empty (N = 0)")
        if int(y.min()) < 0 or int(y.max()) >= K:
            raise ValueError(f"{name}_labels out of range [0, {K - 1}]: found {int(y.min())}..{int(y.max())}")

    device = head.weight.device
    train_feats, val_feats = train_feats.to(device), val_feats.to(device)
    train_labels, val_labels = train_labels.to(device).long(), val_labels.to(device).long()
    loss_fn = loss_fn if loss_fn is not None else F.cross_entropy
    needs_features = bool(getattr(loss_fn, "needs_features", False))

    gen = torch.Generator(device=device).manual_seed(int(seed))
    model = copy.deepcopy(head).train()
    for p in model.parameters():  # the caller may have frozen the stage-1 model, head included
        p.requires_grad_(True)
    params = list(model.parameters()) + (list(loss_fn.parameters()) if isinstance(loss_fn, nn.Module) else [])
    opt = torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)

    t_start = time.perf_counter()
    model.eval()
    rec0 = {"epoch": 0, "keep_rate": None, "next_keep_rate": r, "train_loss": None, "lr": None,
            "time_s": 0.0, **_val_stats(model, val_feats, val_labels, n_bins)}
    records = [rec0]
    if progress:
        progress(rec0)
    best_ece, best_state, best_epoch, best_r = math.inf, None, None, None
    n = train_feats.shape[0]
    for epoch in range(1, epochs + 1):
        model.train()
        lr_now = opt.param_groups[0]["lr"]
        perm = torch.randperm(n, generator=gen, device=device)
        loss_sum = 0.0
        for start in range(0, n, batch_size):
            idx = perm[start:start + batch_size]
            x, y = train_feats[idx], train_labels[idx]
            logits = masked_linear(x, model.weight, model.bias, r, gen)
            loss = loss_fn(logits, y, x) if needs_features else loss_fn(logits, y)
            if not torch.isfinite(loss):
                raise RuntimeError(f"stage-2 loss is {float(loss)} at epoch {epoch} (keep rate {r:.3f}); "
                                   f"lower the learning rate (lr {lr_now:.4g})")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip:  # None or 0 disables clipping, as in the trainer
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            opt.step()
            loss_sum += float(loss.detach()) * idx.numel()
        sched.step()
        model.eval()
        stats = _val_stats(model, val_feats, val_labels, n_bins)
        if hasattr(loss_fn, "update"):
            with torch.no_grad():
                loss_fn.update(model(val_feats), val_labels)
        r_used = r
        r = update_keep_rate(r, stats["val_conf"], stats["val_acc"], eta, r_min)
        rec = {"epoch": epoch, "keep_rate": r_used, "next_keep_rate": r, "train_loss": loss_sum / n,
               "lr": lr_now, "time_s": time.perf_counter() - t_start, **stats}
        records.append(rec)
        if progress:
            progress(rec)
        if stats["val_ece"] < best_ece:
            best_ece, best_epoch, best_r = stats["val_ece"], epoch, r_used
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    best_head = copy.deepcopy(head)
    best_head.load_state_dict(best_state)
    best_head.eval()
    for p in best_head.parameters():
        p.requires_grad_(False)
    history = {
        "records": records,
        "best_epoch": best_epoch,
        "best_keep_rate": best_r,
        "best_val_ece": best_ece,
        "keep_rates": [rec["keep_rate"] for rec in records[1:]],
        "wall_time_s": time.perf_counter() - t_start,
    }
    return best_head, history


# ---------------------------------------------------------------------------------------------
# Run-level glue: a stage-1 run directory in, a MaC-Cal run directory out.
# ---------------------------------------------------------------------------------------------
MACCAL_JSON = "maccal.json"
RULE = ("calibkit's own rule (the published MaC-Cal keep-rate rule is not public): "
        "r <- clip(r - eta * (c - a), r_min, 1) after each stage-2 epoch, with c = mean max-probability "
        "and a = accuracy of the unmasked head on the validation split")


@torch.no_grad()
def extract_features(model: nn.Module, images: torch.Tensor, mean, std, batch_size: int = 1024,
                     device=None) -> torch.Tensor:
    """Penultimate features ``model.forward_features(normalize(images))`` in eval mode, no augmentation.

    Args:
        model: a calibkit model (``forward_features(x) -> (N, D)``).
        images: uint8 ``(N, C, H, W)``.
        mean, std: the stage-1 run's normalisation (``config.json``'s ``mean``/``std``).

    Returns:
        float32 ``(N, D)`` on ``device`` (default: the model's device).
    """
    from calibkit.data import normalize

    device = device if device is not None else next(model.parameters()).device
    model.eval()
    out = [model.forward_features(normalize(images[i:i + batch_size].to(device), mean, std)).float()
           for i in range(0, len(images), batch_size)]
    return torch.cat(out)


def _stage1(stage1_dir) -> tuple[Path, dict]:
    """Check that ``stage1_dir`` is a finished calibkit run; return its path and config.json."""
    from calibkit import rundir

    path = Path(stage1_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"stage-1 run directory {path} not found")
    if not (path / rundir.CONFIG).is_file():
        raise FileNotFoundError(f"stage-1: {path} is not a calibkit run directory (no {rundir.CONFIG})")
    info = rundir.load_info(path)
    if info.get("method") == "maccal":
        raise ValueError(f"stage-1: {path} is itself a MaC-Cal run; pass the stage-1 run it was made from "
                         f"({info.get('stage1', {}).get('path')})")
    if info.get("status") != "done" or not (path / rundir.MODEL).is_file():
        raise ValueError(f"stage-1: {path} is not a finished run (status {info.get('status')!r}); "
                         "finish training it first (run the same calibkit train command again)")
    return path, info


def _check_out(out: Path, stage1: Path) -> None:
    if out.resolve() == stage1.resolve():
        raise ValueError(f"out: {out} is the stage-1 run itself; choose another directory")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"out: {out} exists and is not empty; choose another directory "
                         "(a MaC-Cal run is never overwritten)")


def run_maccal(stage1_dir, out_dir, *, r_init: float = DEFAULTS["r_init"], eta: float = DEFAULTS["eta"],
               r_min: float = DEFAULTS["r_min"], epochs: int = DEFAULTS["epochs"], lr: float = DEFAULTS["lr"],
               momentum: float = DEFAULTS["momentum"], weight_decay: float = DEFAULTS["weight_decay"],
               batch_size: int = DEFAULTS["batch_size"], grad_clip: float | None = DEFAULTS["grad_clip"],
               n_bins: int = DEFAULTS["n_bins"], seed: int = DEFAULTS["seed"], mc_samples: int = 0,
               loss: str = "ce", data_dir: str | None = None, device: str = "auto",
               eval_batch_size: int = 1024, log: Callable[[str], None] | None = None) -> dict:
    """MaC-Cal stage 2 on a finished stage-1 run; writes a standard run directory.

    Steps: load the stage-1 run (``load_run``; best-validation-accuracy weights), reload its data
    split (same data set, seed, sizes; the validation checksum must match), freeze the backbone
    and compute the features of the train / val / test splits once (eval mode, no augmentation),
    run :func:`fit_masked_head`, and write ``out_dir``:

    * ``config.json``: the stage-1 ``config.json`` with ``config.method = "maccal"`` (the other
      ``config`` fields stay stage 1's, which is what ``load_run`` needs to rebuild the model),
      top-level ``method: "maccal"``, ``stage1: {path, config, git_commit}``, ``maccal`` (every
      stage-2 hyperparameter), this checkout's environment, and ``status: "done"``;
    * ``model.safetensors``: the frozen stage-1 backbone with the new head (same keys as stage 1);
    * ``logits.safetensors``: val/test logits of the new head -- the full head, or with
      ``mc_samples > 0`` the log of the Monte-Carlo averaged probabilities (``mc_logits``), so
      ``softmax(stored logits)`` is the prediction either way;
    * ``history.json``: one record per stage-2 epoch (epoch 0 = the stage-1 head);
    * ``maccal.json``: keep-rate trajectory, per-epoch val ECE, best epoch, stage-2 wall time.

    Args:
        stage1_dir: a finished ``calibkit train`` run (any loss).
        out_dir: a new or empty directory.
        r_init, eta, r_min, epochs, lr, momentum, weight_decay, batch_size, grad_clip, n_bins, seed:
            see :func:`fit_masked_head`.
        mc_samples: 0 = full-head inference; S > 0 = average of S masked heads' probabilities at the
            best epoch's keep rate (masks drawn from ``seed``).
        loss: stage-2 loss spec for ``calibkit.losses.build`` (default ``"ce"``); ``"stage1"``
            reuses the stage-1 run's loss spec.
        data_dir: where the data set is (default: the stage-1 run's ``data_dir``).
        device: ``auto`` (CUDA if available), ``cpu``, ``cuda`` or ``cuda:N``.
        eval_batch_size: images per forward pass when computing features.
        log: callable receiving progress lines (default: silent).

    Returns:
        Summary dict: ``status``, ``out_dir``, ``best_epoch``, ``best_keep_rate``, ``keep_rates``,
        ``val_ece`` (best), ``test_acc``, ``test_ece``, ``wall_time_s`` (stage 2 only),
        ``feature_time_s``.
    """
    from calibkit import rundir
    from calibkit.data import load
    from calibkit.functional import ece
    from calibkit.losses import build

    log = log or (lambda line: None)
    stage1, info1 = _stage1(stage1_dir)
    out = Path(out_dir)
    _check_out(out, stage1)
    if isinstance(mc_samples, bool) or not isinstance(mc_samples, int) or mc_samples < 0:
        raise ValueError(f"mc_samples must be an integer >= 0, got {mc_samples!r}")
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       "cpu" if device == "auto" else device)

    model, cfg, _ = rundir.load_run(stage1)
    model.to(dev).eval()
    for p in model.parameters():  # the backbone is frozen; only a copy of the head is trained
        p.requires_grad_(False)
    if not isinstance(getattr(model, "head", None), nn.Linear) or not hasattr(model, "forward_features"):
        raise ValueError(f"stage-1 model {cfg.model!r} has no linear `head` / `forward_features`")
    split = info1.get("split", {})
    bundle = load(cfg.data, data_dir=data_dir if data_dir is not None else cfg.data_dir,
                  seed=cfg.seed, val_size=cfg.val_size, train_subset=cfg.train_subset)
    if split.get("val_checksum") and bundle.split.get("val_checksum") != split["val_checksum"]:
        raise ValueError(f"stage-1: the validation split reloaded for {cfg.data} differs from the one of "
                         f"{stage1} (checksum {bundle.split.get('val_checksum')} != {split['val_checksum']})")
    mean, std = info1["mean"], info1["std"]

    t0 = time.perf_counter()
    feats = {name: extract_features(model, part.images, mean, std, eval_batch_size, dev)
             for name, part in (("train", bundle.train), ("val", bundle.val), ("test", bundle.test))}
    labels = {name: part.labels.to(dev) for name, part in
              (("train", bundle.train), ("val", bundle.val), ("test", bundle.test))}
    feature_time = time.perf_counter() - t0
    log(f"features: train {tuple(feats['train'].shape)}, val {len(labels['val'])}, "
        f"test {len(labels['test'])} in {feature_time:.1f}s")
    # Consistency of the cached features with stage 1: head(features) must reproduce its val logits.
    stored = rundir.load_logits(stage1)["val_logits"]
    with torch.no_grad():
        stage1_diff = float((model.head(feats["val"]).float().cpu() - stored.float()).abs().max())

    loss_spec = cfg.loss if loss == "stage1" else loss
    loss_fn = build(loss_spec, num_classes=bundle.num_classes).to(dev)
    hparams = {"r_init": r_init, "eta": eta, "r_min": r_min, "epochs": epochs, "lr": lr, "momentum": momentum,
               "weight_decay": weight_decay, "batch_size": batch_size, "grad_clip": grad_clip,
               "n_bins": n_bins, "seed": seed}

    def progress(rec):
        if rec["epoch"] == 0:
            log(f"stage-1 head: val acc {rec['val_acc']:.2%}  conf {rec['val_conf']:.2%}  "
                f"val ECE {100 * rec['val_ece']:.2f}  -> r = {rec['next_keep_rate']:.3f}")
        else:
            log(f"epoch {rec['epoch']:>3}/{epochs}  r {rec['keep_rate']:.3f}  loss {rec['train_loss']:.4f}  "
                f"val acc {rec['val_acc']:.2%}  conf {rec['val_conf']:.2%}  val ECE {100 * rec['val_ece']:.2f}  "
                f"-> r {rec['next_keep_rate']:.3f}")

    best_head, hist = fit_masked_head(model.head, feats["train"], labels["train"], feats["val"], labels["val"],
                                      loss_fn=loss_fn, progress=progress, **hparams)

    # Inference with the selected head (full head, or the Monte-Carlo average over masks).
    gen = torch.Generator(device=dev).manual_seed(int(seed) + 1)  # not the training stream
    logits = {name: head_logits(feats[name], best_head, mc_samples, hist["best_keep_rate"], gen).cpu()
              for name in ("val", "test")}
    with torch.no_grad():
        model.head.load_state_dict(best_head.state_dict())
    test_acc = float((logits["test"].argmax(1) == labels["test"].cpu()).double().mean())
    test_ece = float(ece(logits["test"].softmax(1), labels["test"].cpu(), n_bins=n_bins))

    out.mkdir(parents=True, exist_ok=True)
    rundir.write_tensors(out / rundir.MODEL, model.state_dict())
    rundir.write_tensors(out / rundir.LOGITS, {"val_logits": logits["val"], "val_labels": bundle.val.labels,
                                              "test_logits": logits["test"], "test_labels": bundle.test.labels})
    rundir.write_json(out / rundir.HISTORY, hist["records"])
    maccal_record = {
        "rule": RULE,
        "hparams": {**hparams, "loss": loss_spec, "mc_samples": mc_samples},
        "inference": ("full unmasked head" if mc_samples == 0 else
                      f"log of the probabilities averaged over {mc_samples} masks at keep rate "
                      f"{hist['best_keep_rate']}"),
        "keep_rates": hist["keep_rates"],
        "val_ece": [rec["val_ece"] for rec in hist["records"][1:]],
        "stage1_val_ece": hist["records"][0]["val_ece"],
        "best_epoch": hist["best_epoch"],
        "best_keep_rate": hist["best_keep_rate"],
        "best_val_ece": hist["best_val_ece"],
        "stage2_wall_time_s": hist["wall_time_s"],
        "feature_time_s": feature_time,
        "stage1_val_logits_max_abs_diff": stage1_diff,
    }
    rundir.write_json(out / MACCAL_JSON, maccal_record)
    info = {**info1, **rundir.environment(),
            "config": {**info1["config"], "method": "maccal"},
            "method": "maccal",
            "stage1": {"path": str(stage1.resolve()), "config": info1["config"],
                       "git_commit": info1.get("git_commit"), "best_epoch": info1.get("best_epoch"),
                       "wall_time_s": info1.get("wall_time_s")},
            "maccal": maccal_record["hparams"],
            "device": str(dev), "status": "done", "epochs_done": epochs, "best_epoch": hist["best_epoch"],
            "best_val_acc": hist["records"][hist["best_epoch"]]["val_acc"],
            "test_acc": test_acc, "test_ece": test_ece, "wall_time_s": hist["wall_time_s"]}
    rundir.write_json(out / rundir.CONFIG, info)  # written last: its status "done" marks a finished run
    log(f"done: best epoch {hist['best_epoch']} (r {hist['best_keep_rate']:.3f}, val ECE "
        f"{100 * hist['best_val_ece']:.2f}), test acc {test_acc:.2%}, test ECE {100 * test_ece:.2f}, "
        f"stage 2 {hist['wall_time_s']:.1f}s -> {out}")
    return {"status": "done", "out_dir": str(out), "best_epoch": hist["best_epoch"],
            "best_keep_rate": hist["best_keep_rate"], "keep_rates": hist["keep_rates"],
            "val_ece": hist["best_val_ece"], "test_acc": test_acc, "test_ece": test_ece,
            "wall_time_s": hist["wall_time_s"], "feature_time_s": feature_time}
