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
