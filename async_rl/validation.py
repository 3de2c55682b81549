"""Turns pydantic validation errors into one-line messages that name the key and the fix; the base of
every config section."""
from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Any, Mapping, Sequence, TypeVar

import pydantic

from async_rl.errors import ConfigError, unknown_key_message

ModelT = TypeVar("ModelT", bound=pydantic.BaseModel)


def validate_model(model_cls: type[ModelT], data: Mapping[str, Any], what: str) -> ModelT:
    """Build `model_cls` from `data`; raise ConfigError naming the first bad key.

    `what` says where the keys come from (e.g. "clip param", "config key"). A key the model lists in its
    ``renamed_keys`` class attribute (old key -> how to write it now) is refused with that spelling.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{what}s must be a mapping of key: value, got {type(data).__name__}")
    valid = model_cls.model_fields.keys()
    renamed: Mapping[str, str] = getattr(model_cls, "renamed_keys", {})
    for key in data:
        if key in renamed:
            raise ConfigError(f"{what} '{key}' is now {renamed[key]}")
        if key not in valid:
            raise ConfigError(unknown_key_message(str(key), valid, what))
    try:
        return model_cls.model_validate(dict(data))
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        if not err["loc"]:  # a check across several keys
            raise ConfigError(msg) from None
        top = err["loc"][0]
        if top in model_cls.model_fields and _is_union(model_cls.model_fields[top].annotation):
            # every form of the field refused the value: say what each wanted, without pydantic's form tags
            wanted = dict.fromkeys(e["msg"].removeprefix("Value error, ") for e in exc.errors() if e["loc"][:1] == (top,))
            raise ConfigError(f"{what} '{top}' = {data.get(top)!r}: {'; or '.join(wanted)}") from None
        key = ".".join(str(part) for part in err["loc"])
        raise ConfigError(f"{what} '{key}' = {data.get(str(top))!r}: {msg}{_closest_choice(err)}") from None


def _is_union(annotation: Any) -> bool:
    """A field of several forms (``Union[str, list[int]]``); ``Optional[X]`` is one form or null."""
    forms = [a for a in typing.get_args(annotation) if a is not type(None)]
    return typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(forms) > 1


def _closest_choice(err: Any) -> str:
    """" (did you mean 'x'?)" for a misspelt choice of a Literal, else ""."""
    expected = (err.get("ctx") or {}).get("expected")
    if err["type"] != "literal_error" or not isinstance(err["input"], str) or not expected:
        return ""
    choices = [c.strip().strip("'") for c in expected.replace(" or ", ", ").split(", ")]
    close = difflib.get_close_matches(err["input"], choices, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


class ConfigSection(pydantic.BaseModel):
    """A section of the run config: a frozen, typed view handed to the part of the runtime that reads it."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def checked_folder(path: str | Path, what: str, fix: str, *, holds: Sequence[str] = (),
                   holds_one_of: Sequence[str] = ()) -> Path:
    """``path`` (``~`` expanded) when it is a folder holding every entry of ``holds`` (files or folders, relative
    paths) and, when given, at least one file of ``holds_one_of``; else a ConfigError "{what}: no such
    directory; {fix}" (or "not a directory") or "{what}: no X there; {fix}". The one check of every folder a
    user names (a model, an export, a program folder, an installed package's data)."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"{what}: {'not a directory' if folder.exists() else 'no such directory'}; {fix}")
    missing = [name for name in holds if not (folder / name).exists()]
    if holds_one_of and not any((folder / name).is_file() for name in holds_one_of):
        missing.append(" or ".join(holds_one_of))
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise ConfigError(f"{what}: no {', '.join(missing[:3])}{more} there; {fix}")
    return folder
