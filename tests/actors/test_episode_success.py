"""An episode's success follows its env's rule (``TaskSet.success_rule``): ``any`` step (MetaWorld, LIBERO)
or the ``final`` step (CompilerGym, whose per-step label is cleared by an early end). Both readers, the
rollout workers (training success rates, PACS's label) and the evaluator, apply it."""
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import ray
import torch
from conftest import lone_rollout_worker
from tensordict import TensorDict

from async_rl.actors.evaluation import EvaluationWorkerActor
from async_rl.config import load_config
from async_rl.experience import to_wire
from envs.base import episode_success, success_rule

ROOT = Path(__file__).resolve().parents[2]
LENGTH = 3


class PeakEnv:
    """Three steps whatever the actions. Task ``reached_then_lost``: success on the first step only (a
    program at -Oz that then grows); task ``reached_at_the_end``: success on the last step only."""

    def __init__(self, task: int) -> None:
        self.task, self.t = task, 0

    def reset(self, start=None):
        self.t = 0
        return np.zeros(3, dtype=np.float32)

    def step(self, action):
        self.t += 1
        success = self.t == 1 if self.task == 0 else self.t == LENGTH
        return np.full(3, self.t, dtype=np.float32), 1.0, self.t >= LENGTH, False, {"success": success}

    def close(self) -> None:
        pass


class PeakTasks:
    task_names = ["reached_then_lost", "reached_at_the_end"]

    def __init__(self, rule=None) -> None:
        if rule is not None:  # None: a task set that declares no rule (the default, "any")
            self.success_rule = rule

    def make_env(self, task: int, seed: int) -> PeakEnv:
        return PeakEnv(task)


def test_the_rule_decides_which_steps_count_and_the_envs_declare_theirs():
    steps = [{"success": True}, {}, {"success": False}]
    for rule, want in (("any", True), ("final", False)):
        got = False
        for info in steps:
            got = episode_success(rule, got, info)
        assert got is want, rule
    assert success_rule(PeakTasks()) == "any" and success_rule(PeakTasks("final")) == "final"
    with pytest.raises(ValueError, match="success_rule"):
        success_rule(PeakTasks("last"))
    from envs.compilergym.env import CompilerGymTaskSet
    from envs.libero import LiberoTaskSet
    from envs.metaworld import MetaWorldTaskSet

    assert (MetaWorldTaskSet.success_rule, LiberoTaskSet.success_rule, CompilerGymTaskSet.success_rule) == \
        ("any", "any", "final")


@ray.remote
class FixedInference:
    """Stands in for the inference actor: action 0 for every row, policy version 3."""

    async def request(self, wire, deterministic=False):
        n = len(torch.as_tensor(wire["state"]))
        return to_wire(TensorDict({"env_action": torch.zeros(n, 1), "policy_version": torch.full((n,), 3)}, [n]))


def preprocess(raw, instruction):
    return TensorDict({"state": torch.as_tensor(raw)}, batch_size=[])


@pytest.mark.parametrize("rule,want", [("final", {"reached_then_lost": 0.0, "reached_at_the_end": 1.0}),
                                       (None, {"reached_then_lost": 1.0, "reached_at_the_end": 1.0})])
def test_the_evaluator_scores_episodes_by_the_rule(ray_local, rule, want):
    cfg = SimpleNamespace(seed=0, envs_per_worker=2, actor_timeout_s=30.0)
    evaluator = EvaluationWorkerActor.remote(0, PeakTasks(rule), lambda: preprocess, FixedInference.remote(),
                                             "inference-0", cfg)
    result = ray.get(evaluator.evaluate.remote(2, True), timeout=60)
    assert {name: r["success_rate"] for name, r in result["tasks"].items()} == want
    ray.get(evaluator.shutdown.remote(), timeout=30)


def test_the_rollout_worker_labels_episodes_by_the_rule(ray_local):
    spec = {"state_dim": 3}
    cfg = load_config(["--envs-per-worker", "2", "--actor-timeout-s", "60"],
                      str(ROOT / "configs" / "metaworld_mt1_ppo.yaml"))
    tag = f"success{time.monotonic_ns()}"
    lone = lone_rollout_worker(tag, PeakTasks("final"), spec, 2, cfg)
    worker, stats, run = lone.worker, lone.stats, lone.run
    per_task: dict[str, list[float]] = {}
    deadline = time.monotonic() + 60
    while min((len(v) for v in per_task.values()), default=0) < 1 or len(per_task) < 2:
        assert time.monotonic() < deadline, f"the worker finished too few episodes: {per_task}"
        assert not ray.wait([run], timeout=0.2)[0], ray.get(run)
        for name, row in ray.get(stats.snapshot.remote(), timeout=30)["tasks"].items():
            per_task.setdefault(name, []).append(row["success_rate"])
    ray.get(worker.stop.remote(), timeout=30)
    ray.get(run, timeout=60)
    # The episode that reached success and lost it is a failure; the one that ends on it a success.
    assert per_task == {"reached_then_lost": [0.0] * len(per_task["reached_then_lost"]),
                        "reached_at_the_end": [1.0] * len(per_task["reached_at_the_end"])}
    for actor in lone.actors:
        ray.kill(actor)
