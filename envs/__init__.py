"""Environment registry: a new environment is one file in ``envs/`` plus one config.

An env module registers a TaskSet factory with ``@register_env("name")``. Env modules must not
import their (optional, heavy) simulator package at module level; they import it inside the
factory, so that ``import envs`` and the discovery of env modules stay cheap and never fail
because some other environment's package is missing.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any, Callable

from async_rl.errors import ConfigError, unknown_key_message
from envs.base import TaskEnv, TaskSet

__all__ = ["ENV_BUILDERS", "TaskEnv", "TaskSet", "available_envs", "make_task_set", "register_env"]

ENV_BUILDERS: dict[str, Callable[..., TaskSet]] = {}

_NOT_ENV_MODULES = {"base"}
_discovered = False
_broken_modules: dict[str, str] = {}


def register_env(name: str) -> Callable[[Callable[..., TaskSet]], Callable[..., TaskSet]]:
    """Decorator: register ``fn(**kwargs) -> TaskSet`` under ``name``."""

    def deco(fn: Callable[..., TaskSet]) -> Callable[..., TaskSet]:
        existing = ENV_BUILDERS.get(name)
        if existing is not None and existing is not fn:
            raise ValueError(f"environment '{name}' is registered twice")
        ENV_BUILDERS[name] = fn
        return fn

    return deco


def _discover() -> None:
    """Import every env module in this package once, so each one registers itself."""
    global _discovered
    if _discovered:
        return
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name in _NOT_ENV_MODULES:
            continue
        try:
            importlib.import_module(f"{__name__}.{info.name}")
        except ImportError as exc:  # a module that breaks the lazy-import rule; keep the others usable
            _broken_modules[info.name] = f"{exc.__class__.__name__}: {exc}"
    _discovered = True


def available_envs() -> list[str]:
    """Sorted names of all registered environments (discovers env modules on first call)."""
    _discover()
    return sorted(ENV_BUILDERS)


def make_task_set(name: str, **kwargs: Any) -> TaskSet:
    """Build the TaskSet of environment ``name``; unknown names raise ConfigError."""
    if name not in ENV_BUILDERS:
        _discover()
    if name not in ENV_BUILDERS:
        msg = unknown_key_message(name, ENV_BUILDERS, "environment")
        if _broken_modules:
            broken = "; ".join(f"envs/{m}.py: {err}" for m, err in sorted(_broken_modules.items()))
            msg += f" (env modules that failed to import: {broken})"
        raise ConfigError(msg)
    builder = ENV_BUILDERS[name]
    params = inspect.signature(builder).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        for key in kwargs:
            if key not in params:
                raise ConfigError(unknown_key_message(key, params, f"'{name}' env option"))
    return builder(**kwargs)
