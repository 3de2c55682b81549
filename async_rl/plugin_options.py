"""Typed options of the plugins chosen by name (environments, policies): each registers a model of what it
takes, built on the run config's ``ConfigSection``, so that ``env_kwargs`` / ``policy_kwargs`` get the same
treatment as a config key: an unknown key, a wrong type or a value out of range is one line naming the key
and what it should be, before Ray starts; ``--print-config`` lists every option with its type, default and help.
"""
from __future__ import annotations

import typing
from typing import Any, Literal, Sequence, Union

import pydantic
import yaml

from async_rl.validation import ConfigSection

OptionsModel = type[ConfigSection]


def given_options(options: ConfigSection) -> dict[str, Any]:
    """The options a user gave, checked and converted (``"3"`` -> 3), without the defaults they left alone."""
    return options.model_dump(exclude_unset=True)


def model_path_option(takes: str, when_null: str) -> Any:
    """The ``model_path`` option of a policy that loads a model: what folder or file it ``takes`` and what it loads
    ``when_null``. Declaring it is what lets a run pass ``--model-path``, which overrides it (the config loader
    refuses that flag for a policy whose options have no ``model_path``)."""
    return pydantic.Field(None, description=f"{takes} (--model-path wins); null = {when_null}")


def yaml_inline(value: Any) -> str:
    """A value as YAML on one line (how flags and config files write it); a string with line breaks is
    double-quoted, its breaks escaped."""
    def dump(**style: Any) -> str:
        return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10_000, **style
                              ).strip().removesuffix("...").strip()

    text = dump()
    return dump(default_style='"') if "\n" in text else text


def _bounds(metadata: list[Any]) -> str:
    """The range constraints allow (">= 1", "> 0, <= 1"), or ""."""
    words = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    return ", ".join(f"{words[name]} {getattr(meta, name)}" for meta in metadata for name in words
                     if getattr(meta, name, None) is not None)


def type_name(annotation: Any, metadata: Sequence[Any] = ()) -> str:
    """A field's type as a reader writes it: ``int (>= 1)``, ``list[str]``, ``one of cycle, sample``, ``int or null``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    bounds = _bounds(list(metadata))
    if origin is typing.Annotated:
        return type_name(args[0], [*metadata, *args[1:]])
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin is Union or type(annotation).__name__ == "UnionType":
        parts = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(parts) + (" or null" if type(None) in args else "") + (f" ({bounds})" if bounds else "")
    if origin is not None:
        name = f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_name(a) for a in args)}]"
    elif isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        name = "{" + ", ".join(annotation.model_fields) + "}"
    else:
        name = getattr(annotation, "__name__", str(annotation))
    return name + (f" ({bounds})" if bounds else "")


def describe_options(model: OptionsModel) -> list[str]:
    """One line per option: ``name: type (range) = default  help`` (what ``--print-config`` shows)."""
    lines = []
    for name, info in model.model_fields.items():
        default = "required" if info.is_required() else yaml_inline(info.get_default(call_default_factory=True))
        help_text = " ".join((info.description or "").split())
        lines.append(f"{name}: {type_name(info.annotation, info.metadata)} = {default}" + (f"  {help_text}" if help_text else ""))
    return lines
