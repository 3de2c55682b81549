"""Shared fixtures and helpers of the test suite."""
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
import ray
import torch

from async_rl.process_setup import pythonpath_with

TESTS = Path(__file__).resolve().parent
# tests/ mirrors the package (tests/README.md, Layout): a Ray worker that unpickles a class or function of a
# test module imports that module by its name, so every folder of tests goes on the workers' path.
TEST_DIRS = [TESTS, *sorted(p for p in TESTS.iterdir() if p.is_dir() and p.name[0] not in "._" and p.name != "coverage_hook")]
# The test process gets the same path, so a test importing another folder's helpers (e.g. tests/policies from
# tests/e2e's test_e2e_libero) runs alone or in a layer too, not only when pytest collected that folder first.
sys.path.extend(str(d) for d in TEST_DIRS if str(d) not in sys.path)
# --durations-json: per-file wall time kept in tests/durations.json (`make durations`, tests/README.md).
pytest_plugins = ["durations_record"]


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


# ---- the suite's layers ---------------------------------------------------------------------------
# `pytest tests -m "not e2e"` runs the fast layer, `-m e2e` the real runs, `-m multinode` the two-node
# cluster tests, `-m gpu` tests/gpu; `make test` runs everything (no -m). Where a test goes: tests/README.md.
MARKERS = {
    "e2e": "a real run end to end (the driver or a launch script: Ray, trainer ranks, inference, workers, a real env)",
    "multinode": "a real two-node Ray cluster (network namespaces, root; skipped without them); also e2e",
    "gpu": "needs a CUDA GPU (tests/gpu; skipped without one)",
}
# file -> the test functions (names without parameters) that are real runs; None: every test of the file.
E2E = {
    "test_e2e_metaworld.py": None, "test_e2e_ctrl.py": None, "test_e2e_libero.py": None, "test_e2e_compilergym.py": None,
    "test_e2e_lm.py": None, "test_actor_deaths.py": None, "test_stop_signals.py": None, "test_quiet_run.py": None,
    "test_group_rollouts.py": None, "test_multinode.py": None, "test_multinode_node_loss.py": None,
    "test_faults.py": ("test_run_survives_injected_failures_and_stops_on_a_dead_trainer", "test_two_node_cluster_run"),
    "test_checkpoint.py": ("test_stop_and_resume_continues_counters_weights_and_buffer",),
    "test_resume.py": ("test_a_libero_vla_run_resumes_from_its_own_checkpoint",),
    "test_vla_checkpoints.py": ("test_native_checkpoint_trains_through_model_path",),
    "test_media_report.py": ("test_redirected_log_has_status_lines_and_no_error_lines", "test_run_writes_videos_mp4_and_report",
                             "test_report_compares_runs_and_names_a_bad_dir"),
    "test_sft.py": ("test_sft_loss_falls_and_logs_to_tensorboard", "test_the_learning_rate_follows_its_schedule_from_the_first_step",
                    "test_the_export_loads_through_the_rl_launch_and_acts_as_trained",
                    "test_init_from_of_another_policy_or_env_is_one_line_before_ray"),
    "test_ctrl_sft.py": ("test_text_sft_loss_falls_and_the_export_answers_as_trained",
                         "test_the_export_is_an_rl_runs_init_from_and_bad_input_is_one_line"),
}
MULTINODE = {"test_multinode.py", "test_multinode_node_loss.py"}


def pytest_configure(config):
    for name, what in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath))
        if path.parent.name == "gpu" and path.parent.parent == TESTS:
            item.add_marker(pytest.mark.gpu)
        names = E2E.get(path.name, ())
        if names is None or getattr(item, "originalname", item.name) in names:
            item.add_marker(pytest.mark.e2e)
        if path.name in MULTINODE:
            item.add_marker(pytest.mark.multinode)


# What the actors write straight into os.environ when a test builds one in the test process (pin_gpu, the
# trainer rank's rendezvous): a value left behind would change every later test's GPU plan.
PROCESS_PLACEMENT_VARS = ("CUDA_VISIBLE_DEVICES", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _placement_variables_restored():
    before = {name: os.environ.get(name) for name in PROCESS_PLACEMENT_VARS}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="module")
def ray_local():
    """A local 2-CPU Ray for one test module; its workers can import async_rl and the test modules."""
    with child_pythonpath(TESTS.parent, *TEST_DIRS):  # workers inherit the raylet's environment, fixed at init
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


def lone_rollout_worker(tag: str, task_set, spec: dict, batch: int, cfg, workers: int = 1, inference_restarts: int = 0,
                        action_dim: int = 1):
    """Real rollout workers (``workers`` of them, indices 0..) on ``task_set`` with an MLP inference actor
    (``action_dim`` actions, ``batch`` rows, its built weights served; Ray restarts it up to
    ``inference_restarts`` times), a replay buffer and a stats actor of their own, found by names under ``tag``.
    Returns a namespace of the actors, the policy ``factory`` and the first worker's ``run`` ref
    (``worker``, ``run``; all of them in ``workers``, ``runs``); ``actors`` lists them for ``ray.kill``."""
    import functools
    from types import SimpleNamespace

    from async_rl.actors.inference import InferenceActor
    from async_rl.actors.peers import SharedValue
    from async_rl.actors.replay_buffer import ReplayBufferActor
    from async_rl.actors.rollout_worker import RolloutWorkerActor, WorkerPeers
    from async_rl.actors.stats import StatsActor
    from async_rl.policies import build_policy, build_preprocessor

    holder = SharedValue.options(name=f"{tag}:task_set").remote(task_set)
    factory = functools.partial(build_policy, "mlp", spec, action_dim, hidden_sizes=[8])
    inference = InferenceActor.options(name=f"{tag}:inference", num_cpus=0, max_restarts=inference_restarts,
                                       max_task_retries=0).remote(0, factory, batch, 1.0, forward_in_thread=False)
    ray.get(inference.serve_built_weights.remote(), timeout=60)
    replay = ReplayBufferActor.options(name=f"{tag}:replay", num_cpus=0).remote(4096, 0)
    stats = StatsActor.options(name=f"{tag}:stats", num_cpus=0).remote()
    peers = WorkerPeers(task_set=f"{tag}:task_set", inference=f"{tag}:inference", replay=f"{tag}:replay",
                        stats=f"{tag}:stats")
    members = [RolloutWorkerActor.options(num_cpus=0).remote(i, peers, functools.partial(build_preprocessor, "mlp", spec),
                                                             cfg) for i in range(workers)]
    runs = [w.run.remote() for w in members]
    return SimpleNamespace(worker=members[0], workers=members, inference=inference, replay=replay, stats=stats,
                           factory=factory, run=runs[0], runs=runs, actors=(*members, inference, replay, stats, holder))
