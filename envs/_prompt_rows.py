"""Rows of prompts from a user's file: JSONL, Parquet, or a folder a Hugging Face ``datasets`` object was
saved to (``save_to_disk``; a ``DatasetDict`` is read by split). One row per prompt: a ``prompt`` column
(plain text, or chat messages ``[{"role": "user", "content": ...}]``) and any other columns, which the
rewards receive. Every problem with a file is a one-line ConfigError naming the flag, the file and the row.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from async_rl.errors import ConfigError
from async_rl.jsonl import jsonl_values

FORMATS = "a .jsonl file, a .parquet file or a datasets save_to_disk folder"


@dataclass(frozen=True)
class Rows:
    """The rows of one file (or split) and, for each, how a message names it (``train.jsonl line 3``)."""

    rows: tuple[dict, ...]
    labels: tuple[str, ...]


@functools.lru_cache(maxsize=8)
def read_rows(path: str, split: Optional[str] = None, flag: str = "--data") -> Rows:
    """The rows of ``path`` (for a saved ``DatasetDict``, of its ``split``), each checked to have a prompt;
    read once per process."""
    p = Path(path).expanduser()
    name = f"{path}{_of(split)}"
    if p.is_dir():
        rows = _saved_dataset(p, split, flag)
        labels = [f"{name} row {i}" for i in range(len(rows))]
    elif not p.is_file():
        raise ConfigError(f"{flag} {path}: no such file or folder; pass {FORMATS}")
    elif p.suffix == ".parquet":
        rows = _parquet(p, flag)
        labels = [f"{name} row {i}" for i in range(len(rows))]
    elif p.suffix in (".jsonl", ".json"):
        numbered = _jsonl(p, flag)
        rows, labels = [row for _, row in numbered], [f"{name} line {number}" for number, _ in numbered]
    else:
        raise ConfigError(f"{flag} {path}: unknown format {p.suffix or '(no suffix)'}; pass {FORMATS}")
    if not rows:
        raise ConfigError(f"{flag} {name}: no rows in it")
    for row, label in zip(rows, labels):
        check_prompt(row, f"{flag} {label}")
    return Rows(tuple(rows), tuple(labels))


def _of(split: Optional[str]) -> str:
    return f" (split {split})" if split else ""


def _jsonl(p: Path, flag: str) -> list[tuple[int, dict]]:
    out = []
    for number, row in jsonl_values(p, flag, "{\"prompt\": ..., ...} rows"):
        if not isinstance(row, dict):
            raise ConfigError(f"{flag} {p} line {number}: a row must be a JSON object with a \"prompt\"")
        out.append((number, row))
    return out


def _parquet(p: Path, flag: str) -> list[dict]:
    import pyarrow.parquet as pq  # noqa: PLC0415  (heavy; only Parquet files need it)

    try:
        return pq.read_table(p).to_pylist()
    except Exception as exc:  # noqa: BLE001  (pyarrow's many errors for a file that is not Parquet)
        raise ConfigError(f"{flag} {p}: not a readable Parquet file ({type(exc).__name__})") from None


def _saved_dataset(p: Path, split: Optional[str], flag: str) -> list[dict]:
    import datasets  # noqa: PLC0415  (heavy; only save_to_disk folders need it)

    try:
        data = datasets.load_from_disk(str(p))
    except FileNotFoundError:
        raise ConfigError(f"{flag} {p}: a folder but not one datasets' save_to_disk wrote; pass {FORMATS}") from None
    if isinstance(data, datasets.DatasetDict):
        if split is None or split not in data:
            raise ConfigError(f"{flag} {p}: a DatasetDict with splits {', '.join(data)}; "
                              f"split {split!r} is not one of them (set train_split / heldout_split)")
        data = data[split]
    return data.to_list()


def is_split_folder(path: str) -> bool:
    """Whether ``path`` is a saved ``DatasetDict`` (read by split) rather than one data set."""
    return (Path(path).expanduser() / "dataset_dict.json").is_file()


def check_prompt(row: dict, where: str) -> None:
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ConfigError(f"{where}: an empty prompt")
        return
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in prompt):
        roles = [m["role"] for m in prompt]
        if roles != ["user"]:
            # The causal-LM preprocessor builds [system_prompt, user] itself from one user message.
            raise ConfigError(f"{where}: chat prompts of one user message are supported, got roles {roles}; put a "
                              "system message in --policy-kwargs \"{system_prompt: ...}\"")
        return
    raise ConfigError(f"{where}: needs a \"prompt\": a string or a list of chat messages "
                      "[{\"role\": \"user\", \"content\": ...}]" + ("" if "prompt" in row else f" (its keys: {', '.join(map(str, row))})"))


def prompt_text(prompt: Any) -> str:
    """The user message the policy's chat template receives: the prompt itself or its one user message."""
    return prompt if isinstance(prompt, str) else str(prompt[-1]["content"])


def prompt_key(prompt: Any) -> str:
    """A prompt's identity for the train / held-out check: its text with whitespace runs collapsed."""
    return " ".join(prompt_text(prompt).split())


def shared_prompts(train: Sequence[dict], heldout: Sequence[dict]) -> list[str]:
    """The prompts (as ``prompt_key``) found in both."""
    held = {prompt_key(r["prompt"]) for r in heldout}
    return sorted({prompt_key(r["prompt"]) for r in train} & held)
