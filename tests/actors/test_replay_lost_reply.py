"""A consuming draw whose answer never reached the trainer is not lost: the trainer asks again with
the same request id and gets the same items, from the buffer's memory or, after the buffer died
between logging the draw and replying, from its log (records and snapshot); a new request id
moves on to other items, so every item is drawn exactly once."""
import asyncio
import os
import signal
from pathlib import Path

import pytest
import ray
import torch
from tensordict import TensorDict

from async_rl.actors.prefetch import RequestIds, poll, sample_once
from async_rl.actors.replay_buffer import ReplayBuffer, _restarted

ROWS = 32
DRAW = 16


def _rows(start: int, n: int) -> TensorDict:
    return TensorDict({"row": torch.arange(start, start + n), "obs": torch.randn(n, 3),
                       "policy_version": torch.zeros(n, dtype=torch.int64)}, batch_size=[n])


@ray.remote
class ReplyLostBuffer(ReplayBuffer):
    """The replay buffer actor, except that while the file ``die-before-reply`` exists in its root a
    consuming draw kills the process once its log record is durable, before the reply leaves."""

    def __init__(self, capacity: int, root: str) -> None:
        super().__init__(capacity, 0, root, restarted=_restarted())

    async def sample(self, n, consume=False, min_version=None, max_draws_per_item=None, request=None):
        batch = await super().sample(n, consume, min_version, max_draws_per_item, request)
        marker = self._root / "die-before-reply"
        if batch is not None and consume and marker.exists():
            marker.unlink()  # the restarted buffer answers
            os.kill(os.getpid(), signal.SIGKILL)
        return batch


def test_a_draw_whose_reply_died_with_the_buffer_is_handed_to_the_retry(ray_local, tmp_path):
    root = tmp_path / "checkpoints"
    replay = ReplyLostBuffer.options(num_cpus=0, max_restarts=2, max_task_retries=0).remote(64, str(root))
    for i in range(ROWS // 8):
        ray.get(replay.add_batch.remote(_rows(8 * i, 8), f"worker-0/a/{i}"), timeout=60)
    pid = ray.get(replay.pid.remote(), timeout=60)
    (root / "die-before-reply").touch()
    ids = RequestIds("trainer-0/prefetch")

    async def ask():  # as the trainer's prefetch: poll retries a RayActorError with the same id
        return await poll(lambda: sample_once(replay, DRAW, True, None, 60, "trainer-0", ids=ids), DRAW, 120,
                          "trainer-0")

    first = asyncio.run(ask())
    assert ray.get(replay.pid.remote(), timeout=60) != pid  # the buffer did die before replying
    second = asyncio.run(ask())
    drawn = first["row"].tolist() + second["row"].tolist()
    assert sorted(drawn) == list(range(ROWS))  # nothing consumed untrained, nothing twice
    counters = ray.get(replay.counters.remote(), timeout=60)
    assert counters["sampled"] == ROWS and counters["redelivered_draws"] == 1 and counters["size"] == 0
    ray.kill(replay)


# ---- the plain class: the same request across a restart, a log snapshot and a resume ---------------
def _plain(root: Path, restarted: bool = False, **kw) -> ReplayBuffer:
    return ReplayBuffer(64, 0, str(root), restarted=restarted, **kw)


async def _filled(root: Path, **kw) -> ReplayBuffer:
    buffer = _plain(root, **kw)
    for i in range(ROWS // 8):
        await buffer.add_batch(_rows(8 * i, 8), f"w/{i}")
    return buffer


def test_the_same_request_gets_the_same_draw_after_a_restart_and_a_new_one_moves_on(tmp_path):
    async def main():
        buffer = await _filled(tmp_path)
        ids = RequestIds("trainer-0/prefetch")
        drawn = await buffer.sample(DRAW, True, request=ids.current())  # its reply is lost: not answered()
        assert torch.equal((await buffer.sample(DRAW, True, request=ids.current()))["row"], drawn["row"])
        buffer.close()
        again = _plain(tmp_path, restarted=True)  # rebuilt from the log's records
        retried = await again.sample(DRAW, True, request=ids.current())
        assert torch.equal(retried["row"], drawn["row"]) and torch.equal(retried["obs"], drawn["obs"])  # same order too
        with pytest.raises(ValueError, match="asked again for 8"):
            await again.sample(8, True, request=ids.current())
        ids.answered()
        rest = await again.sample(DRAW, True, request=ids.current())
        assert sorted(drawn["row"].tolist() + rest["row"].tolist()) == list(range(ROWS))
        counters = await again.counters()
        assert counters["sampled"] == ROWS and counters["redelivered_draws"] == 2 and counters["size"] == 0
        # A restarted trainer counts from 0 again under the same name: its ids are not its predecessor's.
        assert RequestIds("trainer-0/prefetch").current() != RequestIds("trainer-0/prefetch").current()
        again.close()

    asyncio.run(main())


def test_a_held_draw_survives_a_log_snapshot(tmp_path):
    async def main():
        buffer = await _filled(tmp_path, log_limit_bytes=1024)  # every push compacts: the draw is in a snapshot
        request = ("trainer-1/refill", "nonce/7")
        drawn = await buffer.sample(DRAW, True, request=request)
        compactions = buffer._log.counters["log_compactions"]
        await buffer.add_batch(_rows(ROWS, 8), "w/last")  # over the limit again: a snapshot holding the draw
        assert buffer._log.counters["log_compactions"] == compactions + 1
        buffer.close()
        again = _plain(tmp_path, restarted=True, log_limit_bytes=1024)
        assert "base-" in again.restored_from()
        assert torch.equal((await again.sample(DRAW, True, request=request))["row"], drawn["row"])
        again.close()

    asyncio.run(main())


def test_a_new_run_resuming_a_checkpoint_holds_no_draw_of_the_old_run(tmp_path):
    async def main():
        buffer = await _filled(tmp_path / "before")
        request = ("trainer-0/prefetch", "old/3")
        drawn = await buffer.sample(DRAW, True, request=request)
        await buffer.save(str(tmp_path / "replay.safetensors"))
        buffer.close()
        resumed = _plain(tmp_path / "after")
        assert await resumed.load(str(tmp_path / "replay.safetensors")) == ROWS - DRAW
        # The old run's trainer checkpoint holds what it received; the buffer only what was not drawn.
        other = await resumed.sample(DRAW, True, request=request)
        assert sorted(drawn["row"].tolist() + other["row"].tolist()) == list(range(ROWS))
        resumed.close()

    asyncio.run(main())
