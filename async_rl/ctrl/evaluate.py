"""The CTRL figures of a set of cases (shared by the env's final evaluation, ``launch/eval_ctrl.py`` and
``benchmarks/bench_ctrl.py``).

- ``initial_pass``: the share of initial solutions that pass all their tests;
- ``revise_alone_pass``: the share of revisions passing all tests when the reviser gets no critique;
- ``critic_pass``: the same with the critic's critique (greedy) in the reviser's prompt;
- ``judgment_accuracy``: the share of critiques whose judgment line matches the case's label (a critique
  without one counts as wrong); meaningful on a balanced set;
- ``regression_rate``: the share of correct initial solutions whose revision with the critique fails;
- ``critic_format_rate``: the share of critiques with a judgment line.
Every critique is revised, with or without a judgment line: the pass rate measures the revisions.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from async_rl.ctrl.critique import critic_prompt, parse_judgment, revision_prompt
from async_rl.ctrl.reward import ResultCache, score_revision
from async_rl.sandbox import SandboxPool

TextFn = Callable[[list[str]], list[str]]  # prompts in, texts out (the critic's or the reviser's)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def revisions_pass(cases: Sequence[dict[str, Any]], revisions: Sequence[str], pool: SandboxPool, cache: ResultCache,
                   timeout_s: float) -> list[bool]:
    futures = [score_revision(text, c["tests"], c["prefix"], cache, pool, timeout_s,
                              c.get("entry_point"))[0] for c, text in zip(cases, revisions)]
    return [f.result().all_passed for f in futures]


def initial_pass(cases: Sequence[dict[str, Any]], pool: SandboxPool, cache: ResultCache, timeout_s: float) -> list[bool]:
    """Whether each initial solution passes all its tests (run, not read from the label)."""
    futures = [cache.submit(pool, c["solution"], c["tests"], c["prefix"], timeout_s, c.get("entry_point")) for c in cases]
    return [f.result().all_passed for f in futures]


def revise_alone(cases: Sequence[dict[str, Any]], revise: TextFn, pool: SandboxPool, cache: ResultCache,
                 timeout_s: float) -> dict[str, Any]:
    texts = revise([revision_prompt(c["prompt"], c["solution"], None) for c in cases])
    passed = revisions_pass(cases, texts, pool, cache, timeout_s)
    return {"revise_alone_pass": _mean(passed), "revisions": texts, "passed": passed}


def with_critic(cases: Sequence[dict[str, Any]], critique: TextFn, revise: TextFn, pool: SandboxPool,
                cache: ResultCache, timeout_s: float) -> dict[str, Any]:
    """The critic's figures (``critic_pass``, ``judgment_accuracy``, ``regression_rate``,
    ``critic_format_rate``) and per-case rows."""
    critiques = critique([critic_prompt(c["prompt"], c["solution"]) for c in cases])
    revisions = revise([revision_prompt(c["prompt"], c["solution"], text) for c, text in zip(cases, critiques)])
    passed = revisions_pass(cases, revisions, pool, cache, timeout_s)
    judgments = [parse_judgment(text) for text in critiques]
    correct = [i for i, c in enumerate(cases) if c["correct"]]
    rows = [{"task_id": c.get("task_id"), "source": c.get("source"), "correct": c["correct"], "critique": text,
             "judgment": j, "revision": rev, "revision_passes": ok}
            for c, text, j, rev, ok in zip(cases, critiques, judgments, revisions, passed)]
    return {"critic_pass": _mean(passed),
            "judgment_accuracy": _mean([j is not None and j == c["correct"] for c, j in zip(cases, judgments)]),
            "regression_rate": _mean([not passed[i] for i in correct]),
            "critic_format_rate": _mean([j is not None for j in judgments]), "rows": rows}


def evaluate(cases: Sequence[dict[str, Any]], critique: Optional[TextFn], revise: TextFn, timeout_s: float = 3.0,
             alone: bool = True) -> dict[str, Any]:
    """Every figure of the module docstring for ``cases`` (the critic's only with ``critique``)."""
    cache = ResultCache()
    with SandboxPool() as pool:
        figures: dict[str, Any] = {"n": len(cases), "n_correct": sum(bool(c["correct"]) for c in cases),
                                   "initial_pass": _mean(initial_pass(cases, pool, cache, timeout_s))}
        if alone:
            figures["revise_alone_pass"] = revise_alone(cases, revise, pool, cache, timeout_s)["revise_alone_pass"]
        if critique is not None:
            figures.update(with_critic(cases, critique, revise, pool, cache, timeout_s))
    figures["cache_hit_rate"] = cache.hit_rate()
    return figures
