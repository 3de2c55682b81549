"""Environment calls run off a rollout worker's event loop: while its env is inside a step that
does not return (a slow simulator), the worker still answers a health call, and every env call
happens on one thread (MuJoCo/EGL render contexts belong to the thread that made them)."""
import functools
import threading
import time
from pathlib import Path

import numpy as np
import ray

from async_rl.actors.inference import InferenceActor
from async_rl.actors.peers import SharedValue
from async_rl.actors.replay_buffer import ReplayBufferActor
from async_rl.actors.rollout_worker import RolloutWorkerActor, WorkerPeers
from async_rl.actors.stats import StatsActor
from async_rl.config import load_config
from async_rl.policies import build_policy, build_preprocessor

ROOT = Path(__file__).resolve().parents[2]


class GatedEnv:
    """Its step waits (up to 120 s) until ``gate`` exists; it records the thread of every call."""

    def __init__(self, directory: str) -> None:
        self.dir = Path(directory)
        self._note("make")

    def _note(self, call: str) -> None:
        with open(self.dir / "threads", "a") as f:
            f.write(f"{call} {threading.get_ident()}\n")

    def reset(self):
        self._note("reset")
        return np.zeros(3, dtype=np.float32)

    def step(self, action):
        self._note("step")
        (self.dir / "in_step").touch()
        deadline = time.monotonic() + 120
        while not (self.dir / "gate").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return np.ones(3, dtype=np.float32), 0.0, False, False, {}

    def close(self) -> None:
        self._note("close")


class GatedTasks:
    task_names = ["gated"]

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def make_env(self, task: int, seed: int) -> GatedEnv:
        return GatedEnv(self.directory)


def test_a_slow_env_step_does_not_block_the_workers_health_calls(ray_local, tmp_path):
    cfg = load_config(["--envs-per-worker", "1", "--actor-timeout-s", "30", "--rollout-steps", "4", "--no-inline-env-steps"],
                      str(ROOT / "configs" / "metaworld_mt1_ppo.yaml"))
    tag = f"envloop{id(tmp_path)}"
    spec = {"state_dim": 3}
    holder = SharedValue.options(name=f"{tag}:task_set").remote(GatedTasks(str(tmp_path)))
    inference = InferenceActor.options(name=f"{tag}:inference", num_cpus=0).remote(
        0, functools.partial(build_policy, "mlp", spec, 1, hidden_sizes=[8]), 1, 1.0, forward_in_thread=False)
    ray.get(inference.serve_built_weights.remote(), timeout=60)
    replay = ReplayBufferActor.options(name=f"{tag}:replay", num_cpus=0).remote(64, 0)
    stats = StatsActor.options(name=f"{tag}:stats", num_cpus=0).remote()
    peers = WorkerPeers(task_set=f"{tag}:task_set", inference=f"{tag}:inference", replay=f"{tag}:replay",
                        stats=f"{tag}:stats")
    worker = RolloutWorkerActor.options(num_cpus=0).remote(0, peers, functools.partial(build_preprocessor, "mlp", spec), cfg)
    pid = ray.get(worker.pid.remote(), timeout=60)
    run = worker.run.remote()
    deadline = time.monotonic() + 60
    while not (tmp_path / "in_step").exists():
        assert time.monotonic() < deadline, "the worker never stepped its env"
        assert not ray.wait([run], timeout=0.1)[0], ray.get(run)
    # The step is blocked until the gate opens: the worker answers anyway.
    assert ray.get(worker.pid.remote(), timeout=10) == pid
    assert not (tmp_path / "gate").exists()
    (tmp_path / "gate").touch()
    ray.get(worker.stop.remote(), timeout=30)
    assert ray.get(run, timeout=60) >= 1
    calls = [line.split() for line in (tmp_path / "threads").read_text().splitlines()]
    assert [c for c, _ in calls][:3] == ["make", "reset", "step"] and calls[-1][0] == "close"
    assert len({t for _, t in calls}) == 1, calls  # one thread for every env call
    for actor in (worker, inference, replay, stats, holder):
        ray.kill(actor)
