"""Reward functions of the text envs, called as TRL 1.x's GRPOTrainer calls them:
``f(prompts=..., completions=..., completion_ids=..., trainer_state=..., **columns) -> list[float | None]``,
one value per completion (None: the reward does not apply to that row); ``columns`` are the data set's other
columns, one value per completion. A function without ``**kwargs`` gets only the arguments it names.

A run names its rewards as built-ins (one module each here, registered with ``@register_reward``;
``builtin_rewards()`` lists them, for the launch help and the docs' test) or as ``module:function`` import paths, each with an
optional weight (``math=1.0``). ``functions.py`` turns those names into callables; ``scoring.py`` calls them
on a batch, checks what they return and weighs them into one reward.

A built-in is registered as a factory ``make(**options) -> f``: its options (the ``code_tests`` timeout, the
``format`` pattern, ...) come from the env's ``reward_options``. A user's function is used as it is.
"""
from __future__ import annotations

from typing import Any, Callable

from async_rl.registry import Registry

RewardFunction = Callable[..., list]

REWARDS: Registry[Callable[..., RewardFunction]] = Registry("reward", package=__name__, skip=("functions", "scoring"))


def register_reward(name: str) -> Callable[[Callable[..., RewardFunction]], Callable[..., RewardFunction]]:
    """Decorator: register the factory of built-in reward ``name`` (``make(**options) -> f``)."""
    return REWARDS.register(name)


def builtin_rewards() -> list[str]:
    """The names of the built-in rewards, as registered (the one list: help texts and docs are checked against it)."""
    return REWARDS.names()


def completion_text(completion: Any) -> str:
    """A completion as text: the string itself, or (a chat prompt's completion, TRL's conversational form)
    the content of its last message."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)
