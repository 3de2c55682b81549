"""Group rollouts in a real run (local Ray, a DeepSpeed trainer, MetaWorld workers): GRPO with
groups of 4 trains under the sync schedule without dropping a group; then a rollout worker killed
mid-run leaves no partial or mixed-start group in the sampling pool, and the groups it could not
finish are dropped and counted."""
import os
import signal
import time
from pathlib import Path

import ray
import torch

from async_rl.config import load_config
from async_rl.driver import run

ROOT = Path(__file__).resolve().parents[2]
GROUP = 4


def _episodes(steps) -> list:
    """Consecutive episodes (a group's members are stored together, each ending with ``done``)."""
    ends = (steps["done"].nonzero().squeeze(-1) + 1).tolist()
    return [steps[a:b] for a, b in zip([0, *ends[:-1]], ends)]


def _check_groups(pool) -> int:
    """Every group in the pool is whole (G episodes, one advantage each) and same-start; returns how many."""
    ids = pool["group_id"].unique()
    for gid in ids.tolist():
        members = _episodes(pool[pool["group_id"] == gid])
        assert len(members) == GROUP, f"group {gid} has {len(members)} episodes"
        first = torch.stack([m["obs", "state"][0] for m in members])
        assert torch.equal(first, first[:1].expand_as(first)), f"group {gid}: members started apart"
        assert all(int(m["advantage"].unique().numel()) == 1 for m in members)  # an outcome advantage per episode
        assert torch.equal(torch.stack([m["episode_return"][0] for m in members]),
                           torch.stack([m["reward"].sum() for m in members]))
    return len(ids)


# A bound on a hang, not a speed check: a worker's restart and the epochs that drop its groups took 110 s at load 3
# (26 s idle); the bound leaves room for a loaded 2-core CI machine.
EVENT_WAIT_S = 240


def _config(tmp_path, *extra: str):
    """GRPO over groups of 4 on MetaWorld reach, every size tiny; ``reuse`` keeps what was trained on."""
    return load_config([
        "--advantage", "grpo", "--group-size", str(GROUP), "--max-group-version-spread", "1",
        "--log-dir", str(tmp_path / "run"), "--swanlab-mode", "disabled", "--max-epochs", "2",
        "--env-kwargs", "{benchmark: MT1, task: reach-v3, max_episode_steps: 10}", "--envs-per-worker", "2",
        "--num-trainers", "1", "--num-eval-workers", "0", "--train-batch-size", "16", "--accumulation-steps", "2",
        "--super-batch-size", "32", "--updates-per-epoch", "1", "--replay-sampling", "reuse",
        "--log-interval-seconds", "0.01", "--checkpoint-interval-epochs", "null", "--worker-num-cpus", "0.15", *extra,
    ], str(ROOT / "configs" / "metaworld_mt1_ppo.yaml"))


def test_grpo_groups_stay_whole_and_same_start_in_sync_mode_and_when_a_rollout_worker_dies(tmp_path):
    seen = {}

    def inject(runtime):
        # 1. Two synchronous epochs: workers finish (and fill) their groups before pausing, so every
        # group was collected by one policy and none was dropped.
        seen["sync"] = (ray.get(runtime.replay.snapshot.remote(), timeout=60), runtime.replay_supervisor.counters())
        seen["signature"] = [name for name, *_ in ray.get(runtime.trainers["trainer-0"].weight_signature.remote())]
        # 2. Then workers collect freely (as in asynchronous mode) and one is killed mid-episode: its
        # slots hold tickets of groups that can no longer complete.
        completed = runtime.replay_supervisor.counters()["groups_completed"]
        runtime.workers.call("resume", what="resume")
        deadline = time.monotonic() + EVENT_WAIT_S
        # A new group has members of both workers (at most 2 of 4 each): worker-0 is collecting.
        while runtime.replay_supervisor.counters()["groups_completed"] == completed:
            assert time.monotonic() < deadline, "no group completed after the workers resumed"
            time.sleep(0.2)
        ray.get(runtime.workers["worker-0"].pause.remote(), timeout=60)  # between two steps: every slot holds a ticket
        incomplete = lambda: runtime.replay_supervisor.counters()["groups_dropped_incomplete"]  # noqa: E731
        os.kill(runtime.workers.pids["worker-0"], signal.SIGKILL)
        deadline = time.monotonic() + EVENT_WAIT_S
        # The worker is restarted; its unfinished groups go once newer policies arrive.
        while runtime.workers.restarts.get("worker-0", 0) == 0 or incomplete() == 0:
            assert time.monotonic() < deadline, ("the dead worker's groups were never dropped",
                                                 runtime.replay_supervisor.counters(), runtime.workers.restarts)
            runtime.check_workers()
            runtime.train_epoch()
        seen["health"] = runtime.snapshot()["stats"]["health"]
        seen["pool"] = ray.get(runtime.replay.snapshot.remote(), timeout=60)
        seen["counters"] = runtime.replay_supervisor.counters()

    summary = run(_config(tmp_path, "--sync", "--max-group-version-spread", "1"), inspect=inject)
    assert summary["epochs"] >= 2
    pool, counters = seen["sync"]
    assert counters["groups_completed"] >= 2 and counters["groups_dropped"] == 0, counters
    assert 1 <= _check_groups(pool) <= counters["groups_completed"]  # (each sync epoch drops older groups)
    for gid in pool["group_id"].unique().tolist():
        assert pool[pool["group_id"] == gid]["policy_version"].unique().numel() == 1
    health, counters = seen["health"], seen["counters"]
    assert health["worker_restarts"] == 1, health
    assert 1 <= _check_groups(seen["pool"]) <= counters["groups_completed"] == health["groups_completed"]
    assert health["groups_dropped"] == counters["groups_dropped"] >= 1, (health, counters)
    # No critic: the inference actor served value 0, and the value head is not broadcast.
    assert not seen["pool"]["value"].any()
    assert seen["signature"] and not any(name.startswith("value_net") for name in seen["signature"])


def test_naive_alone_trains_on_episodes_that_are_groups_of_their_own(tmp_path):
    """Success-filtered RL (``--advantage naive --group-size 1``): each episode enters the pool as soon as it
    ends, with its own return as the advantage of every step."""
    seen = {}

    def inject(runtime):
        seen["pool"] = ray.get(runtime.replay.snapshot.remote(), timeout=60)
        seen["counters"] = runtime.replay_supervisor.counters()

    summary = run(_config(tmp_path, "--sync", "--advantage", "naive", "--group-size", "1"), inspect=inject)
    pool, counters = seen["pool"], seen["counters"]
    assert summary["epochs"] >= 2 and counters["groups_completed"] >= 2 and counters["groups_dropped"] == 0, counters
    for gid in pool["group_id"].unique().tolist():
        (member,) = _episodes(pool[pool["group_id"] == gid])  # one episode per group
        torch.testing.assert_close(member["advantage"], member["episode_return"].float())
        torch.testing.assert_close(member["episode_return"][0].float(), member["reward"].sum().float())
    assert not pool["group_member"].any()
