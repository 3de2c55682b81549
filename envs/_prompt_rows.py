"""Rows of prompts from a user's file: JSONL, Parquet, or a folder a Hugging Face ``datasets`` object was
saved to (``save_to_disk``; a ``DatasetDict`` is read by split). One row per prompt: a ``prompt`` column
(plain text, or chat messages ``[{"role": "user", "content": ...}]``) and any other columns, which the
rewards receive. A row's shape is a schema (``PromptRow``); every problem with a file is a one-line
ConfigError naming the flag, the file and the row.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional, Sequence, Union

import pydantic

from async_rl.errors import ConfigError
from async_rl.jsonl import jsonl_values

FORMATS = "a .jsonl file, a .parquet file or a datasets save_to_disk folder"
NEEDS_PROMPT = "needs a \"prompt\": a string or a list of chat messages [{\"role\": \"user\", \"content\": ...}]"


def _not_blank(prompt: str) -> str:
    if not prompt.strip():
        raise ValueError("an empty prompt")
    return prompt


class ChatMessage(pydantic.BaseModel):
    """One message of a chat prompt; other keys are kept."""

    model_config = pydantic.ConfigDict(extra="allow", strict=True)
    role: str
    content: Any


def _one_user_message(messages: list[ChatMessage]) -> list[ChatMessage]:
    roles = [m.role for m in messages]
    if roles != ["user"]:
        # The causal-LM preprocessor builds [system_prompt, user] itself from one user message.
        raise ValueError(f"chat prompts of one user message are supported, got roles {roles}; put a system message "
                         "in --policy-kwargs \"{system_prompt: ...}\"")
    return messages


TextPrompt = Annotated[str, pydantic.AfterValidator(_not_blank)]
ChatPrompt = Annotated[list[ChatMessage], pydantic.Field(min_length=1), pydantic.AfterValidator(_one_user_message)]


class PromptRow(pydantic.BaseModel):
    """A row of a user's file: a prompt (non-blank text, or chat messages: one user message) and any other
    columns, which the rewards receive. Strict: a value of another type is refused, not converted."""

    model_config = pydantic.ConfigDict(extra="allow", strict=True)
    prompt: Union[TextPrompt, ChatPrompt]


def data_path(path: str) -> str:
    """A user's data path as a schema checks it: an existing .jsonl/.json/.parquet file or a folder (a
    ``save_to_disk`` folder's contents are read later); the ValueError's text names the fix. The validator of
    ``DataPath`` and of the commands' data flags, which print it as one line (exit 2)."""
    p = Path(path).expanduser()
    if p.is_dir():
        return path
    if not p.is_file():
        raise ValueError(f"no such file or folder; pass {FORMATS}")
    if p.suffix not in (".parquet", ".jsonl", ".json"):
        raise ValueError(f"unknown format {p.suffix or '(no suffix)'}; pass {FORMATS}")
    return path


DataPath = Annotated[str, pydantic.AfterValidator(data_path)]


@dataclass(frozen=True)
class Rows:
    """The rows of one file (or split) and, for each, how a message names it (``train.jsonl line 3``)."""

    rows: tuple[dict, ...]
    labels: tuple[str, ...]


@functools.lru_cache(maxsize=8)
def read_rows(path: str, split: Optional[str] = None, flag: str = "--data") -> Rows:
    """The rows of ``path`` (for a saved ``DatasetDict``, of its ``split``), each checked against ``PromptRow``;
    read once per process. ``path`` is a ``DataPath``: the options and commands validated it, so a bad one here
    is a caller's bug (data_path's plain ValueError)."""
    data_path(path)
    name = f"{path}{_of(split)}"
    try:
        rows, labels = _rows_and_labels(Path(path).expanduser(), split, name, flag)
    except UnreadableRows as exc:  # the one place a file's refusal becomes a line
        raise ConfigError(f"{flag} {name}: {exc}") from None
    for row, label in zip(rows, labels):
        check_row(row, f"{flag} {label}")
    return Rows(tuple(rows), tuple(labels))


class UnreadableRows(ValueError):
    """A data file or folder that holds no rows to read; the text says why and the fix."""


def _rows_and_labels(p: Path, split: Optional[str], name: str, flag: str) -> tuple[list, list[str]]:
    if p.is_dir():
        rows = _saved_dataset(p, split)
        labels = [f"{name} row {i}" for i in range(len(rows))]
    elif p.suffix == ".parquet":
        rows = _parquet(p)
        labels = [f"{name} row {i}" for i in range(len(rows))]
    else:  # .jsonl / .json
        numbered = _jsonl(p, flag)
        rows, labels = [row for _, row in numbered], [f"{name} line {number}" for number, _ in numbered]
    if not rows:
        raise UnreadableRows("no rows in it")
    return rows, labels


def _of(split: Optional[str]) -> str:
    return f" (split {split})" if split else ""


def _jsonl(p: Path, flag: str) -> list[tuple[int, Any]]:
    """(line number, value) of every row; ``check_row`` refuses a value that is not a row."""
    return list(jsonl_values(p, flag, "{\"prompt\": ..., ...} rows"))


def _parquet(p: Path) -> list[dict]:
    import pyarrow.parquet as pq  # noqa: PLC0415  (heavy; only Parquet files need it)

    try:
        return pq.read_table(p).to_pylist()
    except Exception as exc:  # noqa: BLE001  (pyarrow's many errors for a file that is not Parquet)
        raise UnreadableRows(f"not a readable Parquet file ({type(exc).__name__})") from None


def _saved_dataset(p: Path, split: Optional[str]) -> list[dict]:
    import datasets  # noqa: PLC0415  (heavy; only save_to_disk folders need it)

    try:
        data = datasets.load_from_disk(str(p))
    except FileNotFoundError:
        raise UnreadableRows(f"a folder but not one datasets' save_to_disk wrote; pass {FORMATS}") from None
    if isinstance(data, datasets.DatasetDict):
        if split is None or split not in data:
            raise UnreadableRows(f"a DatasetDict with splits {', '.join(data)}; split {split!r} is not one of them "
                                 "(set train_split / heldout_split)")
        data = data[split]
    return data.to_list()


def is_split_folder(path: str) -> bool:
    """Whether ``path`` is a saved ``DatasetDict`` (read by split) rather than one data set."""
    return (Path(path).expanduser() / "dataset_dict.json").is_file()


def check_row(row: Any, where: str) -> None:
    """``row`` against ``PromptRow``; the one place its refusal becomes a line naming ``where`` (flag, file and
    row) and the fix: the schema's own message where a check of it failed, else what a row needs."""
    try:
        PromptRow.model_validate(row)
    except pydantic.ValidationError as exc:
        ours = [e["msg"].removeprefix("Value error, ") for e in exc.errors() if e["type"] == "value_error"]
        if ours:
            problem = ours[0]
        elif not isinstance(row, dict):
            problem = "a row must be a JSON object with a \"prompt\""
        else:
            problem = NEEDS_PROMPT + ("" if "prompt" in row else f" (its keys: {', '.join(map(str, row))})")
        raise ConfigError(f"{where}: {problem}") from None


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
