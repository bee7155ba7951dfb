"""AdaFocal: focal loss with one gamma per validation-confidence bin, updated after every epoch."""

from __future__ import annotations

import torch
from torch import nn

import calibkit.functional.losses as FL
from calibkit._validation import check_logits, upcast
from calibkit.errors import UserError
from calibkit.functional.binning import bin_indices, equal_mass_edges
from calibkit.functional.pixels import check_ignore_index, dense_rows, flatten_pixels

from .basic import IGNORE_INDEX, _check_classes, _check_num_classes


class AdaFocal(nn.Module):
    """AdaFocal (Ghosh et al., NeurIPS 2022): focal loss with one gamma per confidence bin.

    Bins: ``n_bins`` (15) equal-mass bins of the **validation** confidences (max softmax
    probability), recomputed by every :meth:`update` with the rule of
    :func:`calibkit.metrics.adaptive_ece` (:func:`calibkit.functional.binning.equal_mass_edges`):
    the inner edge ``j`` is the sorted confidence of rank ``ceil(j N / B) - 1`` (0-based), so bin
    ``b`` holds the ranks ``[ceil(b N / B), ceil((b + 1) N / B))`` (``N / B`` each when ``B``
    divides ``N``), ties whole in the bin of their lowest rank; membership ``(lo, hi]``
    (:func:`~calibkit.functional.binning.bin_indices`), edges and confidences compared in float64.
    Before the first update the edges are equal-width on [0, 1] (all gammas equal ``gamma_init``
    then, so the edges do not matter). Each training sample takes the gamma of the bin its detached
    ``p_y`` falls in under the same ``(lo, hi]`` rule (values outside the validation range go to
    the first/last bin). Loss: :func:`calibkit.functional.adafocal`, i.e. focal for ``g > 0`` and
    inverse focal ``-(1 + p_y)^|g| log p_y`` for ``g < 0``.

    Decisions where calibkit departs from the reference code (3mcloud/adafocal), all for one rule
    across calibkit: its edges interpolate the sorted confidences at positions ``j N / B``, which
    puts one sample too many in bin ``j - 1`` whenever ``j N / B`` is an integer (e.g. 2 bins of
    4 samples hold 3 and 1); here the edges are order statistics and the bins exactly equal-mass
    (when no ``j N / B`` is an integer the two give the same validation bins, with edges that
    differ only between two neighbouring confidences). Its first validation bin is open at the
    smallest confidence, so that sample (and any tied with it) is in no bin; here it is in bin 0,
    as in ``adaptive_ece``. Its training
    lookup uses ``[lo, hi)``, the opposite of its validation rule; here both use ``(lo, hi]``, so a
    training ``p_y`` equal to a validation confidence gets that sample's bin (the two differ only
    for a ``p_y`` exactly on an edge).

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

    Dense prediction: each valid pixel is a sample, in training (its own gamma from its ``p_y``)
    and in :meth:`update`, which takes validation logits ``(M, K)`` -- e.g. a pixel subsample --
    or dense ``(N, K, *S)`` with labels ``(N, *S)``; pixels labelled ``ignore_index`` are left
    out. The bin edges and statistics use every pixel given.

    ``edges`` is float64 (an edge is a float64 validation confidence; rounded to float32 it could
    move a sample on it to another bin); the outer edges are stored as 0 and 1 (they never decide
    a bin).
    """

    needs_features = False
    edges: torch.Tensor  # buffers (register_buffer in __init__)
    gammas: torch.Tensor

    def __init__(self, num_classes: int, n_bins: int = 15, lam: float = 1.0, gamma_init: float = 1.0,
                 gamma_min: float = -2.0, gamma_max: float = 20.0, flip_threshold: float = 0.2,
                 ignore_index: int | None = IGNORE_INDEX):
        super().__init__()
        self.ignore_index = check_ignore_index(ignore_index)
        self.num_classes = _check_num_classes(num_classes)
        if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
            raise UserError(f"n_bins must be an integer >= 1, got {n_bins!r}")
        if not gamma_min < 0 < flip_threshold <= gamma_max:
            raise UserError("need gamma_min < 0 < flip_threshold <= gamma_max, got "
                             f"{gamma_min}, {flip_threshold}, {gamma_max}")
        if not (abs(gamma_init) >= flip_threshold and gamma_min <= gamma_init <= gamma_max):
            raise UserError(f"gamma_init must satisfy |gamma_init| >= {flip_threshold} and lie in "
                             f"[{gamma_min}, {gamma_max}], got {gamma_init}")
        self.n_bins, self.lam = n_bins, float(lam)
        self.gamma_min, self.gamma_max, self.flip_threshold = float(gamma_min), float(gamma_max), float(flip_threshold)
        self.register_buffer("edges", torch.arange(n_bins + 1, dtype=torch.float64) / n_bins)
        self.register_buffer("gammas", torch.full((n_bins,), float(gamma_init)))

    def _bin_of(self, conf: torch.Tensor) -> torch.Tensor:
        # Bin b holds edges[b] < c <= edges[b+1] (values past the outer edges clamp to [0, B-1]), in float64.
        return bin_indices(conf.double(), self.edges.double())

    def sample_gammas(self, logits, targets) -> torch.Tensor:
        """The gamma of each sample: the gamma of the bin its detached ``p_y`` falls in.

        (N,) for (N, K) logits; for dense logits one gamma per pixel, shaped like ``targets``
        (ignored pixels get some gamma; their loss terms are dropped).
        """
        dense = isinstance(logits, torch.Tensor) and logits.dim() >= 3
        if dense:
            rows, y, _ = dense_rows(logits, targets, self.ignore_index)
        else:
            rows, y = check_logits(logits, targets)
        _check_classes(rows, self.num_classes, "AdaFocal")
        with torch.no_grad():
            p_y = torch.softmax(upcast(rows), 1).gather(1, y[:, None].to(rows.device)).squeeze(1)
            g = self.gammas.to(p_y.device)[self._bin_of(p_y.to(self.edges.device)).to(p_y.device)]
        return g.reshape(targets.shape) if dense else g

    def forward(self, logits, targets, features=None):
        return FL.adafocal(logits, targets, self.sample_gammas(logits, targets), ignore_index=self.ignore_index)

    @torch.no_grad()
    def update(self, val_logits, val_labels) -> torch.Tensor:
        """Recompute equal-mass bins on the validation confidences and apply the gamma rule.

        Args:
            val_logits: (M, K) validation logits, or dense ``(N, K, *S)``.
            val_labels: (M,) validation labels, or ``(N, *S)`` with ``ignore_index`` for unlabelled pixels.
        Returns:
            (n_bins,) tensor of ``conf_b - acc_b`` per bin (0 for an empty bin), for logging.
        """
        if isinstance(val_logits, torch.Tensor) and val_logits.dim() >= 3:
            val_logits, val_labels, _ = flatten_pixels(val_logits, val_labels, self.ignore_index, name="val_logits")
        else:
            val_logits, val_labels = check_logits(val_logits, val_labels, name="val_logits")
        if val_logits.shape[0] == 0:
            raise UserError("val_logits: every validation pixel is ignore_index; nothing to update from")
        _check_classes(val_logits, self.num_classes, "AdaFocal")
        probs = torch.softmax(upcast(val_logits).double(), dim=1).to(self.edges.device)
        conf, pred = probs.max(dim=1)
        correct = (pred == val_labels.to(pred.device)).double()
        # Equal-mass edges as adaptive_ece's (float64); the outer ones are stored as 0 and 1.
        edges = equal_mass_edges(conf, self.n_bins).to(self.edges.device)
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


