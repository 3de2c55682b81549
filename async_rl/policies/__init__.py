"""Policies (actor-critics) and their worker-side preprocessors, by name."""
from __future__ import annotations

import importlib
from typing import Any, Callable

from async_rl.errors import ConfigError
from async_rl.policies.base import ActorCritic, ObsSpec, Preprocessor

# name -> module that registers it; imported on first use so heavy deps load only when needed.
_POLICY_MODULES = {"mlp": "async_rl.policies.mlp", "categorical_mlp": "async_rl.policies.categorical_mlp",
                   "passformer": "async_rl.policies.passformer"}
POLICY_BUILDERS: dict[str, tuple[Callable[..., ActorCritic], Callable[..., Preprocessor]]] = {}


def register_policy(name: str, preprocessor: Callable[..., Preprocessor]):
    """Register an ActorCritic factory ``fn(obs_spec, action_dim, **kwargs)`` and its preprocessor factory."""

    def wrap(factory: Callable[..., ActorCritic]) -> Callable[..., ActorCritic]:
        POLICY_BUILDERS[name] = (factory, preprocessor)
        return factory

    return wrap


def _entry(name: str):
    if name not in _POLICY_MODULES:
        raise ConfigError(f"unknown policy '{name}'; valid: {', '.join(sorted(_POLICY_MODULES))}")
    importlib.import_module(_POLICY_MODULES[name])
    return POLICY_BUILDERS[name]


def build_policy(name: str, obs_spec: ObsSpec, action_dim: int, **kwargs: Any) -> ActorCritic:
    """Build the actor-critic ``name`` for observations ``obs_spec`` and ``action_dim`` actions."""
    return _entry(name)[0](obs_spec, action_dim, **kwargs)


def build_preprocessor(name: str, obs_spec: ObsSpec, **kwargs: Any) -> Preprocessor:
    """The worker-side preprocessing of policy ``name`` (no model weights)."""
    return _entry(name)[1](obs_spec, **kwargs)


__all__ = ["ActorCritic", "ObsSpec", "Preprocessor", "build_policy", "build_preprocessor", "register_policy"]
