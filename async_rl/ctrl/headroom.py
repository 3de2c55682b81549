"""How far any critique can lift the frozen reviser: its pass rate under two fixed critics.

CTRL rewards a critique by whether the reviser's revision passes the tests, so what a trained critic can
reach is bounded by what the reviser does with a critique at all. On the same cases as the other figures:

- ``approve_all``: every solution gets the supervised stage's approval ("correct, no change"): what a critic
  that never finds a fault earns (a faithful reviser keeps every correct solution and fixes nothing);
- ``oracle``: a mutant gets the critique that names its changed line and the reference's line in its place
  (the fault is known for mutants: ``critique_sft.reference_critique``), a correct solution the approval: a
  critic that is always right and hands the reviser the exact fix.

If the oracle's revisions pass no more often than the reviser's alone, no critic can beat the reviser alone
with this reviser: the reviser is the limit, not the critic (a stronger one: ``--reviser-model-path``).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from async_rl.ctrl.critique import JUDGMENT_CORRECT, JUDGMENT_INCORRECT, critic_prompt
from async_rl.ctrl.critique_sft import APPROVAL, reference_critique
from async_rl.ctrl.evaluate import TextFn, with_critic
from async_rl.ctrl.reward import ResultCache
from async_rl.sandbox import SandboxPool

# A mutant whose fault spans several lines (or has no reference) still gets a right judgment, without a fix.
APPROVED = APPROVAL + JUDGMENT_CORRECT  # the supervised stage's approval of a correct solution
UNLOCATED = ("Analysis: The function fails some of the tests.\n"
             "Improvement suggestions: Find the wrong line and correct it.\n" + JUDGMENT_INCORRECT)


def oracle_critiques(cases: Sequence[dict[str, Any]], references: Mapping[str, str]) -> dict[str, str]:
    """The oracle's critique of each case, keyed by the critic prompt it answers."""
    out = {}
    for case in cases:
        if case["correct"]:
            text = APPROVED
        else:
            text = reference_critique(case, references.get(case.get("task_id", ""))) or UNLOCATED
        out[critic_prompt(case["prompt"], case["solution"])] = text
    return out


def reviser_headroom(cases: Sequence[dict[str, Any]], references: Mapping[str, str], revise: TextFn,
                     timeout_s: float = 3.0) -> dict[str, float]:
    """``approve_all_pass``, ``approve_all_regression_rate``, ``oracle_critique_pass``,
    ``oracle_regression_rate``, ``oracle_fix_rate`` (incorrect solutions whose revision under the oracle's
    critique passes) and ``oracle_located`` (the share of incorrect cases whose fault the oracle could name)."""
    oracle = oracle_critiques(cases, references)
    critics: list[tuple[str, TextFn]] = [("approve_all", lambda prompts: [APPROVED for _ in prompts]),
                                         ("oracle", lambda prompts: [oracle[p] for p in prompts])]
    figures: dict[str, float] = {}
    cache = ResultCache()
    with SandboxPool() as pool:
        rows = {}
        for name, critic in critics:
            result = with_critic(cases, critic, revise, pool, cache, timeout_s)
            rows[name] = result["rows"]
            figures[f"{name}_critique_pass" if name == "oracle" else f"{name}_pass"] = result["critic_pass"]
            figures[f"{name}_regression_rate"] = result["regression_rate"]
    fixed = [row["revision_passes"] for row in rows["oracle"] if not row["correct"]]
    figures["oracle_fix_rate"] = sum(fixed) / len(fixed) if fixed else 0.0
    wrong = [c for c in cases if not c["correct"]]
    located = [oracle[critic_prompt(c["prompt"], c["solution"])] != UNLOCATED for c in wrong]
    figures["oracle_located"] = sum(located) / len(located) if located else 0.0
    return figures
