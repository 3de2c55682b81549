"""``length``: a penalty for long completions, DAPO's soft overlong punishment counted in characters (a
reward function sees text, not the policy's tokens): 0 up to ``max_chars - buffer_chars``, then falling
linearly to -1 at ``max_chars`` and staying there. Give it a weight below the task reward's (``length=0.1``)."""
from __future__ import annotations

from typing import Any

from async_rl.rewards import completion_text, register_reward


@register_reward("length")
def make_length(max_chars: int = 400, buffer_chars: int = 100) -> Any:
    if not 0 < buffer_chars <= max_chars:
        raise TypeError(f"need 0 < buffer_chars <= max_chars, got buffer_chars={buffer_chars}, max_chars={max_chars}")
    start = max_chars - buffer_chars

    def length(prompts: list, completions: list, **_: Any) -> list[float]:
        sizes = [len(completion_text(c)) for c in completions]
        return [0.0 - min(1.0, max(0, n - start) / buffer_chars) for n in sizes]

    return length
