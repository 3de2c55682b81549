"""Policies (actor-critics) and their worker-side preprocessors, by name.

A new policy is one module in this package that calls ``register_policy`` with the model of its options (a
``ConfigSection``: every ``policy_kwargs`` key, typed, with its default, range and help); ``policy_kwargs`` are
checked against it wherever a policy or its preprocessor is built, and before Ray starts. Modules are discovered
on the first lookup of an unknown name. They import heavy packages (transformers, peft) inside
functions, so that discovering every policy stays cheap.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from async_rl.errors import ConfigError
from async_rl.plugin_options import given_options
from async_rl.policies.base import ActorCritic, ObsSpec, Preprocessor
from async_rl.registry import Registry
from async_rl.validation import ConfigSection, validate_model

# lora.py is the trainers' LoRA helper (it imports peft), not a policy.
POLICIES: Registry[Callable[..., ActorCritic]] = Registry("policy", package=__name__, skip=("base", "lora"))


def register_policy(name: str, preprocessor: Callable[..., Preprocessor], *, options: type[ConfigSection],
                    prepare: Optional[Callable[..., dict]] = None):
    """Register an ActorCritic factory ``fn(obs_spec, action_dim, **kwargs)`` and its preprocessor
    factory ``fn(obs_spec, **kwargs)`` (it receives the policy's kwargs too); ``options`` is the model of
    those kwargs (the factories receive the ones given, checked and converted).

    ``prepare(obs_spec, action_dim, model_path, kwargs) -> kwargs`` (optional) runs in the driver
    before Ray starts, on checked kwargs: it checks what needs the env or the files (``model_path``,
    the env's prompts; ConfigError) and returns the kwargs both factories receive.
    """
    return POLICIES.register(name, preprocessor=preprocessor, options=options, prepare=prepare)


def available_policies() -> list[str]:
    """Sorted names of every registered policy (discovers the policy modules)."""
    return POLICIES.names()


def policy_options_model(name: str) -> type[ConfigSection]:
    """The options model policy ``name`` registered; unknown names raise ConfigError."""
    return POLICIES.entry(name).meta["options"]


def policy_kwargs_checked(name: str, kwargs: Any) -> dict[str, Any]:
    """``kwargs`` checked against policy ``name``'s options (an unknown key, a wrong type or a value out of range
    is a one-line ConfigError naming the key): the ones given, converted."""
    return given_options(validate_model(policy_options_model(name), kwargs, f"{name} policy option"))


def _entry(name: str) -> tuple[Callable[..., ActorCritic], Callable[..., Preprocessor], Optional[Callable[..., dict]]]:
    entry = POLICIES.entry(name)
    return entry.obj, entry.meta["preprocessor"], entry.meta["prepare"]


def build_policy(name: str, obs_spec: ObsSpec, action_dim: int, **kwargs: Any) -> ActorCritic:
    """Build the actor-critic ``name`` for observations ``obs_spec`` and ``action_dim`` actions."""
    return _entry(name)[0](obs_spec, action_dim, **policy_kwargs_checked(name, kwargs))


def build_preprocessor(name: str, obs_spec: ObsSpec, **kwargs: Any) -> Preprocessor:
    """The worker-side preprocessing of policy ``name`` (no model weights)."""
    return _entry(name)[1](obs_spec, **policy_kwargs_checked(name, kwargs))


def prepare_policy(name: str, obs_spec: ObsSpec, action_dim: int, model_path: Optional[str],
                   kwargs: dict[str, Any]) -> dict[str, Any]:
    """Check the policy's kwargs and ``model_path`` before Ray starts; returns the kwargs to build with."""
    factory, preprocessor, prepare = _entry(name)
    kwargs = policy_kwargs_checked(name, kwargs)
    if prepare is not None:
        return prepare(obs_spec, action_dim, model_path, kwargs)
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
           "policy_kwargs_checked", "policy_options_model", "prepare_policy", "register_policy"]
