"""Reading a JSONL file given on the command line: each non-blank line one JSON value, a bad line one
ConfigError naming the flag, the file and the line (evaluation commands read their problems this way)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from async_rl.errors import ConfigError


def jsonl_values(path: str | Path, flag: str, what: str) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` of every non-blank line of ``path``; ``what`` describes a line for the
    message when the file does not exist."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{flag} {path}: no such file; pass a JSONL file of {what}")
    for number, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{flag} {path} line {number}: not JSON ({exc.msg})") from None
        yield number, value
