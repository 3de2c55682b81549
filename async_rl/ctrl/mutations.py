"""Seeded AST mutations that make a correct solution wrong: the incorrect initial solutions of CTRL.

Four kinds, each applied at one site of the entry-point function picked by a seeded RNG:

- ``off_by_one``: an integer constant ``c`` becomes ``c + 1`` or ``c - 1``;
- ``flip_comparison``: a comparison operator becomes its negation or its neighbour (``<`` -> ``>=`` or ``<=``);
- ``swap_operands``: the operands of a non-commutative binary operation (``a - b`` -> ``b - a``) or of a
  comparison swap;
- ``wrong_return``: a returned value changes (a boolean constant flips, a number moves by one, another
  return's value, else ``None``).

A mutation is only a candidate: ``cases.py`` keeps it when the sandbox says it fails at least one test
(an equivalent mutant, e.g. ``x == y`` -> ``y == x``, would be a correct solution labelled wrong).
"""
from __future__ import annotations

import ast
import copy
from typing import Any, Callable, Optional

import numpy as np

KINDS = ("off_by_one", "flip_comparison", "swap_operands", "wrong_return")

# A comparison's replacement: its negation first, then a neighbour that differs on the boundary.
_FLIPS: dict[type, tuple[type, ...]] = {
    ast.Lt: (ast.GtE, ast.LtE), ast.LtE: (ast.Gt, ast.Lt), ast.Gt: (ast.LtE, ast.GtE), ast.GtE: (ast.Lt, ast.Gt),
    ast.Eq: (ast.NotEq,), ast.NotEq: (ast.Eq,), ast.In: (ast.NotIn,), ast.NotIn: (ast.In,),
    ast.Is: (ast.IsNot,), ast.IsNot: (ast.Is,),
}
_NON_COMMUTATIVE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift, ast.RShift)


def strip_docstring(function: ast.FunctionDef) -> None:
    """Drop the function's docstring (the problem statement shows it already)."""
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        function.body = body[1:] or [ast.Pass()]


def entry_function(module: ast.Module, entry_point: str) -> ast.FunctionDef:
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name == entry_point:
            return node
    raise ValueError(f"no function {entry_point} in the solution")


def solution_source(code_prompt: str, body: str, entry_point: str) -> str:
    """A HumanEval problem's whole solution (imports, helpers, the entry point with ``body``) without the
    entry point's docstring, normalised by ``ast.unparse``."""
    module = ast.parse(code_prompt + body)
    strip_docstring(entry_function(module, entry_point))
    return ast.unparse(module)


def _sites(function: ast.FunctionDef) -> dict[str, list[ast.AST]]:
    """Every node of the function where each kind of mutation applies."""
    sites: dict[str, list[ast.AST]] = {kind: [] for kind in KINDS}
    for node in ast.walk(function):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            sites["off_by_one"].append(node)
        elif isinstance(node, ast.Compare):
            sites["flip_comparison"].append(node)
            if len(node.ops) == 1:
                sites["swap_operands"].append(node)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, _NON_COMMUTATIVE):
            sites["swap_operands"].append(node)
        elif isinstance(node, ast.Return) and node.value is not None:
            sites["wrong_return"].append(node)
    return sites


def _off_by_one(node: ast.Constant, rng: np.random.Generator, _: ast.FunctionDef) -> None:
    assert isinstance(node.value, (int, float))  # its sites are numeric constants
    node.value = node.value + (1 if node.value == 0 or rng.random() < 0.5 else -1)


def _flip(node: ast.Compare, rng: np.random.Generator, _: ast.FunctionDef) -> None:
    i = int(rng.integers(len(node.ops)))
    choices = _FLIPS[type(node.ops[i])]
    node.ops[i] = choices[int(rng.integers(len(choices)))]()


def _swap(node: ast.Compare | ast.BinOp, rng: np.random.Generator, _: ast.FunctionDef) -> None:
    if isinstance(node, ast.Compare):
        node.left, node.comparators[0] = node.comparators[0], node.left
    else:
        node.left, node.right = node.right, node.left


def _wrong_return(node: ast.Return, rng: np.random.Generator, function: ast.FunctionDef) -> None:
    value = node.value
    if isinstance(value, ast.Constant) and type(value.value) is bool:
        node.value = ast.Constant(not value.value)
        return
    if isinstance(value, ast.Constant) and isinstance(value.value, (int, float)):
        node.value = ast.Constant(value.value + 1)
        return
    here = ast.dump(value)
    others = [r.value for r in ast.walk(function) if isinstance(r, ast.Return) and r.value is not None
              and ast.dump(r.value) != here]
    node.value = copy.deepcopy(others[int(rng.integers(len(others)))]) if others else ast.Constant(None)


# Each mutation takes the node kind its sites hold (a Constant, a Compare, ...): the node is typed Any here.
_APPLY: dict[str, Callable[[Any, np.random.Generator, ast.FunctionDef], None]] = {
    "off_by_one": _off_by_one, "flip_comparison": _flip, "swap_operands": _swap, "wrong_return": _wrong_return,
}


def mutate(source: str, entry_point: str, rng: np.random.Generator, kind: Optional[str] = None) -> Optional[tuple[str, str]]:
    """``(kind, mutated source)``: one mutation of the entry-point function of ``source`` (of ``kind``, or
    of a kind drawn among those with a site), or None when no mutation applies or none changes the code."""
    module = ast.parse(source)
    function = entry_function(module, entry_point)
    sites = _sites(function)
    kinds = [kind] if kind is not None else [k for k in KINDS if sites[k]]
    if not kinds or not sites[kinds[0]]:
        return None
    chosen = kinds[int(rng.integers(len(kinds)))]
    index = int(rng.integers(len(sites[chosen])))
    # Mutate a copy, found again by its position in the walk, so that ``source`` stays intact for the next draw.
    mutant = ast.parse(source)
    target = _sites(entry_function(mutant, entry_point))[chosen][index]
    _APPLY[chosen](target, rng, entry_function(mutant, entry_point))
    ast.fix_missing_locations(mutant)
    text = ast.unparse(mutant)
    return None if text == ast.unparse(module) else (chosen, text)
