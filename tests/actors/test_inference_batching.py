"""The inference actor's batching loop: by size, by timeout, errors, atomic weight swap, and a
loop that dies taking its actor with it (Ray restarts it)."""
import asyncio
import os
import time

import pytest
import torch
from tensordict import TensorDict

from async_rl.actors.inference import BatchingServer


def _obs(i: float, k: int = 1) -> TensorDict:
    return TensorDict({"state": torch.full((k, 1), float(i))}, batch_size=[k])


class Recorder:
    """A forward that records batch sizes and returns x * weight."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.weight = torch.tensor(1.0)
        self.batches: list[int] = []
        self.delay_s = delay_s

    def __call__(self, obs: TensorDict, deterministic: torch.Tensor) -> TensorDict:
        self.batches.append(obs.batch_size[0])  # rows
        time.sleep(self.delay_s)
        return TensorDict({"y": obs["state"][:, 0] * self.weight, "det": deterministic}, batch_size=obs.batch_size)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_full_batch_goes_out_without_waiting_for_the_timeout():
    async def main():
        fwd = Recorder()
        server = BatchingServer(fwd, batch_size=4, timeout_s=10.0)
        start = time.monotonic()
        outs = await asyncio.gather(*(server.submit(_obs(i)) for i in range(4)))
        return fwd.batches, [o["y"].item() for o in outs], time.monotonic() - start

    batches, ys, elapsed = run(main())
    assert batches == [4]
    assert ys == [0.0, 1.0, 2.0, 3.0]  # each caller gets its own row
    assert elapsed < 5.0


def test_partial_batch_goes_out_after_the_timeout():
    async def main():
        fwd = Recorder()
        server = BatchingServer(fwd, batch_size=8, timeout_s=0.2)
        start = time.monotonic()
        outs = await asyncio.gather(*(server.submit(_obs(i), deterministic=i == 1) for i in range(3)))
        return fwd.batches, outs, time.monotonic() - start

    batches, outs, elapsed = run(main())
    assert batches == [3]
    assert 0.15 <= elapsed < 5.0
    assert [o["det"].item() for o in outs] == [False, True, False]
    assert all(o["policy_version"].item() == 0 for o in outs)


def test_more_requests_than_batch_size_are_split():
    async def main():
        fwd = Recorder()
        server = BatchingServer(fwd, batch_size=3, timeout_s=0.05)
        await asyncio.gather(*(server.submit(_obs(i)) for i in range(7)))
        return fwd.batches

    assert run(main()) == [3, 3, 1]


def test_multi_row_requests_stay_together_and_get_their_own_rows():
    async def main():
        fwd = Recorder()
        server = BatchingServer(fwd, batch_size=4, timeout_s=0.05)
        a, b = await asyncio.gather(server.submit(_obs(1, k=3)), server.submit(_obs(2, k=2)))
        return fwd.batches, a, b

    batches, a, b = run(main())
    assert batches == [5]  # 3 rows, then 2 more: a caller's rows are never split
    assert a["y"].tolist() == [1.0, 1.0, 1.0] and b["y"].tolist() == [2.0, 2.0]


def test_failed_forward_reaches_every_pending_caller_and_the_server_keeps_serving():
    calls = {"n": 0}

    def forward(obs, det):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom in forward")
        return TensorDict({"y": obs["state"][:, 0]}, batch_size=obs.batch_size)

    async def main():
        server = BatchingServer(forward, batch_size=3, timeout_s=0.05)
        results = await asyncio.gather(*(server.submit(_obs(i)) for i in range(3)), return_exceptions=True)
        after = await server.submit(_obs(5))
        return results, after

    results, after = run(main())
    assert len(results) == 3 and all(isinstance(r, RuntimeError) and "boom" in str(r) for r in results)
    assert after["y"].item() == 5.0


def test_weight_swap_is_atomic_and_versioned():
    async def main():
        fwd = Recorder(delay_s=0.3)
        server = BatchingServer(fwd, batch_size=1, timeout_s=0.01)
        first = asyncio.ensure_future(server.submit(_obs(1)))
        await asyncio.sleep(0.1)  # the first forward is running now

        def apply():
            fwd.weight = torch.tensor(10.0)

        server.stage_weights(apply, version=7)
        before_swap = float(fwd.weight)  # staging alone changes nothing
        second = await server.submit(_obs(1))
        return await first, second, before_swap

    first, second, before_swap = run(main())
    assert before_swap == 1.0
    assert first["y"].item() == 1.0 and first["policy_version"].item() == 0
    assert second["y"].item() == 10.0 and second["policy_version"].item() == 7


def test_dead_loop_fails_callers_instead_of_hanging():
    async def main():
        server = BatchingServer(Recorder(), batch_size=1, timeout_s=0.01)
        server._task.cancel()
        await asyncio.sleep(0.05)
        with pytest.raises(RuntimeError, match="inference loop"):
            await server.submit(_obs(0))

    run(main())


@pytest.mark.parametrize("in_thread", [True, False])
def test_forward_runs_on_the_loop_or_in_a_thread_with_the_same_answers(in_thread):
    import threading

    threads = []

    def forward(obs, deterministic):
        threads.append(threading.get_ident())
        return TensorDict({"y": obs["state"][:, 0] * 2}, batch_size=obs.batch_size)

    async def main():
        server = BatchingServer(forward, batch_size=2, timeout_s=0.01, forward_in_thread=in_thread)
        outs = await asyncio.gather(*(server.submit(_obs(i)) for i in range(4)))
        return [o["y"].item() for o in outs], threading.get_ident()

    answers, loop_thread = run(main())
    assert answers == [0.0, 2.0, 4.0, 6.0]
    assert all((t != loop_thread) == in_thread for t in threads), (threads, loop_thread)


def test_a_batch_that_cannot_be_served_fails_its_callers_and_the_loop_goes_on():
    """Observations that do not stack, an output of the wrong size: that batch's callers get the
    error; the loop serves the next batch (it used to die and answer nothing more)."""
    def forward(obs, det):
        rows = obs.batch_size[0] + (1 if obs["state"][0, 0] < 0 else 0)  # a negative input: one row too many
        return TensorDict({"y": torch.zeros(rows)}, batch_size=[rows])

    async def main():
        server = BatchingServer(forward, batch_size=2, timeout_s=0.05)
        odd = TensorDict({"other": torch.zeros(1, 1)}, batch_size=[1])
        mixed = await asyncio.gather(server.submit(_obs(1)), server.submit(odd), return_exceptions=True)
        wrong = await asyncio.gather(server.submit(_obs(-1)), return_exceptions=True)
        return mixed, wrong, await server.submit(_obs(3))

    mixed, wrong, after = run(main())
    assert all(isinstance(r, Exception) for r in [*mixed, *wrong]), (mixed, wrong)
    assert after["y"].item() == 0.0 and after["policy_version"].item() == 0


def test_batches_failing_in_a_row_end_the_loop_and_report_it():
    reported = []

    def forward(obs, det):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")  # sticky: every batch fails

    async def main():
        server = BatchingServer(forward, batch_size=1, timeout_s=0.01, max_failed_batches=3, on_fatal=reported.append)
        failures = [await asyncio.gather(server.submit(_obs(i)), return_exceptions=True) for i in range(3)]
        await asyncio.sleep(0.05)
        with pytest.raises(RuntimeError, match="inference loop is dead"):
            await server.submit(_obs(0))
        return failures

    failures = run(main())
    assert all("illegal memory access" in str(f[0]) for f in failures)
    assert len(reported) == 1 and "3 batches in a row failed" in str(reported[0])


def test_a_failed_staged_weight_swap_ends_the_loop_and_fails_its_callers():
    reported = []

    async def main():
        server = BatchingServer(Recorder(), batch_size=1, timeout_s=0.01, on_fatal=reported.append)

        def apply():
            raise RuntimeError("copy failed half-way")

        server.stage_weights(apply, version=1)
        with pytest.raises(RuntimeError, match="copy failed"):
            await server.submit(_obs(0))
        await asyncio.sleep(0.05)

    run(main())
    assert [str(e) for e in reported] == ["copy failed half-way"]


def flaky_mlp(broken_file: str) -> torch.nn.Module:
    """A real MLP policy whose forward raises while ``broken_file`` exists (a device gone bad)."""
    from async_rl.policies import build_policy

    policy = build_policy("mlp", {"state_dim": 1}, 1, hidden_sizes=[8])
    act = policy.act

    def flaky_act(obs, deterministic):
        if os.path.exists(broken_file):
            raise RuntimeError("injected forward failure")
        return act(obs, deterministic)

    policy.act = flaky_act
    return policy


def test_an_inference_actor_whose_loop_dies_is_restarted_and_callers_get_errors(ray_local, tmp_path):
    import functools

    import ray

    from async_rl.actors.inference import InferenceActor
    from async_rl.experience import to_wire

    broken = tmp_path / "broken"
    broken.touch()
    actor = InferenceActor.options(num_cpus=0, max_restarts=1, max_task_retries=0).remote(
        0, functools.partial(flaky_mlp, str(broken)), 1, 1.0, forward_in_thread=False, weights_timeout_s=30)
    ray.get(actor.serve_built_weights.remote(), timeout=60)
    pid = ray.get(actor.pid.remote(), timeout=60)
    for _ in range(3):  # errors, never a hang; the third in a row ends the loop (MAX_FAILED_BATCHES)
        with pytest.raises(ray.exceptions.RayError):
            ray.get(actor.request.remote(to_wire(_obs(1))), timeout=30)
    broken.unlink()
    deadline, new_pid = time.monotonic() + 60, pid
    while new_pid == pid:  # the dead loop took its process with it, and Ray started a new one
        assert time.monotonic() < deadline, "the inference actor was not replaced although its batches kept failing"
        try:
            new_pid = ray.get(actor.pid.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            time.sleep(0.2)
    ray.get(actor.serve_built_weights.remote(), timeout=60)
    answer = ray.get(actor.request.remote(to_wire(_obs(4))), timeout=30)
    assert answer["value"].shape == (1,) and answer["policy_version"].tolist() == [0]
    ray.kill(actor)
