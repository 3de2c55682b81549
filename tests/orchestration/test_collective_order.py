"""Trainer rank 0 drives two communicators: the training group (every rank) and the weight-sync group (rank 0
and the inference actors). With NCCL, two groups used from two threads in no fixed order can wait on each
other for ever (two or more trainers), so the driver touches the weight group only at step boundaries: its
supervised wait heals the group (re-forms it and re-sends the weights) while the ranks wait for data, never
while several ranks are in the epoch's collectives. Here the real driver step (``Runtime.train_epoch``) runs
over two real trainer ranks (DeepSpeed ZeRO-2 over gloo) and a real inference actor; rank 0 is held after
its first optimiser step until the driver's wait has polled a few times, so the test does not depend on
timing. Each rank records the order of its collectives."""
import functools
import threading
from types import SimpleNamespace

import ray
from trainer_batches import ACTIONS, SPEC, N, random_step_records

from async_rl.actors.inference import InferenceActor
from async_rl.actors.trainer import TrainerRank
from async_rl.config.schema import RunConfig
from async_rl.orchestration.actor_group import ActorGroup
from async_rl.orchestration.runtime import Runtime
from async_rl.orchestration.weight_sync_coordinator import WeightSyncCoordinator
from async_rl.policies import build_policy
from async_rl.weights.rendezvous import find_free_port

CFG = RunConfig(device="cpu", precision="fp32", num_trainers=2, train_batch_size=4, accumulation_steps=1,
                super_batch_size=N, replay_capacity=N, updates_per_epoch=1, lr_policy=1e-2, lr_value=1e-2,
                trainer_num_cpus=0.5, inference_num_cpus=0.25, collective_timeout_s=60.0, actor_timeout_s=60.0)
TIMEOUT = 240
POLLS_HELD = 3  # the driver's wait polls this often while rank 0 is held mid-epoch


class RecordingTrainer(TrainerRank):
    """A trainer rank that records its collectives in order: ``train`` per optimiser step (ZeRO-2's reduce and
    gather), ``weights`` per weight broadcast, and where its epoch starts and ends. Rank 0 holds after its first
    step until ``release``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[str] = []
        self.in_epoch, self._gate, self._steps = False, threading.Event(), 0

    def _train_on(self, *args, **kwargs):
        self.events.append("epoch")
        self.in_epoch = True
        try:
            return super()._train_on(*args, **kwargs)
        finally:
            self.in_epoch = False
            self.events.append("epoch end")

    def _loss_and_step(self, *args, **kwargs):
        self.events.append("train")
        out = super()._loss_and_step(*args, **kwargs)
        self._steps += 1
        if self.rank == 0 and self._steps == 1:
            self._gate.wait(TIMEOUT)
        return out

    async def broadcast_weights(self):
        self.events.append("weights")
        return await super().broadcast_weights()

    async def give(self, batch) -> None:
        self._restored.append(batch)  # the next epoch trains on it (no replay buffer needed)

    async def recorded(self) -> tuple[list[str], bool]:
        return list(self.events), self.in_epoch

    async def release(self) -> None:
        self._gate.set()


def test_the_weight_group_waits_for_a_step_boundary_on_every_rank(ray_local):
    factory = functools.partial(build_policy, "mlp", SPEC, ACTIONS)
    port = find_free_port("127.0.0.1")
    trainers = ActorGroup("trainer", {
        f"trainer-{r}": ray.remote(RecordingTrainer).options(num_cpus=0.5).remote(r, 2, "127.0.0.1", port, CFG, factory, None)
        for r in range(2)}, 60.0)
    inference = InferenceActor.options(num_cpus=0.25).remote(0, factory, 4, 2.0, None, 0, 1, "fp32", False, 60.0)
    receivers = ActorGroup("inference", {"inference-0": inference}, 60.0)
    coordinator = WeightSyncCoordinator(trainers, receivers, lambda: ("127.0.0.1", find_free_port("127.0.0.1")), 60.0, 60.0)
    rank0 = trainers["trainer-0"]
    heals, polls = [], []

    def heal():  # the driver's heal, noting whether rank 0 was inside its epoch's collectives then
        heals.append(ray.get(rank0.recorded.remote(), timeout=60)[1])
        return coordinator.heal()

    def check_workers():  # called on each poll of the driver's wait: release rank 0 after a few
        polls.append(1)
        if len(polls) >= POLLS_HELD:
            ray.get(rank0.release.remote(), timeout=60)

    runtime = SimpleNamespace(cfg=CFG, trainers=trainers, policy_version=0, epoch=0, check_workers=check_workers,
                              weight_sync=SimpleNamespace(heal=heal, broadcast=coordinator.broadcast))
    runtime._supervised = functools.partial(Runtime._supervised, runtime)
    try:
        trainers.call("setup", timeout_s=TIMEOUT, what="DeepSpeed set-up")
        receivers.record_pids()
        coordinator.join()
        coordinator.broadcast(0)
        ray.get([a.give.remote(random_step_records()) for a in trainers.values()], timeout=60)
        metrics = Runtime.train_epoch(runtime)
        events = {name: ray.get(a.recorded.remote(), timeout=60)[0] for name, a in trainers.items()}
    finally:
        ray.get(rank0.release.remote(), timeout=60)
        for actor in [*trainers.values(), inference]:
            ray.kill(actor)
    assert len(polls) >= POLLS_HELD, "the epoch ended before the driver's wait polled"
    assert True not in heals, f"the weight group was healed while rank 0 was in the epoch's collectives: {heals}"
    steps = N // CFG.train_batch_size
    # One fixed order on every rank: the weights before, the epoch's steps, the weights after (rank 0 only).
    assert events["trainer-0"] == ["weights", "epoch", *["train"] * steps, "epoch end", "weights"], events
    assert events["trainer-1"] == ["epoch", *["train"] * steps, "epoch end"], events
    assert metrics["broadcast_seconds"] > 0 and runtime.policy_version == 1
