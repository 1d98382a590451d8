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


_RAY_NODE: list = []  # the node id of the instance local_ray_2cpu started (empty: none of ours is up)


@pytest.fixture(scope="module")
def local_ray_2cpu():
    """A fresh local Ray instance of 2 CPUs (address="local": never a `ray start` cluster of this machine),
    shared by the modules that need one: the first starts it, the next ones reuse it while it is up (a start
    and a shutdown cost seconds on 2 shared cores), the session's end shuts it down. An instance that is not
    ours (one a job started by itself) is shut down first; a module that shuts Ray down (sweep_preflight
    checks that a failing sweep never starts it) only makes the next user start another."""
    import time

    import ray

    if ray.is_initialized() and ray.get_runtime_context().get_node_id() in _RAY_NODE:
        # Every module starts from an idle instance: what an earlier module left running (an actor still
        # shutting down) would hold its CPUs. Not idle within a minute: start a fresh one, as before sharing.
        deadline = time.monotonic() + 60
        while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        if ray.available_resources().get("CPU", 0) < 2:
            ray.shutdown()
    elif ray.is_initialized():
        ray.shutdown()
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=True)
        _RAY_NODE[:] = [ray.get_runtime_context().get_node_id()]
    yield


@pytest.fixture(scope="session", autouse=True)
def _shut_down_shared_ray():
    yield
    ray = sys.modules.get("ray")
    if _RAY_NODE and ray is not None and ray.is_initialized() \
            and ray.get_runtime_context().get_node_id() in _RAY_NODE:
        ray.shutdown()
