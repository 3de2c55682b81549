"""Success of a policy on chosen initial states of every task of a LIBERO task set, deterministic actions.

The measure of a LIBERO policy on held-out initial states (those its training never resets to): the run's
evaluation before and after training when ``heldout_init_states`` is set (``held_out_evaluation``, the env's
registered final evaluation, acting through the run's inference actor), and ``launch/eval_libero.py`` for an
export or a checkpoint in one process. A policy is reached through ``act(obs [B], deterministic) -> env
actions [B, A]`` (numpy), the contract of every env's final evaluation.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional, Protocol, Sequence

import numpy as np

from envs.base import Observation

Act = Callable[[Any, bool], np.ndarray]


class InitStateEnv(Protocol):
    """An env as these episodes play it: reset to a chosen initial state (``envs.libero.LiberoTaskEnv`` is one)."""

    task_name: str

    def reset(self, init_state: Optional[int] = None) -> Observation:
        """Start an episode from the task's initial state ``init_state`` (None: the env's own schedule)."""
        ...

    def step(self, action: np.ndarray) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        """(obs, reward, terminated, truncated, info), as ``TaskEnv.step``."""
        ...

    def close(self) -> None:
        ...


class InitStateTaskSet(Protocol):
    """A task set whose envs reset to chosen initial states (``envs.libero.LiberoTaskSet`` is one); this module
    cannot import LIBERO's, which imports it."""

    heldout_init_states: Optional[list[int]]  # the states the final evaluation scores; None: no such evaluation

    def __len__(self) -> int:
        """The number of tasks."""
        ...

    def make_env(self, task_index: int, seed: int) -> InitStateEnv:
        ...


def run_episode(env: InitStateEnv, act: Act, preprocess: Any, init_state: int,
                deterministic: bool = True) -> dict[str, Any]:
    """One episode from ``init_state``: whether it succeeded and in how many steps."""
    obs = env.reset(init_state=init_state)
    steps = 0
    while True:
        action = act(preprocess(obs, env.task_name).unsqueeze(0), deterministic)[0]
        obs, _, terminated, truncated, info = env.step(np.asarray(action, dtype=np.float32))
        steps += 1
        if terminated or truncated:
            return {"success": bool(info.get("success", terminated)), "steps": steps}


def success_rates(task_set: InitStateTaskSet, act: Act, preprocess: Any, init_states: Sequence[int], seed: int = 0,
                  progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Deterministic episodes of every task from each of ``init_states``: the mean success, per task and per
    episode, and the wall seconds they took."""
    started = time.monotonic()
    per_task: dict[str, float] = {}
    episodes = []
    for task in range(len(task_set)):
        env = task_set.make_env(task, seed)
        try:
            results = []
            for k in init_states:
                result = {"task": env.task_name, "init_state": int(k), **run_episode(env, act, preprocess, int(k))}
                results.append(result)
                progress(f"{env.task_name} init state {k}: {'success' if result['success'] else 'failure'} "
                         f"in {result['steps']} steps")
        finally:
            env.close()
        per_task[env.task_name] = sum(r["success"] for r in results) / len(results)
        episodes += results
    return {"success_rate": sum(e["success"] for e in episodes) / len(episodes), "per_task": per_task,
            "episodes": episodes, "init_states": [int(k) for k in init_states],
            "wall_seconds": time.monotonic() - started}


def states_text(states: Sequence[int]) -> str:
    """Sorted initial-state indices as the options write them: "40-49" when they run without a gap, else a list."""
    contiguous = len(states) > 1 and list(states) == list(range(states[0], states[-1] + 1))
    return f"{states[0]}-{states[-1]}" if contiguous else ", ".join(str(k) for k in states)


def held_out_evaluation(task_set: InitStateTaskSet, act: Act, preprocess: Any, seed: int) -> dict[str, Any]:
    """LIBERO's final evaluation (and, with ``eval_before_training``, the one before training): every task from
    each of the task set's ``heldout_init_states``. Reports ``eval/heldout_success_rate`` and, per task,
    ``eval/heldout_success_rate/<task>``; the episodes in ``heldout_episodes.json``."""
    result = success_rates(task_set, act, preprocess, task_set.heldout_init_states, seed)
    scalars = {"eval/heldout_success_rate": result["success_rate"],
               **{f"eval/heldout_success_rate/{task}": rate for task, rate in result["per_task"].items()}}
    text = (f"libero: {len(result['episodes'])} held-out episodes ({len(task_set)} tasks x initial states "
            f"{states_text(result['init_states'])}), deterministic: success {result['success_rate']:.3f} "
            f"({result['wall_seconds']:.0f} s)")
    return {"scalars": scalars, "text": text, "files": {"heldout_episodes.json": result["episodes"]},
            "heldout_success_rate": result["success_rate"], "per_task": result["per_task"]}
