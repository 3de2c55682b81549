"""What the critic is asked, how its judgment is read, and what the reviser is asked.

The critic's prompt asks for the CTRL paper's critique format: an analysis of the solution, improvement
suggestions, and a last line ``Overall judgment: Correct`` or ``Overall judgment: Incorrect``. A critique
without that line is malformed (its reward is ``missing_judgment_reward``, 0 by default). The reviser gets
the problem, the solution and the critique (or, as the baseline "reviser alone", no critique) and answers
with the whole revised function in a python block, as the HumanEval env asks for code.
"""
from __future__ import annotations

import re
from typing import Optional

JUDGMENT_CORRECT, JUDGMENT_INCORRECT = "Overall judgment: Correct", "Overall judgment: Incorrect"

CRITIC_PROMPT = (
    "Review the solution to this Python programming problem.\n\n"
    "Problem:\n```python\n{problem}\n```\n\n"
    "Solution:\n```python\n{solution}\n```\n\n"
    "Write your critique in three parts:\n"
    "Analysis: what the code does and whether it meets every requirement of the problem, edge cases included.\n"
    "Improvement suggestions: the concrete changes that would fix each error (none if it is correct).\n"
    f"On the last line, exactly one of: \"{JUDGMENT_CORRECT}\" or \"{JUDGMENT_INCORRECT}\"."
)

_REVISION_HEAD = "Here is a Python programming problem and a solution to it{with_critique}.\n\n" \
                 "Problem:\n```python\n{problem}\n```\n\nSolution:\n```python\n{solution}\n```\n\n"
_REVISION_ASK = ("Write the corrected solution{following} (repeat the solution unchanged if it is correct). Reply with "
                 "the whole function, with its imports, in one ```python code block.")

# The judgment line, also as models write it: any case, markdown bold or a colon inside it, a full stop.
_JUDGMENT = re.compile(r"overall\s+judg(?:e)?ment\s*\**\s*:?\s*\**\s*(correct|incorrect)\b", re.IGNORECASE)


def critic_prompt(problem: str, solution: str) -> str:
    """The critic's user message for a problem statement (signature and docstring) and an initial solution."""
    return CRITIC_PROMPT.format(problem=problem.strip(), solution=solution.strip())


def parse_judgment(critique: str) -> Optional[bool]:
    """True for ``Overall judgment: Correct``, False for ``... Incorrect``, None when the critique has no
    judgment line (the format check). With several, the last one counts: it is the final judgment."""
    found = _JUDGMENT.findall(critique or "")
    return None if not found else found[-1].lower() == "correct"


def revision_prompt(problem: str, solution: str, critique: Optional[str]) -> str:
    """The reviser's user message: problem, solution and the critique; ``critique=None`` asks for a
    revision without one (the "reviser alone" baseline)."""
    head = _REVISION_HEAD.format(problem=problem.strip(), solution=solution.strip(),
                                 with_critique="" if critique is None else ", and a critique of the solution")
    if critique is None:
        return head + "Check the solution for errors. " + _REVISION_ASK.format(following="")
    return head + f"Critique:\n{critique.strip()}\n\n" + _REVISION_ASK.format(following=" following the critique")
