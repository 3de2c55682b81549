"""The scripted expert's LIBERO episodes: one episode (recorded or only judged), and a worker that
runs many, in this process or in a pool of spawned processes (one env per task, built once)."""
from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np

import envs
from envs.libero import LiberoTaskSet
from envs.libero_expert import ExpertSettings, ScriptedPickPlace


def episode_seed(seed: int, task_index: int, episode: int, attempt: int = 0) -> int:
    """The expert's noise seed for an episode: a function of the recording's seed, the task and the
    episode number; a retry after a failure takes the next one."""
    base = int(np.random.SeedSequence([seed, task_index, episode]).generate_state(1)[0])
    return (base + attempt) % 2**32


@dataclass
class ExpertEpisode:
    success: bool
    steps: int
    tensors: Optional[dict[str, np.ndarray]]  # the file's arrays when recorded (see storage)


def run_expert_episode(env: Any, init_state: int, seed: int, noise: float, settings: ExpertSettings,
                       record: bool) -> ExpertEpisode:
    """One episode of the expert from initial state ``init_state``; ``record`` keeps what a
    demonstration file holds: obs[t] is what action[t] was chosen from."""
    obs = env.reset(init_state=init_state)
    expert = ScriptedPickPlace(env, settings=settings, noise=noise, seed=seed)  # reads the reset scene
    images: dict[str, list[np.ndarray]] = {c: [] for c in env.cameras}
    proprio, executed_actions, labels = [], [], []
    states = [env.sim_state()] if record else []
    steps = 0
    while True:
        executed, label = expert.act()
        # The file stores float32, so the env executes exactly that value: replaying the file's
        # actions then reproduces the recorded states bit for bit.
        executed = executed.astype(np.float32)
        if record:
            for camera in images:
                images[camera].append(obs[camera])
            proprio.append(obs["proprio"])
            executed_actions.append(executed)
            labels.append(label.astype(np.float32))
        obs, _, terminated, truncated, info = env.step(executed.astype(np.float64))
        steps += 1
        if record:
            states.append(env.sim_state())
        if terminated or truncated:
            break
    if not record:
        return ExpertEpisode(success=bool(info["success"]), steps=steps, tensors=None)
    tensors = {f"obs.{camera}": np.stack(frames).astype(np.uint8) for camera, frames in images.items()}
    tensors["obs.proprio"] = np.stack(proprio).astype(np.float32)
    tensors["action"] = np.stack(executed_actions)
    tensors["expert_action"] = np.stack(labels)
    tensors["sim_state"] = np.stack(states).astype(np.float64)
    return ExpertEpisode(success=bool(info["success"]), steps=steps, tensors=tensors)


def libero_task_set(env_kwargs: dict[str, Any]) -> LiberoTaskSet:
    """``envs.make_task_set("libero", **env_kwargs)``, typed as what it is."""
    task_set = envs.make_task_set("libero", **env_kwargs)
    assert isinstance(task_set, LiberoTaskSet)
    return task_set


class ExpertWorker:
    """Runs expert episodes of one task set; each task's env is built on first use (~4 s) and kept.
    Every env is made with ``env_seed``, so an episode depends only on its init state and seed,
    never on which worker ran it or what ran before (resets restore the state exactly)."""

    def __init__(self, env_kwargs: dict[str, Any], env_seed: int, noise: float, settings: ExpertSettings) -> None:
        self.task_set = libero_task_set(env_kwargs)
        self.env_seed, self.noise, self.settings = env_seed, noise, settings
        self._envs: dict[int, Any] = {}

    def env(self, task_index: int) -> Any:
        if task_index not in self._envs:
            self._envs[task_index] = self.task_set.make_env(task_index, seed=self.env_seed)
        return self._envs[task_index]

    def run(self, task_index: int, init_state: int, seed: int, record: bool) -> ExpertEpisode:
        return run_expert_episode(self.env(task_index), init_state, seed, self.noise, self.settings, record)

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs.clear()


# ---- running jobs, here or in spawned processes ------------------------------------------
_WORKER: Optional[ExpertWorker] = None
_JOB: Optional[Callable[[ExpertWorker, Any], Any]] = None


def _start_worker(worker_args: tuple, job: Callable[[ExpertWorker, Any], Any]) -> None:
    global _WORKER, _JOB
    _WORKER, _JOB = ExpertWorker(*worker_args), job


def _run_in_worker(item: Any) -> Any:
    assert _WORKER is not None and _JOB is not None
    return _JOB(_WORKER, item)


def run_jobs(worker_args: tuple, job: Callable[[ExpertWorker, Any], Any], items: Iterable[Any],
             workers: int = 1) -> Iterator[Any]:
    """``job(worker, item)`` for every item, results in completion order. ``workers > 1`` spreads
    the items over that many spawned processes (each with its own ExpertWorker); ``job`` must
    then be a module-level function."""
    items = list(items)
    if workers <= 1:
        worker = ExpertWorker(*worker_args)
        try:
            for item in items:
                yield job(worker, item)
        finally:
            worker.close()
        return
    # spawn: robosuite's GL contexts and MuJoCo do not survive a fork of a process that made them.
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, initializer=_start_worker, initargs=(worker_args, job)) as pool:
        yield from pool.imap_unordered(_run_in_worker, items, chunksize=1)
