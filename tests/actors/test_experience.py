"""The record's wire format, worker-side GAE pieces, V-trace segments, the replay buffer and the task sampler."""
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from async_rl.actors.env_slots import FailureWeightedTaskSampler
from async_rl.actors.replay_buffer import ReplayStorage
from async_rl.algo.estimators import GaeSegmenter, VtraceSegmenter
from async_rl.experience import from_wire, inference_keys, step_records, to_wire

GAMMA, LAM = 0.9, 0.8


def _record(t: int, value: float, reward: float, done: bool = False, version: int = 0) -> TensorDict:
    out = TensorDict({"action": torch.zeros(2), "env_action": torch.zeros(2), "logp": torch.zeros(2),
                      "value": torch.tensor(value), "policy_version": torch.tensor(version)}, batch_size=[])
    obs = TensorDict({"state": torch.tensor([float(t)])}, batch_size=[])
    return step_records(obs.unsqueeze(0), out.unsqueeze(0), [reward], [done])[0]


def test_wire_ships_declared_dtypes_and_float32_for_bf16():
    """bf16 tensors cannot become numpy: the wire carries float32, integers and bools as declared."""
    out = TensorDict({"action": torch.rand(3, 2, dtype=torch.bfloat16), "env_action": torch.rand(3, 2),
                      "logp": torch.randn(3, 2, dtype=torch.bfloat16), "value": torch.randn(3, dtype=torch.float64),
                      "mu": torch.zeros(3, 2), "policy_version": torch.tensor([1, 1, 1], dtype=torch.int32),
                      "obs": TensorDict({"pixels": torch.zeros(3, 4, dtype=torch.uint8),
                                         "state": torch.ones(3, 5, dtype=torch.bfloat16)}, [3])}, [3])
    wire = to_wire(out, keys=(*inference_keys("action"), "policy_version", "obs"))
    assert "mu" not in wire  # not declared by the policy: not shipped
    back = from_wire(wire)
    dtypes = {k: v.dtype for k, v in back.items(True, True)}
    assert dtypes == {"action": torch.float32, "env_action": torch.float32, "logp": torch.float32,
                      "value": torch.float32, "policy_version": torch.int64, ("obs", "pixels"): torch.uint8,
                      ("obs", "state"): torch.float32}
    torch.testing.assert_close(back["logp"], out["logp"].float())
    steps = TensorDict({"reward": torch.ones(1, 4, dtype=torch.float64), "done": torch.zeros(1, 4, dtype=torch.int64)}, [1, 4])
    seg = from_wire(to_wire(TensorDict({"steps": steps}, [1])))  # declared dtypes inside segments too
    assert seg["steps", "reward"].dtype == torch.float32 and seg["steps", "done"].dtype == torch.bool


def test_a_bf16_policy_answer_ships_as_float32_with_only_the_declared_fields():
    """What the inference actor does with ``act()``: keep the declared fields, then ``to_wire``."""
    from async_rl.policies import build_policy

    policy = build_policy("mlp", {"state_dim": 39}, 4).to(torch.bfloat16)
    out = policy.act(TensorDict({"state": torch.randn(3, 39)}, [3]))
    assert {"mu", "log_std"} <= set(out.keys())  # act() returns them; training does not read them
    wire = to_wire(out.select(*inference_keys(policy.action_key, policy.behaviour_stats)))
    assert set(wire) == {"action", "env_action", "logp", "value"}
    assert {k: str(v.dtype) for k, v in wire.items()} == dict.fromkeys(wire, "float32")


def test_the_compact_layout_round_trips_every_field_and_reads_ray_arrays_without_a_copy():
    """A batch of K observations and answers crosses Ray as one contiguous numpy array per field;
    ``from_wire`` gives tensors over those arrays (read-only ones, as Ray maps them, too)."""
    import pickle

    batch = TensorDict({"obs": TensorDict({"state": torch.randn(4, 39), "image": torch.randint(0, 255, (4, 2, 8, 8), dtype=torch.uint8),
                                           "tokens": torch.randint(0, 9, (4, 6))}, [4]),
                        "action": torch.randn(4, 7), "done": torch.tensor([True, False, True, False]),
                        "policy_version": torch.arange(4)}, [4])
    wire = pickle.loads(pickle.dumps(to_wire(batch), protocol=5))
    leaves = [v for d in (wire, wire["obs"]) for v in d.values() if isinstance(v, np.ndarray)]
    assert all(v.flags.c_contiguous for v in leaves)
    for v in leaves:
        v.setflags(write=False)  # as an array mapped from Ray's object store
    back = from_wire(wire)
    for key, value in batch.items(True, True):
        assert back[key].dtype == value.dtype and torch.equal(back[key], value), key
    assert back["obs", "state"].data_ptr() == wire["obs"]["state"].ctypes.data  # zero-copy


def test_step_records_keep_what_the_trainer_reads_one_per_env():
    out = TensorDict({"action": torch.randn(3, 2), "env_action": torch.randn(3, 2), "logp": torch.randn(3),
                      "value": torch.randn(3), "policy_version": torch.tensor([4, 4, 5])}, [3])
    obs = TensorDict({"state": torch.randn(3, 5)}, [3])
    rewards, dones = [0.5, -1.0, 2.0], [False, True, False]
    records = step_records(obs, out, rewards, dones)
    assert len(records) == 3
    for k, record in enumerate(records):
        assert set(record.keys()) == {"action", "logp", "value", "policy_version", "obs", "reward", "done"}
        assert record["reward"].dtype == torch.float32 and record["done"].dtype == torch.bool
        assert float(record["reward"]) == rewards[k] and bool(record["done"]) == dones[k]
        for key in ("action", "logp", "value", "policy_version"):
            assert torch.equal(record[key], out[k][key]), key
        assert torch.equal(record["obs", "state"], obs[k]["state"])


def _manual_gae(rewards, values, bootstrap):
    adv, running, nxt = [0.0] * len(rewards), 0.0, bootstrap
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + GAMMA * nxt - values[t]
        running = delta + GAMMA * LAM * running
        adv[t], nxt = running, values[t]
    return adv


def test_episode_end_bootstraps_zero():
    seg = GaeSegmenter(local_buf=10, gamma=GAMMA, lam=LAM)
    values, rewards = [0.5, 1.0, 2.0], [1.0, 0.0, 3.0]
    pieces = [seg.add(_record(t, values[t], rewards[t], done=t == 2), None) for t in range(3)]
    assert pieces[:2] == [None, None]
    piece = pieces[2]
    assert piece.batch_size == torch.Size([3])
    torch.testing.assert_close(piece["advantage"], torch.tensor(_manual_gae(rewards, values, 0.0)))
    torch.testing.assert_close(piece["value_target"], piece["advantage"] + torch.tensor(values))
    assert seg.steps == []


def test_buffer_cut_bootstraps_from_the_next_value_and_keeps_that_step():
    seg = GaeSegmenter(local_buf=3, gamma=GAMMA, lam=LAM)
    values, rewards = [0.5, 1.0, 2.0, 4.0], [1.0, 0.0, 3.0, 7.0]
    pieces = [seg.add(_record(t, values[t], rewards[t]), None) for t in range(4)]
    assert pieces[:3] == [None, None, None]
    piece = pieces[3]
    assert piece.batch_size == torch.Size([3])
    torch.testing.assert_close(piece["advantage"], torch.tensor(_manual_gae(rewards[:3], values[:3], 4.0)))
    # Cut vs end: the same steps ending the episode instead bootstrap 0 and differ.
    assert not torch.allclose(piece["advantage"], torch.tensor(_manual_gae(rewards[:3], values[:3], 0.0)))
    assert len(seg.steps) == 1 and float(seg.steps[0]["value"]) == 4.0


def test_flush_cuts_early_like_a_full_buffer():
    seg = GaeSegmenter(local_buf=10, gamma=GAMMA, lam=LAM)
    assert seg.flush() is None
    values, rewards = [0.5, 1.0, 2.0], [1.0, 0.0, 3.0]
    for t in range(3):
        seg.add(_record(t, values[t], rewards[t]), None)
    piece = seg.flush()
    torch.testing.assert_close(piece["advantage"], torch.tensor(_manual_gae(rewards[:2], values[:2], 2.0)))
    assert len(seg.steps) == 1


def test_vtrace_segments_have_fixed_length_and_cross_episode_ends():
    seg = VtraceSegmenter(length=4)
    out = [seg.add(_record(t, 0.0, 1.0, done=t == 1), TensorDict({"state": torch.tensor([t + 1.0])}, [])) for t in range(4)]
    segment = out[-1]
    assert out[:3] == [None, None, None]
    assert segment.batch_size == torch.Size([1])
    assert segment["steps"].batch_size == torch.Size([1, 4])
    assert segment["steps", "done"].tolist() == [[False, True, False, False]]
    assert float(segment["bootstrap_obs", "state"]) == 4.0


def _items(start: int, n: int) -> TensorDict:
    return TensorDict({"x": torch.arange(start, start + n).float()}, batch_size=[n])


def test_replay_is_a_bounded_fifo_with_counters():
    store = ReplayStorage(capacity=5, seed=0)
    store.add_batch(_items(0, 3))
    store.add_batch(_items(3, 4))  # evicts 0 and 1
    assert store.size() == 5
    # 0 and 1 were never drawn: generated for nothing
    assert store.counters == {"added": 7, "sampled": 0, "evicted": 2, "evicted_untrained": 2, "dropped_stale": 0}
    sample = store.sample(5)
    assert sorted(sample["x"].tolist()) == [2.0, 3.0, 4.0, 5.0, 6.0]  # without replacement, only live items
    with pytest.raises(ValueError, match="holding 5"):
        store.sample(6)
    assert store.counters["sampled"] == 5


def test_consumed_items_leave_and_free_slots_are_refilled_before_evicting():
    store = ReplayStorage(capacity=4, seed=0)
    store.add_batch(_items(0, 4))
    taken = store.sample(3, consume=True)["x"].tolist()
    assert store.size() == 1
    store.add_batch(_items(10, 3))  # fills the three free slots, evicts nothing
    assert store.counters["evicted"] == 0 and store.size() == 4
    left = sorted(set(range(4)) - set(int(x) for x in taken))
    assert sorted(store.sample(4)["x"].tolist()) == [float(left[0]), 10.0, 11.0, 12.0]
    store.add_batch(_items(20, 1))  # now the oldest (the survivor of the first batch) goes
    assert sorted(store.sample(4)["x"].tolist()) == [10.0, 11.0, 12.0, 20.0]
    # the survivor had been drawn (sampled above) before it went
    assert store.counters == {"added": 8, "sampled": 11, "evicted": 1, "evicted_untrained": 0, "dropped_stale": 0}


def test_snapshot_returns_live_items_in_insertion_order_without_sampling():
    store = ReplayStorage(capacity=4, seed=0)
    assert store.snapshot() is None
    store.add_batch(_items(0, 3))
    store.sample(1, consume=True)
    store.add_batch(_items(10, 2))  # refills the freed slot, then evicts the oldest
    kept = store.snapshot()["x"].tolist()
    assert len(kept) == 4 and kept[-2:] == [10.0, 11.0] and kept[:2] == sorted(kept[:2])
    assert store.counters["sampled"] == 1


def test_drop_older_than_removes_stale_steps_and_segments():
    store = ReplayStorage(capacity=6, seed=0)
    store.add_batch(TensorDict({"x": torch.arange(4.0), "policy_version": torch.tensor([0, 1, 2, 3])}, [4]))
    assert store.drop_older_than(2) == 2
    assert sorted(store.sample(2)["x"].tolist()) == [2.0, 3.0]
    assert store.counters["dropped_stale"] == 2
    segments = ReplayStorage(capacity=2, seed=0)
    steps = TensorDict({"policy_version": torch.tensor([[1, 2], [2, 2]])}, [2, 2])
    segments.add_batch(TensorDict({"steps": steps}, [2]))
    assert segments.drop_older_than(2) == 1  # the segment that holds a version-1 step


def test_replay_sampling_is_uniform():
    store = ReplayStorage(capacity=10, seed=1)
    store.add_batch(_items(0, 10))
    counts = np.zeros(10)
    for _ in range(2000):
        for x in store.sample(3)["x"].tolist():
            counts[int(x)] += 1
    assert np.all(np.abs(counts / counts.sum() - 0.1) < 0.02)


def test_failure_weighted_task_sampling():
    sampler = FailureWeightedTaskSampler(3, window=4, rng=np.random.default_rng(0))
    np.testing.assert_allclose(sampler.probabilities(), [1 / 3] * 3)
    for _ in range(3):
        sampler.record(0, success=False)  # 3 recent failures -> weight 4
    sampler.record(1, success=True)  # a success adds nothing -> weight 1
    np.testing.assert_allclose(sampler.probabilities(), [4 / 6, 1 / 6, 1 / 6])
    draws = np.bincount([sampler.sample() for _ in range(3000)], minlength=3) / 3000
    np.testing.assert_allclose(draws, [4 / 6, 1 / 6, 1 / 6], atol=0.03)
    for _ in range(4):
        sampler.record(0, success=True)  # the window forgets old failures
    np.testing.assert_allclose(sampler.probabilities(), [1 / 3] * 3)


def test_task_sampler_state_survives_a_json_checkpoint():
    """The curriculum a checkpoint keeps: recent outcomes and the RNG continue exactly after a resume."""
    import json

    sampler = FailureWeightedTaskSampler(3, window=4, rng=np.random.default_rng(5))
    for task, success in [(0, False), (0, False), (2, True), (1, False)]:
        sampler.record(task, success)
    sampler.sample()
    state = json.loads(json.dumps(sampler.state_dict()))  # as meta.json stores it
    restored = FailureWeightedTaskSampler(3, window=4, rng=np.random.default_rng(99))
    restored.load_state_dict(state)
    np.testing.assert_allclose(restored.probabilities(), sampler.probabilities())
    assert [restored.sample() for _ in range(50)] == [sampler.sample() for _ in range(50)]


def test_replay_log_keeps_what_a_checkpoint_lacks(tmp_path):
    """The replay buffer's write-ahead log: records survive a new process, are read in order after
    a checkpoint's last sequence number, and are dropped once a checkpoint covers them (more in
    tests/actors/test_replay_exactly_once.py)."""
    import asyncio

    from async_rl.actors.replay_log import ReplayLog, pack, unpack

    async def write():
        log = ReplayLog(tmp_path / "log", fresh=True)
        log.start(0)
        for i in range(4):
            blob, sizes = pack([TensorDict({"reward": torch.full((2,), float(i))}, batch_size=[2])])
            await log.durable(log.append({"op": "add", "id": f"w/{i}", "sizes": sizes}, blob))
        log.close()

    asyncio.run(write())
    reopened = ReplayLog(tmp_path / "log", fresh=False)  # what a restarted buffer sees
    after = reopened.records(after=1)
    assert [r.seq for r in after] == [2, 3]
    assert [float(unpack(r.payload, r.header["sizes"])[0]["reward"][0]) for r in after] == [2.0, 3.0]
    reopened.start(4)
    reopened.drop_through(2)  # a segment goes once a checkpoint covers all of it: records 0-3 share one
    asyncio.run(reopened.durable(reopened.append({"op": "count", "key": "x", "n": 1})))
    reopened.drop_through(3)
    reopened.close()
    assert [r.seq for r in ReplayLog(tmp_path / "log", fresh=False).records(after=-1)] == [4]
    assert ReplayLog(tmp_path / "log", fresh=True).records(after=-1) == []


def test_finite_rows_flags_only_the_envs_with_a_non_finite_observation():
    from async_rl.actors.env_slots import finite_rows

    obs = TensorDict({"state": torch.zeros(4, 3), "image": torch.zeros(4, 2, 2, dtype=torch.uint8),
                      "extra": TensorDict({"v": torch.zeros(4, 2)}, [4])}, [4])
    obs["state"][1, 2] = float("nan")
    obs["extra", "v"][3, 0] = float("inf")
    assert finite_rows(obs) == [True, False, True, False]
