"""Group rollouts: the ticket ledger and group assembler (async_rl/actors/groups.py), the episode
segmenter, the no-critic policy, and same-start resets of the MetaWorld env."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from async_rl.actors.groups import GroupAssembler, stamp_episode
from async_rl.algo import advantage_estimator, grpo_advantages, rloo_advantages


def episode(group_id: int, rewards: list[float], version: int | list[int] = 0, success: bool = False) -> TensorDict:
    """A finished episode's steps as a rollout worker pushes them."""
    n = len(rewards)
    versions = torch.tensor(version if isinstance(version, list) else [version] * n, dtype=torch.int64)
    steps = TensorDict({"obs": TensorDict({"state": torch.randn(n, 3)}, batch_size=[n]),
                        "reward": torch.tensor(rewards, dtype=torch.float32),
                        "done": torch.arange(n) == n - 1, "policy_version": versions}, batch_size=[n])
    return stamp_episode(steps, group_id, success)


def assembler(group_size: int = 4, max_spread: int = 1, num_workers: int = 2, name: str = "grpo",
              id_base: int = 0) -> GroupAssembler:
    from async_rl.config.schema import RunConfig

    est, cfg = advantage_estimator(name), RunConfig(advantage=name, group_size=group_size)
    return GroupAssembler(group_size, max_spread, num_workers, lambda r: est.episode_advantages(r, cfg), seed=0,
                          id_base=id_base)


def test_tickets_spread_a_group_over_workers_and_fill_only_never_opens_one():
    a = assembler(group_size=4, num_workers=2)
    w0 = [a.ticket("worker-0", task=3) for _ in range(3)]
    w1 = [a.ticket("worker-1", task=5) for _ in range(2)]
    first = w0[0]
    # At most ceil(4 / 2) = 2 members per worker: worker-0's third ticket opens a second group.
    assert w0[1] == first and w0[2].group_id != first.group_id and w1 == [first, first]  # worker-1 fills the older one
    assert first.task == 3 and w0[2].task == 3  # a new group plays the task its first worker proposed
    assert a.counters["groups_opened"] == 2 and a.open_groups() == 2
    # The second group has 1 of 4 issued: a draining worker fills it past its per-worker bound, then gets none.
    assert [a.ticket("worker-1", 0, fill_only=True).group_id for _ in range(3)] == [w0[2].group_id] * 3
    assert a.ticket("worker-1", 0, fill_only=True) is None
    assert a.counters["groups_opened"] == 2


@pytest.mark.parametrize("name, maths", [("grpo", grpo_advantages), ("rloo", rloo_advantages)])
def test_a_group_is_released_whole_with_the_estimators_outcome_advantage_on_every_step(name, maths):
    a = assembler(name=name)
    ticket = a.ticket("worker-0", 1)
    returns = [[1.0, 0.0], [0.0], [2.0, 2.0, 1.0], [0.5]]
    released = []
    for k, rewards in enumerate(returns):
        assert released == []  # nothing leaves before the last member
        released = a.add_episode(episode(ticket.group_id, rewards, success=k == 2))
    assert len(released) == 1
    group = released[0]
    assert group.batch_size[0] == 7 and (group["group_id"] == ticket.group_id).all()
    expected = maths(torch.tensor([[sum(r) for r in returns]]))[0]
    per_step = torch.cat([expected[k].expand(len(r)) for k, r in enumerate(returns)]).float()
    torch.testing.assert_close(group["advantage"], per_step)
    torch.testing.assert_close(group["episode_return"], torch.cat([torch.full((len(r),), sum(r)) for r in returns]))
    assert group["success"].tolist() == [False] * 3 + [True] * 3 + [False]
    assert a.counters["groups_completed"] == 1 and a.counters["groups_dropped"] == 0 and a.open_groups() == 0


def test_naive_alone_each_episode_is_its_own_group_with_its_outcome_on_every_step():
    """Success-filtered RL (``--advantage naive --group-size 1``): no comparison, so no partner to wait for."""
    from async_rl.config import load_config

    assert load_config(["--advantage", "naive"]).group_size == 1
    a = assembler(group_size=1, num_workers=2, name="naive")
    tickets = [a.ticket("worker-0", 1), a.ticket("worker-0", 1)]
    assert tickets[0].group_id != tickets[1].group_id  # one worker, two slots: two groups, each complete alone
    released = a.add_episode(episode(tickets[1].group_id, [0.0, 1.0], success=True))
    assert len(released) == 1 and released[0]["advantage"].tolist() == [1.0, 1.0]
    assert a.add_episode(episode(tickets[0].group_id, [0.0, 0.0, 0.0]))[0]["advantage"].tolist() == [0.0] * 3
    assert a.counters["groups_completed"] == 2 and a.open_groups() == 0


def test_a_group_straddling_too_many_policy_versions_is_dropped_and_counted():
    a = assembler(max_spread=1)
    a.latest_version = 3  # the ledger has seen policy 3 when it opens the group
    ticket = a.ticket("worker-0", 0)
    assert a.add_episode(episode(ticket.group_id, [1.0, 1.0], version=[3, 4])) == []
    assert a.add_episode(episode(ticket.group_id, [1.0], version=4)) == []
    assert a.add_episode(episode(ticket.group_id, [0.0], version=4)) == []
    # Staleness is judged by the version each member started with (actors/groups.py): starts 3..5.
    assert a.add_episode(episode(ticket.group_id, [0.0, 1.0], version=[5, 5])) == []
    assert a.counters["groups_dropped_spread"] == 1 and a.counters["groups_dropped"] == 1
    assert a.counters["groups_completed"] == 0 and a.open_groups() == 0


def test_long_episodes_spanning_many_versions_but_started_together_make_a_whole_group():
    """MetaWorld: one 500-step episode spans more versions than max_spread; that alone is no reason
    to drop the group, and the incomplete-group bound waits an episode's span on top of max_spread."""
    a = assembler(group_size=2, max_spread=1)
    ticket = a.ticket("worker-0", 0)
    a.ticket("worker-1", 0)
    assert a.add_episode(episode(ticket.group_id, [1.0] * 4, version=[0, 2, 4, 6])) == []
    assert a.episode_span() == 6 and a.open_groups() == 1  # newest 6 - last ticket 0 <= 1 + 6
    released = a.add_episode(episode(ticket.group_id, [0.0] * 4, version=[1, 3, 5, 7]))
    assert len(released) == 1 and released[0].batch_size[0] == 8
    assert a.counters["groups_completed"] == 1 and a.counters["groups_dropped"] == 0


def test_the_incomplete_group_of_a_dead_worker_is_dropped_once_newer_policies_arrive():
    a = assembler(group_size=2, max_spread=2, num_workers=2)
    dead = a.ticket("worker-0", 0)  # worker-0 dies with this member
    alive = a.ticket("worker-1", 0)
    assert alive == dead
    a.add_episode(episode(dead.group_id, [1.0], version=0))
    version = 0
    while a.counters["groups_dropped"] == 0:  # the other workers go on with newer policies
        version += 1
        other = a.ticket("worker-1", 0)
        a.add_episode(episode(other.group_id, [1.0], version=version))
        a.add_episode(episode(other.group_id, [0.0], version=version))
        assert version < 10
    assert version == 3  # newest (3) - oldest (0) > max_spread (2)
    assert a.counters["groups_dropped_incomplete"] == 1 and a.counters["groups_completed"] == version
    # A member that comes back late is discarded without counting the group again.
    assert a.add_episode(episode(dead.group_id, [1.0], version=3)) == []
    assert a.counters["groups_dropped"] == 1 and a.counters["group_episodes_discarded"] == 2


def test_a_restarted_ledger_drops_the_groups_it_never_issued_once_each_and_abandon_drops_now():
    before = assembler()
    old = before.ticket("worker-0", 0)
    after = assembler(id_base=1 << 32)  # a buffer restarted without a log: its ledger is new (ids elsewhere)
    assert after.add_episode(episode(old.group_id, [1.0])) == []
    assert after.add_episode(episode(old.group_id, [1.0])) == []
    assert after.counters["groups_dropped_unknown"] == 1 and after.counters["groups_dropped"] == 1
    fresh = after.ticket("worker-0", 0)
    assert fresh.group_id != old.group_id
    after.abandon(fresh.group_id)  # a member's episode broke
    assert after.counters["groups_dropped_incomplete"] == 1 and after.open_groups() == 0


def test_the_run_seed_alone_decides_the_groups_and_their_starts_in_any_process():
    """Reproducible runs: the ledger's group ids and starts depend on the seed, not on the process."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("from async_rl.actors.groups import GroupAssembler as A; a = A(4, 1, 2, lambda r: r, seed=7); "
            "print([tuple(a.ticket(f'worker-{k % 2}', 0)) for k in range(12)])")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           cwd=Path(__file__).resolve().parents[2]).stdout.strip()
    here = GroupAssembler(4, 1, 2, lambda r: r, seed=7)
    assert str([tuple(here.ticket(f"worker-{k % 2}", 0)) for k in range(12)]) == other
    starts = [GroupAssembler(4, 1, 2, lambda r: r, seed=s).ticket("worker-0", 0).start for s in (7, 8)]
    assert starts[0] != starts[1]  # the seed does decide


def _compilergym_env(builds: set[str], skipped: set[str]):
    """A CompilerGym env without a server: ``reset_to`` builds the programs in ``builds`` and skips
    (and remembers) the others, as the real one does; ``skipped``: what this env skipped before."""
    from envs.compilergym.env import CompilerGymTaskEnv

    env = CompilerGymTaskEnv.__new__(CompilerGymTaskEnv)
    env.benchmarks = [f"program-{i}" for i in range(5)]
    env.skipped, env.skipped_uris, env.played = {"build_failed": len(skipped)}, set(skipped), []

    def reset_to(uri):
        if uri not in builds:
            env.skipped_uris.add(uri)
            return None
        env.played.append(uri)
        return {"program": uri}
    env.reset_to = reset_to
    return env


def test_every_member_of_a_group_plays_its_start_or_none_whatever_it_skipped_before():
    from envs.base import StartUnavailable

    everything = {f"program-{i}" for i in range(5)}
    # Worker A once failed to build program-1 (a transient failure); worker B never tried it.
    a, b = _compilergym_env(everything, {"program-1"}), _compilergym_env(everything, set())
    assert a.reset(start=6) == b.reset(start=6) == {"program": "program-1"}  # 6 % 5: both play program-1
    # Where the group's program does not build, the member plays no other program: it says so.
    c = _compilergym_env(everything - {"program-1"}, set())
    with pytest.raises(StartUnavailable, match="program-1"):
        c.reset(start=6)
    assert c.played == []


def test_a_worker_whose_env_cannot_play_its_start_drops_that_group_and_takes_another_ticket():
    import asyncio
    from types import SimpleNamespace

    from async_rl.actors.groups import Ticket
    from async_rl.actors.rollout_worker import RolloutWorkerActor
    from envs.base import StartUnavailable

    worker_class = RolloutWorkerActor.__ray_metadata__.modified_class
    tickets, abandoned = iter([Ticket(1, 0, 6), Ticket(2, 0, 7)]), []

    class Env:
        def reset(self, start=None):
            if start == 6:  # the group's program does not build here
                raise StartUnavailable("program-1")
            return {"start": start}

    slot = SimpleNamespace(obs=None, ticket=None, task=0, envs=SimpleNamespace(get=lambda task: Env()))

    async def take_tickets(slots):
        for s in slots:
            s.ticket = next(tickets)

    async def call(fn, *args):
        return fn(*args)

    worker = SimpleNamespace(slots=[slot], grouped=True, index=0, task_names=["t"], preprocess=lambda obs, name: obs,
                             _take_tickets=take_tickets, _env_thread=SimpleNamespace(call=call),
                             replay=SimpleNamespace(abandon_group=SimpleNamespace(remote=abandoned.append)))
    worker._reset_in_thread = lambda slots: worker_class._reset_in_thread(worker, slots)
    asyncio.run(worker_class._reset_envs(worker))
    assert abandoned == [1] and slot.ticket == Ticket(2, 0, 7) and slot.obs == {"start": 7}


def test_episode_segmenter_hands_over_whole_episodes_only():
    seg = advantage_estimator("grpo").segmenter(None)
    steps = episode(0, [1.0, 2.0, 3.0])
    for k in range(3):
        assert seg.add(steps[k], steps[k]["obs"]) is None
        assert seg.flush() is None  # a pause keeps the episode
    taken = seg.take()
    assert taken.batch_size[0] == 3 and seg.take() is None


def test_a_policy_without_critic_freezes_and_hides_its_value_head():
    from async_rl.policies import build_policy

    policy = build_policy("mlp", {"state_dim": 39}, 4)
    full = dict(policy.inference_tensors())
    policy.drop_critic()
    value = {id(p) for p in policy.value_parameters()}
    sent = dict(policy.inference_tensors())
    assert not policy.has_critic and all(not p.requires_grad for p in policy.value_parameters())
    assert all(p.requires_grad for p in policy.parameters() if id(p) not in value)
    assert set(full) - set(sent) == {n for n, p in policy.named_parameters() if id(p) in value}
    assert not any(id(t) in value for t in sent.values())


def test_metaworld_resets_with_the_same_start_give_the_same_first_observation():
    from envs import make_task_set

    task_set = make_task_set("metaworld", benchmark="MT1", task="reach-v3")
    a, b = task_set.make_env(0, seed=1), task_set.make_env(0, seed=2)  # two workers' envs
    try:
        np.testing.assert_array_equal(a.reset(start=123), b.reset(start=123))
        a.step(np.full(4, 0.5, dtype=np.float32))
        np.testing.assert_array_equal(a.reset(start=123), b.reset(start=123))  # again, after steps
        assert not np.array_equal(a.reset(start=123), a.reset(start=124))  # another start, another goal
    finally:
        a.close()
        b.close()


def test_compilergym_resets_with_the_same_start_give_the_same_program():
    from contextlib import closing

    from envs import make_task_set
    from envs.compilergym.client import compilergym_unavailable_reason

    if compilergym_unavailable_reason() is not None:
        pytest.skip(str(compilergym_unavailable_reason()))
    task_set = make_task_set("compilergym", mode="per_step", max_steps=3, train_seeds=[1000002, 1000004],
                             eval_seeds=[0, 1], ir_tokens=64, call_timeout_s=60)
    with closing(task_set.make_env(0, seed=1)) as env:  # the program is chosen by index: the env seed plays no part
        first = env.reset(start=11)
        uri = env.program["uri"]
        env.reset(start=12)
        assert env.program["uri"] != uri  # the next start, the other program
        again = env.reset(start=11)
        assert env.program["uri"] == uri and first.keys() == again.keys()
        for key in first:
            np.testing.assert_array_equal(first[key], again[key], err_msg=key)


def test_every_launch_config_takes_grpo_with_groups_of_8():
    from pathlib import Path

    import envs
    from async_rl.algo import check_group_capacity
    from async_rl.config import load_config

    configs = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))  # launches' and presets
    assert len(configs) >= 5
    examples = Path(__file__).resolve().parents[2] / "examples"
    # A user's data set, required by the prompts env: the shipped example stands in for it.
    user_data = ["--env.data", str(examples / "arithmetic_train.jsonl"),
                 "--env.heldout-data", str(examples / "arithmetic_heldout.jsonl")]
    for config in configs:
        takes_data = "\nenv: prompts\n" in config.read_text()
        cfg = load_config(["--advantage", "grpo", "--group-size", "8", *(user_data if takes_data else [])], str(config))
        assert (cfg.advantage, cfg.group_size) == ("grpo", 8), config.name
        # The replay buffer holds a whole group of the env's longest episodes (the configs' variants size it).
        kwargs = dict(cfg.env_kwargs)
        if "samples" in kwargs:  # CTRL's GPU preset: sampling the base model's own solutions takes many minutes
            kwargs["samples"] = 0  # on CPU, and a group's capacity does not depend on the cases
        task_set = envs.make_task_set(cfg.env, **kwargs)
        check_group_capacity(cfg.group_size, cfg.replay_capacity, task_set.max_episode_steps)


def test_without_critic_under_lora_the_value_head_and_its_adapters_stay_frozen_and_unsent():
    from async_rl.policies import build_policy
    from async_rl.policies.lora import apply_lora

    plain = build_policy("mlp", {"state_dim": 39}, 4, hidden_sizes=[16, 16]).drop_critic()
    lora = apply_lora(build_policy("mlp", {"state_dim": 39}, 4, hidden_sizes=[16, 16]).drop_critic(), 4, 8.0, 0.0,
                      None, ["value_net"])  # even a value head named fully trainable
    lora.drop_critic()  # what the trainer does after LoRA
    assert not any(p.requires_grad for p in lora.value_parameters())
    assert any(p.requires_grad for p in lora.parameters())
    # The trainer's merged tensors and the inference copy's (no LoRA) have the same names: the signatures match.
    assert [n for n, _ in lora.inference_tensors()] == [n for n, _ in plain.inference_tensors()]


def test_the_trainer_optimises_no_value_parameter_without_a_critic_under_lora_or_not():
    import functools

    from async_rl.actors.trainer_setup import optimizer_groups, training_model
    from async_rl.config.schema import RunConfig
    from async_rl.orchestration.runtime import critic_free
    from async_rl.policies import build_policy

    factory = functools.partial(build_policy, "mlp", {"state_dim": 39}, 4, hidden_sizes=[16, 16])
    for lora_rank in (0, 4):
        cfg = RunConfig(lora_rank=lora_rank, lora_trainable=["value_net"])
        with_critic = optimizer_groups(cfg, training_model(cfg, factory))
        without = optimizer_groups(cfg, training_model(cfg, functools.partial(critic_free, factory)))
        assert [g["name"] for g in with_critic] == ["policy", "value"], lora_rank
        assert [g["name"] for g in without] == ["policy"], lora_rank
        policy_count = lambda groups: sum(p.numel() for p in groups[0]["params"])  # noqa: E731
        assert policy_count(without) == policy_count(with_critic), lora_rank  # the actor trains as before
        assert all(p.requires_grad for g in without for p in g["params"])


def test_group_advantages_are_scaled_but_not_centred_over_the_batch_only_when_asked():
    # A group estimator's baseline is its group's (grpo and rloo have mean 0 in every group; naive has none on
    # purpose): normalize_group_advantages divides by the batch's RMS without subtracting the batch mean; by
    # default (and whatever normalize_advantages says, which is gae's) group advantages reach the loss as they are.
    from types import SimpleNamespace

    adv = torch.tensor([3.0, 1.0, -2.0, 6.0])
    batch = TensorDict({"advantage": adv.clone()}, [4])
    std, rms = adv.std(unbiased=False), adv.square().mean().sqrt()
    for name, want in (("gae", (adv - adv.mean()) / std), ("grpo", adv / rms), ("rloo", adv / rms),
                       ("naive", adv / rms)):
        asked = SimpleNamespace(normalize_advantages=name == "gae", normalize_group_advantages=name != "gae",
                                normalize_advantages_per="batch")
        got = advantage_estimator(name).prepare(batch, asked)["advantage"]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=name)
        default = SimpleNamespace(normalize_advantages=name != "gae", normalize_group_advantages=False,
                                  normalize_advantages_per="batch")
        off = advantage_estimator(name).prepare(batch, default)["advantage"]
        torch.testing.assert_close(off, adv, rtol=0, atol=0, msg=name)


def test_a_replay_buffer_smaller_than_a_whole_group_is_refused_before_ray_starts():
    from pathlib import Path

    from async_rl.algo import check_group_capacity
    from async_rl.config import load_config
    from async_rl.driver import prepare
    from async_rl.errors import ConfigError

    check_group_capacity(8, 4000, 500)  # exactly one group of the longest episodes fits
    check_group_capacity(1, 16, 500)  # no groups: any capacity
    with pytest.raises(ConfigError, match=r"replay_capacity 3999 cannot hold a whole group of 8 episodes of up to "
                                          r"500 steps \(4000 steps\): pass --replay-capacity 4000 or more"):
        check_group_capacity(8, 3999, 500)
    config = str(Path(__file__).resolve().parents[2] / "configs" / "metaworld_mt1_vtrace.yaml")  # 500-step episodes
    with pytest.raises(ConfigError, match="--replay-capacity 4000"):  # a flag wins over the config's group variant
        prepare(load_config(["--advantage", "grpo", "--group-size", "8", "--replay-capacity", "128"], config))
    cfg = load_config(["--advantage", "grpo", "--group-size", "8", "--replay-capacity", "4000"], config)
    assert prepare(cfg).max_episode_steps == 500
