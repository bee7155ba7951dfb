"""Every results store answers the whole :class:`ResultStore` protocol, with its signatures."""

import inspect

import pytest

from calibkit.bench.resultfiles import ResultFiles
from calibkit.store import NullStore, PostgresStore, ResultStore, Store

BACKENDS = [Store, PostgresStore, ResultFiles, NullStore]


def _members():
    """The protocol's operations, read from its class body (an independent listing of its API)."""
    return sorted(n for n, v in vars(ResultStore).items() if inspect.isfunction(v) and not n.startswith("_"))


def test_the_protocol_lists_what_the_bench_and_the_tuner_call():
    assert _members() == sorted([
        "busy_elsewhere", "candidates", "claim", "close", "fail", "finish", "get", "get_meta", "put_meta", "retire",
        "runs", "select_candidate", "status"])
    assert ResultStore.__annotations__ == {"keeps_records": "bool"}


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", _members())
def test_each_backend_has_each_operation_with_the_protocols_parameters(backend, name):
    want = inspect.signature(getattr(ResultStore, name)).parameters
    got = inspect.signature(getattr(backend, name)).parameters
    assert [(p.name, p.kind, p.default) for p in got.values()] == [(p.name, p.kind, p.default) for p in want.values()]


def test_instances_conform_at_run_time(tmp_path):
    db = Store(tmp_path / "runs.db")
    try:
        for store in (db, ResultFiles(tmp_path), NullStore()):
            assert isinstance(store, ResultStore)
    finally:
        db.close()
    assert (Store.keeps_records, PostgresStore.keeps_records, ResultFiles.keeps_records,
            NullStore.keeps_records) == (True, True, False, False)
    assert not isinstance(object(), ResultStore)
