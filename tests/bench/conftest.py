"""Fixtures of the bench tests."""

import pytest

from tests.helpers.slurm import require_cluster


@pytest.fixture(scope="module")
def cluster():
    """A one-node SLURM cluster that answers, checked once per test file
    (:func:`tests.helpers.slurm.require_cluster`: skipped without one, failed where CI set one up)."""
    require_cluster()
