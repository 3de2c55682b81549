"""Plain data on the wire between a candidate's process and the judge that decides its verdicts.

Both ends of ``async_rl/sandbox/`` run this file's text as part of their program (the candidate's
harness ``sandbox/child.py`` and the judge ``sandbox/judge.py``; only the standard library). A value
crosses as one JSON line whose every node is one of: null, a bool, an int, a float (NaN and the
infinities included), a string, or an object with exactly one tag key:
``{"L": [...]}`` list, ``{"T": [...]}`` tuple, ``{"S": [...]}`` set, ``{"F": [...]}`` frozenset,
``{"D": [[key, value], ...]}`` dict, ``{"B": "hex"}`` bytes, ``{"C": [re, im]}`` complex.

Only these exact types are plain: a subclass (an int whose ``__eq__`` is always true), a generator, a
function or any other object is refused by ``to_plain`` and by ``from_plain`` alike, so the judge only
ever compares values it built itself from JSON.
"""
import json
from typing import Any

WIRE_DEPTH = 64  # nesting deeper than this is not plain data (a self-containing list would recurse forever)


class NotPlain(Exception):
    """A value that is not plain data, or a wire node that is not one of the tagged shapes."""


_SCALARS = frozenset({type(None), bool, int, float, str})  # exact types: a subclass is not plain data


def _is_scalar(value: object, depth: int) -> bool:
    """Whether ``value`` passes the wire as it is (both directions); NotPlain past ``WIRE_DEPTH``."""
    if depth > WIRE_DEPTH:
        raise NotPlain("nested too deep")
    return type(value) in _SCALARS


def to_plain(value: Any, depth: int = 0) -> Any:
    """``value`` as a JSON-able tree (see the module docstring); NotPlain for anything else."""
    if _is_scalar(value, depth):
        return value
    kind = type(value)
    if kind is list or kind is tuple or kind is set or kind is frozenset:
        tags: dict[type, str] = {list: "L", tuple: "T", set: "S", frozenset: "F"}
        tag = tags[kind]
        return {tag: [to_plain(v, depth + 1) for v in value]}
    if kind is dict:
        return {"D": [[to_plain(k, depth + 1), to_plain(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"B": value.hex()}
    if kind is complex:
        return {"C": [value.real, value.imag]}
    raise NotPlain(f"a {kind.__name__} is not plain data")


def from_plain(node: Any, depth: int = 0) -> Any:
    """The value a wire tree stands for; NotPlain for any node that is not one of the tagged shapes."""
    if _is_scalar(node, depth):
        return node
    kind = type(node)
    if kind is not dict or len(node) != 1:
        raise NotPlain(f"not a wire node: {kind.__name__}")
    (tag, body), = node.items()
    if tag in ("L", "T", "S", "F") and type(body) is list:
        items = [from_plain(v, depth + 1) for v in body]
        try:
            return {"L": list, "T": tuple, "S": set, "F": frozenset}[tag](items)
        except TypeError as exc:  # an unhashable member of a set
            raise NotPlain(str(exc)) from None
    if tag == "D" and type(body) is list:
        out: dict[Any, Any] = {}
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise NotPlain("a dict item is not a [key, value] pair")
            try:
                out[from_plain(pair[0], depth + 1)] = from_plain(pair[1], depth + 1)
            except TypeError as exc:
                raise NotPlain(str(exc)) from None
        return out
    if tag == "B" and type(body) is str:
        try:
            return bytes.fromhex(body)
        except ValueError as exc:
            raise NotPlain(str(exc)) from None
    if tag == "C" and type(body) is list and len(body) == 2 and all(type(x) in (int, float) for x in body):
        return complex(body[0], body[1])
    raise NotPlain(f"unknown wire tag {tag!r}")


def dump_line(message: dict[str, Any]) -> bytes:
    """One message (a dict of JSON-able values) as one UTF-8 line."""
    return (json.dumps(message, separators=(",", ":"), ensure_ascii=True) + "\n").encode()


def parse_line(line: bytes) -> dict[str, Any]:
    """The dict a line holds; NotPlain when it is not one (bad JSON, too deep, digits past the int limit)."""
    try:
        message = json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError, MemoryError) as exc:  # UnicodeDecodeError is a ValueError
        raise NotPlain(f"not a JSON line: {type(exc).__name__}") from None
    if type(message) is not dict:
        raise NotPlain("a message is not a JSON object")
    return message
