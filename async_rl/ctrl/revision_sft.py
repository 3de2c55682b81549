"""Demonstrations for a reviser that acts on critiques: the oracle's critique in, the code it asks for out.

CTRL's reward is only as good as the reviser: the frozen SmolLM2-135M, greedy, ignores what a critique says
(``benchmarks/bench_ctrl.py``'s headroom: its revisions pass as often under the oracle's critique, which names
the exact fault and fix, as under an approval or no critique at all). The CTRL paper's reviser is a stronger
instruction model; none runs on this CPU, so this module writes what a supervised stage needs to make one of
the small model: for each training case, the reviser's prompt with the oracle's critique
(``headroom.oracle_critiques``) and, as the response, the code that critique asks for: the reference
solution for a mutant (its named line replaced), the solution unchanged for a correct case. Only training
problems are used; the set is balanced.

    python -m async_rl.ctrl.revision_sft --out demos/ctrl_revisions.jsonl
    python launch/sft.py --config configs/ctrl_reviser_sft.yaml        # exports runs/ctrl_reviser_sft/policy
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from async_rl.ctrl.cases import balanced, reference_solutions
from async_rl.ctrl.critique import critic_prompt, revision_prompt
from async_rl.ctrl.demo_files import demonstrations_main
from async_rl.ctrl.headroom import UNLOCATED, oracle_critiques


def revision_demonstrations(cases: Sequence[dict[str, Any]], references: Mapping[str, str],
                            seed: int = 0) -> list[dict[str, str]]:
    """Balanced ``{"prompt", "response"}`` pairs: the oracle-critiqued revision prompt and the code it asks for
    (cases whose fault the oracle cannot name are left out: no code is known to follow from them)."""
    critiques = oracle_critiques(cases, references)
    # A mutant without a reference is UNLOCATED too: only cases whose asked-for code is known remain.
    usable = [c for c in cases if critiques[critic_prompt(c["prompt"], c["solution"])] != UNLOCATED]
    pairs = []
    for case in balanced(usable, None, seed):
        code = case["solution"] if case["correct"] else references[case["task_id"]]
        critique = critiques[critic_prompt(case["prompt"], case["solution"])]
        pairs.append({"prompt": revision_prompt(case["prompt"], case["solution"], critique),
                      "response": f"```python\n{code.strip()}\n```"})
    return pairs


def main(argv: Optional[list[str]] = None) -> int:
    code, _ = demonstrations_main("python -m async_rl.ctrl.revision_sft", __doc__, lambda task_set, seed:
                                     revision_demonstrations(task_set.train, reference_solutions("train"), seed), argv)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
