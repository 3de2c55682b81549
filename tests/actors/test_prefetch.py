"""A trainer's prefetch against a real replay buffer actor: with a fresh buffer (each epoch it holds
only experience of the newest policy, as workers refill it after a broadcast) the super-batch an
epoch trains on is at most ``prefetch_batches`` versions old; waits end in errors naming the buffer,
and a checkpoint's hold pauses the asks instead of waiting for a short buffer to fill."""
import asyncio
import time

import pytest
import ray
import torch
from tensordict import TensorDict

from async_rl.actors.prefetch import Prefetcher, poll, sample_once
from async_rl.actors.replay_buffer import ReplayBufferActor
from async_rl.errors import ActorTimeoutError
from async_rl.experience import policy_versions

SUPER_BATCH = 8


def _items(version: int, n: int) -> TensorDict:
    return TensorDict({"obs": {"state": torch.randn(n, 3)}, "policy_version": torch.full((n,), version)}, batch_size=[n])


def _ask(replay):
    """One ask for a super-batch, as the trainer's (consume sampling, no lag limit)."""
    return lambda: sample_once(replay, SUPER_BATCH, True, None, 30, "trainer-0")


async def _lags(replay, depth: int, epochs: int = 6) -> list[int]:
    """Per epoch v: the buffer drops what older policies made and gets two super-batches made by
    policy v, then the trainer takes its next super-batch; returns v - its oldest item's version."""
    prefetch = Prefetcher(_ask(replay), SUPER_BATCH, depth, timeout_s=30, name="trainer-0")
    lags = []
    for version in range(epochs):
        await replay.drop_older_than.remote(version)
        await replay.add_batch.remote(_items(version, 2 * SUPER_BATCH))
        batch = await prefetch.next()
        lags.append(version - int(policy_versions(batch).min()))
        deadline = time.monotonic() + 30  # let the background draws land before the next epoch
        while len(prefetch.pending()) < depth and await replay.size.remote() >= SUPER_BATCH:
            assert time.monotonic() < deadline, "the prefetch did not draw"
            await asyncio.sleep(0.05)
    prefetch.close()
    return lags


@pytest.mark.parametrize("depth, worst", [(0, 0), (1, 1), (2, 2)])
def test_the_trained_batch_is_at_most_prefetch_batches_versions_old(ray_local, depth, worst):
    # depth 2 is what the trainer did before (a queue of one plus one drawn batch held for room).
    replay = ReplayBufferActor.options(num_cpus=0).remote(256, 0)
    lags = asyncio.run(_lags(replay, depth))
    assert max(lags) == worst, lags
    ray.kill(replay)


def test_waits_on_a_short_buffer_end_in_errors_naming_it(ray_local):
    replay = ReplayBufferActor.options(num_cpus=0).remote(256, 0)

    async def main():
        await replay.add_batch.remote(_items(0, 3))
        with pytest.raises(ActorTimeoutError, match="replay buffer did not hold 8 items for trainer-0 within 0.5 s"):
            await poll(_ask(replay), SUPER_BATCH, 0.5, "trainer-0")
        prefetch = Prefetcher(_ask(replay), SUPER_BATCH, 1, 0.5, "trainer-0")
        with pytest.raises(ActorTimeoutError, match="trainer-0: the replay buffer gave no super-batch within 0.5 s"):
            await prefetch.next()
        # A checkpoint's hold does not wait for the short buffer to fill: the background asks pause.
        await prefetch.hold()
        await replay.add_batch.remote(_items(0, SUPER_BATCH))
        await asyncio.sleep(0.5)  # several poll intervals: an ask not held back would take the items now
        assert prefetch.pending() == [] and await replay.size.remote() == 3 + SUPER_BATCH
        prefetch.release()
        assert (await prefetch.next()).batch_size[0] == SUPER_BATCH
        prefetch.close()

    asyncio.run(main())
    ray.kill(replay)


def test_the_reuse_bound_makes_the_trainer_wait_for_fresh_data(ray_local):
    """max_sample_reuse: with reuse sampling nothing ever runs out, yet at 1 draw per item added a
    trainer gets a second super-batch only once the workers have added as much again."""
    replay = ReplayBufferActor.options(num_cpus=0).remote(256, 0)

    async def main():
        ask = lambda: sample_once(replay, SUPER_BATCH, False, None, 30, "trainer-0", max_draws_per_item=1.0)  # noqa: E731
        await replay.add_batch.remote(_items(0, SUPER_BATCH))
        assert (await ask()).batch_size[0] == SUPER_BATCH  # 8 draws of 8 items: within the bound
        assert await ask() is None  # 16 draws of 8 items would be 2 per item: refused
        prefetch = Prefetcher(ask, SUPER_BATCH, 1, 30, "trainer-0")
        waiting = asyncio.ensure_future(prefetch.next())
        await asyncio.sleep(0.6)  # several poll intervals: the trainer is still waiting
        assert not waiting.done()
        await replay.add_batch.remote(_items(1, SUPER_BATCH))
        batch = await asyncio.wait_for(waiting, 30)
        assert batch.batch_size[0] == SUPER_BATCH
        counters = await replay.counters.remote()
        assert counters["sampled"] == 2 * SUPER_BATCH and counters["added"] == 2 * SUPER_BATCH
        assert counters["reuse_refusals"] >= 2
        # Without a bound, the same buffer hands out its items again at once.
        assert (await sample_once(replay, SUPER_BATCH, False, None, 30, "trainer-0")).batch_size[0] == SUPER_BATCH
        prefetch.close()

    asyncio.run(main())
    ray.kill(replay)
