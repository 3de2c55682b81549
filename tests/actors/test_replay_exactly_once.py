"""Exactly-once experience in the replay buffer: a buffer that dies comes back
as it died (consumption and counters included), a batch pushed again is stored once, the log is
written by a thread of its own and stays bounded without checkpoints, and episodes held for their
group survive a restart."""
import asyncio
import os
import signal
import time
from types import SimpleNamespace

import ray
import torch
from tensordict import TensorDict

from async_rl.actors.replay_buffer import ReplayBufferActor

COMPARED = ("added", "sampled", "evicted", "dropped_stale", "size")


def _rows(start: int, n: int, version: int = 0) -> TensorDict:
    return TensorDict({"row": torch.arange(start, start + n), "obs": torch.randn(n, 3),
                       "policy_version": torch.full((n,), version)}, batch_size=[n])


def _restart(actor) -> None:
    """SIGKILL the buffer's process and wait until Ray has restarted it (its constructor has recovered)."""
    pid = ray.get(actor.pid.remote(), timeout=60)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if ray.get(actor.pid.remote(), timeout=10) != pid:
                return
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
        time.sleep(0.2)
    raise AssertionError("the replay buffer was not restarted within 120 s")


def _buffer(tmp_path):
    return ReplayBufferActor.options(num_cpus=0, max_restarts=2, max_task_retries=0).remote(
        64, 0, str(tmp_path / "checkpoints"))


def test_a_killed_buffer_comes_back_as_it_died_and_never_hands_out_a_consumed_item_again(ray_local, tmp_path):
    replay = _buffer(tmp_path)
    for i in range(4):
        ray.get(replay.add_batch.remote(_rows(8 * i, 8)), timeout=60)
    drawn = ray.get(replay.sample.remote(16, True), timeout=60)  # consumed: a trainer trains on them
    at_kill = ray.get(replay.counters.remote(), timeout=60)  # read before the kill, nothing runs after
    _restart(replay)
    after = ray.get(replay.counters.remote(), timeout=60)
    assert {k: after[k] for k in COMPARED} == {k: at_kill[k] for k in COMPARED}
    left = ray.get(replay.snapshot.remote(), timeout=60)
    assert sorted(left["row"].tolist()) == sorted(set(range(32)) - set(drawn["row"].tolist()))
    assert ray.get(replay.sample.remote(17, True), timeout=60) is None  # only the 16 not drawn are left
    ray.kill(replay)


def test_a_batch_pushed_again_after_the_kill_is_stored_once(ray_local, tmp_path):
    replay = _buffer(tmp_path)
    ray.get(replay.add_batch.remote(_rows(0, 8), "worker-0/a/0"), timeout=60)
    _restart(replay)  # the worker never heard the answer: it pushes the same batch again
    assert ray.get(replay.add_batch.remote(_rows(0, 8), "worker-0/a/0"), timeout=60) == 8
    counters = ray.get(replay.counters.remote(), timeout=60)
    assert counters["added"] == 8 and counters["size"] == 8 and counters["duplicate_pushes"] == 1
    assert ray.get(replay.add_batch.remote(_rows(8, 8), "worker-0/a/1"), timeout=60) == 16  # a new id is new
    ray.kill(replay)


# ---- the plain class: the log's writer thread, its bound, and the group assembler ------------------
def _plain(tmp_path, restarted=False, **kw):
    from async_rl.actors.replay_buffer import ReplayBuffer

    return ReplayBuffer(64, 0, str(tmp_path / "checkpoints"), restarted=restarted, **kw)


def test_pushes_are_answered_after_one_fsync_of_the_writer_thread(tmp_path):
    async def main():
        buffer = _plain(tmp_path)
        buffer._log.pause(True)  # the writer holds: nothing is durable, so nobody is answered
        pushes = [asyncio.ensure_future(buffer.add_batch(_rows(4 * i, 4), f"w/{i}")) for i in range(5)]
        for _ in range(20):
            await asyncio.sleep(0)
        assert not any(p.done() for p in pushes)
        commits = buffer._log.counters["log_commits"]
        buffer._log.pause(False)
        assert await asyncio.gather(*pushes) == [4, 8, 12, 16, 20]
        assert buffer._log.counters["log_commits"] == commits + 1  # one fsync for the five
        buffer.close()

    asyncio.run(main())


def test_the_log_stays_bounded_without_a_checkpoint_and_recovers_through_its_snapshot(tmp_path):
    limit = 8 * 1024

    async def main():
        buffer = _plain(tmp_path, log_limit_bytes=limit)
        record = 0
        for i in range(60):  # far more than the limit, no checkpoint ever
            await buffer.add_batch(_rows(8 * i, 8), f"w/{i}")
            record = max(record, buffer._log._live[-1][1] if buffer._log._live else 0)
            if i % 3 == 2:
                await buffer.sample(8, True)
            assert buffer._log.live_bytes <= limit + record
        counters = await buffer.counters()
        assert counters["log_compactions"] > 0 and counters["log_limit_bytes"] == limit
        await buffer._log.durable()
        buffer._log.close()  # the writer has finished its snapshots: what is on disk is what a restart reads
        assert buffer._log.size_bytes() <= limit + record
        kept = buffer.snapshot()
        again = _plain(tmp_path, restarted=True, log_limit_bytes=limit)
        assert "base-" in again.restored_from()
        assert torch.equal(again.snapshot()["row"], kept["row"])
        restored = await again.counters()
        assert {k: restored[k] for k in COMPARED} == {k: counters[k] for k in COMPARED}
        assert await again.add_batch(_rows(0, 8), "w/59") == kept.batch_size[0]  # its id survived the snapshot
        again.close()

    asyncio.run(main())


def _group_buffer(tmp_path, restarted=False, group_size=4, whole_group_draws=True):
    from async_rl.actors.groups import GroupSpec
    from async_rl.actors.replay_buffer import ReplayBuffer

    spec = GroupSpec("grpo", group_size, 4, 2, None, SimpleNamespace(grpo_scale_by_std=True), whole_group_draws)
    return ReplayBuffer(4096, 0, str(tmp_path / "checkpoints"), spec, restarted=restarted)


def _episode(group_id: int, n: int, ret: float) -> TensorDict:
    from async_rl.actors.groups import stamp_episode

    steps = TensorDict({"obs": torch.randn(n, 3), "reward": torch.full((n,), ret / n),
                        "policy_version": torch.zeros(n, dtype=torch.int64)}, batch_size=[n])
    return stamp_episode(steps, group_id, ret > 0)


def test_episodes_held_for_their_group_survive_a_restart(tmp_path):
    async def main():
        buffer = _group_buffer(tmp_path)
        tickets = [(await buffer.tickets(f"worker-{k % 2}", [0]))[0] for k in range(4)]
        gid = tickets[0][0]
        assert all(t == tickets[0] for t in tickets)  # four members of one group
        await buffer.add_episodes([_episode(gid, 5, 1.0), _episode(gid, 6, 0.0)], "worker-0/x/0")
        buffer.close()
        again = _group_buffer(tmp_path, restarted=True)  # the two held episodes come back with their group
        counters = await again.counters()
        assert counters["group_steps_held"] == 11 and counters["groups_dropped"] == 0
        entered = await again.add_episodes([_episode(gid, 7, 2.0), _episode(gid, 8, 0.5)], "worker-1/y/0")
        assert entered == 5 + 6 + 7 + 8 and again.size() == 26
        assert sorted(again.snapshot()["group_member"].unique().tolist()) == [0, 1, 2, 3]
        # A ticket after the restart continues the ledger: a new group, not an id handed out before.
        assert (await again.tickets("worker-0", [0]))[0][0] != gid
        again.close()

    asyncio.run(main())


def test_group_steps_are_drawn_to_the_last_unless_the_loss_needs_whole_groups(tmp_path):
    """A group of a 3-step and a 9-step episode: drawn step by step (any loss but PACS's) every step
    is trained on; drawn by whole groups (equal steps per member) the long episode's last 6 steps
    are stranded once the short one is used up: the cost only a loss comparing members pays."""
    async def drawn(whole: bool) -> tuple[int, int]:
        buffer = _group_buffer(tmp_path / str(whole), group_size=2, whole_group_draws=whole)
        gid = (await buffer.tickets("worker-0", [0, 0]))[0][0]
        assert await buffer.add_episodes([_episode(gid, 3, 1.0), _episode(gid, 9, 0.0)], "worker-0/x/0") == 12
        taken = 0
        while (batch := await buffer.sample(2, consume=True)) is not None:
            taken += batch.batch_size[0]
            if whole:  # every draw holds both members, equally
                assert sorted(batch["group_member"].tolist()) == [0, 1]
        left = buffer.size()
        buffer.close()
        return taken, left

    async def main():
        assert await drawn(whole=False) == (12, 0)
        assert await drawn(whole=True) == (6, 6)

    asyncio.run(main())


def test_a_checkpoint_of_the_buffer_holds_its_log_position_and_trims_the_log(tmp_path):
    async def main():
        buffer = _plain(tmp_path)
        for i in range(3):
            await buffer.add_batch(_rows(8 * i, 8), f"w/{i}")
        ckpt = tmp_path / "checkpoints" / "epoch-000001"
        ckpt.mkdir(parents=True)
        await buffer.save(str(ckpt / "replay.safetensors"))
        (ckpt / "meta.json").write_text("{}")  # committed
        buffer.checkpoint_committed(str(ckpt / "replay.safetensors"))
        await buffer.sample(8, True)  # after the checkpoint: only the log has it
        await buffer._log.durable()
        assert buffer._log.live_bytes < 1000  # the adds went with the checkpoint
        buffer.close()
        again = _plain(tmp_path, restarted=True)
        assert again.restored_from() == str(ckpt) and again.size() == 16
        again.close()

    asyncio.run(main())


def test_a_torn_last_record_is_not_read_and_numbering_goes_on(tmp_path):
    from async_rl.actors.replay_log import ReplayLog

    async def main():
        log = ReplayLog(tmp_path / "log", fresh=True)
        log.start(0)
        for i in range(3):
            await log.durable(log.append({"op": "count", "key": "x", "n": i}))
        log.close()
        segment = sorted((tmp_path / "log").glob("seg-*.log"))[-1]
        segment.write_bytes(segment.read_bytes()[:-3])  # a crash in the middle of the last write
        again = ReplayLog(tmp_path / "log", fresh=False)
        records = again.records(after=-1)
        assert [r.seq for r in records] == [0, 1]
        again.start(2)
        await again.durable(again.append({"op": "count", "key": "x", "n": 9}))
        again.close()
        assert [(r.seq, r.header["n"]) for r in ReplayLog(tmp_path / "log", fresh=False).records(-1)] == \
            [(0, 0), (1, 1), (2, 9)]

    asyncio.run(main())


def test_a_consuming_draw_waits_for_its_record(tmp_path):
    """A consuming draw is answered only once it is on disk (a restart can then never hold it again)."""
    async def main():
        buffer = _plain(tmp_path)
        await buffer.add_batch(_rows(0, 8), "w/0")
        buffer._log.pause(True)
        draw = asyncio.ensure_future(buffer.sample(8, True))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not draw.done()
        buffer._log.pause(False)
        assert (await draw).batch_size[0] == 8
        buffer.close()

    asyncio.run(main())


def test_a_buffer_resumed_from_a_checkpoint_comes_back_with_it_after_a_restart(tmp_path):
    async def main():
        first = _plain(tmp_path / "before")
        await first.add_batch(_rows(0, 8), "w/0")
        await first.save(str(tmp_path / "replay.safetensors"))
        first.close()
        resumed = _plain(tmp_path)  # a new run (a fresh log) resuming that checkpoint
        assert await resumed.load(str(tmp_path / "replay.safetensors")) == 8
        await resumed.add_batch(_rows(8, 8), "w/1")
        resumed.close()
        again = _plain(tmp_path, restarted=True)  # no checkpoint of its own yet: the log's snapshot is the base
        assert sorted(again.snapshot()["row"].tolist()) == list(range(16))
        again.close()

    asyncio.run(main())
