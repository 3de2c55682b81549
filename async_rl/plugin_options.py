"""Typed options of the plugins chosen by name (environments, policies): each registers a model of what it
takes, built on the run config's ``ConfigSection``, so that ``env_kwargs`` / ``policy_kwargs`` get the same
treatment as a config key: an unknown key, a wrong type or a value out of range is one line naming the key
and what it should be, before Ray starts; ``--print-config`` lists every option with its type, default and help.
"""
from __future__ import annotations

import typing
from typing import Any, Literal, Mapping, Union

import pydantic

from async_rl.validation import ConfigSection

OptionsModel = type[ConfigSection]


class NoOptions(ConfigSection):
    """A plugin that takes no options."""


def given_options(options: ConfigSection) -> dict[str, Any]:
    """The options a user gave, checked and converted (``"3"`` -> 3), without the defaults they left alone."""
    return options.model_dump(exclude_unset=True)


def type_name(annotation: Any) -> str:
    """A field's type as a reader writes it: ``int``, ``list[str]``, ``one of cycle, sample``, ``int or null``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin is Union or type(annotation).__name__ == "UnionType":
        parts = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(parts) + (" or null" if type(None) in args else "")
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_name(a) for a in args)}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(info: pydantic.fields.FieldInfo) -> str:
    """The range a field's constraints allow (">= 1", "> 0, <= 1"), or ""."""
    words = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    found = [f"{words[name]} {getattr(meta, name)}" for meta in info.metadata for name in words
             if getattr(meta, name, None) is not None]
    return ", ".join(found)


def describe_options(model: OptionsModel) -> list[str]:
    """One line per option: ``name: type (range) = default  help`` (what ``--print-config`` shows)."""
    lines = []
    for name, info in model.model_fields.items():
        default = info.get_default(call_default_factory=True)
        bounds = _bounds(info)
        kind = type_name(info.annotation) + (f" ({bounds})" if bounds else "")
        shown = "null" if default is None else repr(default) if isinstance(default, str) else default
        help_text = " ".join((info.description or "").split())
        lines.append(f"{name}: {kind} = {shown}" + (f"  {help_text}" if help_text else ""))
    return lines
