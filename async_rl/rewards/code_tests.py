"""``code_tests``: the fraction of a row's tests that the completion's first code block passes, each test
statement judged by the sandbox (``async_rl/sandbox/``) against the block run after the row's ``prefix``.
Columns: ``tests`` (a list of Python statements, or one string: a single test), optional ``prefix`` (the
prompt's imports and helpers the tests need: the judge takes them from here, so a completion that
redefines one changes only its own calls) and optional ``entry_point`` (the name of the function under
test: always asked of the completion, even where the prefix defines a stub of it or it shadows a builtin;
HumanEval's rows carry it). A batch runs in parallel, one sandbox per completion."""
from __future__ import annotations

from typing import Any, Optional, Sequence

from async_rl.code_blocks import extract_code
from async_rl.rewards import completion_text, register_reward
from async_rl.sandbox import REASONS, SandboxPool, SandboxResult

_POOL: Optional[SandboxPool] = None


def shared_pool() -> SandboxPool:
    """One sandbox pool per process (CPU-count threads), shared by every env and reward of that process."""
    global _POOL
    if _POOL is None:
        _POOL = SandboxPool()
    return _POOL


def _tests(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if value is None or not all(isinstance(t, str) for t in value):
        raise TypeError(f"the tests column must hold a list of Python statements, got {value!r:.80}")
    return list(value)


def _entry_point(value: Any) -> Optional[str]:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not value.isidentifier():
        raise TypeError(f"the entry_point column must hold a function's name, got {value!r:.80}")
    return value


def run_code_tests(texts: Sequence[str], tests: Sequence[Any], prefixes: Sequence[Optional[str]],
                   timeout_s: float = 3.0, entry_points: Optional[Sequence[Optional[str]]] = None) -> list[SandboxResult]:
    """Each text's first code block against its tests, in parallel; a text without a block is ``no_code``."""
    jobs, results = [], []
    for text, row_tests, prefix, entry in zip(texts, tests, prefixes, entry_points or [None] * len(texts)):
        code, row_tests = extract_code(text), _tests(row_tests)
        results.append(SandboxResult(0, len(row_tests), "no_code") if code is None else None)
        if code is not None:  # helpers apart: the judge takes the prompt's; the entry point is the candidate's
            jobs.append((code, row_tests, {"prefix": prefix or "", "entry_point": _entry_point(entry)}))
    done = iter(shared_pool().map(jobs, timeout_s=timeout_s))
    return [r if r is not None else next(done) for r in results]


@register_reward("code_tests")
def make_code_tests(timeout_s: float = 3.0) -> Any:
    """timeout_s: wall seconds per completion (its code and all its tests together)."""
    if not timeout_s > 0:
        raise TypeError(f"timeout_s must be positive, got {timeout_s}")

    def code_tests(prompts: list, completions: list, tests: list, prefix: Optional[list] = None,
                   entry_point: Optional[list] = None, **_: Any) -> list[float]:
        results = run_code_tests([completion_text(c) for c in completions], tests, prefix or [None] * len(completions),
                                 timeout_s, entry_point)
        code_tests.last_reasons = [r.reason for r in results]  # type: ignore[attr-defined]  # what the reward says of its calls, read by its callers
        code_tests.last_solved = [r.all_passed for r in results]  # type: ignore[attr-defined]  # what the reward says of its calls, read by its callers
        return [r.fraction for r in results]

    code_tests.reason_names = REASONS  # type: ignore[attr-defined]  # what the reward says of its calls, read by its callers
    return code_tests
