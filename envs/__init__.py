"""Environment registry: a new environment is one file in ``envs/`` plus one config (or, for an env that belongs
to a domain package above envs, one module there named in ``DOMAIN_ENV_MODULES``).

An env module registers a TaskSet factory with ``@register_env("name", options=NameOptions)``, optionally
with a ``final_evaluation`` the runtime runs on the final weights after training. ``NameOptions`` (a
``ConfigSection``) declares every option the env takes, typed, with its default, range and help:
``make_task_set`` checks ``env_kwargs`` against it and hands the factory the checked options, so the
factory only constructs. Env modules must not import their (optional, heavy) simulator package at module
level; they import it inside the factory, so that ``import envs`` and the discovery of env modules stay
cheap and never fail because some other environment's package is missing.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from async_rl.registry import Registry
from async_rl.renamed_keys import ENV_NAMES
from async_rl.validation import ConfigSection, validate_model
from envs.base import TaskEnv, TaskSet

__all__ = ["ENVS", "FinalEvaluation", "TaskEnv", "TaskSet", "available_envs", "env_options", "env_options_model",
           "final_evaluation_for", "make_task_set", "register_env"]

# fn(task_set, act, preprocess, seed) -> report. ``act(obs_batch, deterministic) -> env actions
# [B, action_dim]`` runs the current policy on a batch of preprocessed observations (a TensorDict);
# ``preprocess(obs, task_name)`` is the policy's preprocessor. The report holds ``scalars``
# ({"eval/...": float}), ``text`` (printable), ``files`` ({name: JSON-able}) and any raw fields.
# ``task_set`` is typed Any: an env's evaluation reads its own task set's class (what its factory makes), which no
# callable of a TaskSet in general could name.
FinalEvaluation = Callable[[Any, Callable[[Any, bool], np.ndarray], Callable[..., Any], int], dict[str, Any]]

# Env modules that live in their domain package, above envs/ (CTRL's env beside its cases, reward and reviser).
# Discovery imports them by name, as it imports this package's modules, so ``--env ctrl_humaneval`` resolves
# wherever an env name is resolved (the config loader, the driver, each Ray worker); no module of envs/ imports
# their code.
DOMAIN_ENV_MODULES = ("async_rl.ctrl.env",)

ENVS: Registry[Callable[[Any], TaskSet]] = Registry("environment", package=__name__, skip=("base",),
                                                     plugins=DOMAIN_ENV_MODULES, renamed=ENV_NAMES)


def register_env(name: str, *, options: type[ConfigSection], final_evaluation: Optional[FinalEvaluation] = None
                 ) -> Callable[[Callable[[Any], TaskSet]], Callable[[Any], TaskSet]]:
    """Decorator: register ``fn(options) -> TaskSet`` under ``name``, where ``options`` is an instance of the
    ``options`` model (and the env's final evaluation)."""
    return ENVS.register(name, options=options, final_evaluation=final_evaluation)


def available_envs() -> list[str]:
    """Sorted names of all registered environments (discovers env modules on first call)."""
    return ENVS.names()


def final_evaluation_for(name: str, task_set: Optional[TaskSet] = None) -> Optional[FinalEvaluation]:
    """The final evaluation environment ``name`` registered, or None; None too when ``task_set`` says its options
    ask for none (``final_evaluation_on`` false: LIBERO without held-out initial states). Unknown names raise
    ConfigError."""
    evaluate = ENVS.entry(name).meta.get("final_evaluation")
    if task_set is not None and not getattr(task_set, "final_evaluation_on", True):
        return None
    return evaluate


def env_options_model(name: str) -> type[ConfigSection]:
    """The options model environment ``name`` registered; unknown names raise ConfigError."""
    return ENVS.entry(name).meta["options"]


def env_options(name: str, kwargs: Any) -> ConfigSection:
    """``kwargs`` checked against environment ``name``'s options: an unknown key, a wrong type or a value out
    of range is a one-line ConfigError naming the key."""
    return validate_model(env_options_model(name), kwargs, f"{name} env option")


def make_task_set(name: str, **kwargs: Any) -> TaskSet:
    """Build the TaskSet of environment ``name``; unknown names and bad options raise ConfigError."""
    return ENVS.get(name)(env_options(name, kwargs))
