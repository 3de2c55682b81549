"""Arithmetic questions with an exact checker: a verifiable reward for a language model.

A problem is an integer expression (``"63 - 88"``, ``"7 * 12 + 40"``); the difficulty knob sets how
many operands, how large and which operators (``LEVELS``). The model is asked for the number only;
the built-in ``math`` reward (math-verify) checks the answer ("17 + 25 = 42" reads 42, "= - 25" reads -25,
"The answer is 42. Check: 40 + 2." reads 42) and rewards 1 for the exact value, 0 otherwise. The env is
the ``prompts`` env over generated rows (``ArithmeticRows``).

Train and held-out problems never mix, whatever the difficulty, seed or number asked for: a
problem's split is a hash of its expression (one in ``HELDOUT_BUCKETS`` is held out). The training
generator rejects held-out expressions; ``heldout_problems(n, difficulty)`` is a fixed seeded list.
"""
from __future__ import annotations

import functools
import hashlib
import itertools
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np
import pydantic

from async_rl.rewards.functions import parse_reward_specs
from async_rl.rewards.math_answer import answer_matches
from envs import register_env
from envs._text import TextEnvOptions
from envs.prompts import PromptTaskSet, heldout_evaluation


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
COUNTED_LEVEL_SIZE = 100_000  # a level with at most this many expressions has its held-out ones counted
HELDOUT_SEED = 20261125
PROMPT = "What is {expr}? Answer with the number only."


def is_heldout(expr: str) -> bool:
    """The split of a problem, from its expression alone (stable across processes and versions)."""
    return int(hashlib.sha256(expr.encode()).hexdigest(), 16) % HELDOUT_BUCKETS == 0


def _level(difficulty: int) -> Level:
    if difficulty not in LEVELS:  # the env's options refuse it first; this is a caller's bug
        raise ValueError(f"arithmetic difficulty must be one of {sorted(LEVELS)}, got {difficulty!r}")
    return LEVELS[difficulty]


def _expression(nums: Any, ops: Any) -> str:
    """``"63 - 88"``: the operands with the operators between them."""
    return " ".join([str(nums[0])] + [f"{op} {n}" for op, n in zip(ops, nums[1:])])


def draw_problem(rng: np.random.Generator, difficulty: int, heldout: bool) -> dict[str, Any]:
    """A problem of ``difficulty`` from the held-out or the training side: ``{"prompt", "answer", "expr"}``."""
    level = _level(difficulty)
    while True:
        nums = rng.integers(level.low, level.high + 1, size=level.operands)
        ops = rng.choice(list(level.ops), size=level.operands - 1)
        expr = _expression(nums, ops)
        if is_heldout(expr) == heldout:
            # Only + - * on small integers: eval of this generated string is exact integer arithmetic.
            return {"prompt": PROMPT.format(expr=expr), "answer": int(eval(expr, {"__builtins__": {}})), "expr": expr}


@functools.lru_cache(maxsize=None)
def heldout_capacity(difficulty: int) -> int:
    """How many distinct held-out problems ``difficulty`` offers (the most ``heldout_size`` may ask for). A small
    level's are counted. A large level holds out about a tenth of its expressions, give or take about the square
    root of that; half the tenth is returned, a count the split surely reaches (and no held-out list is longer)."""
    level = _level(difficulty)
    operands = range(level.low, level.high + 1)
    size = len(operands) ** level.operands * len(level.ops) ** (level.operands - 1)
    if size > COUNTED_LEVEL_SIZE:
        return size // HELDOUT_BUCKETS // 2
    return sum(is_heldout(_expression(nums, ops)) for nums in itertools.product(operands, repeat=level.operands)
               for ops in itertools.product(level.ops, repeat=level.operands - 1))


@functools.lru_cache(maxsize=16)
def _heldout(n: int, difficulty: int) -> tuple:
    rng = np.random.default_rng([HELDOUT_SEED, difficulty])
    seen: dict[str, dict] = {}
    # Drawing n of a pool of heldout_capacity >= n takes a few times n draws; the bound only stops a bug.
    for _ in range(50 * n + 1000):
        if len(seen) == n:
            return tuple(seen.values())
        problem = draw_problem(rng, difficulty, heldout=True)
        seen.setdefault(problem["expr"], problem)
    raise RuntimeError(f"arithmetic difficulty {difficulty}: drew only {len(seen)} of {n} held-out problems, "
                       f"though heldout_capacity says {heldout_capacity(difficulty)}")


def heldout_problems(n: int = 200, difficulty: int = 2) -> list[dict[str, Any]]:
    """The fixed held-out list: ``n`` distinct problems ``{"prompt", "answer", "expr"}``, the same in
    every process (the first ``n`` of a longer list are the same problems)."""
    if not 1 <= n <= heldout_capacity(difficulty):
        raise ValueError(f"heldout_problems n must be 1..{heldout_capacity(difficulty)} at difficulty {difficulty}, "
                         f"got {n}")
    return [dict(p) for p in _heldout(int(n), int(difficulty))]


def arithmetic_reward(text: str, answer: Union[int, str, float]) -> float:
    """1.0 when ``text`` answers ``answer`` (the built-in ``math`` reward's check: math-verify), else 0.0."""
    return float(answer_matches(text, answer)[1])


@dataclass(frozen=True)
class ArithmeticRows:
    """Generated rows ``{"prompt", "answer", "expr"}`` for the prompts env: held-out, the fixed list of
    ``heldout_size`` problems (row ``i % heldout_size``); training, endless (row ``i`` drawn from a generator
    seeded by ``i`` alone, so that a group's members get the same problem)."""

    difficulty: int
    heldout: bool
    heldout_size: int = 200

    @property
    def size(self) -> Optional[int]:
        return self.heldout_size if self.heldout else None

    def row(self, index: int) -> dict:
        if self.heldout:
            return dict(_heldout(self.heldout_size, self.difficulty)[index % self.heldout_size])
        return draw_problem(np.random.default_rng([HELDOUT_SEED + 1, self.difficulty, int(index)]), self.difficulty,
                            heldout=False)

    def label(self, index: int) -> str:
        return f"arithmetic {'held-out' if self.heldout else 'training'} problem {index}"


class ArithmeticOptions(TextEnvOptions):
    """Arithmetic questions: split train is generated (held-out expressions rejected), heldout the fixed list."""

    difficulty: int = pydantic.Field(2, ge=min(LEVELS), le=max(LEVELS))
    """a key of LEVELS: 1 is a +- b up to 50 ... 5 three operands up to 999 with *"""
    heldout_size: pydantic.PositiveInt = 200
    """problems in the fixed held-out list (at most heldout_capacity(difficulty): 497 at difficulty 1)"""

    @pydantic.model_validator(mode="after")
    def _enough_heldout_problems(self) -> "ArithmeticOptions":
        capacity = heldout_capacity(self.difficulty)
        if self.heldout_size > capacity:
            raise ValueError(f"arithmetic heldout_size {self.heldout_size}: difficulty {self.difficulty} has only "
                             f"{capacity} distinct held-out problems; set heldout_size <= {capacity} or raise the "
                             "difficulty")
        return self


@register_env("arithmetic", options=ArithmeticOptions, final_evaluation=heldout_evaluation)
def arithmetic_task_set(options: ArithmeticOptions) -> PromptTaskSet:
    """Arithmetic questions: the prompts env over these rows, scored by ``math``."""
    return PromptTaskSet(split=options.split, tokenizer_path=options.tokenizer_path, seed=options.seed,
                         train=ArithmeticRows(options.difficulty, heldout=False),
                         heldout=ArithmeticRows(options.difficulty, heldout=True, heldout_size=options.heldout_size),
                         rewards=tuple(parse_reward_specs(["math"])), success_reward="math",
                         task_names=["arithmetic"])
