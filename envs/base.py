"""The two interfaces every environment family implements.

A ``TaskSet`` is built once in the driver (it may be slow: MetaWorld MT50 takes ~30 s), is
picklable, and is handed to rollout workers, which call ``make_env`` to get ``TaskEnv`` instances.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional, Protocol, Union, runtime_checkable

import numpy as np

Observation = Union[np.ndarray, dict[str, Any]]


class StartUnavailable(RuntimeError):
    """``reset(start=...)`` cannot start from that state here (a program that does not build): the
    group's other members play it, so this member must not play another one (its group is dropped)."""


@runtime_checkable
class TaskEnv(Protocol):
    """One environment instance for one task (task index) of a TaskSet."""

    task_name: str

    def reset(self, *, start: Optional[int] = None) -> Observation:
        """Start an episode; returns the first observation: an array (float32, shape (obs_dim,)) or
        a dict (e.g. LIBERO's images, proprio and instruction, described by ``TaskSet.obs_spec``).
        ``start`` (group rollouts) picks the initial state: two resets with the same ``start`` on
        envs of the same task start from the same state, whatever their seeds and their history;
        an env that cannot start from it raises ``StartUnavailable`` rather than start elsewhere."""
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

    ``success_rule`` says which steps' ``info["success"]`` make an episode a success: ``"any"`` (a
    task once solved stays solved: MetaWorld, LIBERO) or ``"final"`` (the label judges the state the
    episode ends in and an early end clears it: CompilerGym). A task set without it is ``"any"``;
    every reader goes through ``success_rule`` and ``episode_success`` below.

    ``final_evaluation_on`` (optional, true where absent) false says that the options ask for no final
    evaluation, though the env registers one (LIBERO without ``heldout_init_states``).

    The members below are read-only here, so that a task set may declare them as attributes, properties or
    class attributes alike; ``success_rule`` and ``final_evaluation_on`` are optional and not members.
    """

    @property
    def task_names(self) -> list[str]: ...

    @property
    def obs_dim(self) -> int: ...

    @property
    def action_dim(self) -> int: ...

    @property
    def max_episode_steps(self) -> int: ...

    def make_env(self, task_index: int, seed: int) -> TaskEnv:
        ...


@runtime_checkable
class TokenizedTaskSet(Protocol):
    """A task set whose envs decode a response's token ids with the policy's tokenizer (the text envs):
    ``tokenizer_path`` None is filled by the driver from the policy's model."""

    tokenizer_path: Optional[str]


SUCCESS_RULES = ("any", "final")


def success_rule(task_set: TaskSet) -> str:
    """``task_set``'s ``success_rule`` (``"any"`` where it declares none); ValueError if it is not one of
    ``SUCCESS_RULES``, since a misspelt rule would silently score every episode by the wrong steps."""
    rule = getattr(task_set, "success_rule", "any")
    if rule not in SUCCESS_RULES:
        raise ValueError(f"{type(task_set).__name__}.success_rule is {rule!r}; valid: {', '.join(SUCCESS_RULES)}")
    return rule


def episode_success(rule: str, so_far: bool, info: Mapping[str, Any]) -> bool:
    """An episode's success after one more step whose info is ``info``, given ``so_far`` (its success
    before that step; False at the start) and the task set's ``success_rule``."""
    step = bool(info.get("success", False))
    return step if rule == "final" else so_far or step
