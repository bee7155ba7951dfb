"""The evaluation panel: ``evaluate``, a mergeable streaming accumulator, bootstrap intervals.

``evaluate(probs, labels)`` returns the ten numbers reported for every model::

    acc, ece, aece, cece, mce, rmsce, o_ece, u_ece, nll, brier

It is implemented as one :class:`CalibrationAccumulator` update followed by ``compute()``, so the
streaming and the one-shot results come from the same code. Definitions: ``docs/metrics.md``.

Example:
    >>> import torch
    >>> probs = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8]])
    >>> labels = torch.tensor([0, 1, 1])
    >>> round(evaluate(probs, labels, n_bins=2)["ece"], 4)
    0.1
"""

from __future__ import annotations

import torch

from calibkit._validation import check_n_bins
from calibkit.bootstrap import BootstrapResult, bootstrap_ci, paired_bootstrap_diff
from calibkit.functional.binning import BinSums, bin_sums, binned_errors, equal_mass_bins, panel_sums

__all__ = [
    "PANEL",
    "evaluate",
    "CalibrationAccumulator",
    "BootstrapResult",
    "bootstrap_ci",
    "paired_bootstrap_diff",
]

#: Keys of the dict returned by :func:`evaluate`, in reporting order.
PANEL = ("acc", "ece", "aece", "cece", "mce", "rmsce", "o_ece", "u_ece", "nll", "brier")


def evaluate(probs, labels, n_bins: int = 15) -> dict[str, float]:
    """All panel metrics of ``probs`` ``(N, K)`` against ``labels`` ``(N,)`` as python floats.

    Each value equals the corresponding function of :mod:`calibkit.functional` (``acc`` =
    ``accuracy``, ``aece`` = ``adaptive_ece``, ``cece`` = ``classwise_ece``, ``o_ece``/``u_ece`` =
    ``over_under_ece``), but the input is validated once and the top label is computed once.
    """
    return CalibrationAccumulator(n_bins).update(probs, labels).compute()


class CalibrationAccumulator:
    """Streaming, mergeable and distributable state for :func:`evaluate`.

    State (float64, kept on the CPU whatever the input device):

    * equal-width top-label sums ``(3, B)`` (count, confidence, correct): ECE, MCE, RMSCE, O/U-ECE;
    * classwise sums ``(3, K, B)``: classwise ECE;
    * running sums of correct, ``-log p_y`` and the per-sample Brier score, and the count N;
    * the per-sample top-label confidence (float64) and correctness (bool), 2 numbers per sample,
      because equal-mass edges depend on all confidences at once (AECE).

    ``compute()`` equals ``evaluate`` on the concatenation of every batch seen (up to float64
    summation order), whatever the batch split.

    Args:
        n_bins: number of bins ``B`` (equal-width and equal-mass).
        num_classes: ``K``; inferred from the first batch when ``None``.

    Example:
        >>> acc = CalibrationAccumulator(n_bins=15)
        >>> for p, y in batches:  # doctest: +SKIP
        ...     acc.update(p, y)
        >>> acc.sync().compute()  # doctest: +SKIP
    """

    def __init__(self, n_bins: int = 15, num_classes: int | None = None):
        self.n_bins = check_n_bins(n_bins)
        self.num_classes = num_classes
        self.n = 0
        self._scalars = torch.zeros(3, dtype=torch.float64)  # correct, nll, brier sums
        self._bins = torch.zeros(3, self.n_bins, dtype=torch.float64)
        self._classwise = None if num_classes is None else self._empty_classwise(num_classes)
        self._conf: list[torch.Tensor] = []
        self._correct: list[torch.Tensor] = []

    def _empty_classwise(self, k: int) -> torch.Tensor:
        return torch.zeros(3, k, self.n_bins, dtype=torch.float64)

    def update(self, probs, labels) -> CalibrationAccumulator:
        """Add a batch: ``probs`` ``(n, K)`` probabilities, ``labels`` ``(n,)``. Returns ``self``."""
        s = panel_sums(probs, labels, self.n_bins)  # validates; one pass over the matrix
        k = s.classwise.count.shape[0]
        if self.num_classes is None:
            self.num_classes = k
        if k != self.num_classes:
            raise ValueError(f"probs has K = {k} classes but this accumulator holds K = {self.num_classes}")
        if self._classwise is None:
            self._classwise = self._empty_classwise(k)
        self._bins += torch.stack([s.top.count, s.top.conf, s.top.correct]).cpu()
        self._classwise += torch.stack([s.classwise.count, s.classwise.conf, s.classwise.correct]).cpu()
        self._scalars += torch.stack([s.correct.sum().double(), s.nll, s.brier]).cpu()
        self.n += s.conf.shape[0]
        self._conf.append(s.conf.cpu())
        self._correct.append(s.correct.cpu())
        return self

    def merge(self, other: CalibrationAccumulator) -> CalibrationAccumulator:
        """Add the state of ``other`` (same ``n_bins`` and ``K``) into ``self``; returns ``self``."""
        if other.n_bins != self.n_bins:
            raise ValueError(f"cannot merge accumulators with n_bins {self.n_bins} and {other.n_bins}")
        if other.n == 0:
            return self
        if self.num_classes is not None and other.num_classes != self.num_classes:
            raise ValueError(f"cannot merge accumulators with K = {self.num_classes} and K = {other.num_classes}")
        if self._classwise is None:
            self.num_classes = other.num_classes
            self._classwise = self._empty_classwise(other.num_classes)
        self.n += other.n
        self._scalars += other._scalars
        self._bins += other._bins
        self._classwise += other._classwise
        self._conf += list(other._conf)
        self._correct += list(other._correct)
        return self

    def sync(self, group=None) -> CalibrationAccumulator:
        """Combine the state of every process of ``torch.distributed`` (no-op when not initialised).

        The O(B) and O(K B) sums travel in **one** all-reduce; the per-sample AECE arrays are
        all-gathered (padded to the longest rank). Afterwards every rank holds the global state,
        so call it once, after the last ``update``. Every rank must have seen the same ``K``.
        Works with the gloo backend (CPU tensors).
        """
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return self
        if self.num_classes is None:
            raise ValueError("sync() needs num_classes on every rank: pass it to the constructor or update first")
        if self._classwise is None:
            self._classwise = self._empty_classwise(self.num_classes)
        flat = torch.cat([torch.tensor([float(self.n)], dtype=torch.float64), self._scalars,
                          self._bins.reshape(-1), self._classwise.reshape(-1)])
        dist.all_reduce(flat, group=group)
        sizes = [3, self._bins.numel(), self._classwise.numel()]
        n, rest = flat[0], flat[1:]
        scalars, bins, classwise = rest.split(sizes)
        self.n = int(round(float(n)))
        self._scalars = scalars.clone()
        self._bins = bins.reshape(self._bins.shape).clone()
        self._classwise = classwise.reshape(self._classwise.shape).clone()
        conf, correct = self._per_sample()
        world = dist.get_world_size(group)
        local = torch.tensor([conf.numel()], dtype=torch.long)
        counts = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
        dist.all_gather(counts, local, group=group)
        longest = max(int(c) for c in counts)
        packed = torch.zeros(2, longest, dtype=torch.float64)
        packed[0, : conf.numel()] = conf
        packed[1, : conf.numel()] = correct.double()
        gathered = [torch.zeros_like(packed) for _ in range(world)]
        dist.all_gather(gathered, packed, group=group)
        self._conf = [g[0, : int(c)] for g, c in zip(gathered, counts)]
        self._correct = [g[1, : int(c)].bool() for g, c in zip(gathered, counts)]
        return self

    def _per_sample(self) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._conf:
            return torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.bool)
        if len(self._conf) == 1:  # evaluate: one batch, no copy
            return self._conf[0], self._correct[0]
        return torch.cat(self._conf), torch.cat(self._correct)

    def compute(self) -> dict[str, float]:
        """The panel of :func:`evaluate` on everything accumulated, as python floats."""
        if self.n == 0:
            raise ValueError("no samples accumulated (N = 0): call update() with data first")
        out = {"acc": float(self._scalars[0] / self.n)}
        errors = binned_errors(BinSums(*self._bins))
        conf, correct = self._per_sample()
        eq_mass = bin_sums(equal_mass_bins(conf, self.n_bins), conf, correct, self.n_bins)
        out["ece"] = float(errors["ece"])
        out["aece"] = float(binned_errors(eq_mass)["ece"])
        cw = self._classwise
        out["cece"] = float((cw[2] - cw[1]).abs().sum() / (self.n * self.num_classes))
        for key in ("mce", "rmsce", "o_ece", "u_ece"):
            out[key] = float(errors[key])
        out["nll"] = float(self._scalars[1] / self.n)
        out["brier"] = float(self._scalars[2] / self.n)
        return out
