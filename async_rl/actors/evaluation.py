"""EvaluationWorker (EvaluationWorkerActor is its Ray face): episodes with the latest weights; never writes to the replay buffer."""
from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np
import ray
from tensordict import TensorDict

import envs
from async_rl.actors.env_slots import EnvPool, EnvThread
from async_rl.actors.policy_client import PolicyClient
from async_rl.errors import ActorTimeoutError
from async_rl.experience import from_wire, to_wire
from async_rl.media import frame_of
from async_rl.process_setup import configure_torch
from envs.base import episode_success, success_rule

if TYPE_CHECKING:
    from async_rl.config.schema import RunConfig
    from envs.base import TaskSet


class EvaluationWorker:
    """Runs up to ``envs_per_worker`` evaluation episodes in lock-step, one inference request per
    step of all of them (one request per env step would cost as much CPU as the rollouts)."""

    def __init__(self, index: int, task_set: TaskSet, preprocessor_factory: Callable[[], Any], inference: Any,
                 inference_name: str, cfg: RunConfig) -> None:
        configure_torch(cfg.seed + 555_555 + index, 1)
        self.preprocess = preprocessor_factory()
        self.task_set, self.seed = task_set, cfg.seed + 900_001 * (index + 1)
        self.pools: list[EnvPool] = []  # pool k holds the env of every task's k-th parallel episode
        self.parallel = cfg.envs_per_worker
        self.task_names = list(task_set.task_names)
        self.success_rule = success_rule(task_set)
        self.policy = PolicyClient(inference, inference_name, cfg.actor_timeout_s)
        self._env_thread = EnvThread(f"eval-{index}-env")
        self.media_seconds = 0.0  # time spent rendering frames in the current evaluation

    def _env(self, slot: int, task: int) -> Any:
        while len(self.pools) <= slot:
            self.pools.append(EnvPool(self.task_set, seed=self.seed + 1_000_003 * len(self.pools)))
        return self.pools[slot].get(task)

    async def _run_episodes(self, episodes: list[int], deterministic: bool, versions: set[int],
                            frames: Optional[dict[int, list]] = None) -> list[tuple[bool, float]]:
        """(success, return) of one episode of each task in ``episodes``, stepped together;
        ``frames[k]`` (episode media), where given, collects episode k's frames."""
        frames = frames or {}

        def grab(k: int, env: Any, raw: Any) -> Any:  # episode media: rendering runs in the env thread too
            if k in frames:
                began = time.perf_counter()
                frame = frame_of(env, raw)
                self.media_seconds += time.perf_counter() - began
                if frame is not None:
                    frames[k].append(frame)
            return raw

        def start() -> tuple[list, list]:  # in the env thread, as every env call
            made = [self._env(slot, task) for slot, task in enumerate(episodes)]
            return made, [self.preprocess(grab(k, env, env.reset()), self.task_names[task])
                          for k, (env, task) in enumerate(zip(made, episodes))]

        def step(running: list[int], actions: np.ndarray) -> list[tuple]:
            """(next observation, or None at the episode's end; reward; info) of each running env."""
            stepped = []
            for row, k in enumerate(running):
                raw, reward, terminated, truncated, info = made[k].step(actions[row])
                grab(k, made[k], raw)
                end = terminated or truncated
                stepped.append((None if end else self.preprocess(raw, self.task_names[episodes[k]]), reward, info))
            return stepped

        made, obs = await self._env_thread.call(start)
        success, returns = [False] * len(made), [0.0] * len(made)
        running = list(range(len(made)))
        while running:
            out = await self.policy.act(TensorDict.stack([obs[k] for k in running]), deterministic)
            versions.update(int(v) for v in out["policy_version"])
            results = await self._env_thread.call(step, running, out["env_action"].numpy())
            still = []
            for k, (next_obs, reward, info) in zip(running, results):
                success[k] = episode_success(self.success_rule, success[k], info)
                returns[k] += reward
                if next_obs is not None:
                    obs[k] = next_obs
                    still.append(k)
            running = still
        return list(zip(success, returns))

    async def evaluate(self, episodes_per_task: int, deterministic: bool, record: int = 0) -> dict[str, Any]:
        """Success rate and mean return per task, and the policy versions that acted; with ``record``,
        also ``videos`` (uint8 [T, H, W, 3] per episode: the first episode of each task first)."""
        episodes = [task for task in range(len(self.task_names)) for _ in range(episodes_per_task)]
        versions: set[int] = set()
        outcomes: list[tuple[bool, float]] = []
        recorded = set(sorted(range(len(episodes)), key=lambda i: (i % episodes_per_task, i))[:record])
        videos: dict[str, np.ndarray] = {}
        self.media_seconds = 0.0
        for start in range(0, len(episodes), self.parallel):
            batch = episodes[start:start + self.parallel]
            frames: dict[int, list[np.ndarray]] = {k: [] for k in range(len(batch)) if start + k in recorded}
            outcomes += await self._run_episodes(batch, deterministic, versions, frames)
            videos.update({f"{self.task_names[batch[k]]}-{start + k}": np.stack(f) for k, f in frames.items() if f})
        per_task = {}
        for task, name in enumerate(self.task_names):
            mine = [o for t, o in zip(episodes, outcomes) if t == task]
            per_task[name] = {"success_rate": sum(s for s, _ in mine) / len(mine), "return": sum(r for _, r in mine) / len(mine)}
        media = {"videos": videos, "media_seconds_per_episode": self.media_seconds / len(videos)} if videos else {}
        return {"tasks": per_task, "policy_versions": sorted(versions), **media}

    async def final_evaluation(self, env_name: str, seed: int) -> Optional[dict[str, Any]]:
        """The evaluation ``env_name`` registers for the end of a run (e.g. CompilerGym's held-out
        programs against -Oz), with the latest weights; None if it registers none. Its report:
        ``scalars``, ``text`` and ``files`` (written under the run's log dir by the driver)."""
        evaluate = envs.final_evaluation_for(env_name, self.task_set)
        if evaluate is None:
            return None
        inference, timeout, loop = self.policy.inference, self.policy.timeout_s, asyncio.get_running_loop()

        async def request(obs: TensorDict, deterministic: bool) -> Any:
            try:
                return await asyncio.wait_for(inference.request.remote(to_wire(obs), deterministic), timeout)
            except asyncio.TimeoutError:
                raise ActorTimeoutError(f"final evaluation: the inference actor did not answer within {timeout:g} s "
                                        "(actor_timeout_s)") from None

        def act(obs: TensorDict, deterministic: bool) -> np.ndarray:
            # The request is awaited on this actor's event loop: a blocking ray.get in an async actor
            # (even from a thread) makes Ray warn that it blocks the loop.
            wire = asyncio.run_coroutine_threadsafe(request(obs, deterministic), loop).result()
            return from_wire(wire)["env_action"].numpy()

        # A thread: the evaluation blocks on env steps, not the event loop.
        return await asyncio.to_thread(evaluate, self.task_set, act, self.preprocess, seed)

    async def pid(self) -> int:
        return os.getpid()

    async def shutdown(self) -> None:
        for pool in self.pools:
            await self._env_thread.call(pool.close)
        self._env_thread.close()


@ray.remote
class EvaluationWorkerActor(EvaluationWorker):
    """The Ray face of EvaluationWorker (held-out episodes with the latest weights): an actor of its methods; tests may use EvaluationWorker in process."""
