"""Two real trainer ranks (DeepSpeed ZeRO-2 over gloo) whose super-batches arrive far apart: rank 1's
comes later than the training group's collective timeout after rank 0's. The epoch must wait for
both and then train, as when one slow rollout worker refills stale rows for two ranks; a rank that
entered the epoch's collectives first would time out (the failure CI met on a loaded machine)."""
import functools
import time

import ray
import torch
from trainer_batches import ACTIONS, SPEC, N, random_step_records

from async_rl.actors.trainer import TrainerActor
from async_rl.config.schema import RunConfig
from async_rl.orchestration.actor_group import ActorGroup, get_named
from async_rl.orchestration.runtime import epoch_on_every_rank
from async_rl.policies import build_policy
from async_rl.weights.rendezvous import find_free_port

COLLECTIVE_TIMEOUT_S = 10.0
LATE_S = 1.6 * COLLECTIVE_TIMEOUT_S  # rank 1's data comes this long after rank 0 first asked
CFG = RunConfig(device="cpu", precision="fp32", num_trainers=2, train_batch_size=4, accumulation_steps=2,
                super_batch_size=N, replay_capacity=N, updates_per_epoch=1, lr_policy=1e-2, lr_value=1e-2,
                trainer_num_cpus=0.5, collective_timeout_s=COLLECTIVE_TIMEOUT_S, actor_timeout_s=60.0)


@ray.remote(num_cpus=0)
class LateForRank1:
    """A replay buffer stand-in: a batch for trainer-0 at once, for trainer-1 only ``late_s`` after
    trainer-0's first ask (None before, as a buffer holding too few items answers)."""

    def __init__(self, late_s: float) -> None:
        self.late_s, self.first_ask = late_s, None

    def sample(self, n, consume, min_version=None, max_draws=None, request=None):
        requester = request[0] if request else ""
        if requester.startswith("trainer-0"):
            self.first_ask = self.first_ask or time.monotonic()
            return random_step_records()
        if self.first_ask is not None and time.monotonic() - self.first_ask >= self.late_s:
            return random_step_records()
        return None

    def count_dropped_stale(self, n: int) -> None:
        pass


def test_an_epoch_waits_for_every_ranks_data_before_any_rank_trains(ray_local):
    replay = LateForRank1.remote(LATE_S)
    factory = functools.partial(build_policy, "mlp", SPEC, ACTIONS)
    port = find_free_port("127.0.0.1")
    trainers = ActorGroup("trainer", {
        f"trainer-{r}": TrainerActor.options(num_cpus=0.5).remote(r, 2, "127.0.0.1", port, CFG, factory, replay)
        for r in range(2)}, 60.0)
    try:
        trainers.call("setup", timeout_s=300, what="DeepSpeed set-up")
        start = time.monotonic()
        results = epoch_on_every_rank(trainers, 0, 0, lambda refs, what: get_named(refs, 120, what))
        took = time.monotonic() - start
        # Both ranks trained one epoch (no collective timed out) once rank 1's data arrived.
        assert took >= LATE_S, took
        assert results["trainer-1"]["data_wait_seconds"] >= LATE_S - 1.0, results["trainer-1"]
        assert all(r["global_step"] == 1 for r in results.values()), results  # one optimiser step each
        w0, w1 = (ray.get(trainers[name].weights.remote(), timeout=60) for name in ("trainer-0", "trainer-1"))
        assert all(torch.equal(w0[k], w1[k]) for k in w0), "the ranks' weights differ after the epoch"
    finally:
        trainers.kill_all()
        ray.kill(replay)
