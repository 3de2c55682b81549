"""The two interfaces every environment family implements.

A ``TaskSet`` is built once in the driver (it may be slow: MetaWorld MT50 takes ~30 s), is
picklable, and is handed to rollout workers, which call ``make_env`` to get ``TaskEnv`` instances.
"""
from __future__ import annotations

from typing import Any, Optional, Protocol, Union, runtime_checkable

import numpy as np

Observation = Union[np.ndarray, dict[str, Any]]


@runtime_checkable
class TaskEnv(Protocol):
    """One environment instance for one task (task index) of a TaskSet."""

    task_name: str

    def reset(self, start: Optional[int] = None) -> Observation:
        """Start an episode; returns the first observation: an array (float32, shape (obs_dim,)) or
        a dict (e.g. LIBERO's images, proprio and instruction, described by ``TaskSet.obs_spec``).
        ``start`` (group rollouts) picks the initial state: two resets with the same ``start`` on
        envs of the same task start from the same state, whatever their seeds."""
        ...

    def step(self, action: np.ndarray) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        """Returns (obs, reward, terminated, truncated, info); obs as in ``reset``; info["success"] is a bool."""
        ...

    def close(self) -> None:
        ...


@runtime_checkable
class TaskSet(Protocol):
    """Picklable description of a set of tasks; ``task_names[i]`` names task index ``i``.

    A TaskSet with dict observations also has ``obs_spec`` (a dict describing them, e.g. camera
    names, image size, proprio dim); the driver hands it to the policy instead of ``obs_dim``.
    """

    task_names: list[str]
    obs_dim: int
    action_dim: int
    max_episode_steps: int

    def make_env(self, task_index: int, seed: int) -> TaskEnv:
        ...
