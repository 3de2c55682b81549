"""The CTRL reward: a critique is worth what the reviser's revision of the code scores in the sandbox.

``critique_reward``: ``missing_judgment_reward`` (0, or -1 as a later CTRL version uses) when the critique
has no judgment line; otherwise the revision's first python block runs against the tests and scores 1 when
all pass (``all_pass``) or the fraction passed (``pass_rate``). The problem's ``prefix`` (its imports and
helpers) and ``entry_point`` go to the sandbox apart from the code: its judge takes the helpers from the
prompt, so a revision that redefines one changes only its own calls.

``ResultCache`` returns a known result without running the code again. Its key is the exact program
text plus the prefix, the tests, the timeout and the entry point: no normalisation, since a candidate
can read its own text (a docstring through ``__doc__``, a name through ``__name__`` or ``globals()``,
a comment through its harness's frames), so two texts that differ anywhere may behave differently.
"""
from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any, Optional, Sequence

from async_rl.code_blocks import extract_code
from async_rl.ctrl.critique import parse_judgment
from async_rl.sandbox import SandboxPool, SandboxResult, run_tests

REWARD_MODES = ("all_pass", "pass_rate")


def cache_key(code: str, tests: Sequence[str], prefix: str = "", timeout_s: float = 3.0,
              entry_point: Optional[str] = None) -> str:
    """The cache's key: a hash of the exact texts (see the module docstring) and the run's settings."""
    parts = [code, prefix, *tests, f"{timeout_s:g}", entry_point or ""]
    return hashlib.sha256(json.dumps([len(tests), parts]).encode()).hexdigest()


class ResultCache:
    """Sandbox results by ``cache_key``, bounded (least recently used out), shared by the envs of a process.
    A key already running answers with the same future. ``lookups`` and ``hits`` count for the hit rate."""

    def __init__(self, capacity: int = 50_000) -> None:
        self.capacity = capacity
        self._results: "OrderedDict[str, Future[SandboxResult]]" = OrderedDict()
        self._lock = threading.Lock()
        self.lookups = self.hits = 0

    def submit(self, pool: Optional[SandboxPool], code: str, tests: Sequence[str], prefix: str = "",
               timeout_s: float = 3.0, entry_point: Optional[str] = None) -> "Future[SandboxResult]":
        """The result of ``prefix + code`` against ``tests``: known, in flight, or started now in ``pool``
        (None: run in this thread). ``prefix`` (the prompt's helpers) and ``entry_point`` go to the sandbox
        apart from the code (``run_tests``)."""
        return self.submit_counted(pool, code, tests, prefix, timeout_s, entry_point)[0]

    def submit_counted(self, pool: Optional[SandboxPool], code: str, tests: Sequence[str], prefix: str = "",
                       timeout_s: float = 3.0, entry_point: Optional[str] = None) -> tuple["Future[SandboxResult]", bool]:
        """``submit``, and whether the cache answered (a caller counting its own hits reads it)."""
        key = cache_key(code, tests, prefix, timeout_s, entry_point)
        with self._lock:
            self.lookups += 1
            known = self._results.get(key)
            if known is not None:
                self.hits += 1
                self._results.move_to_end(key)
                return known, True
            future = _run(pool, code, prefix, list(tests), timeout_s, entry_point)
            self._results[key] = future
            while len(self._results) > self.capacity:
                self._results.popitem(last=False)
        # A sandbox failure (reason error) is not a property of the code: forget it so the next one runs.
        future.add_done_callback(lambda f: self._forget_errors(key, f))
        return future, False

    def _forget_errors(self, key: str, future: "Future[SandboxResult]") -> None:
        if future.exception() is not None or future.result().reason == "error":
            with self._lock:
                if self._results.get(key) is future:
                    del self._results[key]

    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0


def _run(pool: Optional[SandboxPool], code: str, prefix: str, tests: list[str],
         timeout_s: float, entry_point: Optional[str] = None) -> "Future[SandboxResult]":
    # The prefix goes apart from the code: the sandbox's judge then takes the prompt's helpers from the
    # prompt, so a revision that redefines one (HumanEval/38's encode_cyclic) changes only its own calls.
    if pool is not None:
        return pool.submit(code, tests, timeout_s=timeout_s, prefix=prefix, entry_point=entry_point)
    future: Future = Future()
    future.set_result(run_tests(code, tests, timeout_s=timeout_s, prefix=prefix, entry_point=entry_point))
    return future


def reward_of(result: SandboxResult, mode: str) -> float:
    """1/0 for all tests passed (``all_pass``) or the fraction passed (``pass_rate``)."""
    return result.fraction if mode == "pass_rate" else float(result.all_passed)


def score_revision(revision: str, tests: Sequence[str], prefix: str, cache: ResultCache,
                   pool: Optional[SandboxPool] = None, timeout_s: float = 3.0,
                   entry_point: Optional[str] = None) -> tuple["Future[SandboxResult]", Optional[bool]]:
    """The sandbox result of a revision's first python block (reason ``no_code`` without one), and
    whether the cache answered (None: no code, nothing looked up). ``prefix``: the problem's helpers,
    judged as the prompt's; ``entry_point``: the function under test (a case's, when it has one)."""
    code = extract_code(revision)
    if code is None:
        future: Future = Future()
        future.set_result(SandboxResult(0, len(tests), "no_code"))
        return future, None
    return cache.submit_counted(pool, code, tests, prefix, timeout_s, entry_point)


def critique_reward(critique: str, result: Optional[SandboxResult], mode: str = "all_pass",
                    missing_judgment_reward: float = 0.0, format_check: bool = True) -> tuple[float, dict[str, Any]]:
    """(reward, info) of a critique whose revision scored ``result`` (None when it was not revised: a
    critique without judgment is not, unless ``format_check`` is off). info: judgment (True/False/None),
    reason, success, passed, total."""
    judgment = parse_judgment(critique)
    if judgment is None and format_check:
        total = result.total if result is not None else 0
        return missing_judgment_reward, {"judgment": None, "reason": "no_judgment", "success": False,
                                         "passed": 0, "total": total}
    if result is None:
        raise ValueError("a critique that is scored needs its revision's sandbox result")
    return reward_of(result, mode), {"judgment": judgment, "reason": result.reason,
                                     "success": result.all_passed,
                                     "passed": result.passed, "total": result.total}
