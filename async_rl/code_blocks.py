"""Code out of a model's answer: the first fenced block (the humaneval env, later CTRL critiques)."""
from __future__ import annotations

import re
from typing import Optional

__all__ = ["extract_code"]

# An opening fence (``` or longer, optional language tag), the body, the same fence closing it. A
# missing closing fence (the answer was cut at max new tokens) still yields the body up to the end:
# a truncated function is then a syntax error in the sandbox, which is the honest score.
_FENCE = re.compile(r"^[ \t]*(?P<fence>`{3,})[ \t]*(?P<lang>[\w+.-]*)[^\n]*\n(?P<body>.*?)(?:^[ \t]*(?P=fence)[ \t]*$|\Z)",
                    re.MULTILINE | re.DOTALL)


def extract_code(text: Optional[str]) -> Optional[str]:
    """The first ```python (or ```py / ```python3) block of ``text``, else the first ``` block of any
    language, else None. The body is returned without its fences; an empty block counts as none."""
    if not text:
        return None
    blocks = [(m.group("lang").lower(), m.group("body")) for m in _FENCE.finditer(text)]
    blocks = [(lang, body) for lang, body in blocks if body.strip()]
    for lang, body in blocks:
        if lang in ("python", "py", "python3"):
            return body.rstrip() + "\n"
    return blocks[0][1].rstrip() + "\n" if blocks else None
