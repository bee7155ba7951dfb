"""MaC-Cal as a scikit-learn style object on features, and feature extraction from any model.

>>> est = MaCCal(model.fc, mc_samples=64).fit(train_feats, train_labels, val_feats, val_labels)
>>> probs = est.predict_proba(test_feats)          # the deployed predictor, (N, K)

``__init__`` only stores hyperparameters; :meth:`MaCCal.fit` learns ``head_``, ``keep_rate_``,
``best_epoch_``, ``history_``. The same object drives ``calibkit maccal``, ``calibkit train
--method maccal`` and the benchmark.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

import calibkit.losses
from calibkit._arrays import array_io
from calibkit.distributed import eval_batch_size
from calibkit.errors import UserError
from calibkit.methods.maccal.masking import check_int, deployed_proba, mc_logits
from calibkit.methods.maccal.stage2 import DEFAULTS, fit_masked_head

__all__ = ["MaCCal", "NotFittedError", "extract_features"]

_PARAMS = ("r_init", "eta", "r_min", "epochs", "lr", "momentum", "weight_decay", "batch_size", "grad_clip",
           "n_bins", "seed", "mc_samples", "loss")


class NotFittedError(ValueError, AttributeError):
    """A :class:`MaCCal` method that needs ``fit`` was called before it."""


class MaCCal:
    """MaC-Cal stage 2: retrain a linear head on frozen features under adaptive random masks.

    Deployed predictor (``mc_samples = S >= 1``, default 64): the average of the probabilities
    of ``S`` masked copies of the retrained head,
    ``p(x) = (1/S) sum_s softmax(x @ ((M_s * W) / r*).T + b)``, ``M_s ~ Bernoulli(r*)`` drawn
    from a fixed seed, at the keep rate ``r*`` the selected head was trained under. It is a
    deterministic function of the features (same input, same output, row by row). The keep-rate
    rule ``r <- clip(r - eta * (c - a), r_min, 1)`` and the epoch selection (lowest validation
    ECE) both score this predictor on the validation split. ``mc_samples = 0`` deploys, steers
    and selects the plain unmasked head instead (deterministic, one head evaluation; measured to
    barely calibrate, see ``docs/maccal.md``). The keep-rate rule is calibkit's own; the
    paper's is not public.

    Args:
        head: the stage-1 last layer, an ``nn.Linear(D, K)`` (copied by ``fit``, never modified).
        r_init, eta, r_min: keep-rate rule: initial rate, step, floor.
        epochs, lr, momentum, weight_decay, batch_size, grad_clip: stage-2 SGD (cosine lr to 0).
        n_bins: bins of the validation ECE that selects the epoch.
        seed: seeds the shuffling, the training masks and (offset) the deployed masks.
        mc_samples: ``S`` masked heads averaged by the deployed predictor; 0 = unmasked head.
        loss: stage-2 loss: ``None`` or ``"ce"`` (cross-entropy), a ``calibkit.losses.build`` spec,
            or a callable ``loss(logits, targets) -> scalar`` (copied by ``fit``).

    Attributes:
        head_: (set by ``fit``, like every attribute below) the selected retrained ``nn.Linear``
            (eval mode, no gradients).
        keep_rate_: ``r*``, the keep rate of the deployed masks.
        best_epoch_: the selected stage-2 epoch (1-based).
        history_: per-epoch records and the keep-rate trajectory (see ``fit_masked_head``).
        n_features_in_, n_classes_: ``D`` and ``K``.
        loss_: the loss module/callable used (its state after training, e.g. AdaFocal's gammas).
    """

    def __init__(self, head: nn.Linear, *, r_init: float = DEFAULTS["r_init"], eta: float = DEFAULTS["eta"],
                 r_min: float = DEFAULTS["r_min"], epochs: int = DEFAULTS["epochs"], lr: float = DEFAULTS["lr"],
                 momentum: float = DEFAULTS["momentum"], weight_decay: float = DEFAULTS["weight_decay"],
                 batch_size: int = DEFAULTS["batch_size"], grad_clip: float | None = DEFAULTS["grad_clip"],
                 n_bins: int = DEFAULTS["n_bins"], seed: int = DEFAULTS["seed"],
                 mc_samples: int = DEFAULTS["mc_samples"], loss: str | Callable | None = None):
        self.head = head
        self.r_init, self.eta, self.r_min = r_init, eta, r_min
        self.epochs, self.lr, self.momentum, self.weight_decay = epochs, lr, momentum, weight_decay
        self.batch_size, self.grad_clip, self.n_bins, self.seed = batch_size, grad_clip, n_bins, seed
        self.mc_samples, self.loss = mc_samples, loss

    def get_params(self, deep: bool = False) -> dict:
        """The constructor arguments (scikit-learn convention)."""
        return {"head": self.head, **{name: getattr(self, name) for name in _PARAMS}}

    def set_params(self, **params) -> MaCCal:
        """Set constructor arguments by name (scikit-learn convention); returns ``self``."""
        for name, value in params.items():
            if name != "head" and name not in _PARAMS:
                raise UserError(f"MaCCal has no parameter {name!r}; valid: head, {', '.join(_PARAMS)}")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        head = f"Linear({self.head.in_features}, {self.head.out_features})" if isinstance(self.head, nn.Linear) \
            else type(self.head).__name__
        return f"MaCCal({head}, " + ", ".join(f"{n}={getattr(self, n)!r}" for n in _PARAMS) + ")"

    def _build_loss(self, num_classes: int):
        if self.loss is None or self.loss == "ce":
            return None
        if isinstance(self.loss, str):
            return calibkit.losses.build(self.loss, num_classes=num_classes).to(self.head.weight.device)
        if callable(self.loss):
            return copy.deepcopy(self.loss)
        raise UserError(f"loss must be None, a loss spec string or a callable, got {self.loss!r}")

    def fit(self, train_features, train_labels, val_features, val_labels,
            progress: Callable[[dict], None] | None = None) -> MaCCal:
        """Retrain the head on ``(N, D)`` training features, steering and selecting on ``(M, D)``
        validation features (never the test split). Labels: integer class indices. Returns ``self``."""
        if not isinstance(self.head, nn.Linear):
            raise UserError(f"head must be an nn.Linear (the model's last layer), got {type(self.head).__name__}")
        K, D = self.head.weight.shape
        tf, tl, vf, vl = (_as_tensor(a) for a in (train_features, train_labels, val_features, val_labels))
        loss_fn = self._build_loss(K)
        hparams = {name: getattr(self, name) for name in _PARAMS if name != "loss"}
        best, history = fit_masked_head(self.head, tf, tl, vf, vl, loss_fn=loss_fn, progress=progress, **hparams)
        self.head_, self.history_ = best, history
        self.keep_rate_, self.best_epoch_ = history["best_keep_rate"], history["best_epoch"]
        self.n_features_in_, self.n_classes_ = D, K
        self.loss_ = loss_fn
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "head_"):
            raise NotFittedError("this MaCCal is not fitted yet; call fit(train_features, train_labels, "
                                 "val_features, val_labels) first")

    @array_io
    @torch.no_grad()
    def predict_proba(self, features, unmasked: bool = False) -> torch.Tensor:
        """``(N, K)`` float32 probabilities of the deployed predictor for ``(N, D)`` features
        (a numpy array for numpy features, a tensor for a tensor: :mod:`calibkit._arrays`).

        ``unmasked=True`` returns ``softmax(head_(features))`` instead: deterministic, one head
        evaluation, but **not** the predictor the keep rate was steered by (with
        ``mc_samples > 0`` it keeps most of the stage-1 over-confidence).
        """
        self._check_fitted()
        x = _as_tensor(features)
        if x.dim() != 2 or x.shape[1] != self.n_features_in_:
            raise UserError(f"features must have shape (N, {self.n_features_in_}), got {tuple(x.shape)}")
        if not x.is_floating_point() or not bool(torch.isfinite(x).all()):
            raise UserError("features must be finite floating-point values (found NaN/inf or integers)")
        w, b = self.head_.weight, self.head_.bias
        x = x.to(w.device, w.dtype)
        return deployed_proba(x, w, b, self.keep_rate_, 0 if unmasked else self.mc_samples, self.seed)

    @array_io
    def predict_log_proba(self, features, unmasked: bool = False) -> torch.Tensor:
        """``log(max(predict_proba, tiny))``: logits whose softmax is the deployed prediction."""
        return mc_logits(self.predict_proba(_as_tensor(features), unmasked=unmasked))

    @array_io
    def predict(self, features) -> torch.Tensor:
        """``(N,)`` predicted classes of the deployed predictor."""
        return self.predict_proba(_as_tensor(features)).argmax(dim=1)


def _as_tensor(a) -> torch.Tensor:
    return a if isinstance(a, torch.Tensor) else torch.as_tensor(a)


def _batches(data, batch_size: int):
    """Yield ``(inputs, labels or None)`` from a tensor, a ``(inputs, labels)`` pair, a Dataset or a DataLoader."""
    if isinstance(data, torch.Tensor):
        for i in range(0, len(data), batch_size):
            yield data[i:i + batch_size], None
        return
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(t, torch.Tensor) for t in data):
        x, y = data
        if len(x) != len(y):
            raise UserError(f"inputs and labels differ in length: {len(x)} vs {len(y)}")
        for i in range(0, len(x), batch_size):
            yield x[i:i + batch_size], y[i:i + batch_size]
        return
    if isinstance(data, torch.utils.data.Dataset):
        data = torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=False)
    for batch in data:
        if isinstance(batch, (tuple, list)):
            yield batch[0], (batch[1] if len(batch) > 1 else None)
        else:
            yield batch, None


@torch.no_grad()
def extract_features(model: nn.Module, data, feature_fn: Callable | None = None, *, batch_size: int | None = None,
                     device=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Penultimate features of any model, computed once, in eval mode, without gradients.

    Args:
        model: the trained network; put in eval mode for the pass (its mode is restored after).
        data: a tensor of inputs, an ``(inputs, labels)`` pair of tensors, a ``Dataset`` or a
            ``DataLoader`` yielding ``inputs`` or ``(inputs, labels, ...)``. Give it without
            random augmentation and unshuffled if the order matters.
        feature_fn: ``feature_fn(model, inputs) -> (B, D)``, everything before the last linear
            layer (e.g. ``lambda m, x: m.body(x)``); default ``model.forward_features(inputs)``.
        batch_size: batch size when ``data`` is a tensor or a Dataset (None: by device, 128 on a
            CPU, 1024 on an accelerator: :func:`calibkit.distributed.eval_batch_size`).
        device: where the model runs (default: the device of its first parameter, else CPU).

    Returns:
        ``(features, labels)``: float32 ``(N, D)`` on the CPU, and int64 ``(N,)`` labels (``None``
        when ``data`` carries none).
    """
    if batch_size is not None:
        check_int(batch_size, "batch_size", 1)
    if feature_fn is None:
        if not hasattr(model, "forward_features"):
            raise UserError(f"{type(model).__name__} has no forward_features(); pass "
                             "feature_fn=lambda model, x: ... (the network up to its last linear layer)")
        feature_fn = type(model).forward_features  # type: ignore[attr-defined]  # checked just above
    if device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
    batch_size = eval_batch_size(device, batch_size)
    was_training = model.training
    model.eval()
    feats: list[torch.Tensor] = []
    labels: list[torch.Tensor | None] = []
    try:
        for x, y in _batches(data, batch_size):
            f = feature_fn(model, x.to(device))
            if not isinstance(f, torch.Tensor) or f.dim() != 2 or f.shape[0] != len(x):
                raise UserError(f"feature_fn must return (B, D) features for a batch of {len(x)}, got "
                                 f"{getattr(f, 'shape', type(f).__name__)}")
            feats.append(f.float().cpu())
            labels.append(None if y is None else torch.as_tensor(y).long().cpu())
    finally:
        model.train(was_training)
    if not feats:
        raise UserError("extract_features: data is empty")
    known = [y for y in labels if y is not None]
    return torch.cat(feats), (torch.cat(known) if len(known) == len(labels) else None)
