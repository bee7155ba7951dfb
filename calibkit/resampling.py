"""Bootstrap resamples as count matrices (:func:`count_draws`), drawn once per block
(:func:`shared_draws`) and shared by every interval on the same rows.

A resample of ``N`` rows is its count vector ``W`` (how often each row was drawn, from one seeded
``torch.Generator``), so any statistic that is a weighted sum over rows is evaluated on many
resamples at once (:mod:`calibkit.bootstrap`, :mod:`calibkit.selective_bootstrap`,
:mod:`calibkit.report.sets`). :func:`shared_draws` keeps each draw, and the binned sums that
:mod:`calibkit.bootstrap` computes from it per model (``_SUMS``), for the duration of a block.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

_ROW_BUDGET = 4_000_000  # entries of W (R_chunk x N) held at once (32 MB in float64)


def count_draws(n: int, n_resamples: int, seed: int = 0):
    """The resamples of ``n`` rows as count matrices, chunk by chunk: yields ``(idx, W)`` with ``idx``
    the ``(r, n)`` drawn indices and ``W`` their float64 ``(r, n)`` counts (``W[j, i]`` = how often
    row ``i`` is in resample ``j``), ``r`` rows per chunk so that ``W`` holds at most about
    ``_ROW_BUDGET`` entries. One seeded ``torch.Generator``: every caller with the same ``n``,
    ``n_resamples`` and ``seed`` gets the same resamples, so any statistic computed from them is
    paired with the panel metrics' intervals. Inside :func:`shared_draws` they are drawn once and
    the same tensors handed to every later call (callers read ``W``, never change it in place)."""
    chunk = max(1, _ROW_BUDGET // n)
    key = (n, n_resamples, seed, chunk)
    if _SHARED is not None and key in _SHARED:
        for idx, W in _SHARED[key]:
            yield idx.long(), W
        return
    kept = sum(W.numel() for draws in (_SHARED or {}).values() for _, W in draws)
    keep: list[tuple[torch.Tensor, torch.Tensor]] | None = (
        [] if _SHARED is not None and kept + n * n_resamples <= _SHARED_BUDGET else None)
    gen = torch.Generator().manual_seed(seed)
    done = 0
    while done < n_resamples:
        r = min(chunk, n_resamples - done)
        idx = torch.randint(0, n, (r, n), generator=gen)
        flat = (idx + torch.arange(r).view(-1, 1) * n).reshape(-1)
        W = torch.bincount(flat, minlength=r * n).view(r, n).double()
        if keep is not None:
            keep.append((idx.int(), W))
        yield idx, W
        done += r
    if keep is not None and _SHARED is not None:  # only a draw that ran to its end is kept
        _SHARED[key] = keep


#: ``{(n, n_resamples, seed, chunk): [(idx as int32, W), ...]}`` while :func:`shared_draws` is active.
_SHARED: dict | None = None
#: Entries of ``W`` kept in all by :func:`shared_draws` (96 MB, and half that for the indices); a
#: draw that would pass it is drawn again at every call, as outside the block.
_SHARED_BUDGET = 12_000_000
#: ``{(model key, id(W)): (BinSums, inputs)}`` while :func:`shared_draws` is active: the binned sums
#: of a model (:func:`model_key`) on a draw ``W`` kept in ``_SHARED`` (which holds it, as this holds
#: the model's inputs: no identity is reused while the entry lives).
_SUMS: dict = {}


def model_key(probs, labels, n_bins: int, ignore_index) -> tuple | None:
    """A model's key in ``_SUMS`` (None outside :func:`shared_draws`, or for inputs that are not
    tensors): the identity and in-place version (``Tensor._version``, raised by every in-place
    change) of the probabilities and labels given, the bins and ``ignore_index``. Tensors made under
    ``torch.inference_mode()`` have no version counter, so they get no key."""
    if _SHARED is None or not isinstance(probs, torch.Tensor) or not isinstance(labels, torch.Tensor):
        return None
    if probs.is_inference() or labels.is_inference():  # no version counter: not cached (their sums are recomputed)
        return None
    return id(probs), probs._version, id(labels), labels._version, n_bins, ignore_index


def kept_sums(key: tuple | None, W: torch.Tensor, inputs, compute):
    """``compute()`` (a model's sums on the draw ``W``), computed once per model key and draw inside
    :func:`shared_draws` when ``W`` is a draw the block keeps; otherwise computed at each call.
    ``inputs`` (the model's tensors) are held with the result, so no identity in ``key`` is reused
    while the entry lives."""
    kept = key is not None and _SHARED is not None and any(W is w for d in _SHARED.values() for _, w in d)
    if not kept:
        return compute()
    if (key, id(W)) not in _SUMS:
        _SUMS[(key, id(W))] = (compute(), inputs)
    return _SUMS[(key, id(W))][0]


@contextmanager
def shared_draws():
    """Within the block, :func:`count_draws` draws the resamples of each ``(n, n_resamples, seed)``
    once and hands the same tensors to every later call: the same resamples as drawing them again
    (one seeded generator), without the cost. A report uses it for its many intervals on the same
    test rows. Nested blocks share the outer one's draws; they are released when it ends."""
    global _SHARED
    outer = _SHARED
    if outer is None:
        _SHARED = {}
    try:
        yield
    finally:
        _SHARED = outer
        if outer is None:
            _SUMS.clear()
