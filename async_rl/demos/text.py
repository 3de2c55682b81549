"""Text demonstrations for a language-model policy's supervised stage (``launch/sft.py``).

A JSONL file, one demonstration per line: ``{"prompt": str, "response": str}``. The prompt is the
user message a rollout worker would send (the policy's chat template is applied when training, as
for an env's prompt); the response is the text the policy learns to answer, its end-of-text token
added. ``python -m async_rl.ctrl.critique_sft`` writes such a file of reference critiques.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from async_rl.errors import ConfigError
from async_rl.jsonl import jsonl_values

SUFFIX = ".jsonl"


@dataclass
class TextDemos:
    path: str
    pairs: list[dict[str, str]]


def is_text_demos(path: str) -> bool:
    return Path(path).suffix == SUFFIX


def load_text_demos(path: str) -> TextDemos:
    """The pairs of ``path``; a ConfigError naming the first bad line, or an empty file."""
    pairs = []
    for number, value in jsonl_values(path, "--demos", "{\"prompt\": ..., \"response\": ...} demonstrations"):
        if not isinstance(value, dict) or not all(isinstance(value.get(k), str) and value[k] for k in ("prompt", "response")):
            raise ConfigError(f"--demos {path} line {number}: needs non-empty strings \"prompt\" and \"response\"")
        pairs.append({"prompt": value["prompt"], "response": value["response"]})
    if not pairs:
        raise ConfigError(f"--demos {path} holds no demonstrations; write some (one JSON object per line)")
    return TextDemos(str(path), pairs)
