"""heal() re-sends the weights to an inference actor that Ray restarted while trainer 0 is in the
middle of an epoch. What arrives must be one whole, completed version with its own
number: not the live parameters, which an optimiser step rewrites while they are on the wire and
which are then of no version at all. A real trainer rank (DeepSpeed over gloo) is held after the
first optimiser step of its epoch by a gate, so the test does not depend on timing."""
import asyncio
import functools
import threading
import time

import pytest
import ray
import torch
from tensordict import TensorDict
from trainer_batches import ACTIONS, SPEC, N, random_step_records

from async_rl.actors.inference import InferenceActor
from async_rl.actors.trainer import TrainerRank
from async_rl.config.schema import RunConfig
from async_rl.orchestration.actor_group import ActorGroup
from async_rl.orchestration.weight_sync_coordinator import WeightSyncCoordinator
from async_rl.policies import build_policy
from async_rl.weights.rendezvous import find_free_port

CFG = RunConfig(device="cpu", precision="fp32", num_trainers=1, train_batch_size=4, accumulation_steps=1,
                super_batch_size=4, replay_capacity=N, updates_per_epoch=1, lr_policy=1e-2, lr_value=1e-2,
                trainer_num_cpus=0.5, collective_timeout_s=60.0, actor_timeout_s=60.0)
TIMEOUT = 180


class GatedTrainer(TrainerRank):
    """A trainer whose epoch stops after its first optimiser step until ``release``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._held, self._gate, self._steps = threading.Event(), threading.Event(), 0

    def _loss_and_step(self, *args, **kwargs):  # runs in the epoch's thread: the event loop keeps answering
        out = super()._loss_and_step(*args, **kwargs)
        self._steps += 1
        if self._steps == 1:
            self._held.set()
            self._gate.wait(TIMEOUT)
        return out

    async def give(self, batch: TensorDict) -> None:
        self._restored.append(batch)  # the next train_epoch trains on it (no replay buffer needed)

    async def held(self) -> bool:
        return await asyncio.to_thread(self._held.wait, TIMEOUT)

    async def release(self) -> None:
        self._gate.set()


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _received(inference) -> tuple[dict, int]:
    weights = ray.get(inference.weights.remote(), timeout=60)  # applies what was staged
    return weights, int(ray.get(inference.stats.remote(), timeout=60)["policy_version"])


def test_heal_mid_epoch_sends_the_last_completed_version(ray_local):
    factory = functools.partial(build_policy, "mlp", SPEC, ACTIONS)
    trainer = ray.remote(GatedTrainer).options(num_cpus=0.5).remote(
        0, 1, "127.0.0.1", find_free_port("127.0.0.1"), CFG, factory, None)
    inference = InferenceActor.options(num_cpus=0.5, max_restarts=1, max_task_retries=0).remote(
        0, factory, 4, 2.0, None, 0, 1, "fp32", False, 60.0)
    trainers = ActorGroup("trainer", {"trainer-0": trainer}, 60.0)
    receivers = ActorGroup("inference", {"inference-0": inference}, 60.0, max_restarts=1)
    coordinator = WeightSyncCoordinator(trainers, receivers, lambda: ("127.0.0.1", find_free_port("127.0.0.1")),
                                        60.0, 60.0)
    epoch = None
    try:
        ray.get(trainer.setup.remote(), timeout=TIMEOUT)
        coordinator.join()
        coordinator.broadcast(0)
        receivers.record_pids()
        v0 = ray.get(trainer.weights.remote(), timeout=60)
        assert _same(_received(inference)[0], v0)

        ray.get(trainer.give.remote(random_step_records()), timeout=60)
        epoch = trainer.train_epoch.remote(0)
        assert ray.get(trainer.held.remote(), timeout=TIMEOUT), "the epoch never reached its first step"
        assert not _same(ray.get(trainer.weights.remote(), timeout=60), v0)  # mid-epoch: no longer v0

        # The inference actor dies; Ray restarts it with fresh (untrained) weights.
        old_pid = receivers.pids["inference-0"]
        ray.kill(inference, no_restart=False)
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            try:
                if ray.get(inference.pid.remote(), timeout=10) != old_pid:
                    break
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                pass
            time.sleep(0.2)
        assert coordinator.heal(), "heal() did not see the restarted inference actor"
        weights, version = _received(inference)
        assert _same(weights, v0) and version == 0, "heal sent weights other than v0, or labelled them wrongly"

        ray.get(trainer.release.remote(), timeout=60)
        ray.get(epoch, timeout=TIMEOUT)
        coordinator.broadcast(1)  # after the epoch: the completed v1, labelled 1
        weights, version = _received(inference)
        assert _same(weights, ray.get(trainer.weights.remote(), timeout=60)) and version == 1
    finally:
        if epoch is not None:
            ray.get(trainer.release.remote(), timeout=60)
        for actor in (trainer, inference):
            ray.kill(actor)


def test_broadcast_refuses_a_version_the_sender_does_not_hold(ray_local):
    """The driver's broadcast(v) right after an epoch expects the sender's last completed version to
    be v; any other value would label the receivers wrongly, so it is an error, not a silent relabel."""

    class Sender:
        class broadcast_weights:
            @staticmethod
            def remote():
                return ray.put((0.01, 3))

    coordinator = WeightSyncCoordinator.__new__(WeightSyncCoordinator)
    coordinator.collective_timeout_s, coordinator.seconds = 1.0, []
    coordinator.trainers = {"trainer-0": Sender()}
    coordinator.inference = ActorGroup("inference", {}, 1.0)
    with pytest.raises(RuntimeError, match="holds v3"):
        coordinator.broadcast(2)
