"""Reference critiques for the critic's supervised stage (CTRL trains the format before RL).

The CTRL paper fine-tunes the critic first on critiques that a stronger model wrote with the help of
execution feedback and the reference solution. No stronger model runs here, but for a mutated case the
exact fault is known: the line the mutation changed, the line the reference has there, and the kind of
mutation. The reference critique of an incorrect case names that line, says what is wrong with it and
suggests the reference's line; a correct case gets a short approval. Both end with the judgment line,
so the stage teaches the format (without it every reward of the format rule is 0) and gives the critic
the habit of naming one concrete line and its fix, which is what the frozen reviser can act on.

    python -m async_rl.ctrl.critique_sft --out demos/ctrl_critiques.jsonl      # the config's training cases
    python launch/sft.py --config configs/ctrl_sft.yaml                          # then GRPO with --init-from

The file is the text demonstrations format of ``launch/sft.py``: one ``{"prompt", "response"}`` per line
(the prompt is the critic's user message; the chat template is applied when training). Only training
problems are used; the set is balanced (as many correct as incorrect cases).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from async_rl.ctrl.cases import balanced
from async_rl.ctrl.critique import JUDGMENT_CORRECT, JUDGMENT_INCORRECT, critic_prompt
from async_rl.ctrl.demo_files import demonstrations_main

# What each mutation kind does to a line, said as a reviewer would say it.
FAULTS = {
    "off_by_one": "a number in it is off by one",
    "flip_comparison": "its comparison uses the wrong operator",
    "swap_operands": "its operands are in the wrong order",
    "wrong_return": "it returns the wrong value",
}
APPROVAL = ("Analysis: The code does what the problem asks, for the docstring's examples and for the edge cases.\n"
            "Improvement suggestions: None; the solution is correct.\n")


def changed_line(reference: str, mutant: str) -> Optional[tuple[str, str]]:
    """``(mutant's line, reference's line)`` where the two differ in exactly one line, else None."""
    ours, theirs = mutant.splitlines(), reference.splitlines()
    if len(ours) != len(theirs):
        return None
    diffs = [(a.strip(), b.strip()) for a, b in zip(ours, theirs) if a != b]
    return diffs[0] if len(diffs) == 1 else None


def reference_critique(case: dict[str, Any], reference: Optional[str]) -> Optional[str]:
    """The critique the critic learns for ``case`` (None when a mutant's fault cannot be located: no
    reference solution, or the mutation changed more than one line)."""
    if case["correct"]:
        return APPROVAL + JUDGMENT_CORRECT
    kind = case["source"].split(":", 1)[-1]
    found = changed_line(reference, case["solution"]) if reference else None
    if found is None or kind not in FAULTS:
        return None
    bad, good = found
    return (f"Analysis: The line `{bad}` is wrong: {FAULTS[kind]}, so the function fails some of the tests.\n"
            f"Improvement suggestions: Replace `{bad}` with `{good}`.\n{JUDGMENT_INCORRECT}")


def critique_demonstrations(cases: Sequence[dict[str, Any]], seed: int = 0) -> list[dict[str, str]]:
    """Balanced ``{"prompt", "response"}`` pairs for the cases whose critique can be written."""
    references = {c["task_id"]: c["solution"] for c in cases if c["source"] == "canonical"}
    written = [{**c, "critique": reference_critique(c, references.get(c["task_id"]))} for c in cases]
    return [{"prompt": critic_prompt(c["prompt"], c["solution"]), "response": c["critique"]}
            for c in balanced([c for c in written if c["critique"] is not None], None, seed)]


def main(argv: Optional[list[str]] = None) -> int:
    code, pairs = demonstrations_main("python -m async_rl.ctrl.critique_sft", __doc__,
                                         lambda task_set, seed: critique_demonstrations(task_set.train, seed), argv)
    if pairs is not None:
        incorrect = sum(p["response"].endswith(JUDGMENT_INCORRECT) for p in pairs)
        print(f"({len(pairs) - incorrect} correct, {incorrect} incorrect)")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
