"""Shared fixtures and helpers of the test suite."""
import contextlib
import os
import time
from pathlib import Path
from typing import Callable

import pytest
import ray
import torch

from async_rl.runtime import pythonpath_with

TESTS = Path(__file__).resolve().parent


@contextlib.contextmanager
def child_pythonpath(*paths: Path):
    """``paths`` ahead of PYTHONPATH while processes started in the block inherit it (Ray's
    workers, a forkserver); the test process gets its own value back."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = pythonpath_with(*paths)
    try:
        yield
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old


@pytest.fixture(scope="module")
def ray_local():
    """A local 2-CPU Ray for one test module; its workers can import async_rl and the test modules."""
    with child_pythonpath(TESTS.parent, TESTS):  # workers inherit the raylet's environment, fixed at init
        ray.init(num_cpus=2, include_dashboard=False, address="local", log_to_driver=False)
    yield
    ray.shutdown()


def wait_for_replay(runtime, accept: Callable = lambda batch: True, timeout_s: float = 120.0):
    """The replay buffer's contents once they are non-empty and ``accept``-ed (checked every 0.2 s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = ray.get(runtime.replay.snapshot.remote(), timeout=60)
        if batch is not None and accept(batch):
            return batch
        time.sleep(0.2)
    raise AssertionError(f"the replay buffer held no accepted experience within {timeout_s} s")


@contextlib.contextmanager
def released(members, timeout_s: float = 30.0):
    """Weight-sync test members (Ray actors with ``close``): closed and killed afterwards, whatever happened."""
    try:
        yield members
    finally:
        ray.get([m.close.remote() for m in members], timeout=timeout_s)
        for m in members:
            ray.kill(m)


def assert_broadcast_delivered(members, seed: int, timeout_s: float) -> None:
    """Rank 0 of ``members`` broadcasts seeded tensors; every receiver then holds them exactly."""
    sent, received = ray.get([m.sync.remote(seed=seed) for m in members], timeout=timeout_s)
    for s, r in zip(sent, received):
        assert s.dtype == r.dtype and torch.equal(s, r)
