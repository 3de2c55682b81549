"""The shared-memory path between co-located rollout workers and their inference actor
(actors/shared_slab.py, actors/policy_client.py): the same answers as over Ray, the loss of either
side noticed and survived (SIGKILL), Ray kept for workers on another node or with the key off, and
no segment left in /dev/shm."""
import asyncio
import functools
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import ray
import torch
from conftest import lone_rollout_worker
from tensordict import TensorDict

from async_rl.actors.inference import InferenceActor
from async_rl.actors.policy_client import PolicyClient
from async_rl.actors.shared_slab import AnswerMisfit, PeerGone, SlabClient, SlabServer, SlabSpec, wire_layout
from async_rl.config import load_config
from async_rl.experience import from_wire, to_wire
from async_rl.orchestration.runtime import obs_spec_of
from async_rl.policies import build_policy, build_preprocessor
from envs import make_task_set

ROOT = Path(__file__).resolve().parents[2]
K = 4  # envs per worker


def segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("psm_")}


def until(condition, timeout_s: float, what: str, interval_s: float = 0.2):
    """Poll ``condition`` until it returns a truthy value (returned) or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"{what} within {timeout_s} s")


@pytest.fixture(scope="module")
def reach():
    """MetaWorld MT1 reach-v3 (episodes of 50 steps, so that time-limit bootstraps happen too)."""
    task_set = make_task_set("metaworld", benchmark="MT1", task="reach-v3", max_episode_steps=50)
    return task_set, obs_spec_of(task_set)


def worker_cfg(mode: str):
    return load_config(["--envs-per-worker", str(K), "--rollout-steps", "8", "--actor-timeout-s", "30",
                        "--shared-memory", mode], str(ROOT / "configs" / "metaworld_mt1_ppo.yaml"))


def total_steps(stats) -> int:
    return ray.get(stats.state_dict.remote(), timeout=30)["total_env_steps"]


def stop(setup, timeout_s: float = 60.0) -> None:
    """Stop the live workers (their runs return), then kill every actor."""
    live = [(w, r) for w, r in zip(setup.workers, setup.runs) if not ray.wait([r], timeout=0)[0]]
    ray.get([w.stop.remote() for w, _ in live], timeout=timeout_s)
    ray.get([r for _, r in live], timeout=timeout_s)
    for actor in setup.actors:
        ray.kill(actor)


def event_loop_factory(kind: str):
    """asyncio's own loop, or uvloop's: Ray runs async actors on uvloop wherever it is installed, and uvloop
    refuses to connect to an abstract socket address given as a path (the client must connect it itself)."""
    if kind == "asyncio":
        return asyncio.new_event_loop
    return pytest.importorskip("uvloop", reason="uvloop is not installed").new_event_loop


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_slab_round_trip_misfit_errors_and_either_side_closing(loop):
    """In one process: answers arrive in place, a batch the slab cannot hold is refused (None), so is an
    answer of another shape (AnswerMisfit), an error reaches the caller, and either side's closing reaches the other; nothing stays in /dev/shm."""
    before = segments()
    loop_factory = event_loop_factory(loop)

    async def serve(obs, deterministic):
        if obs["state"][0, 0] < -100:
            raise ValueError("bad row")
        n = obs.batch_size[0]
        if obs["state"][0, 0] > 100:  # an answer of another shape than the slab's
            return to_wire(TensorDict({"value": obs["state"].sum(-1)}, [n]))
        return to_wire(TensorDict({"action": obs["state"][:, :2] * 2, "value": obs["state"].sum(-1),
                                   "policy_version": torch.full((n,), 7 + deterministic)}, [n]))

    async def main():
        server = SlabServer(serve, "inference-0", 10.0)
        obs = TensorDict({"state": torch.randn(K, 5)}, [K])
        spec = SlabSpec(wire_layout(to_wire(obs)), wire_layout(await serve(obs, False)), K)
        client = await SlabClient.connect(await server.offer("worker-0", spec), 10.0)
        for rows, deterministic in ((K, False), (1, True)):
            got, want = await client.act(obs[:rows], deterministic, 10.0), from_wire(await serve(obs[:rows], deterministic))
            assert set(got.keys()) == set(want.keys()) and all(torch.equal(got[k], want[k]) for k in want.keys())
        assert segments() == before  # unlinked once both sides mapped it
        assert await client.act(TensorDict({"state": torch.zeros(K + 1, 5)}, [K + 1]), False, 10.0) is None
        assert await client.act(TensorDict({"state": torch.zeros(1, 6)}, [1]), False, 10.0) is None
        with pytest.raises(AnswerMisfit):
            await client.act(TensorDict({"state": torch.full((1, 5), 1000.0)}, [1]), False, 10.0)
        with pytest.raises(RuntimeError, match="bad row"):
            await client.act(TensorDict({"state": torch.full((1, 5), -1000.0)}, [1]), False, 10.0)
        client.close()
        for _ in range(100):
            if not server.peers:
                break
            await asyncio.sleep(0.05)
        assert not server.peers
        client = await SlabClient.connect(await server.offer("worker-1", spec), 10.0)
        await client.act(obs, False, 10.0)
        server.close()
        with pytest.raises(PeerGone):
            await asyncio.wait_for(client.act(obs, False, 10.0), 10.0)
        client.close()
        server.close()
        unclaimed = SlabServer(serve, "inference-1", 0.2)
        offer = await unclaimed.offer("worker-2", spec)  # never connected: its segment goes after the timeout,
        name = offer.segment.lstrip("/")
        assert name in segments()
        for _ in range(200):  # before close() (which would unlink it too), polled for up to 10 s
            if name not in segments():
                break
            await asyncio.sleep(0.05)
        assert name not in segments(), "an offer nobody claimed kept its segment past its connect timeout"
        unclaimed.close()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(main())
    assert segments() == before


@ray.remote
class ProbeClient:
    """A PolicyClient in its own process, as a worker holds one."""

    def __init__(self, inference: str, mode: str) -> None:
        self.client = PolicyClient(ray.get_actor(inference), "inference", 30.0, mode, f"probe-{mode}", K)

    async def act(self, obs, deterministic: bool):
        out = await self.client.act(from_wire(obs), deterministic)
        return to_wire(out), self.client.slab_answers

    async def close(self) -> None:
        self.client.close()


def metaworld_obs(task_set, spec) -> dict:
    """K preprocessed observations of one reach-v3 episode, as a wire batch."""
    env, preprocess = task_set.make_env(0, seed=3), build_preprocessor("mlp", spec)
    rows, actions = [preprocess(env.reset(), task_set.task_names[0])], np.random.default_rng(0).uniform(-1, 1, (K, 4))
    for action in actions[1:]:
        rows.append(preprocess(env.step(action.astype(np.float32))[0], task_set.task_names[0]))
    env.close()
    return to_wire(torch.stack(rows))


def test_shared_memory_answers_equal_ray_answers_on_metaworld_observations(ray_local, reach):
    task_set, spec = reach
    before, name = segments(), "slabsame:inference"
    inference = InferenceActor.options(name=name, num_cpus=0).remote(
        0, functools.partial(build_policy, "mlp", spec, task_set.action_dim, hidden_sizes=[8]), K, 1.0,
        forward_in_thread=False)
    ray.get(inference.serve_built_weights.remote(), timeout=60)
    obs = metaworld_obs(task_set, spec)
    probes = ProbeClient.remote(name, "off"), ProbeClient.remote(name, "auto")
    for rows in (K, K, 1):  # "auto" asks over Ray first and opens its slab; then K rows, then 1 (a bootstrap's size)
        batch = {key: value[:rows] for key, value in obs.items()}
        reference = ray.get(inference.request.remote(batch, True), timeout=30)
        # One after the other: requests batched together could meet a forward of another size, whose
        # float sums may differ in the last bit
        # The first call also waits for the probe's process to start: 120 s bounds a hang (30 s timed out at load ~27)
        answers = [ray.get(p.act.remote(batch, True), timeout=120) for p in probes]
        for answer, _ in answers:
            assert answer.keys() == reference.keys()
            for key in reference:
                assert answer[key].dtype == reference[key].dtype and (answer[key] == reference[key]).all(), key
    assert [count for _, count in answers] == [0, 2]  # the Ray path's probe never used a slab
    assert ray.get(inference.shared_memory_peers.remote(), timeout=30) == ["probe-auto"]
    ray.get([p.close.remote() for p in probes], timeout=30)
    until(lambda: ray.get(inference.shared_memory_peers.remote(), timeout=30) == [], 30, "the closed slab was not dropped")
    for actor in (*probes, inference):
        ray.kill(actor)
    assert segments() == before


def test_a_killed_inference_actor_is_noticed_and_its_restart_gets_a_new_slab(ray_local, reach):
    task_set, spec = reach
    before = segments()
    setup = lone_rollout_worker("slabkill", task_set, spec, K, worker_cfg("auto"), inference_restarts=1,
                                action_dim=task_set.action_dim)
    inference = setup.inference
    until(lambda: ray.get(inference.shared_memory_peers.remote(), timeout=30) == ["worker-0"], 120,
          "the worker did not open a shared-memory slab")
    steps = total_steps(setup.stats)
    until(lambda: total_steps(setup.stats) > steps, 60, "the worker did not collect over shared memory")
    pid = ray.get(inference.pid.remote(), timeout=30)
    os.kill(pid, signal.SIGKILL)  # the worker is always inside a step: collecting never pauses here

    def restarted():
        try:
            return ray.get(inference.pid.remote(), timeout=10) != pid
        except ray.exceptions.RayActorError:
            return False

    until(restarted, 60, "Ray did not restart the inference actor")
    ray.get(inference.serve_built_weights.remote(), timeout=30)  # the worker's Ray retries then get answers
    until(lambda: ray.get(inference.shared_memory_peers.remote(), timeout=30) == ["worker-0"], 60,
          "the worker did not open a new slab on the restarted inference actor")
    steps = total_steps(setup.stats)
    until(lambda: total_steps(setup.stats) > steps + 2 * K, 60, "collection did not go on after the restart")
    assert not ray.wait([setup.run], timeout=0)[0], "the worker's run ended"
    stop(setup)
    assert segments() == before


def test_a_killed_worker_loses_its_slab_and_the_inference_actor_serves_the_others(ray_local, reach):
    task_set, spec = reach
    before = segments()
    setup = lone_rollout_worker("slabworker", task_set, spec, 2 * K, worker_cfg("auto"), workers=2,
                                action_dim=task_set.action_dim)
    inference = setup.inference
    until(lambda: ray.get(inference.shared_memory_peers.remote(), timeout=30) == ["worker-0", "worker-1"], 120,
          "the workers did not open shared-memory slabs")
    os.kill(ray.get(setup.workers[0].pid.remote(), timeout=30), signal.SIGKILL)
    until(lambda: ray.get(inference.shared_memory_peers.remote(), timeout=30) == ["worker-1"], 30,
          "the inference actor kept the killed worker's slab")
    steps = total_steps(setup.stats)
    until(lambda: total_steps(setup.stats) > steps + 2 * K, 60, "the other worker stopped collecting")
    assert not ray.wait([setup.runs[1]], timeout=0)[0], "the other worker's run ended"
    stop(setup)
    assert segments() == before


def test_the_ray_path_for_the_key_off_and_for_a_worker_on_another_node(ray_local, reach):
    task_set, spec = reach
    setup = lone_rollout_worker("slaboff", task_set, spec, K, worker_cfg("off"), action_dim=task_set.action_dim)
    steps = total_steps(setup.stats)
    until(lambda: total_steps(setup.stats) > steps + 2 * K, 120, "the worker did not collect over Ray")
    assert ray.get(setup.inference.shared_memory_peers.remote(), timeout=30) == []
    # Co-location is decided from Ray's node ids: another node's worker gets no slab, only the Ray path.
    layout = wire_layout({"state": torch.zeros(1, 39).numpy()})
    assert ray.get(setup.inference.open_slab.remote("worker-far", "another-node-id", SlabSpec(layout, layout, K)),
                   timeout=30) is None
    stop(setup)
