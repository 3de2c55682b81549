"""Environment registry: a new environment is one file in ``envs/`` plus one config.

An env module registers a TaskSet factory with ``@register_env("name")``, optionally with a
``final_evaluation`` the runtime runs on the final weights after training. Env modules must not
import their (optional, heavy) simulator package at module level; they import it inside the
factory, so that ``import envs`` and the discovery of env modules stay cheap and never fail
because some other environment's package is missing.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

import numpy as np

from async_rl.errors import ConfigError, unknown_key_message
from async_rl.registry import Registry
from envs.base import TaskEnv, TaskSet

__all__ = ["ENVS", "FinalEvaluation", "TaskEnv", "TaskSet", "available_envs", "final_evaluation_for", "make_task_set",
           "register_env"]

# fn(task_set, act, preprocess, seed) -> report. ``act(obs_batch, deterministic) -> env actions
# [B, action_dim]`` runs the current policy on a batch of preprocessed observations (a TensorDict);
# ``preprocess(obs, task_name)`` is the policy's preprocessor. The report holds ``scalars``
# ({"eval/...": float}), ``text`` (printable), ``files`` ({name: JSON-able}) and any raw fields.
FinalEvaluation = Callable[[TaskSet, Callable[[Any, bool], np.ndarray], Callable[..., Any], int], dict]

ENVS: Registry[Callable[..., TaskSet]] = Registry("environment", package=__name__, skip=("base",))


def register_env(name: str, final_evaluation: Optional[FinalEvaluation] = None
                 ) -> Callable[[Callable[..., TaskSet]], Callable[..., TaskSet]]:
    """Decorator: register ``fn(**kwargs) -> TaskSet`` under ``name`` (and its final evaluation)."""
    return ENVS.register(name, final_evaluation=final_evaluation)


def available_envs() -> list[str]:
    """Sorted names of all registered environments (discovers env modules on first call)."""
    return ENVS.names()


def final_evaluation_for(name: str) -> Optional[FinalEvaluation]:
    """The final evaluation environment ``name`` registered, or None; unknown names raise ConfigError."""
    return ENVS.entry(name).meta.get("final_evaluation")


def make_task_set(name: str, **kwargs: Any) -> TaskSet:
    """Build the TaskSet of environment ``name``; unknown names and options raise ConfigError."""
    builder = ENVS.get(name)
    params = inspect.signature(builder).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        for key in kwargs:
            if key not in params:
                raise ConfigError(unknown_key_message(key, params, f"'{name}' env option"))
    return builder(**kwargs)
