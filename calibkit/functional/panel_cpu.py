"""The CPU path of :func:`calibkit.functional.panel.panel_sums`: blocked numpy passes over
``probs`` ``(N, K)``.

Each block of rows (about 2 MiB, so it stays in cache) is read by a few numpy reductions instead
of a dozen passes over the whole matrix, and blocks are spread over ``torch.get_num_threads()``
threads (numpy releases the GIL in its loops). Partial sums are added in block order, so no
result depends on the number of threads. The work is in two parts:

* the **top label** (:func:`_top_block`): validation (the minimum entry, the row sums, in
  float32 for half and float32 input, and the row maxima; a block outside the tolerance hands over
  to ``check_probs`` for the error), ``argmax`` per row (first index on ties) and the maximum
  gathered from it. Every sort-based metric needs only this part;
* the **full** part (:func:`_full_block`): ``p_y`` and the sum of squares per row (in the input
  precision), the classwise sums of the entries above ``1 / B`` only (a row summing to 1 has
  fewer than ``B (1 + tol)`` of them; bin 0 of a class is its column total minus its other bins),
  and the column totals as sums of 16 rows in float32 added in float64. After the blocks, one
  vectorised pass over the per-row arrays gives the NLL, the Brier score (``sum p^2 - 2 p_y + 1``)
  and the bins of the labelled entries (:func:`_full_sums`).

Called at once, both parts run block by block in one pass. With ``defer=True`` (the metric panel,
:class:`calibkit.metrics.CalibrationAccumulator`) the top-label part runs first and the full part
is handed to :class:`FullPass`: helper threads start on its blocks at once, and the caller joins
them when it asks for the result, after it has done its own sort-based work on the top label in
the meantime (docs/performance.md: at two threads this brought the panel from 1.32-1.39x
torchmetrics' ECE to 0.82-1.09x, median 0.95x).

Half-precision blocks are upcast to float32 and compared with the edges rounded to the input
dtype (then upcast, exactly), which gives the bins of the input dtype.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from calibkit._validation import check_probs, probs_within_tolerance
from calibkit.functional.binning import BinSums, _count_below, equal_width_edges
from calibkit.functional.panel_types import PanelSums

__all__ = ["panel_sums_cpu", "FullPass"]

# Rows per block: about 2 MiB of input. A block near a core's L2 size (2 MiB per core on the
# benchmark machine) is read again by several reductions from cache; halving it doubles the numpy
# calls, whose fixed cost (and, at 2 threads, the hand-over of the GIL between them) then
# dominates. Measured for the whole pass at N = 10^6, K = 100, 1 / 2 threads: 0.25 MiB 360 / 550
# ms, 1 MiB 229 / 188 ms, 2 MiB 202 / 146 ms, 16 MiB 244 / 187 ms (docs/performance.md).
_BLOCK_BYTES = 1 << 21


class _Plan:
    """What every block of one ``(probs, labels)`` shares: the working dtype, the inner edges,
    the labels as numpy, the block size and the per-row output arrays."""

    def __init__(self, probs: torch.Tensor, labels: torch.Tensor, n_bins: int, full: bool):
        n, k = probs.shape
        self.probs, self.n_bins, self.n, self.k = probs, n_bins, n, k
        self.work = torch.float32 if probs.dtype in (torch.float16, torch.bfloat16) else probs.dtype
        self.inner = equal_width_edges(n_bins, probs.dtype)[1:-1].to(self.work).numpy()
        self.y = labels.cpu().numpy()
        self.rows = max(16, _BLOCK_BYTES // (k * self.work.itemsize) // 16 * 16)  # a multiple of 16
        self.starts = range(0, n, self.rows)
        self.src = probs.detach()
        self.conf, self.correct, self.pred = np.empty(n, np.float64), np.empty(n, bool), np.empty(n, np.int64)
        # p_y and the sum of squares of each row, for the full part
        self.per_row = (np.empty(n, self.inner.dtype), np.empty(n, self.inner.dtype)) if full else None

    def block(self, start: int) -> np.ndarray:
        return np.ascontiguousarray(self.src[start : start + self.rows].to(self.work).numpy())


def _top_block(plan: _Plan, start: int, x: np.ndarray) -> None:
    """The top-label part of one block: fills its rows of ``conf``, ``correct`` and ``pred``."""
    r, k = x.shape
    flat, at = x.reshape(-1), np.arange(0, r * k, k)  # gathers by flat index: a 1-D take is cheapest
    pred = x.argmax(1)  # first index of the maximum; NaN wins, and fails the check below
    m = flat.take(at + pred)
    dev = np.abs(np.einsum("ij->i", x) - 1).max()
    if not probs_within_tolerance(x.min(), m.max(), dev, plan.probs.dtype):
        check_probs(plan.probs)  # raises its error (unless a rounding tie at the tolerance flips it)
    plan.conf[start : start + r] = m
    plan.correct[start : start + r] = pred == plan.y[start : start + r]
    plan.pred[start : start + r] = pred
    if plan.per_row is not None:  # the sum of squares (Brier) here: it balances the two parts' times
        np.einsum("ij,ij->i", x, x, out=plan.per_row[1][start : start + r])


def _full_block(plan: _Plan, start: int, x: np.ndarray) -> dict:
    """The full part of one block: fills its rows of ``per_row`` and returns its classwise sums
    and column totals."""
    r, k = x.shape
    n_bins, inner = plan.n_bins, plan.inner
    flat = x.reshape(-1)
    assert plan.per_row is not None
    flat.take(np.arange(0, r * k, k) + plan.y[start : start + r], out=plan.per_row[0][start : start + r])
    part: dict = {"cw_count": None, "cw_conf": None}
    if n_bins > 1:
        hit = np.flatnonzero(x > inner[0])  # the entries above 1 / B, compared in `work`
        vals = flat.take(hit)
        slot = (hit - hit // k * k) * n_bins + _count_below(vals, inner)  # column: faster than `%`
        part["cw_count"] = np.bincount(slot, minlength=k * n_bins)
        part["cw_conf"] = np.bincount(slot, weights=vals, minlength=k * n_bins)
    # column totals: 16 float32 slabs of r / 16 rows added elementwise (each sum has 16 terms),
    # then the r / 16 partial rows in float64
    grouped = r // 16 * 16
    slabs = np.add.reduce(x[:grouped].reshape(16, -1, k), 0)
    part["col_total"] = slabs.sum(0, dtype=np.float64) + x[grouped:].sum(0, dtype=np.float64)
    return part


def _both(plan: _Plan, start: int) -> dict:
    x = plan.block(start)
    _top_block(plan, start, x)
    return _full_block(plan, start, x)


def _top_only(plan: _Plan, start: int) -> None:
    _top_block(plan, start, plan.block(start))


def _full_only(plan: _Plan, start: int) -> dict:
    return _full_block(plan, start, plan.block(start))


def _map(fn, plan: _Plan, threads: int) -> list:
    """``[fn(plan, start) for start in plan.starts]`` over ``threads`` threads, in block order."""
    threads = min(threads, len(plan.starts))
    if threads <= 1:
        return [fn(plan, start) for start in plan.starts]
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda start: fn(plan, start), plan.starts))  # the first failing block raises


def _full_sums(plan: _Plan, parts: list[dict]) -> tuple[BinSums, torch.Tensor, torch.Tensor]:
    """The classwise sums, the NLL and the Brier sum from the blocks' parts (added in block order)
    and the per-row ``p_y`` and sums of squares."""
    n, k, n_bins = plan.n, plan.k, plan.n_bins
    cw_count, cw_conf, col_total = np.zeros(k * n_bins, np.int64), np.zeros(k * n_bins), np.zeros(k)
    for part in parts:
        if part["cw_count"] is not None:
            cw_count += part["cw_count"]
            cw_conf += part["cw_conf"]
        col_total += part["col_total"]
    count = cw_count.astype(np.float64).reshape(k, n_bins)
    conf_kb = cw_conf.reshape(k, n_bins)
    count[:, 0] = n - count[:, 1:].sum(1)
    conf_kb[:, 0] = col_total - conf_kb[:, 1:].sum(1)
    assert plan.per_row is not None
    p_y, sq = plan.per_row
    hit = np.bincount(plan.y * n_bins + _count_below(p_y, plan.inner), minlength=k * n_bins)
    classwise = BinSums(count=torch.from_numpy(count), conf=torch.from_numpy(conf_kb),
                        correct=torch.from_numpy(hit.astype(np.float64).reshape(k, n_bins)))
    p_y64 = p_y.astype(np.float64)
    tiny = torch.finfo(plan.probs.dtype).tiny
    nll = torch.tensor(-np.log(np.maximum(p_y64, tiny)).sum(), dtype=torch.float64)
    brier = torch.tensor((sq.astype(np.float64) - 2 * p_y64 + 1).sum(), dtype=torch.float64)
    return classwise, nll, brier


def _top_sums(plan: _Plan) -> BinSums:
    """The top label's equal-width sums from the per-row confidences and correctness."""
    bins = _count_below(plan.conf, plan.inner.astype(np.float64))  # exact upcasts: same bins
    return BinSums(
        count=torch.from_numpy(np.bincount(bins, minlength=plan.n_bins).astype(np.float64)),
        conf=torch.from_numpy(np.bincount(bins, weights=plan.conf, minlength=plan.n_bins)),
        correct=torch.from_numpy(np.bincount(bins, weights=plan.correct, minlength=plan.n_bins)),
    )


class FullPass:
    """The full part of :func:`panel_sums_cpu` running on helper threads; :meth:`result` joins.

    ``helpers`` threads take blocks from a shared counter as soon as they are made; the thread
    that calls :meth:`result` takes the blocks still left, then waits for the helpers. Each
    block's part is kept at its index and the parts are added in block order, so the result is
    the same as the one-pass computation's whatever the threads did. The thread that finishes the
    last block also works out the final sums, the top label's bins among them (it waits for the
    caller's :meth:`top_done`, or :meth:`cancel`), so that the caller, busy meanwhile, finds them
    ready. The first error of a block is raised by :meth:`result`.
    """

    def __init__(self, plan: _Plan, helpers: int):
        self._plan = plan
        self._next = itertools.count()  # next() on a count is atomic under the GIL
        self._parts: list[dict | None] = [None] * len(plan.starts)
        self._remaining = len(plan.starts)
        self._lock = threading.Lock()
        self._top = threading.Event()
        self._final: tuple | None = None
        self._errors: list[BaseException] = []
        self._threads = [threading.Thread(target=self._work, name=f"calibkit-panel-{i}", daemon=True)
                         for i in range(helpers)]
        for t in self._threads:
            t.start()

    def top_done(self) -> None:
        """The caller has filled every row's confidence and correctness."""
        self._top.set()

    def _work(self) -> None:
        plan = self._plan
        try:
            while (i := next(self._next)) < len(plan.starts) and not self._errors:
                self._parts[i] = _full_only(plan, plan.starts[i])
                with self._lock:
                    self._remaining -= 1
                    last = self._remaining == 0
                if last:  # the final sums, once the caller's top label is done (moments away: the parts are balanced)
                    self._top.wait()
                    if not self._errors:
                        self._final = self._finish()
        except BaseException as err:  # kept for result(), which re-raises it on the caller's thread
            self._errors.append(err)

    def _finish(self) -> tuple:
        return (_top_sums(self._plan), *_full_sums(self._plan, self._parts))  # type: ignore[arg-type]

    def cancel(self) -> None:
        """Stop the helpers after their current block (the top-label part failed: nothing will be read)."""
        self._errors.append(RuntimeError("cancelled"))
        self._top.set()  # a helper waiting for the top label goes on, sees the error and stops
        for t in self._threads:
            t.join()

    def result(self) -> tuple[BinSums, BinSums, torch.Tensor, torch.Tensor]:
        """``(top, classwise, nll, brier)`` once every block is done (after :meth:`top_done`)."""
        self._work()
        for t in self._threads:
            t.join()
        if self._errors:
            raise self._errors[0]
        return self._final if self._final is not None else self._finish()  # type: ignore[return-value]


def panel_sums_cpu(probs: torch.Tensor, labels: torch.Tensor, n_bins: int, full: bool,
                   defer: bool = False) -> PanelSums:
    """:func:`calibkit.functional.panel.panel_sums` of checked-layout ``probs`` ``(N, K)`` on the CPU.

    ``defer`` (with ``full``): return after the top-label part, with the full part running on
    ``torch.get_num_threads() - 1`` helper threads behind ``out.pending`` (a :class:`FullPass`;
    ``top`` is ``None`` until :meth:`PanelSums.settle` fills it with ``classwise``, ``nll`` and
    ``brier``). With one thread, or fewer blocks than threads, the full part is done here and
    nothing is pending.
    """
    plan = _Plan(probs, labels, n_bins, full)
    threads = torch.get_num_threads()
    pending = None
    if defer and full and threads > 1 and len(plan.starts) >= threads:
        pending = FullPass(plan, threads - 1)  # the helpers start on the full part at once
        try:
            _map(_top_only, plan, 1)  # while this thread does the top label
        except BaseException:
            pending.cancel()
            raise
    elif full:
        parts = _map(_both, plan, threads)
    else:
        _map(_top_only, plan, threads)
    top = None if pending is not None else _top_sums(plan)  # pending: the helpers add the top label's bins
    out = PanelSums(top=top, conf=torch.from_numpy(plan.conf),  # type: ignore[arg-type]
                    correct=torch.from_numpy(plan.correct), pred=torch.from_numpy(plan.pred), labels=labels, n=plan.n)
    if pending is not None:
        pending.top_done()
        out.pending = pending
    elif full:
        out.classwise, out.nll, out.brier = _full_sums(plan, parts)
    return out
