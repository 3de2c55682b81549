"""What the text envs (``prompts``, over which ``arithmetic`` and ``humaneval`` run, and ``ctrl_humaneval``) share:
one-step episodes over a prompt.

An episode is one question: ``reset`` returns ``{"prompt": str}`` (the user message; the policy's
worker-side preprocessor applies the chat template and tokenizes it), ``step`` receives the response
as a 1-D array of token ids (ids < 0 are padding), decodes it with the model's tokenizer and scores
it, or receives the decoded text itself (unit tests, evaluation scripts).
"""
from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

import numpy as np

from async_rl.errors import ConfigError
from async_rl.validation import ConfigSection, checked_folder

OBS_SPEC = {"text": True}
SPLITS = ("train", "heldout")


class TextEnvOptions(ConfigSection):
    """What every text env takes; each adds its own options."""

    split: Literal["train", "heldout"] = "train"
    """the problems episodes draw from: train, or heldout (those of the final evaluation)"""
    tokenizer_path: Optional[str] = None
    """the model's folder, to decode responses (the driver fills it from the policy's model)"""
    seed: int = 0
    """seeds the problems the env draws"""


@dataclass
class TextTaskSetBase:
    """What every text task set holds: one task of one-step episodes over text prompts. Picklable and
    small; a subclass adds its options and ``task_names``, ``heldout_count`` and ``make_env``."""

    split: str = "train"
    tokenizer_path: Optional[str] = None  # the model's folder, filled by the driver from --model-path
    seed: int = 0
    obs_dim: int = 0
    action_dim: int = 1  # the causal-LM policy ignores it: a response is the action
    max_episode_steps: int = 1
    obs_spec: dict = field(default_factory=lambda: dict(OBS_SPEC))


def check_split(split: str, env: str) -> str:
    """``split`` if it is one (the env's options refuse a bad one first: here it is a caller's bug)."""
    if split not in SPLITS:
        raise ValueError(f"{env} split must be one of {', '.join(SPLITS)}, got {split!r}")
    return split


@functools.lru_cache(maxsize=4)
def load_tokenizer(path: str) -> Any:
    """The tokenizer of a Hugging Face folder or a ``.gguf`` file, loaded once per process."""
    from transformers import AutoTokenizer  # heavy; only envs that decode ids need it

    p = Path(path).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    return AutoTokenizer.from_pretrained(str(checked_folder(p, f"tokenizer_path {path}",
                                                            "pass the model's folder or its .gguf file")))


def response_text(action: Union[str, np.ndarray, list], tokenizer_path: Optional[str], env: str) -> str:
    """The response as text: ``action`` itself when it is a string, else its token ids (padding,
    any id < 0, dropped) decoded without special tokens."""
    if isinstance(action, str):
        return action
    ids = np.asarray(action).reshape(-1)
    if ids.dtype.kind not in "iu":
        raise ValueError(f"{env} expects the response's token ids (integers), got dtype {ids.dtype}")
    if tokenizer_path is None:
        raise ConfigError(f"{env} env got token ids but has no tokenizer_path; set env kwarg tokenizer_path "
                          "(the driver fills it from --model-path)")
    return load_tokenizer(str(tokenizer_path)).decode([int(i) for i in ids if i >= 0], skip_special_tokens=True)


def response_tokens(action: Union[str, np.ndarray, list]) -> int:
    """The response's tokens: its ids less the padding (a response given as text, as tests do, counts none)."""
    return 0 if isinstance(action, str) else int((np.asarray(action).reshape(-1) >= 0).sum())


class TextEnvBase:
    """One-step episodes: a subclass sets ``task_name`` and implements ``_problem(start)`` (-> its
    prompt and whatever scoring needs) and ``score(text) -> (reward, info)``."""

    task_name: str
    reason_names: tuple[str, ...] = ()  # counted from zero, so that each is logged from the first episode

    def __init__(self, tokenizer_path: Optional[str], seed: int) -> None:
        self.tokenizer_path = tokenizer_path
        self.rng = np.random.default_rng(seed)
        self.problem: Optional[dict] = None
        self.reasons: Counter = Counter({r: 0 for r in self.reason_names})  # running totals for counters()
        self.completions = self.completion_tokens = 0  # likewise: the stats' completions/s and tokens per completion

    def reset(self, start: Optional[int] = None) -> dict[str, str]:
        """A problem drawn by the env's seeded RNG, or (group rollouts) the problem of ``start``:
        the same start, the same problem, whatever the env's seed."""
        self.problem = self._problem(start)
        return self.observation()

    def observation(self) -> dict[str, str]:
        """What the policy's preprocessor receives: the current problem's prompt (a user message)."""
        return {"prompt": self.problem["prompt"]}

    def step(self, action: Union[str, np.ndarray]) -> tuple[dict[str, str], float, bool, bool, dict[str, Any]]:
        if self.problem is None:
            raise RuntimeError(f"{self.task_name} env: call reset() before step() (an episode is one step)")
        reward, info = self.score(response_text(action, self.tokenizer_path, self.task_name))
        self.reasons[info["reason"]] += 1
        self.completions += 1
        self.completion_tokens += response_tokens(action)
        obs, self.problem = self.observation(), None
        return obs, float(reward), True, False, info

    def counters(self) -> dict[str, int]:
        """Running totals the rollout worker logs as ``env/<name>``: how each response ended, and the responses
        (``completions``) and their tokens (``completion_tokens``), which the stats turn into completions/s and
        the mean completion length (``rollout/completions_per_sec``, ``rollout/completion_tokens``)."""
        return {**{f"{self.task_name}_{reason}": n for reason, n in self.reasons.items()},
                "completions": self.completions, "completion_tokens": self.completion_tokens}

    def _problem(self, start: Optional[int]) -> dict:
        raise NotImplementedError

    def score(self, text: str) -> tuple[float, dict[str, Any]]:
        raise NotImplementedError

    def close(self) -> None:
        pass


def action_key(action: Union[str, np.ndarray, list]) -> Any:
    """A hashable identity of an action (its text, or its token ids and their dtype)."""
    return action if isinstance(action, str) else (np.asarray(action).tobytes(), np.asarray(action).dtype.str)


class PreparedStepEnv(TextEnvBase):
    """A text env whose scoring starts in ``prepare_step(action)`` (the rollout worker calls it for all its
    envs before stepping any, so their scoring runs in parallel) and is collected in ``score``. A subclass
    sets ``self._pending = (action_key(action), whatever score needs)``; a step of an action that was not
    prepared prepares it first."""

    _pending: Optional[tuple[Any, Any]] = None

    def prepare_step(self, action: Union[str, np.ndarray]) -> None:
        raise NotImplementedError

    def step(self, action: Union[str, np.ndarray]) -> tuple[dict[str, str], float, bool, bool, dict[str, Any]]:
        if self._pending is None or self._pending[0] != action_key(action):
            self.prepare_step(action)
        return super().step(action)


EVAL_BATCH = 16  # prompts per inference request of a held-out evaluation
