"""Turns pydantic validation errors into one-line messages that name the key and the fix; the base of
every config section."""
from __future__ import annotations

from typing import Any, Mapping, TypeVar

import pydantic

from async_rl.errors import ConfigError, unknown_key_message

ModelT = TypeVar("ModelT", bound=pydantic.BaseModel)


def validate_model(model_cls: type[ModelT], data: Mapping[str, Any], what: str) -> ModelT:
    """Build `model_cls` from `data`; raise ConfigError naming the first bad key.

    `what` says where the keys come from (e.g. "clip param", "config key").
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{what}s must be a mapping of key: value, got {type(data).__name__}")
    valid = model_cls.model_fields.keys()
    for key in data:
        if key not in valid:
            raise ConfigError(unknown_key_message(str(key), valid, what))
    try:
        return model_cls.model_validate(dict(data))
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        if not err["loc"]:  # a check across several keys
            raise ConfigError(msg) from None
        key = ".".join(str(part) for part in err["loc"])
        raise ConfigError(f"{what} '{key}' = {data.get(err['loc'][0])!r}: {msg}") from None


class ConfigSection(pydantic.BaseModel):
    """A section of the run config: a frozen, typed view handed to the part of the runtime that reads it."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
