"""Backpressure from the replay buffer to generation (async_rl/actors/backpressure.py): a producer
faster than its consumer waits instead of having its items evicted untrained, and a consumer that
stops drawing ends the wait with an error instead of a hang. Behaviour only: the buffer's own
class and the worker's gate on one event loop, no Ray."""
from __future__ import annotations

import asyncio

import pytest
import torch
from tensordict import TensorDict

from async_rl.actors.backpressure import GenerationGate, untrained_bound
from async_rl.actors.replay_buffer import ReplayBuffer
from async_rl.actors.replay_storage import ReplayStorage
from async_rl.config import load_config
from async_rl.errors import ActorTimeoutError, ConfigError


def _items(n: int, start: int = 0) -> TensorDict:
    return TensorDict({"x": torch.arange(start, start + n, dtype=torch.float32).unsqueeze(-1)}, batch_size=[n])


async def _produce(buffer: ReplayBuffer, gate: GenerationGate, pushes: int, per_push: int) -> None:
    """A worker's loop without envs: wait at the gate, 'generate', push, note the size the push reported."""
    for k in range(pushes):
        await gate.before_generation(buffer.wait_for_room)
        gate.reported(await buffer.add_batch(_items(per_push, k * per_push)))
        await asyncio.sleep(0)  # a real push is a Ray call: the consumer gets a turn


async def _consume(buffer: ReplayBuffer, total: int, per_draw: int, pause_s: float) -> list[float]:
    """A slow trainer: a consuming draw of ``per_draw`` items, then ``pause_s`` of 'training'."""
    got: list[float] = []
    while len(got) < total:
        batch = await buffer.sample(per_draw, consume=True)
        if batch is None:
            await asyncio.sleep(0.001)
            continue
        got += batch["x"].squeeze(-1).tolist()
        await asyncio.sleep(pause_s)
    return got


def _run_pair(bound: int | None) -> tuple[dict, GenerationGate, list[float]]:
    async def main():
        buffer = ReplayBuffer(capacity=64, seed=0)
        gate = GenerationGate(bound, limit_s=30.0, slice_s=0.05)
        pushes, per_push = 40, 8
        consumer = asyncio.ensure_future(_consume(buffer, pushes * per_push, 16, 0.01))
        await _produce(buffer, gate, pushes, per_push)
        if bound is None:  # nothing held the producer back: what the consumer can still get is what is left
            consumer.cancel()
            return await buffer.counters(), gate, []
        # the producer finished: the consumer drains what stays
        got = await asyncio.wait_for(consumer, 30)
        return await buffer.counters(), gate, got
    return asyncio.run(main())


def test_fast_producer_against_slow_consumer_waits_and_evicts_nothing():
    counters, gate, got = _run_pair(bound=32)
    assert counters["evicted"] == 0 and counters["evicted_untrained"] == 0
    assert gate.waits > 0  # it blocked rather than dropped
    assert counters["added"] == 320
    assert sorted(got) == list(range(320))  # every item generated was trained, once


def test_without_a_bound_the_same_producer_evicts_untrained_items():
    counters, gate, _ = _run_pair(bound=None)
    assert gate.waits == 0
    assert counters["evicted_untrained"] > 0  # what the bound prevents


def test_a_consumer_that_never_draws_ends_the_wait_with_a_clear_error():
    async def main():
        buffer = ReplayBuffer(capacity=64, seed=0)
        gate = GenerationGate(16, limit_s=0.3, slice_s=0.05)
        with pytest.raises(ActorTimeoutError, match="untrained items .*without any trainer drawing"):
            await asyncio.wait_for(_produce(buffer, gate, 10, 8), 20)  # the outer bound only guards the test
        assert (await buffer.counters())["evicted"] == 0
    asyncio.run(main())


def test_a_slow_consumer_that_keeps_drawing_is_waited_for():
    """The limit counts time without any draw, not the whole wait: a live trainer is never given up on."""
    async def main():
        buffer = ReplayBuffer(capacity=64, seed=0)
        await buffer.add_batch(_items(40))
        gate = GenerationGate(16, limit_s=0.5, slice_s=0.05)
        gate.reported(None)  # unknown: the gate asks the buffer
        consumer = asyncio.ensure_future(_consume(buffer, 28, 4, 0.15))  # 7 draws: well over limit_s in all
        await asyncio.wait_for(gate.before_generation(buffer.wait_for_room), 20)
        assert (await buffer.counters())["size"] < 16 and gate.waits == 1
        await consumer
    asyncio.run(main())


def test_a_stopped_worker_leaves_the_wait():
    async def main():
        buffer = ReplayBuffer(capacity=64, seed=0)
        await buffer.add_batch(_items(32))
        gate = GenerationGate(16, limit_s=60.0, slice_s=0.05)
        gate.reported(32)
        await asyncio.wait_for(gate.before_generation(buffer.wait_for_room, stopped=lambda: True), 20)
    asyncio.run(main())


def test_evicted_untrained_counts_only_items_never_drawn():
    store = ReplayStorage(capacity=8, seed=0)
    store.add_batch(_items(8))
    store.sample(4, consume=False)  # reuse mode: drawn items stay live
    store.add_batch(_items(8, 8))  # evicts all 8: 4 of them never drawn
    assert store.counters["evicted"] == 8 and store.counters["evicted_untrained"] == 4


def test_the_bound_in_force_by_mode():
    lm = load_config(["--config", "configs/lm_arithmetic.yaml"])
    assert untrained_bound(lm) == lm.super_batch_size  # capacity less two pushes of 16 x 8, floored at a super-batch
    assert untrained_bound(load_config([])) is None  # gae (MetaWorld's default): workers run ahead, FIFO evicts
    assert untrained_bound(load_config(["--advantage", "grpo", "--group-size", "4"])) == 4096 - 2 * 2 * 4 * 4
    assert untrained_bound(load_config(["--max-untrained-items", "0"])) is None
    assert untrained_bound(load_config(["--replay-sampling", "reuse"])) is None
    assert untrained_bound(load_config(["--sync"])) is None
    assert untrained_bound(load_config(["--max-untrained-items", "1024"])) == 1024


@pytest.mark.parametrize("flags, words", [
    (["--max-untrained-items", "8"], "trainers could never draw"),
    (["--max-untrained-items", "600", "--replay-sampling", "reuse"], "only to replay_sampling consume"),
])
def test_a_bound_that_cannot_work_is_refused(flags, words):
    with pytest.raises(ConfigError, match=words):
        load_config(flags)
