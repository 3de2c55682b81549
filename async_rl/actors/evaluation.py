"""EvaluationWorkerActor: episodes with the latest weights; never writes to the replay buffer."""
from __future__ import annotations

from typing import Any, Callable

import ray
import torch

from async_rl.actors.rollout_worker import EnvPool, PolicyClient
from async_rl.runtime import configure_torch


@ray.remote
class EvaluationWorkerActor:
    """Runs up to ``envs_per_worker`` evaluation episodes in lock-step, one inference request per
    step of all of them (one request per env step would cost as much CPU as the rollouts)."""

    def __init__(self, index: int, task_set: Any, preprocessor_factory: Callable[[], Any], inference: Any,
                 inference_name: str, cfg: Any) -> None:
        configure_torch(cfg.seed + 555_555 + index, 1)
        self.preprocess = preprocessor_factory()
        self.task_set, self.seed = task_set, cfg.seed + 900_001 * (index + 1)
        self.pools: list[EnvPool] = []  # pool k holds the env of every task's k-th parallel episode
        self.parallel = cfg.envs_per_worker
        self.task_names = list(task_set.task_names)
        self.policy = PolicyClient(inference, inference_name, cfg.actor_timeout_s)

    def _env(self, slot: int, task: int) -> Any:
        while len(self.pools) <= slot:
            self.pools.append(EnvPool(self.task_set, seed=self.seed + 1_000_003 * len(self.pools)))
        return self.pools[slot].get(task)

    async def _run_episodes(self, episodes: list[int], deterministic: bool, versions: set[int]) -> list[tuple[bool, float]]:
        """(success, return) of one episode of each task in ``episodes``, stepped together."""
        envs = [self._env(slot, task) for slot, task in enumerate(episodes)]
        obs = [self.preprocess(env.reset(), self.task_names[task]) for env, task in zip(envs, episodes)]
        success, returns = [False] * len(envs), [0.0] * len(envs)
        running = list(range(len(envs)))
        while running:
            out = await self.policy.act(torch.stack([obs[k] for k in running]), deterministic)
            versions.update(int(v) for v in out["policy_version"])
            still = []
            for row, k in enumerate(running):
                raw, reward, terminated, truncated, info = envs[k].step(out["env_action"][row].numpy())
                success[k] = success[k] or bool(info.get("success", False))
                returns[k] += reward
                if not (terminated or truncated):
                    obs[k] = self.preprocess(raw, self.task_names[episodes[k]])
                    still.append(k)
            running = still
        return list(zip(success, returns))

    async def evaluate(self, episodes_per_task: int, deterministic: bool) -> dict[str, Any]:
        """Success rate and mean return per task, and the policy versions that acted."""
        episodes = [task for task in range(len(self.task_names)) for _ in range(episodes_per_task)]
        versions: set[int] = set()
        outcomes: list[tuple[bool, float]] = []
        for start in range(0, len(episodes), self.parallel):
            outcomes += await self._run_episodes(episodes[start:start + self.parallel], deterministic, versions)
        per_task = {}
        for task, name in enumerate(self.task_names):
            mine = [o for t, o in zip(episodes, outcomes) if t == task]
            per_task[name] = {"success_rate": sum(s for s, _ in mine) / len(mine), "return": sum(r for _, r in mine) / len(mine)}
        return {"tasks": per_task, "policy_versions": sorted(versions)}

    def shutdown(self) -> None:
        for pool in self.pools:
            pool.close()
