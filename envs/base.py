"""The two interfaces every environment family implements.

A ``TaskSet`` is built once in the driver (it may be slow: MetaWorld MT50 takes ~30 s), is
picklable, and is handed to rollout workers, which call ``make_env`` to get ``TaskEnv`` instances.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class TaskEnv(Protocol):
    """One environment instance for one task (task index) of a TaskSet."""

    task_name: str

    def reset(self) -> np.ndarray:
        """Start an episode; returns the first observation (float32, shape (obs_dim,))."""
        ...

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Returns (obs float32, reward, terminated, truncated, info); info["success"] is a bool."""
        ...

    def close(self) -> None:
        ...


@runtime_checkable
class TaskSet(Protocol):
    """Picklable description of a set of tasks; ``task_names[i]`` names task index ``i``."""

    task_names: list[str]
    obs_dim: int
    action_dim: int
    max_episode_steps: int

    def make_env(self, task_index: int, seed: int) -> TaskEnv:
        ...
