"""calibkit's metric panel as a ``torchmetrics.Metric``: ``update`` / ``compute`` / ``reset``,
synchronised across processes by torchmetrics itself.

Importable only when ``torchmetrics`` is installed (``pip install "calibkit[integrations]"``);
torchmetrics is not a dependency of calibkit. Lightning is not needed either: a
``LightningModule`` logs the dict returned by ``compute()`` with ``self.log_dict``.

Example:
    >>> from calibkit.integrations.torchmetrics import CalibrationMetric  # doctest: +SKIP
    >>> metric = CalibrationMetric(num_classes=10).to(device)              # doctest: +SKIP
    >>> for x, y in loader:                                                # doctest: +SKIP
    ...     metric.update(model(x).softmax(1), y)
    >>> metric.compute()["ece"]                                            # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from calibkit.errors import UserError
from calibkit.extras import MissingExtra

try:
    import torchmetrics
    from torchmetrics.utilities.data import dim_zero_cat
except ImportError as exc:  # absent or broken install
    raise MissingExtra("calibkit.integrations.torchmetrics needs torchmetrics: "
                       "pip install 'calibkit[integrations]'") from exc

import torch

from calibkit._panel_state import Layout, batch_vector, fold_check, neutral_check, panel_from_state
from calibkit._validation import check_n_bins
from calibkit.functional.panel import panel_sums

__all__ = ["CalibrationMetric"]


class CalibrationMetric(torchmetrics.Metric):
    """The panel of :func:`calibkit.metrics.evaluate` as a torchmetrics metric.

    ``compute()`` returns ``{acc, ece, aece, cece, mce, rmsce, o_ece, u_ece, nll, brier, smece, ece_sweep, ks}`` (plus
    ``miou`` with ``dense=True``) as 0-dim float64 tensors, equal to ``evaluate`` on every batch
    seen by every process. The state is that of
    :class:`calibkit.metrics.CalibrationAccumulator` (:mod:`calibkit._panel_state`): one flat
    vector of sums (``dist_reduce_fx="sum"``), the deferred value checks (``"max"``) and, unless
    ``dense``, the per-sample top-label confidence, correctness and weight for the exact AECE
    (``"cat"``).

    Args:
        num_classes: ``K`` (2 for binary 1-D inputs); torchmetrics needs state shapes up front.
        n_bins: bins ``B``.
        ignore_index: label of samples to leave out (255 for segmentation void), or ``None``.
        dense: ``True`` for pixel inputs ``(N, K, *spatial)``: memory independent of the number
            of pixels (fixed-histogram AECE, confusion matrix for ``miou``); with ``False`` dense
            inputs are refused, since the exact AECE keeps 2 numbers per sample.
        **kwargs: passed to ``torchmetrics.Metric`` (e.g. ``sync_on_compute``, ``process_group``).
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False
    if TYPE_CHECKING:  # for mypy only: not class attributes, so the API reference does not list them
        # The states add_state registers (nn.Module's attribute lookup types them only as Tensor | Module):
        # the flat sums, the deferred checks and, unless dense, the per-sample lists (one tensor a batch;
        # during compute a synchronised list may arrive already concatenated into one tensor).
        sums: torch.Tensor
        check: torch.Tensor
        conf: list[torch.Tensor]
        correct: list[torch.Tensor]
        weight: list[torch.Tensor]

    def __init__(self, num_classes: int, n_bins: int = 15, ignore_index: int | None = None, dense: bool = False,
                 **kwargs):
        super().__init__(**kwargs)
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise UserError(f"num_classes must be an integer >= 2, got {num_classes!r}")
        self.n_bins = check_n_bins(n_bins)
        self.num_classes, self.ignore_index, self.dense = num_classes, ignore_index, bool(dense)
        self._layout = Layout(self.n_bins, num_classes, hist=self.dense, confusion=self.dense)
        self.add_state("sums", default=torch.zeros(self._layout.size, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("check", default=neutral_check(), dist_reduce_fx="max")
        if not self.dense:
            for name in ("conf", "correct", "weight"):
                self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(self, probs, labels) -> None:
        """Add a batch: probabilities ``(n, K)``, binary ``(n,)``, or ``(n, K, *spatial)`` with ``dense``."""
        s = panel_sums(probs, labels, self.n_bins, ignore_index=self.ignore_index, allow_empty=True)
        if s is None:
            return
        if s.k != self.num_classes:
            raise UserError(f"probs has K = {s.k} classes "
                            f"but this metric was built with num_classes={self.num_classes}")
        if s.dense and not self.dense:
            raise UserError("dense inputs (N, K, *spatial) need CalibrationMetric(..., dense=True), whose memory "
                             "does not grow with the number of pixels")
        dev = self.sums.device
        self.sums += batch_vector(self._layout, s).to(dev)
        if s.check is not None:
            self.check = fold_check(self.check, s)
        if not self.dense:
            self.conf.append(s.conf.to(dev))
            self.correct.append(s.correct.double().to(dev))
            self.weight.append(torch.ones_like(s.conf) if s.weight is None else s.weight.to(dev))

    def compute(self) -> dict[str, torch.Tensor]:
        """The panel on everything accumulated (synchronised first under ``torch.distributed``)."""
        samples: tuple[tuple[()] | list[torch.Tensor], ...]  # per-sample conf, correct, weight
        if self.dense:
            samples = ((), (), ())
        else:
            conf, correct, weight = (dim_zero_cat(x) if isinstance(x, list) and x else x
                                     for x in (self.conf, self.correct, self.weight))
            if isinstance(conf, list) or isinstance(correct, list) or isinstance(weight, list):  # nothing seen
                samples = ((), (), ())
            else:
                samples = ([conf], [correct.bool()], [weight])
        panel = panel_from_state(self._layout, self.sums, self.check, *samples)
        return {k: torch.tensor(v, dtype=torch.float64) for k, v in panel.items()}
