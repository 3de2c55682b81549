"""Where the project keeps what it builds once per machine and reuses across runs (models converted
from GGUF, the tiny VLA, CTRL's built cases)."""
from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir(name: str) -> Path:
    """``$XDG_CACHE_HOME/async_rl/<name>`` (``~/.cache`` without ``XDG_CACHE_HOME``); not created here."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "async_rl" / name
