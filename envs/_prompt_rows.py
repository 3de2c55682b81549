"""Rows of prompts from a user's file: JSONL, Parquet, or a folder a Hugging Face ``datasets`` object was
saved to (``save_to_disk``; a ``DatasetDict`` is read by split, ``heldout_split_of`` finds its held-out one).
One row per prompt: a prompt column (``prompt``, or the one ``prompt_column`` names, which is read as
``prompt``; plain text, or chat messages ``[{"role": "system", ...}, {"role": "user", "content": ...}]``) and
any other columns, which the rewards receive. A row's shape is a schema (``PromptRow``); every problem with a
file is a one-line ConfigError naming the flag, the file and the row."""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional, Sequence, Union

import pydantic

from async_rl.errors import ConfigError
from async_rl.jsonl import jsonl_values

FORMATS = "a .jsonl file, a .parquet file or a datasets save_to_disk folder"
NEEDS_PROMPT = "needs a \"prompt\": a string or a list of chat messages [{\"role\": \"user\", \"content\": ...}]"
HELDOUT_SPLITS = ("test", "validation")  # looked for, in this order, when heldout_split is not set


def _not_blank(prompt: str) -> str:
    if not prompt.strip():
        raise ValueError("an empty prompt")
    return prompt


class ChatMessage(pydantic.BaseModel):
    """One message of a chat prompt; other keys are kept."""

    model_config = pydantic.ConfigDict(extra="allow", strict=True)
    role: str
    content: Any


def _ends_with_a_user_message(messages: list[ChatMessage]) -> list[ChatMessage]:
    """A conversation the model answers next: a system message only first, the last message the user's."""
    roles = [m.role for m in messages]
    if roles[-1] != "user" or "system" in roles[1:]:
        raise ValueError(f"a chat prompt is an optional system message, then messages ending with the user's; got roles "
                         f"{roles}")
    return messages


TextPrompt = Annotated[str, pydantic.AfterValidator(_not_blank)]
ChatPrompt = Annotated[list[ChatMessage], pydantic.Field(min_length=1), pydantic.AfterValidator(_ends_with_a_user_message)]


class PromptRow(pydantic.BaseModel):
    """A row of a user's file: a prompt (non-blank text, or chat messages ending with a user message) and any other
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
def read_rows(path: str, split: Optional[str] = None, flag: str = "--data", prompt_column: str = "prompt") -> Rows:
    """The rows of ``path`` (for a saved ``DatasetDict``, of its ``split``), each checked against ``PromptRow``
    with its ``prompt_column`` read as ``prompt``; read once per process. ``path`` is a ``DataPath``: the options
    and commands validated it, so a bad one here is a caller's bug (data_path's plain ValueError)."""
    data_path(path)
    name = f"{path}{_of(split)}"
    try:
        rows, labels = _rows_and_labels(Path(path).expanduser(), split, name, flag)
    except UnreadableRows as exc:  # the one place a file's refusal becomes a line
        raise ConfigError(f"{flag} {name}: {exc}") from None
    if prompt_column != "prompt":
        rows = [_renamed(row, prompt_column) for row in rows]
    for row, label in zip(rows, labels):
        check_row(row, f"{flag} {label}", prompt_column)
    return Rows(tuple(rows), tuple(labels))


def _renamed(row: Any, prompt_column: str) -> Any:
    """``row`` with its ``prompt_column`` as ``prompt`` (first), the other columns as they were."""
    if not isinstance(row, dict) or prompt_column not in row:
        return row
    return {"prompt": row[prompt_column], **{k: v for k, v in row.items() if k not in (prompt_column, "prompt")}}


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
    import pyarrow.parquet as pq  # heavy; only Parquet files need it

    try:
        return pq.read_table(p).to_pylist()
    except Exception as exc:  # noqa: BLE001  (pyarrow's many errors for a file that is not Parquet)
        raise UnreadableRows(f"not a readable Parquet file ({type(exc).__name__})") from None


def _saved_dataset(p: Path, split: Optional[str]) -> list[dict]:
    import datasets  # heavy; only save_to_disk folders need it

    try:
        data = datasets.load_from_disk(str(p))
    except FileNotFoundError:
        raise UnreadableRows(f"a folder but not one datasets' save_to_disk wrote; pass {FORMATS}") from None
    if isinstance(data, datasets.DatasetDict):
        if split is None or split not in data:
            raise UnreadableRows(f"a DatasetDict with splits {', '.join(data)}; split {split!r} is not one of them "
                                 "(set --env.train-split / --env.heldout-split)")
        data = data[split]
    return data.to_list()


def is_split_folder(path: str) -> bool:
    """Whether ``path`` is a saved ``DatasetDict`` (read by split) rather than one data set."""
    return (Path(path).expanduser() / "dataset_dict.json").is_file()


def split_names(path: str) -> list[str]:
    """The splits a saved ``DatasetDict`` folder lists in its ``dataset_dict.json`` (none when it lists none)."""
    try:
        splits = json.loads((Path(path).expanduser() / "dataset_dict.json").read_text()).get("splits", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [str(s) for s in splits] if isinstance(splits, list) else []


def heldout_split_of(path: str, chosen: Optional[str], train_split: str, flag: str = "--data") -> str:
    """The held-out split of a saved ``DatasetDict``: ``chosen`` when set, else the first of ``HELDOUT_SPLITS``
    it has; none of them is one ConfigError line naming its splits and the option to set."""
    if chosen is not None:
        return chosen
    splits = split_names(path)
    found = next((s for s in HELDOUT_SPLITS if s in splits and s != train_split), None)
    if found is None:
        raise ConfigError(f"{flag} {path}: a DatasetDict with splits {', '.join(splits) or '(none listed)'} and no "
                          f"held-out split ({' or '.join(HELDOUT_SPLITS)}); set --env.heldout-split NAME or pass "
                          "--heldout-data FILE")
    return found


def check_row(row: Any, where: str, prompt_column: str = "prompt") -> None:
    """``row`` against ``PromptRow``; the one place its refusal becomes a line naming ``where`` (flag, file and
    row) and the fix: the schema's own message where a check of it failed, else what a row needs (for a row
    without its prompt column: that column's name and the option that names another)."""
    try:
        PromptRow.model_validate(row)
    except pydantic.ValidationError as exc:
        ours = [e["msg"].removeprefix("Value error, ") for e in exc.errors() if e["type"] == "value_error"]
        if ours:
            problem = ours[0]
        elif not isinstance(row, dict):
            problem = "a row must be a JSON object with a \"prompt\""
        elif prompt_column != "prompt" and "prompt" not in row:
            problem = (f"has no prompt column {prompt_column!r} (its keys: {', '.join(map(str, row))}); "
                       "name the prompt column with --env.prompt-column NAME")
        else:
            problem = NEEDS_PROMPT + ("" if "prompt" in row else f" (its keys: {', '.join(map(str, row))}; "
                                      "another column is named with --env.prompt-column NAME)")
        raise ConfigError(f"{where}: {problem}") from None


def prompt_text(prompt: Any) -> str:
    """A prompt's question as text: the prompt itself, or a chat prompt's last (user) message."""
    return prompt if isinstance(prompt, str) else str(prompt[-1]["content"])


def prompt_key(prompt: Any) -> str:
    """A prompt's identity for the train / held-out check: its text with whitespace runs collapsed."""
    return " ".join(prompt_text(prompt).split())


def shared_prompts(train: Sequence[dict], heldout: Sequence[dict]) -> list[str]:
    """The prompts (as ``prompt_key``) found in both."""
    held = {prompt_key(r["prompt"]) for r in heldout}
    return sorted({prompt_key(r["prompt"]) for r in train} & held)
