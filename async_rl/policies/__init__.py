"""Policies (actor-critics) and their worker-side preprocessors, by name.

A new policy is one module in this package that calls ``register_policy``; modules are discovered
on the first lookup of an unknown name. They import heavy packages (transformers, peft) inside
functions, so that discovering every policy stays cheap.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from async_rl.errors import ConfigError
from async_rl.policies.base import ActorCritic, ObsSpec, Preprocessor
from async_rl.registry import Registry

# lora.py is the trainers' LoRA helper (it imports peft), not a policy.
POLICIES: Registry[Callable[..., ActorCritic]] = Registry("policy", package=__name__, skip=("base", "lora"))


def register_policy(name: str, preprocessor: Callable[..., Preprocessor], prepare: Optional[Callable[..., dict]] = None):
    """Register an ActorCritic factory ``fn(obs_spec, action_dim, **kwargs)`` and its preprocessor
    factory ``fn(obs_spec, **kwargs)`` (it receives the policy's kwargs too).

    ``prepare(obs_spec, action_dim, model_path, kwargs) -> kwargs`` (optional) runs in the driver
    before Ray starts: it checks the kwargs and ``model_path`` (ConfigError) and returns the
    kwargs both factories receive.
    """
    return POLICIES.register(name, preprocessor=preprocessor, prepare=prepare)


def available_policies() -> list[str]:
    """Sorted names of every registered policy (discovers the policy modules)."""
    return POLICIES.names()


def _entry(name: str) -> tuple[Callable[..., ActorCritic], Callable[..., Preprocessor], Optional[Callable[..., dict]]]:
    entry = POLICIES.entry(name)
    return entry.obj, entry.meta["preprocessor"], entry.meta["prepare"]


def build_policy(name: str, obs_spec: ObsSpec, action_dim: int, **kwargs: Any) -> ActorCritic:
    """Build the actor-critic ``name`` for observations ``obs_spec`` and ``action_dim`` actions."""
    return _entry(name)[0](obs_spec, action_dim, **kwargs)


def build_preprocessor(name: str, obs_spec: ObsSpec, **kwargs: Any) -> Preprocessor:
    """The worker-side preprocessing of policy ``name`` (no model weights)."""
    return _entry(name)[1](obs_spec, **kwargs)


def prepare_policy(name: str, obs_spec: ObsSpec, action_dim: int, model_path: Optional[str],
                   kwargs: dict[str, Any]) -> dict[str, Any]:
    """Check the policy's kwargs and ``model_path`` before Ray starts; returns the kwargs to build with."""
    factory, preprocessor, prepare = _entry(name)
    if prepare is not None:
        return prepare(obs_spec, action_dim, model_path, kwargs)
    if model_path is not None:
        raise ConfigError(f"policy '{name}' loads no model; drop --model-path (or use a policy that does, e.g. vla)")
    # A policy without a prepare hook is small: build it once here, so that a kwarg it does not
    # take or an env whose observations it cannot read fails now, not inside every actor.
    try:
        factory(obs_spec, action_dim, **kwargs)
        preprocessor(obs_spec, **kwargs)
    except (TypeError, KeyError) as exc:
        if isinstance(exc, TypeError) and "keyword argument" not in str(exc):
            raise  # a bug in the policy, not a bad kwarg: keep its traceback
        detail = f"missing observation field {exc}" if isinstance(exc, KeyError) else str(exc).splitlines()[0]
        raise ConfigError(f"policy '{name}' does not fit this env and policy_kwargs ({detail}); fix --policy-kwargs "
                          f"or pick a policy for this env (valid: {', '.join(available_policies())})") from None
    return dict(kwargs)


__all__ = ["POLICIES", "ActorCritic", "ObsSpec", "Preprocessor", "available_policies", "build_policy", "build_preprocessor",
           "prepare_policy", "register_policy"]
