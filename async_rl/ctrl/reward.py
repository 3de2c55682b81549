"""The CTRL reward: a critique is worth what the reviser's revision of the code scores in the sandbox.

``critique_reward``: ``missing_judgment_reward`` (0, or -1 as a later CTRL version uses) when the critique
has no judgment line; otherwise the revision's first python block runs against the tests and scores 1 when
all pass (``all_pass``) or the fraction passed (``pass_rate``). The problem's ``prefix`` (its imports and
helpers) and ``entry_point`` go to the sandbox apart from the code: its judge takes the helpers from the
prompt, so a revision that redefines one changes only its own calls.

``ResultCache`` returns a known result without running the code again. Its key is the code normalised on
the AST (comments, docstrings and layout dropped, local variables renamed ``_v0, _v1, ...`` in order of
first use) plus the prefix, the tests, the timeout and the entry point, so two revisions that differ only in those run once.
Names visible from outside are kept: functions, classes, parameters (tests may pass them as keywords),
imports, module-level names and ``global``/``nonlocal`` ones. Code that does not parse is keyed on its text.
"""
from __future__ import annotations

import ast
import builtins
import hashlib
import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any, Optional, Sequence

from async_rl.code_blocks import extract_code
from async_rl.ctrl.critique import parse_judgment
from async_rl.sandbox import SandboxPool, SandboxResult

REWARD_MODES = ("all_pass", "pass_rate")


class _LocalNames(ast.NodeVisitor):
    """The names a normalisation may rename: bound inside a function, invisible from outside."""

    def __init__(self) -> None:
        self.bound: list[str] = []
        self.kept: set[str] = set()
        self.depth = 0

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.kept.add(node.name)
        self.kept.update(a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg))
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.kept.update(a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg))
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.kept.add(node.name)
        depth, self.depth = self.depth, 0  # names bound in a class body are its attributes: kept
        self.generic_visit(node)
        self.depth = depth

    def visit_Import(self, node: ast.Import) -> None:
        self.kept.update((a.asname or a.name).split(".")[0] for a in node.names)

    visit_ImportFrom = visit_Import  # type: ignore[assignment]

    def visit_Global(self, node: ast.Global) -> None:
        self.kept.update(node.names)

    visit_Nonlocal = visit_Global  # type: ignore[assignment]

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Store):
            (self.bound.append if self.depth else self.kept.add)(node.id)


class _Rename(ast.NodeTransformer):
    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.Name:
        node.id = self.names.get(node.id, node.id)
        return node

    def _drop_docstring(self, node: Any) -> Any:
        self.generic_visit(node)
        body = node.body
        if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:]
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Module = _drop_docstring


def normalize_code(code: str) -> str:
    """``code`` as the cache sees it (see the module docstring); its own text when it does not parse."""
    try:
        module = ast.parse(code)
    except (SyntaxError, ValueError):
        return code.strip()
    finder = _LocalNames()
    finder.visit(module)
    # Names bound outside ast.Name (``except E as e``, match captures): kept, since their uses are not renamed.
    finder.kept.update(n.name for n in ast.walk(module)
                       if isinstance(n, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and n.name)
    # A builtin is never renamed, even where a function binds its name: else a local ``sum`` in one
    # function and a call of the builtin ``sum`` in another would share a name, and two programs a key.
    finder.kept.update(dir(builtins))
    order: dict[str, str] = {}
    for name in finder.bound:
        if name not in finder.kept and name not in order:
            order[name] = f"_v{len(order)}"
    return ast.unparse(_Rename(order).visit(module))


def cache_key(code: str, tests: Sequence[str], prefix: str = "", timeout_s: float = 3.0,
              entry_point: Optional[str] = None) -> str:
    text = "\0".join([normalize_code(code), prefix, *tests, f"{timeout_s:g}"] + ([entry_point] if entry_point else []))
    return hashlib.sha256(text.encode()).hexdigest()


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
    from async_rl.sandbox import run_tests  # noqa: PLC0415

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
