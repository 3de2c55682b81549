"""``math``: 1.0 when the completion's answer equals the row's ``answer`` column, else 0.0, checked by
Hugging Face's ``math-verify`` (LaTeX, ``\\boxed{}``, fractions, plain numbers; "17 + 25 = 42" reads 42,
"The answer is 42. Check: 40 + 2." reads 42).

One normalisation runs first, for answers a model writes with a detached sign: "63 - 88 = - 25" and a
unicode minus ("= \u221225") both mean -25, where math-verify alone reads the first as 25. And an answer that
is an unworked sum, difference or product of plain numbers ("To evaluate 49 - 19, we need ...") is no answer:
math-verify would evaluate it, rewarding a restatement of the question.

math-verify bounds its parsing time with ``SIGALRM``, which only the main thread may set; rollout workers
score in their env thread, so there the bound is off (completions are already bounded by max_new_tokens).
"""
from __future__ import annotations

import re
import threading
from typing import Any

from async_rl.rewards import completion_text, register_reward

# A sign right after "=" or ":" (or at the start), spaces, then a digit: the sign belongs to the number.
_DETACHED_SIGN = re.compile(r"(^|[=:]\s*)-\s+(?=\d)")
# A sum, difference or product of plain numbers, not worked out ("49 - 19"): math-verify evaluates it, so a model
# that restates an arithmetic question ("To evaluate 49 - 19, we ...") would be scored right without answering.
_NUMBER = r"\(?-?\d[\d.,]*\)?"
_UNEVALUATED = re.compile(rf"^{_NUMBER}(\s*[-+*\u00d7\u00b7]\s*{_NUMBER})+$")
_TIMEOUT_S = 5


def normalise_signs(text: str) -> str:
    return _DETACHED_SIGN.sub(r"\1-", text.replace("\u2212", "-"))


def _timeout() -> Any:
    return _TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def gold_answer(answer: Any) -> list:
    """The row's answer as math-verify's parse of it (a number is wrapped in ``$...$`` so that it reads as LaTeX)."""
    from math_verify import parse  # noqa: PLC0415  (sympy's import costs seconds; only math rewards need it)

    text = str(answer).strip()
    parsed = parse(text if "$" in text or "\\" in text else f"${text}$", parsing_timeout=_timeout())
    return parsed or parse(text, parsing_timeout=_timeout())


def answer_matches(text: str, answer: Any) -> tuple[bool, bool]:
    """(an answer was found in ``text``, it equals ``answer``)."""
    from math_verify import parse, verify  # noqa: PLC0415 (sympy: as above)

    found = parse(normalise_signs(text), parsing_timeout=_timeout())
    if not found or (len(found) > 1 and _UNEVALUATED.match(str(found[-1]).strip())):
        return False, False
    gold = gold_answer(answer)
    return True, bool(gold) and bool(verify(gold, found, timeout_seconds=_timeout()))


@register_reward("math")
def make_math() -> Any:
    def math_reward(prompts: list, completions: list, answer: list, **_: Any) -> list[float]:
        checked = [answer_matches(completion_text(c), a) for c, a in zip(completions, answer)]
        math_reward.last_reasons = ["no_answer" if not found else "correct" if right else "wrong" for found, right in checked]  # type: ignore[attr-defined]  # what the reward says of its calls, read by its callers
        return [float(right) for _, right in checked]

    math_reward.reason_names = ("correct", "wrong", "no_answer")  # type: ignore[attr-defined]  # what the reward says of its calls, read by its callers
    return math_reward
