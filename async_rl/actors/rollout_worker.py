"""RolloutWorkerActor: an environment and its preprocessing, never model weights.

Loop: preprocess obs -> await the inference actor -> step the env -> keep the step locally.
With GAE the worker computes advantages and value targets itself (bootstrap 0 on a terminal
step, the next step's value on a buffer cut) and pushes finished pieces to the replay buffer;
with V-trace it pushes fixed-length segments for the trainer to correct off-policy.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Optional

import numpy as np
import ray
from tensordict import TensorDict

from async_rl.experience import GaeSegmenter, VtraceSegmenter, step_record
from async_rl.runtime import configure_torch, wait_for


class FailureWeightedTaskSampler:
    """Seed 004 section 3.2: P(task) proportional to (failures in its recent episodes + 1)."""

    def __init__(self, num_tasks: int, window: int, rng: np.random.Generator) -> None:
        self.outcomes = [deque(maxlen=window) for _ in range(num_tasks)]
        self.rng = rng

    def probabilities(self) -> np.ndarray:
        weights = np.array([sum(h) for h in self.outcomes], dtype=np.float64) + 1.0
        return weights / weights.sum()

    def sample(self) -> int:
        return int(self.rng.choice(len(self.outcomes), p=self.probabilities()))

    def record(self, task: int, success: bool) -> None:
        self.outcomes[task].append(0 if success else 1)


class EnvPool:
    """One env per task index, created on first use and kept (no rebuild between episodes)."""

    def __init__(self, task_set: Any, seed: int) -> None:
        self.task_set, self.seed = task_set, seed
        self._envs: dict[int, Any] = {}

    def get(self, task: int) -> Any:
        if task not in self._envs:
            self._envs[task] = self.task_set.make_env(task, seed=self.seed + 7919 * task)
        return self._envs[task]

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs.clear()


class PolicyClient:
    """A worker's view of its inference actor: one awaited request with a timeout."""

    def __init__(self, inference: Any, name: str, timeout_s: float) -> None:
        self.inference, self.name, self.timeout_s = inference, name, timeout_s

    async def act(self, obs: TensorDict, deterministic: bool = False) -> TensorDict:
        return await wait_for(self.inference.request.remote(obs, deterministic), self.timeout_s, self.name, "an inference request")


@ray.remote
class RolloutWorkerActor:
    def __init__(self, index: int, task_set: Any, preprocessor_factory: Callable[[], Any], inference: Any,
                 inference_name: str, replay: Any, stats: Any, cfg: Any) -> None:
        configure_torch(cfg.seed + 1000 * (index + 1), 1)
        self.index, self.cfg = index, cfg
        self.preprocess = preprocessor_factory()
        self.envs = EnvPool(task_set, seed=cfg.seed + 100_003 * (index + 1))
        self.task_names = list(task_set.task_names)
        self.sampler = FailureWeightedTaskSampler(len(self.task_names), cfg.task_failure_window,
                                                  np.random.default_rng(cfg.seed + index))
        self.policy = PolicyClient(inference, inference_name, cfg.actor_timeout_s)
        self.replay, self.stats = replay, stats
        self._stopped = False
        self._push_ref: Optional[ray.ObjectRef] = None
        self.env_steps = 0

    async def stop(self) -> None:
        self._stopped = True

    async def _push(self, batch: TensorDict) -> None:
        # At most one push in flight: bounds memory and surfaces replay errors here.
        if self._push_ref is not None:
            await wait_for(self._push_ref, self.cfg.actor_timeout_s, "replay buffer", "add_batch")
        self._push_ref = self.replay.add_batch.remote(batch)
        self.stats.record_steps.remote(f"worker-{self.index}", batch.numel() if "steps" not in batch.keys() else batch["steps"].numel())

    async def run(self) -> int:
        """Collect until ``stop``; returns the number of env steps taken."""
        cfg = self.cfg
        segmenter = (VtraceSegmenter(cfg.rollout_local_buf) if cfg.advantage == "vtrace"
                     else GaeSegmenter(cfg.rollout_local_buf, cfg.gamma, cfg.gae_lambda))
        obs: Optional[TensorDict] = None
        while not self._stopped:
            if obs is None:
                task = self.sampler.sample()
                env = self.envs.get(task)
                obs = self.preprocess(env.reset(), self.task_names[task])
                ep_return, ep_len, ep_success, ep_start = 0.0, 0, False, time.monotonic()
            out = await self.policy.act(obs)
            raw, reward, terminated, truncated, info = env.step(out["env_action"].numpy())
            next_obs = self.preprocess(raw, self.task_names[task])
            ep_return += reward
            ep_len += 1
            ep_success = ep_success or bool(info.get("success", False))
            learn_reward = reward * cfg.reward_scale
            if truncated and not terminated:
                # A time limit is not a terminal state: fold the value of the cut-off state into the reward.
                learn_reward += cfg.gamma * float((await self.policy.act(next_obs))["value"])
            done = terminated or truncated
            piece = segmenter.add(step_record(obs, out, learn_reward, done, task), next_obs)
            self.env_steps += 1
            obs = next_obs
            if done:
                self.sampler.record(task, ep_success)
                self.stats.record_episode.remote(self.task_names[task], ep_return, ep_len, ep_success,
                                                 time.monotonic() - ep_start)
                obs = None
            if piece is not None:
                await self._push(piece)
        if self._push_ref is not None:
            await wait_for(self._push_ref, cfg.actor_timeout_s, "replay buffer", "add_batch")
        self.envs.close()
        return self.env_steps
