import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def gen():
    """A seeded torch generator, so every random test input is reproducible."""
    return torch.Generator().manual_seed(0)


@pytest.fixture
def cli_env():
    """Environment for subprocess calls of the command line (package importable from the checkout)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


PYTHON = sys.executable
