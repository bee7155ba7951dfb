"""What the bench and the tuner ask of a results store: :class:`ResultStore`.

Four backends answer it: the SQLite file ``runs.db`` (:class:`~calibkit.store.sqlite.Store`), a
PostgreSQL server (:class:`~calibkit.store.postgres.PostgresStore`), the result files of a
scheduler's task (:class:`~calibkit.bench.resultfiles.ResultFiles`, in the bench: they live in its
run directories) and, on the processes of a ``torchrun`` job other than rank 0, a store that records nothing
(:class:`~calibkit.store.null.NullStore`; rank 0's answers reach them by broadcast). Every
operation is required; what a backend cannot keep is said by ``keeps_records`` (tuning records)
or raised as :class:`~calibkit.store.common.StoreError` (``retire``), never probed for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable


@runtime_checkable
class ResultStore(Protocol):
    """The operations of a results store (their meaning: :class:`calibkit.store.sqlite.Store`).

    Attributes:
        keeps_records: whether :meth:`put_meta` keeps what it is given (False: :meth:`get_meta`
            answers None and :meth:`put_meta` keeps nothing, so a tuning records no grid extension).
    """

    keeps_records: bool

    # -- runs ---------------------------------------------------------------------------------
    def claim(self, key: str, *, preset: str, method: str, seed: int, table: str = "runs",
              hparams: dict | None = None, config: dict | None = None, git_commit: str | None = None,
              versions: dict | None = None) -> bool:
        """Hold row ``key`` of ``table`` (``"runs"``, or ``"tuning"`` with the candidate's ``hparams``)
        for this process; False when it is done or held by another live one."""
        ...

    def finish(self, key: str, table: str = "runs", **fields) -> None:
        """Record the results of a claimed row and mark it ``done``."""
        ...

    def fail(self, key: str, error: str, table: str = "runs") -> None:
        """Mark a claimed row ``failed`` with its error."""
        ...

    def get(self, key: str) -> dict | None:
        """The row of run ``key``, or None."""
        ...

    def runs(self, preset: str | None = None, status: str | None = "done", tolerant: bool = False) -> list[dict]:
        """The run rows (of ``preset``, with ``status``), in insertion order."""
        ...

    def retire(self, key: str, new_key: str, run_dir: str | None, logits_path: str | None) -> None:
        """Move finished run ``key`` to ``new_key`` (a re-tuned method's old run)."""
        ...

    # -- runs and candidates ------------------------------------------------------------------
    def status(self, key: str, table: str = "runs") -> str | None:
        """``running``, ``done``, ``failed`` or None (no row) for run or candidate ``key``."""
        ...

    def busy_elsewhere(self, key: str, table: str = "runs") -> bool:
        """Whether another live process holds run or candidate ``key`` right now."""
        ...

    # -- tuning candidates --------------------------------------------------------------------
    def candidates(self, preset: str | None = None, method: str | None = None, seed: int | None = None,
                   status: str | None = "done") -> list[dict]:
        """The candidate rows, filtered, in insertion order (``selected`` flags the selection)."""
        ...

    def select_candidate(self, preset: str, method: str, seed: int, key: str, criterion: dict) -> None:
        """Flag candidate ``key`` as the selection of ``(preset, method, seed)``."""
        ...

    # -- tuning records and plumbing ----------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        """The record under ``key`` (None when absent, or when ``keeps_records`` is False)."""
        ...

    def put_meta(self, key: str, value: str) -> None:
        """Keep ``value`` under ``key`` (nothing kept when ``keeps_records`` is False)."""
        ...

    def close(self) -> None:
        """Stop the heartbeat (if any) and release the connection."""
        ...


if TYPE_CHECKING:  # the type checker verifies that every backend conforms
    from calibkit.store.null import NullStore
    from calibkit.store.postgres import PostgresStore
    from calibkit.store.sqlite import Store

    def _backends(a: Store, b: PostgresStore, d: NullStore) -> list[ResultStore]:
        return [a, b, d]  # the result files of a scheduler's task: checked in calibkit.bench.resultfiles
