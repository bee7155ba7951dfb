"""The store of a process that records nothing: every process of a ``torchrun`` job but rank 0.

Only rank 0 opens the results store; the bench and the tuner hand the other ranks a
:class:`NullStore` and broadcast rank 0's answers to them (:func:`calibkit.bench.attempts.broadcast`),
so their code has no ``store is None`` branch. Its reads find nothing, its claims are refused
and its writes keep nothing: an answer a rank computes from it is replaced by rank 0's.
"""

from __future__ import annotations


class NullStore:
    """A :class:`~calibkit.store.protocol.ResultStore` that holds nothing and keeps nothing."""

    keeps_records = False
    where = "no store (not the main process)"

    def claim(self, key: str, *, preset: str, method: str, seed: int, table: str = "runs",
              hparams: dict | None = None, config: dict | None = None, git_commit: str | None = None,
              versions: dict | None = None) -> bool:
        return False

    def finish(self, key: str, table: str = "runs", **fields) -> None:
        pass

    def fail(self, key: str, error: str, table: str = "runs") -> None:
        pass

    def get(self, key: str) -> dict | None:
        return None

    def runs(self, preset: str | None = None, status: str | None = "done", tolerant: bool = False) -> list[dict]:
        return []

    def retire(self, key: str, new_key: str, run_dir: str | None, logits_path: str | None) -> None:
        pass

    def status(self, key: str, table: str = "runs") -> str | None:
        return None

    def busy_elsewhere(self, key: str, table: str = "runs") -> bool:
        return False

    def candidates(self, preset: str | None = None, method: str | None = None, seed: int | None = None,
                   status: str | None = "done") -> list[dict]:
        return []

    def select_candidate(self, preset: str, method: str, seed: int, key: str, criterion: dict) -> None:
        pass

    def get_meta(self, key: str) -> str | None:
        return None

    def put_meta(self, key: str, value: str) -> None:
        pass

    def close(self) -> None:
        pass
