import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def gen():
    """A seeded torch generator, so every random test input is reproducible."""
    return torch.Generator().manual_seed(0)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of tiny networks: OpenMP synchronisation costs more than
    the work itself on a busy machine (up to 40x slower with two threads)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def cli_env():
    """Environment for subprocess calls of the command line (package importable from the checkout)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


PYTHON = sys.executable


@pytest.fixture
def pg_url():
    """A libpq URL of an empty schema of the PostgreSQL test server (``CALIBKIT_TEST_POSTGRES``,
    started by ``.ci/services.sh``), dropped afterwards; skips without a server."""
    import uuid

    base = os.environ.get("CALIBKIT_TEST_POSTGRES")
    if not base:
        pytest.skip("no PostgreSQL server: set CALIBKIT_TEST_POSTGRES (source .ci/services.sh; start-postgres)")
    psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'calibkit[postgres]')")
    from tests.helpers import pglock

    schema = f"t_{uuid.uuid4().hex[:12]}"
    pglock.shared()  # no other test process restarts the server meanwhile (tests/helpers/pglock.py)
    try:
        with psycopg.connect(base, autocommit=True) as con:
            con.execute(f"CREATE SCHEMA {schema}")
        yield base + ("&" if "?" in base else "?") + f"options=-csearch_path%3D{schema}"
        with psycopg.connect(base, autocommit=True) as con:
            con.execute(f"DROP SCHEMA {schema} CASCADE")
    finally:
        pglock.release()


# The files of the longest end-to-end tests, longest first (summed per file from a --durations
# profile of the whole suite; docs/performance.md, "CI and the test suite"): collected first, so that
# pytest-xdist's --dist loadfile, which hands files out in collection order, starts them at once
# instead of leaving one worker alone with them at the end. Only the order changes.
LONGEST_FIRST = ("tests/bench/test_slurm_faults.py", "tests/bench/test_slurm.py",
                 "tests/commands/test_segmentation_e2e.py", "tests/test_readme.py", "tests/report/test_report.py",
                 "tests/commands/test_bench_own_data.py", "tests/bench/test_runner.py",
                 "tests/bench/test_pretrained_presets.py", "tests/bench/test_workers_faults.py",
                 "tests/store/test_store_paths.py", "tests/store/test_store_hosts.py", "tests/report/test_data_rows.py",
                 "tests/train/test_text.py", "tests/bench/test_tune.py")


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order
