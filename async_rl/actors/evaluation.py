"""EvaluationWorkerActor: episodes with the latest weights; never writes to the replay buffer."""
from __future__ import annotations

from typing import Any, Callable

import ray

from async_rl.actors.rollout_worker import EnvPool, PolicyClient
from async_rl.runtime import configure_torch


@ray.remote
class EvaluationWorkerActor:
    def __init__(self, index: int, task_set: Any, preprocessor_factory: Callable[[], Any], inference: Any,
                 inference_name: str, cfg: Any) -> None:
        configure_torch(cfg.seed + 555_555 + index, 1)
        self.preprocess = preprocessor_factory()
        self.envs = EnvPool(task_set, seed=cfg.seed + 900_001 * (index + 1))
        self.task_names = list(task_set.task_names)
        self.policy = PolicyClient(inference, inference_name, cfg.actor_timeout_s)

    async def evaluate(self, episodes_per_task: int, deterministic: bool) -> dict[str, Any]:
        """Success rate and mean return per task, and the policy versions that acted."""
        per_task: dict[str, dict[str, float]] = {}
        versions: set[int] = set()
        for task, name in enumerate(self.task_names):
            env = self.envs.get(task)
            successes, returns = 0, 0.0
            for _ in range(episodes_per_task):
                obs, done, success = self.preprocess(env.reset(), name), False, False
                while not done:
                    out = (await self.policy.act(obs.unsqueeze(0), deterministic))[0]
                    versions.add(int(out["policy_version"]))
                    raw, reward, terminated, truncated, info = env.step(out["env_action"].numpy())
                    obs, done = self.preprocess(raw, name), terminated or truncated
                    success = success or bool(info.get("success", False))
                    returns += reward
                successes += success
            per_task[name] = {"success_rate": successes / episodes_per_task, "return": returns / episodes_per_task}
        return {"tasks": per_task, "policy_versions": sorted(versions)}

    def shutdown(self) -> None:
        self.envs.close()
