"""Arithmetic questions with an exact checker: a verifiable reward for a language model.

A problem is an integer expression (``"63 - 88"``, ``"7 * 12 + 40"``); the difficulty knob sets how
many operands, how large and which operators (``LEVELS``). The model is asked for the number only;
the checker takes the LAST number of the answer (so "17 + 25 = 42" is read as 42) and rewards 1 for
the exact value, 0 otherwise.

Train and held-out problems never mix, whatever the difficulty, seed or number asked for: a
problem's split is a hash of its expression (one in ``HELDOUT_BUCKETS`` is held out). The training
generator rejects held-out expressions; ``heldout_problems(n, difficulty)`` is a fixed seeded list.
"""
from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Optional, Union

import numpy as np

from async_rl.errors import ConfigError
from envs import register_env
from envs._text import TextEnvBase, TextTaskSetBase, check_split, heldout_evaluation


@dataclass(frozen=True)
class Level:
    operands: int
    low: int
    high: int  # operands are drawn from [low, high]
    ops: str


LEVELS = {
    1: Level(2, 0, 50, "+-"),
    2: Level(2, 0, 99, "+-"),
    3: Level(2, 0, 99, "+-*"),
    4: Level(3, 0, 99, "+-*"),
    5: Level(3, 10, 999, "+-*"),
}
HELDOUT_BUCKETS = 10  # one expression in ten is held out
HELDOUT_SEED = 20261125
PROMPT = "What is {expr}? Answer with the number only."
_NUMBER = re.compile(r"[-\u2212]?\d+(?:,\d{3})*(?:\.\d+)?")


def is_heldout(expr: str) -> bool:
    """The split of a problem, from its expression alone (stable across processes and versions)."""
    return int(hashlib.sha256(expr.encode()).hexdigest(), 16) % HELDOUT_BUCKETS == 0


def _level(difficulty: int) -> Level:
    if difficulty not in LEVELS:
        raise ConfigError(f"arithmetic difficulty must be one of {sorted(LEVELS)}, got {difficulty!r}")
    return LEVELS[difficulty]


def draw_problem(rng: np.random.Generator, difficulty: int, heldout: bool) -> dict[str, Any]:
    """A problem of ``difficulty`` from the held-out or the training side: ``{"prompt", "answer", "expr"}``."""
    level = _level(difficulty)
    while True:
        nums = rng.integers(level.low, level.high + 1, size=level.operands)
        ops = rng.choice(list(level.ops), size=level.operands - 1)
        expr = " ".join([str(nums[0])] + [f"{op} {n}" for op, n in zip(ops, nums[1:])])
        if is_heldout(expr) == heldout:
            # Only + - * on small integers: eval of this generated string is exact integer arithmetic.
            return {"prompt": PROMPT.format(expr=expr), "answer": int(eval(expr, {"__builtins__": {}})), "expr": expr}


@functools.lru_cache(maxsize=16)
def _heldout(n: int, difficulty: int) -> tuple:
    rng = np.random.default_rng([HELDOUT_SEED, difficulty])
    seen: dict[str, dict] = {}
    for _ in range(50 * n + 1000):
        if len(seen) == n:
            return tuple(seen.values())
        problem = draw_problem(rng, difficulty, heldout=True)
        seen.setdefault(problem["expr"], problem)
    raise ConfigError(f"arithmetic difficulty {difficulty} has fewer than {n} distinct held-out problems "
                      f"(found {len(seen)}); ask for fewer or raise the difficulty")


def heldout_problems(n: int = 200, difficulty: int = 2) -> list[dict[str, Any]]:
    """The fixed held-out list: ``n`` distinct problems ``{"prompt", "answer", "expr"}``, the same in
    every process (the first ``n`` of a longer list are the same problems)."""
    if n < 1:
        raise ConfigError(f"heldout_problems n must be >= 1, got {n}")
    return [dict(p) for p in _heldout(int(n), int(difficulty))]


def final_number(text: str) -> Optional[Fraction]:
    """The last number written in ``text`` (thousands commas and a unicode minus allowed), or None."""
    found = _NUMBER.findall(text or "")
    if not found:
        return None
    return Fraction(found[-1].replace(",", "").replace("\u2212", "-"))


def arithmetic_reward(text: str, answer: Union[int, str, float]) -> float:
    """1.0 when the last number of ``text`` equals ``answer`` exactly, else 0.0 (TRL-style reward)."""
    got = final_number(text)
    return float(got is not None and got == Fraction(str(answer)))


@register_env("arithmetic", final_evaluation=heldout_evaluation)
def arithmetic_task_set(difficulty: int = 2, split: str = "train", tokenizer_path: Optional[str] = None,
                        seed: int = 0, heldout_size: int = 200) -> "ArithmeticTaskSet":
    """Arithmetic questions. difficulty: a key of ``LEVELS`` (1: a +- b up to 50 ... 5: three operands
    up to 999 with *). split: ``train`` (generated, held-out expressions rejected) or ``heldout``
    (the fixed list of ``heldout_size`` problems). tokenizer_path: the model's folder (filled by the
    driver from --model-path), to decode responses."""
    _level(difficulty)
    return ArithmeticTaskSet(difficulty=difficulty, split=check_split(split, "arithmetic"),
                             tokenizer_path=tokenizer_path, seed=int(seed), heldout_size=int(heldout_size))


@dataclass
class ArithmeticTaskSet(TextTaskSetBase):
    """Picklable and small: problems are generated in the env."""

    difficulty: int = 2
    heldout_size: int = 200
    task_names: list[str] = field(default_factory=lambda: ["arithmetic"])

    def heldout_count(self) -> int:
        """How many held-out problems the final evaluation answers."""
        return self.heldout_size

    def make_env(self, task_index: int, seed: int) -> "ArithmeticEnv":
        if task_index != 0:
            raise IndexError(f"task_index {task_index} out of range: arithmetic has one task")
        return ArithmeticEnv(self.difficulty, self.split, self.tokenizer_path, seed=int(seed) + 1_000_003 * self.seed,
                             heldout_size=self.heldout_size)


class ArithmeticEnv(TextEnvBase):
    task_name = "arithmetic"
    reason_names = ("correct", "wrong", "no_number")

    def __init__(self, difficulty: int, split: str, tokenizer_path: Optional[str], seed: int,
                 heldout_size: int = 200) -> None:
        super().__init__(tokenizer_path, seed)
        self.difficulty, self.split, self.heldout_size = difficulty, split, heldout_size

    def _problem(self, start: Optional[int]) -> dict:
        if self.split == "heldout":
            problems = _heldout(self.heldout_size, self.difficulty)
            return dict(problems[int(self.rng.integers(len(problems))) if start is None else start % len(problems)])
        # A training problem per start (group rollouts): seeded by the start alone.
        rng = self.rng if start is None else np.random.default_rng([HELDOUT_SEED + 1, self.difficulty, int(start)])
        return draw_problem(rng, self.difficulty, heldout=False)

    def score(self, text: str) -> tuple[float, dict[str, Any]]:
        """(reward, info) of a response to the current problem (``reset`` first)."""
        got = final_number(text)
        reward = arithmetic_reward(text, self.problem["answer"]) if got is not None else 0.0
        reason = "no_number" if got is None else "correct" if reward == 1.0 else "wrong"
        return reward, {"success": reward == 1.0, "reason": reason}
