"""``format``: 1.0 when the completion matches a regular expression, else 0.0 (TRL's format reward).

The default pattern asks for a final answer in ``\\boxed{...}``; reward_options ``{format: {pattern: ...,
full_match: true}}`` sets another (full_match: the whole completion must match, as TRL's ``<think>...</think>``
examples do; false: anywhere in it). The pattern is compiled once, with DOTALL (``.`` crosses lines)."""
from __future__ import annotations

import re
from typing import Any

from async_rl.rewards import completion_text, register_reward

DEFAULT_PATTERN = r"\\boxed\{.+\}"


@register_reward("format")
def make_format(pattern: str = DEFAULT_PATTERN, full_match: bool = False) -> Any:
    try:
        compiled = re.compile(pattern, re.DOTALL)
    except re.error as exc:
        raise TypeError(f"pattern {pattern!r} is not a regular expression ({exc})") from None
    match = compiled.fullmatch if full_match else compiled.search

    def format_reward(prompts: list, completions: list, **_: Any) -> list[float]:
        found = [match(completion_text(c).strip()) is not None for c in completions]
        format_reward.last_reasons = ["matched" if f else "unmatched" for f in found]  # type: ignore[attr-defined]  # what the reward says of its calls, read by its callers
        return [float(f) for f in found]

    format_reward.reason_names = ("matched", "unmatched")  # type: ignore[attr-defined]  # what the reward says of its calls, read by its callers
    return format_reward
