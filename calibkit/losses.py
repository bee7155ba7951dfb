"""Calibration losses as drop-in ``nn.Module`` s, and the ``LOSSES`` registry.

Every module is called as ``loss(logits (N, K), targets (N,), features=None) -> 0-dim tensor``
(batch mean), so it replaces ``nn.CrossEntropyLoss()`` in a plain loop. Stateless modules call
one function of :mod:`calibkit.functional.losses`; ``features`` is ignored by all but FeDLaS.

Two losses carry state:

* :class:`AdaFocal` keeps per-bin gammas and the validation bin edges in buffers;
  the trainer calls ``loss.update(val_logits, val_labels)`` after every epoch.
* :class:`FeDLaS` keeps the running feature-norm statistics ``mu``/``sigma`` in buffers and owns a
  trainable gate. The trainer optimises ``list(model.parameters()) + list(loss.parameters())``
  with one optimizer and saves ``loss.state_dict()`` in the checkpoint.

``build("mbls:margin=6,lam=0.1", num_classes=10)`` turns a spec string into a module.
"""

from __future__ import annotations

import inspect
import re

import torch
import torch.distributed as dist
from torch import nn

import calibkit.functional.losses as FL
from calibkit._validation import check_logits, upcast

__all__ = [
    "CrossEntropy", "LabelSmoothing", "Focal", "FLSD", "ECP", "MbLS", "ACLS", "DualFocal",
    "AdaFocal", "FeDLaS", "LOSSES", "build",
]


def _probe(fn, **hparams) -> None:
    """Validate hyperparameters at construction by one call on a 1 x 2 input (same checks as training)."""
    fn(torch.zeros(1, 2), torch.zeros(1, dtype=torch.long), **hparams)


class _Stateless(nn.Module):
    """Calls ``fn(logits, targets, **hparams)``; the hyperparameters are plain attributes."""

    fn = staticmethod(FL.cross_entropy)
    needs_features = False

    def __init__(self, **hparams):
        super().__init__()
        _probe(self.fn, **hparams)
        self.hparams = hparams

    def forward(self, logits, targets, features=None):  # features: accepted and ignored
        return self.fn(logits, targets, **self.hparams)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.hparams.items())


class CrossEntropy(_Stateless):
    """Cross-entropy ``-log p_y``; see :func:`calibkit.functional.cross_entropy`."""

    fn = staticmethod(FL.cross_entropy)

    def __init__(self):
        super().__init__()


class LabelSmoothing(_Stateless):
    """Label smoothing, default ``alpha=0.05``; see :func:`calibkit.functional.label_smoothing`."""

    fn = staticmethod(FL.label_smoothing)

    def __init__(self, alpha: float = 0.05):
        super().__init__(alpha=alpha)


class Focal(_Stateless):
    """Focal loss, default ``gamma=3``; see :func:`calibkit.functional.focal`."""

    fn = staticmethod(FL.focal)

    def __init__(self, gamma: float = 3.0):
        super().__init__(gamma=gamma)


class FLSD(_Stateless):
    """FLSD-53 (gamma 5 if detached ``p_y < 0.2`` else 3); see :func:`calibkit.functional.flsd`."""

    fn = staticmethod(FL.flsd)

    def __init__(self):
        super().__init__()


class ECP(_Stateless):
    """Confidence penalty ``CE - beta H(p)/K``, default ``beta=0.1``; see :func:`calibkit.functional.ecp`."""

    fn = staticmethod(FL.ecp)

    def __init__(self, beta: float = 0.1):
        super().__init__(beta=beta)


class MbLS(_Stateless):
    """Margin-based label smoothing, defaults ``margin=10, lam=0.1``; see :func:`calibkit.functional.mbls`."""

    fn = staticmethod(FL.mbls)

    def __init__(self, margin: float = 10.0, lam: float = 0.1):
        super().__init__(margin=margin, lam=lam)


class ACLS(_Stateless):
    """ACLS, defaults ``alpha=0.1, lam1=1, lam2=0.1, margin=10``; see :func:`calibkit.functional.acls`."""

    fn = staticmethod(FL.acls)

    def __init__(self, alpha: float = 0.1, lam1: float = 1.0, lam2: float = 0.1, margin: float = 10.0):
        super().__init__(alpha=alpha, lam1=lam1, lam2=lam2, margin=margin)


class DualFocal(_Stateless):
    """Dual focal loss, default ``gamma=5``; see :func:`calibkit.functional.dual_focal`."""

    fn = staticmethod(FL.dual_focal)

    def __init__(self, gamma: float = 5.0):
        super().__init__(gamma=gamma)


def _check_classes(logits: torch.Tensor, num_classes: int, who: str) -> None:
    if logits.shape[1] != num_classes:
        raise ValueError(f"{who} was built for num_classes={num_classes} but logits have {logits.shape[1]} columns")


def _check_num_classes(num_classes) -> int:
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    return num_classes


class AdaFocal(nn.Module):
    """AdaFocal (Ghosh et al., NeurIPS 2022): focal loss with one gamma per confidence bin.

    Bins: ``n_bins`` (15) equal-mass bins of the **validation** confidences (max softmax
    probability), recomputed by every :meth:`update`; before the first update the edges are
    equal-width on [0, 1] (all gammas equal ``gamma_init`` then, so the edges do not matter).
    Each training sample takes the gamma of the bin its detached ``p_y`` falls in (values outside
    the validation range go to the first/last bin). Loss: :func:`calibkit.functional.adafocal`,
    i.e. focal for ``g > 0`` and inverse focal ``-(1 + p_y)^|g| log p_y`` for ``g < 0``.

    End-of-epoch rule (:meth:`update`), per bin ``b`` with ``gap_b = conf_b - acc_b`` on val::

        g_b <- g_b * exp(lam * gap_b)    if g_b > 0     (over-confident bin: larger g)
        g_b <- g_b * exp(-lam * gap_b)   if g_b < 0     (over-confident bin: |g| shrinks)
        if |g_b| < flip_threshold: g_b <- -sign(g_b) * flip_threshold
        g_b <- clip(g_b, gamma_min, gamma_max)

    Gammas stay attached to the bin index when the edges are recomputed (the reference
    implementation does the same); an empty bin has gap 0 and keeps its gamma.

    Args:
        num_classes: K (checked against the logits).
        n_bins: number of equal-mass bins (15). lam: update rate (1.0). gamma_init: initial gamma (1.0),
            ``|gamma_init| >= flip_threshold``. gamma_min, gamma_max: clip range (-2, 20).
        flip_threshold: sign-flip threshold (0.2).

    State (buffers, saved by ``state_dict``): ``edges`` (n_bins + 1,), ``gammas`` (n_bins,).
    """

    needs_features = False

    def __init__(self, num_classes: int, n_bins: int = 15, lam: float = 1.0, gamma_init: float = 1.0,
                 gamma_min: float = -2.0, gamma_max: float = 20.0, flip_threshold: float = 0.2):
        super().__init__()
        self.num_classes = _check_num_classes(num_classes)
        if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
            raise ValueError(f"n_bins must be an integer >= 1, got {n_bins!r}")
        if not gamma_min < 0 < flip_threshold <= gamma_max:
            raise ValueError("need gamma_min < 0 < flip_threshold <= gamma_max, got "
                             f"{gamma_min}, {flip_threshold}, {gamma_max}")
        if not (abs(gamma_init) >= flip_threshold and gamma_min <= gamma_init <= gamma_max):
            raise ValueError(f"gamma_init must satisfy |gamma_init| >= {flip_threshold} and lie in "
                             f"[{gamma_min}, {gamma_max}], got {gamma_init}")
        self.n_bins, self.lam = n_bins, float(lam)
        self.gamma_min, self.gamma_max, self.flip_threshold = float(gamma_min), float(gamma_max), float(flip_threshold)
        self.register_buffer("edges", torch.linspace(0.0, 1.0, n_bins + 1))
        self.register_buffer("gammas", torch.full((n_bins,), float(gamma_init)))

    def _bin_of(self, conf: torch.Tensor) -> torch.Tensor:
        # Bin b holds edges[b] <= c < edges[b+1]; bucketize on the interior edges clamps to [0, B-1].
        return torch.bucketize(conf, self.edges[1:-1].to(conf.dtype), right=True)

    def sample_gammas(self, logits, targets) -> torch.Tensor:
        """The (N,) gamma of each sample: the gamma of the bin its detached ``p_y`` falls in."""
        logits, targets = check_logits(logits, targets)
        _check_classes(logits, self.num_classes, "AdaFocal")
        with torch.no_grad():
            p_y = torch.softmax(upcast(logits), 1).gather(1, targets[:, None].to(logits.device)).squeeze(1)
            return self.gammas.to(p_y.device)[self._bin_of(p_y.to(self.edges.device)).to(p_y.device)]

    def forward(self, logits, targets, features=None):
        return FL.adafocal(logits, targets, self.sample_gammas(logits, targets))

    @torch.no_grad()
    def update(self, val_logits, val_labels) -> torch.Tensor:
        """Recompute equal-mass bins on the validation confidences and apply the gamma rule.

        Args:
            val_logits: (M, K) validation logits. val_labels: (M,) validation labels.
        Returns:
            (n_bins,) tensor of ``conf_b - acc_b`` per bin (0 for an empty bin), for logging.
        """
        val_logits, val_labels = check_logits(val_logits, val_labels, name="val_logits")
        _check_classes(val_logits, self.num_classes, "AdaFocal")
        probs = torch.softmax(upcast(val_logits).double(), dim=1).to(self.edges.device)
        conf, pred = probs.max(dim=1)
        correct = (pred == val_labels.to(pred.device)).double()
        # Equal-mass edges: quantiles of the validation confidences; outer edges pinned to 0 and 1.
        edges = torch.quantile(conf, torch.linspace(0, 1, self.n_bins + 1, dtype=conf.dtype, device=conf.device))
        edges[0], edges[-1] = 0.0, 1.0
        self.edges.copy_(edges)
        idx = self._bin_of(conf)
        count = torch.bincount(idx, minlength=self.n_bins).double()
        sum_conf = torch.bincount(idx, weights=conf, minlength=self.n_bins)
        sum_acc = torch.bincount(idx, weights=correct, minlength=self.n_bins)
        gap = torch.where(count > 0, (sum_conf - sum_acc) / count.clamp_min(1), torch.zeros_like(count))
        g = self.gammas.double()
        g = torch.where(g > 0, g * torch.exp(self.lam * gap), g * torch.exp(-self.lam * gap))
        th = self.flip_threshold
        g = torch.where(g.abs() < th, torch.where(g > 0, -th, th).to(g.dtype), g)
        self.gammas.copy_(g.clamp(self.gamma_min, self.gamma_max))
        return gap.float()

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, n_bins={self.n_bins}, lam={self.lam}"


_FEDLAS_DEFAULTS = {
    "ls": {"alpha": 0.05, "beta": 4.0, "theta": 0.95, "margin": None},
    "mbls": {"alpha": 0.1, "beta": 0.5, "theta": 0.95, "margin": 6.0},
}


class FeDLaS(nn.Module):
    """FeDLaS, feature-modulated bidirectional label smoothing (ECCV 2026), spec section 3.

    Per sample, from the detached penultimate features ``z_i`` and detached logits ``s_i``::

        gamma_i = (||z_i||_1 - mu) / (sigma + 1e-3)                        (NCI)
        psi_i   = sign(p1 - p0),  p = softmax(gate(s_i))                    (BCG, in {-1, +1})
        alpha_i = alpha * 2 * sigmoid(beta * psi_i * gamma_i)               (ASM, in (0, 2 alpha))
        LS   variant: mean_i[(1 - alpha_i) NLL_i + alpha_i mean_k(-log p_ik)]
        MbLS variant: mean_i[(1 - alpha_i) NLL_i] + mean_i[alpha_i mean_k relu(d_ik - margin)]

    ``gate`` is ``Linear(K, K//2) -> LeakyReLU(0.01) -> Linear(K//2, 2)``; the sign uses a
    straight-through estimator (forward ``sign``, backward identity); ``sign(0)`` is taken as +1.
    The gate has no loss of its own: its only training signal is the main loss through
    ``alpha_i``. **The trainer must optimise it**: build one optimizer over
    ``list(model.parameters()) + list(loss.parameters())`` (same lr, weight decay and schedule),
    and save ``loss.state_dict()`` (gate weights, ``mu``, ``sigma``) with the model. Under DDP the
    gate is not inside the wrapped model, so its gradients must be all-reduced like the model's
    (e.g. wrap the loss in ``DistributedDataParallel`` too, or all-reduce ``loss.parameters()``
    grads before the step).

    Running statistics (buffers ``mu`` = 20, ``sigma`` = 100 at start) are updated in training
    mode only, before normalising, with ``theta`` weighting the NEW batch::

        mu <- theta * mean_batch + (1 - theta) * mu;  sigma <- theta * std_batch + (1 - theta) * sigma

    ``std_batch`` is the unbiased std; for a batch of one sample (std undefined) sigma is left
    unchanged. When ``torch.distributed`` is initialised the batch mean/std are taken over the
    global batch (all-reduce of count, sum and sum of squares in float64), so every rank keeps
    identical buffers. ``beta = 0`` recovers the base loss with ``alpha_i = alpha``.

    Args:
        num_classes: K. variant: ``"ls"`` or ``"mbls"``.
        alpha, beta, theta, margin: ``None`` takes the variant's default (spec section 3):
            LS alpha 0.05, beta 4, theta 0.95; MbLS alpha 0.1, beta 0.5, theta 0.95, margin 6.
            ``margin`` applies to the MbLS variant only.
    """

    needs_features = True

    def __init__(self, num_classes: int, variant: str = "ls", alpha: float | None = None,
                 beta: float | None = None, theta: float | None = None, margin: float | None = None):
        super().__init__()
        self.num_classes = _check_num_classes(num_classes)
        if variant not in _FEDLAS_DEFAULTS:
            raise ValueError(f"variant must be one of {sorted(_FEDLAS_DEFAULTS)}, got {variant!r}")
        if variant == "ls" and margin is not None:
            raise ValueError("margin applies to FeDLaS variant 'mbls' only")
        d = _FEDLAS_DEFAULTS[variant]
        self.variant = variant
        self.alpha = FL._check_number(d["alpha"] if alpha is None else alpha, "alpha", 0.0)
        self.beta = FL._check_number(d["beta"] if beta is None else beta, "beta")
        self.theta = FL._check_number(d["theta"] if theta is None else theta, "theta", 0.0, 1.0)
        self.margin = None if variant == "ls" else FL._check_number(d["margin"] if margin is None else margin,
                                                                    "margin", 0.0)
        k = self.num_classes
        self.gate = nn.Sequential(nn.Linear(k, k // 2), nn.LeakyReLU(0.01), nn.Linear(k // 2, 2))
        self.register_buffer("mu", torch.tensor(20.0))
        self.register_buffer("sigma", torch.tensor(100.0))

    @torch.no_grad()
    def _update_stats(self, norms: torch.Tensor) -> None:
        # Shift by the current mu (identical on every rank) so the float64 sum of squares does not
        # cancel catastrophically; count, sum and sum of squares are all additive over ranks.
        shift = self.mu.double().to(norms.device)
        x = norms.double() - shift
        stats = torch.stack([torch.tensor(float(x.numel()), dtype=torch.float64, device=x.device),
                             x.sum(), (x * x).sum()])
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(stats, op=dist.ReduceOp.SUM)
        n, s, sq = stats.unbind()
        mean = s / n
        var = (sq - n * mean * mean) / (n - 1).clamp_min(1)
        std = torch.where(n > 1, var.clamp_min(0).sqrt(), self.sigma.double().to(x.device))
        self.mu.copy_(self.theta * (mean + shift) + (1 - self.theta) * self.mu.double().to(x.device))
        self.sigma.copy_(self.theta * std + (1 - self.theta) * self.sigma.double().to(x.device))

    def sign_gate(self, logits: torch.Tensor) -> torch.Tensor:
        """psi in {-1, +1}, shape (N,), with a straight-through gradient to the gate's parameters."""
        w = self.gate[0].weight
        p = torch.softmax(self.gate(logits.detach().to(w.dtype)), dim=1)
        diff = p[:, 1] - p[:, 0]
        hard = torch.where(diff >= 0, 1.0, -1.0).to(diff.dtype)
        return diff + (hard - diff).detach()  # forward: hard sign; backward: identity

    def sample_alphas(self, logits, features) -> torch.Tensor:
        """alpha_i, shape (N,); updates ``mu``/``sigma`` first when in training mode."""
        norms = FL.feature_l1_norms(features)
        if norms.shape[0] != logits.shape[0]:
            raise ValueError(f"features have {norms.shape[0]} rows but logits have {logits.shape[0]}")
        if self.training:
            self._update_stats(norms)
        nci = FL.fedlas_nci(norms, self.mu.to(norms.device, norms.dtype), self.sigma.to(norms.device, norms.dtype))
        return FL.fedlas_alpha(nci, self.sign_gate(logits), self.alpha, self.beta)

    def forward(self, logits, targets, features=None):
        if features is None:
            raise ValueError("FeDLaS needs the penultimate features: call "
                             "loss(logits, targets, features=model.forward_features(x)) "
                             "(FeDLaS.needs_features is True)")
        logits, targets = check_logits(logits, targets)
        _check_classes(logits, self.num_classes, "FeDLaS")
        alpha = self.sample_alphas(logits, features)
        if self.variant == "ls":
            return FL.weighted_label_smoothing(logits, targets, alpha)
        return FL.weighted_mbls(logits, targets, alpha, self.margin)

    def extra_repr(self) -> str:
        m = "" if self.margin is None else f", margin={self.margin}"
        return f"num_classes={self.num_classes}, variant={self.variant!r}, alpha={self.alpha}, " \
               f"beta={self.beta}, theta={self.theta}{m}"


def _fedlas_ls(num_classes: int, alpha: float = 0.05, beta: float = 4.0, theta: float = 0.95) -> FeDLaS:
    return FeDLaS(num_classes, "ls", alpha=alpha, beta=beta, theta=theta)


def _fedlas_mbls(num_classes: int, alpha: float = 0.1, beta: float = 0.5, theta: float = 0.95,
                 margin: float = 6.0) -> FeDLaS:
    return FeDLaS(num_classes, "mbls", alpha=alpha, beta=beta, theta=theta, margin=margin)


# name -> class or factory; `build` reads the hyperparameter names from their signatures.
LOSSES = {
    "ce": CrossEntropy,
    "ls": LabelSmoothing,
    "focal": Focal,
    "flsd": FLSD,
    "ecp": ECP,
    "mbls": MbLS,
    "acls": ACLS,
    "dfl": DualFocal,
    "adafocal": AdaFocal,
    "fedlas_ls": _fedlas_ls,
    "fedlas_mbls": _fedlas_mbls,
}

_INT = re.compile(r"[+-]?\d+")


def _parse_value(text: str):
    """``true``/``false`` -> bool, integers, floats, otherwise the string (quotes stripped). No eval."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if _INT.fullmatch(text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text.strip("'\"")


def build(spec: str, num_classes: int | None = None) -> nn.Module:
    """Build a loss module from ``"name"`` or ``"name:key=value,key=value"``.

    >>> build("mbls:margin=6,lam=0.1")
    MbLS(margin=6, lam=0.1)

    Raises:
        ValueError: unknown name or hyperparameter (listing the valid ones), malformed spec, or a
            loss that needs ``num_classes`` (AdaFocal, FeDLaS) built without it.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"loss spec must be a non-empty string like 'mbls:margin=6', got {spec!r}")
    name, _, rest = spec.partition(":")
    name = name.strip().lower()
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; valid losses: {', '.join(LOSSES)}")
    factory = LOSSES[name]
    params = inspect.signature(factory).parameters
    valid = [p for p in params if p != "num_classes"]
    kwargs = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key or not value.strip():
            raise ValueError(f"malformed item {item!r} in loss spec {spec!r}: expected key=value")
        if key not in valid:
            raise ValueError(f"unknown hyperparameter {key!r} for loss {name!r}; "
                             f"valid: {', '.join(valid) if valid else '(none)'}")
        if key in kwargs:
            raise ValueError(f"hyperparameter {key!r} given twice in loss spec {spec!r}")
        kwargs[key] = _parse_value(value.strip())
    if "num_classes" in params:
        if num_classes is None:
            raise ValueError(f"loss {name!r} needs num_classes: build({spec!r}, num_classes=K)")
        kwargs["num_classes"] = num_classes
    return factory(**kwargs)
