"""The evaluation panel: ``evaluate``, a mergeable streaming accumulator, bootstrap intervals.

``evaluate(probs, labels)`` returns the sixteen numbers reported for every model::

    acc, ece, aece, cece, mce, rmsce, o_ece, u_ece, nll, brier, smece, ece_sweep, ks,
    aurc, eaurc, augrc

(plus ``miou`` for dense inputs). It is implemented as one :class:`CalibrationAccumulator`
update followed by ``compute()``, so the streaming and the one-shot results come from the same
code. Inputs: ``(N, K)``, binary ``(N,)`` or dense ``(N, K, *spatial)`` probabilities (see
:mod:`calibkit.functional.inputs`). Definitions: ``docs/metrics.md``.

Example:
    >>> import torch
    >>> probs = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8]])
    >>> labels = torch.tensor([0, 1, 1])
    >>> round(evaluate(probs, labels, n_bins=2)["ece"], 4)
    0.1
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from calibkit._panel_state import Layout, batch_vector, fold_check, neutral_check, panel_from_state
from calibkit._validation import check_n_bins
from calibkit.bootstrap import BootstrapResult, bootstrap_ci, paired_bootstrap_diff
from calibkit.errors import UserError
from calibkit.functional.panel import panel_sums

__all__ = [
    "PANEL",
    "evaluate",
    "CalibrationAccumulator",
    "BootstrapResult",
    "bootstrap_ci",
    "paired_bootstrap_diff",
]

#: Keys of the dict returned by :func:`evaluate`, in reporting order (dense inputs add ``miou``).
PANEL = ("acc", "ece", "aece", "cece", "mce", "rmsce", "o_ece", "u_ece", "nll", "brier", "smece", "ece_sweep", "ks",
         "aurc", "eaurc", "augrc")
_STATES = ("auto", "exact", "fixed")


def evaluate(probs, labels, n_bins: int = 15, ignore_index: int | None = None) -> dict[str, float]:
    """All panel metrics of ``probs`` against ``labels`` as python floats.

    Each value equals the corresponding function of :mod:`calibkit.functional` (``acc`` =
    ``accuracy``, ``aece`` = ``adaptive_ece``, ``cece`` = ``classwise_ece``, ``o_ece``/``u_ece`` =
    ``over_under_ece``, ``smece`` = ``smooth_ece``, ``ece_sweep`` = ``ece_sweep`` with ``p = 1``,
    ``ks`` = ``ks_error``, ``aurc``/``eaurc``/``augrc`` = ``aurc``/``eaurc``/``augrc`` with the
    default maximum-probability confidence), but the input is read once and the confidences
    sorted once for all the sort-based entries. Dense inputs ``(N, K, *spatial)`` also give
    ``miou`` (:func:`calibkit.functional.mean_iou`). On an accelerator the whole panel is
    computed there and moved to the host in one transfer (after one read of a count, see
    :meth:`CalibrationAccumulator.update`).
    """
    acc = CalibrationAccumulator(n_bins, ignore_index=ignore_index, state="exact")
    return acc.update(probs, labels, wait=True).compute()


class CalibrationAccumulator:
    """Streaming, mergeable and distributable state for :func:`evaluate`.

    State (float64, on the device of the first batch; details in :mod:`calibkit._panel_state`):

    * equal-width top-label sums ``(3, B)``: ECE, MCE, RMSCE, O/U-ECE; classwise sums
      ``(3, K, B)``: classwise ECE; running sums of correct, ``-log p_y``, Brier, and N;
    * for AECE, depending on ``state``:

      - ``"exact"``: the per-sample top-label confidence and correctness (2 numbers per sample),
        because equal-mass edges depend on all confidences at once (so do smooth ECE's bandwidth,
        the sweep's number of bins, and the sort order of the KS error, AURC, E-AURC and AUGRC);
      - ``"fixed"``: a fixed histogram of the confidences (``FINE_BINS = 7937`` bins, each at most
        0.4% of ``1 - conf`` wide) on which the equal-mass bins are formed, each fine bin kept
        whole (as tied confidences are); memory independent of N. Smooth ECE, the sweep, the KS
        error, AURC, E-AURC and AUGRC take each non-empty fine bin as one block of tied
        confidences at its mean. Equal to the exact values when no fine bin holds two different
        confidences, otherwise an approximation (docs/metrics.md);
        plus a confusion matrix ``(K, K)``, reported as ``miou`` for dense inputs;
      - ``"auto"`` (default): ``"fixed"`` when the first batch is dense (pixels), else ``"exact"``.

    ``compute()`` equals ``evaluate`` on the concatenation of every batch seen (up to float64
    summation order; AECE in the ``"fixed"`` state as above), whatever the batch split.
    Bootstrap intervals need the samples: use :func:`bootstrap_ci` on the arrays (or a seeded
    subsample of pixels); the fixed state refuses nothing else.

    On an accelerator ``update`` never waits for the device: its value checks (probabilities in
    [0, 1], rows summing to 1, labels in range) are reduced on the device and raised by
    ``compute()``. On the CPU they are raised by ``update`` itself.

    Args:
        n_bins: number of bins ``B`` (equal-width and equal-mass).
        num_classes: ``K``; inferred from the first batch when ``None``.
        ignore_index: label of samples to leave out (255 for segmentation void), or ``None``.
        state: ``"auto"``, ``"exact"`` or ``"fixed"`` (above).

    Example:
        >>> acc = CalibrationAccumulator(n_bins=15, ignore_index=255)
        >>> for p, y in batches:  # doctest: +SKIP
        ...     acc.update(p, y)   # p (n, K, H, W) probabilities, y (n, H, W) labels
        >>> acc.sync().compute()  # doctest: +SKIP
    """

    def __init__(self, n_bins: int = 15, num_classes: int | None = None, ignore_index: int | None = None,
                 state: str = "auto"):
        if state not in _STATES:
            raise UserError(f"state must be one of {', '.join(_STATES)}, got {state!r}")
        self.n_bins = check_n_bins(n_bins)
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.state = state
        self._layout: Layout | None = None
        self._sums: torch.Tensor | None = None
        self._check: torch.Tensor | None = None
        self._conf: list[torch.Tensor] = []
        self._correct: list[torch.Tensor] = []
        self._weight: list[torch.Tensor | None] = []
        # CPU batches whose classwise sums, NLL and Brier are still being computed on helper
        # threads (panel_sums(defer=True)); added to the sums, in order, by _settle()
        self._pending: list = []

    # -- state ---------------------------------------------------------------------------------
    def _allocate(self, k: int, dense: bool, device) -> None:
        hist = self.state == "fixed" or (self.state == "auto" and dense)
        self._layout = Layout(self.n_bins, k, hist=hist, confusion=hist or dense)
        self._sums = torch.zeros(self._layout.size, dtype=torch.float64, device=device)
        self._check = neutral_check(device)

    def _allocated(self) -> tuple[Layout, torch.Tensor, torch.Tensor]:
        """Layout, sums and checks of a state that exists (after the first batch, a merge or a sync)."""
        assert self._layout is not None and self._sums is not None and self._check is not None
        self._settle()
        return self._layout, self._sums, self._check

    def _settle(self) -> torch.Tensor | None:
        """Add the pending batches' sums (waiting for their helper threads) and return the sums."""
        while self._pending:
            s = self._pending.pop(0).settle()
            assert self._layout is not None and self._sums is not None
            self._sums += batch_vector(self._layout, s).to(self._sums.device)
        return self._sums

    @property
    def n(self) -> int:
        """Number of samples accumulated."""
        sums = self._settle()
        return 0 if sums is None else int(round(float(sums[0])))

    @property
    def _bins(self) -> torch.Tensor:
        layout, sums, _ = self._allocated()
        return layout.view(sums, "bins")

    @property
    def _classwise(self) -> torch.Tensor:
        layout, sums, _ = self._allocated()
        return layout.view(sums, "classwise")

    def update(self, probs, labels, wait: bool = False) -> CalibrationAccumulator:
        """Add a batch: ``probs`` ``(n, K)``, ``(n,)`` (binary) or ``(n, K, *spatial)`` with
        labels ``(n,)`` / ``(n, *spatial)``. Returns ``self``.

        ``wait=True`` (accelerators only; :func:`evaluate` uses it) lets the update read one
        count from the device, so that the classwise sums gather exactly the entries they need
        instead of a buffer sized for the worst case: one host synchronisation, several times
        less work on the device. Same result."""
        s = panel_sums(probs, labels, self.n_bins, ignore_index=self.ignore_index, allow_empty=True, exact=wait,
                       defer=True)
        if s is None:  # every label ignored
            return self
        if self.num_classes is None:
            self.num_classes = s.k
        if s.k != self.num_classes:
            raise UserError(f"probs has K = {s.k} classes but this accumulator holds K = {self.num_classes}")
        if self._sums is None:
            self._allocate(s.k, s.dense, s.conf.device)
        elif s.dense and self.state == "auto" and not self._allocated()[0].confusion:
            raise UserError("this accumulator was set up for (N, K) inputs by its first batch and keeps 2 numbers "
                             "per sample; for pixels (dense inputs) use a new one, or state='fixed'")
        layout, sums, check = self._allocated()
        dev = sums.device
        if s.pending is not None:  # the exact state's per-sample arrays below are all compute() needs first
            self._pending.append(s)
        else:
            sums += batch_vector(layout, s).to(dev)
        if s.check is not None:
            self._check = fold_check(check, s)
        if not layout.hist:
            self._conf.append(s.conf.to(dev))
            self._correct.append(s.correct.to(dev))
            self._weight.append(None if s.weight is None else s.weight.to(dev))
        return self

    def merge(self, other: CalibrationAccumulator) -> CalibrationAccumulator:
        """Add the state of ``other`` (same ``n_bins``, ``K`` and state kind) into ``self``; returns ``self``."""
        if other.n_bins != self.n_bins:
            raise UserError(f"cannot merge accumulators with n_bins {self.n_bins} and {other.n_bins}")
        if other._sums is None:
            return self
        if self.num_classes is not None and other.num_classes != self.num_classes:
            raise UserError(f"cannot merge accumulators with K = {self.num_classes} and K = {other.num_classes}")
        other_layout, other_sums, other_check = other._allocated()
        if self._sums is None:
            self.num_classes, self.state = other.num_classes, other.state
            self._layout = other_layout
            self._sums, self._check = torch.zeros_like(other_sums), other_check.clone()
        else:
            own = self._allocated()[0]
            if (own.hist, own.confusion) != (other_layout.hist, other_layout.confusion):
                raise UserError("cannot merge an exact-state accumulator with a fixed-state (pixel) one")
        _, sums, check = self._allocated()
        dev = sums.device
        sums += other_sums.to(dev)
        self._check = torch.maximum(check, other_check.to(dev))
        self._conf += [t.to(dev) for t in other._conf]
        self._correct += [t.to(dev) for t in other._correct]
        self._weight += [None if t is None else t.to(dev) for t in other._weight]
        return self

    def sync(self, group=None) -> CalibrationAccumulator:
        """Combine the state of every process of ``torch.distributed`` (no-op when not initialised).

        Every sum travels in **one** all-reduce and the deferred checks in one more (maximum);
        in the exact state the per-sample AECE arrays are all-gathered (padded to the longest
        rank). Afterwards every rank holds the global state, so call it once, after the last
        ``update``. Every rank must have seen the same ``K`` and the same kind of input (dense or
        not). State tensors must suit the backend (CPU for gloo, CUDA for nccl).
        """
        if not (dist.is_available() and dist.is_initialized()):
            return self
        if self._sums is None:
            if self.num_classes is None or self.state == "auto":
                raise UserError("sync() on a rank without data needs num_classes and state='exact' or 'fixed' "
                                 "in the constructor")
            self._allocate(self.num_classes, False, "cpu")
        layout, sums, check = self._allocated()
        dist.all_reduce(sums, group=group)
        dist.all_reduce(check, op=dist.ReduceOp.MAX, group=group)
        if not layout.hist:
            self._gather_samples(dist, group)
        return self

    def _gather_samples(self, dist, group) -> None:
        dev = self._allocated()[1].device
        conf = torch.cat(self._conf) if self._conf else torch.zeros(0, dtype=torch.float64, device=dev)
        correct = torch.cat(self._correct) if self._correct else torch.zeros(0, dtype=torch.bool, device=dev)
        weight = torch.cat([torch.ones_like(c) if w is None else w for c, w in zip(self._conf, self._weight)]) \
            if self._conf else torch.zeros(0, dtype=torch.float64, device=dev)
        world = dist.get_world_size(group)
        local = torch.tensor([conf.numel()], dtype=torch.long, device=dev)
        counts = [torch.zeros_like(local) for _ in range(world)]
        dist.all_gather(counts, local, group=group)
        longest = max(int(c) for c in counts)
        packed = torch.zeros(3, longest, dtype=torch.float64, device=dev)
        packed[0, : conf.numel()], packed[1, : conf.numel()], packed[2, : conf.numel()] = conf, correct.double(), weight
        gathered = [torch.zeros_like(packed) for _ in range(world)]
        dist.all_gather(gathered, packed, group=group)
        self._conf = [g[0, : int(c)] for g, c in zip(gathered, counts)]
        self._correct = [g[1, : int(c)].bool() for g, c in zip(gathered, counts)]
        self._weight = [g[2, : int(c)] for g, c in zip(gathered, counts)]

    def compute(self) -> dict[str, float]:
        """The panel of :func:`evaluate` on everything accumulated, as python floats
        (``miou`` added when dense batches were seen)."""
        if self._sums is None:
            raise UserError("no samples accumulated (N = 0): call update() with data first")
        assert self._layout is not None and self._check is not None
        # unsettled: the sort-based part runs while pending batches finish on their helper threads
        return panel_from_state(self._layout, self._settle, self._check, self._conf, self._correct, self._weight)

    def state_bytes(self) -> int:
        """Bytes held by the state (sums, checks and per-sample arrays)."""
        tensors = [t for t in [self._sums, self._check, *self._conf, *self._correct, *self._weight] if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)
