"""Reward functions of the text envs, in TRL's convention: ``f(prompts, completions, **columns) -> list[float]``,
one float per completion; ``columns`` are the data set's other columns, one value per completion.

A run names its rewards as built-ins (``math``, ``code_tests``, ``format``, ``length``, ``last_number``: one
module each here, registered with ``@register_reward``) or as ``module:function`` import paths, each with an
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


def completion_text(completion: Any) -> str:
    """A completion as text: the string itself, or (a chat prompt's completion, TRL's conversational form)
    the content of its last message."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)
