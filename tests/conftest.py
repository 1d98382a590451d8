"""Shared test set-up."""

import sys
from pathlib import Path

import pytest
import torch

# Tests are grouped in folders by area (engine, models, kernels, train, ...). engine/engine_helpers.py lives beside
# the engine tests and a models test (the draft vocabulary's decoding) uses it too: importable from every folder.
sys.path.insert(0, str(Path(__file__).resolve().parent / "engine"))


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny-model tests run faster on one intra-op thread: on 2 shared cores, two OpenMP threads
    fighting other processes cost more than they gain (measured: a joint step 0.16 s vs 4.5 s)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
