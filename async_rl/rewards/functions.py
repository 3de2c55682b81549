"""From the names a user writes (``math``, ``math=0.5``, ``my_rewards:exact=2``) to reward callables.

A name with a colon is an import path ``module:function``, imported from the working directory (as TRL
and verl users expect); the folder it was found in travels with the spec, so that Ray's workers, which
start elsewhere, import the same file. Any other name is a built-in of ``REWARDS``. Each spec is checked
in the driver, before Ray starts: an unknown name or an import that fails is one ConfigError line.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

from async_rl.errors import ConfigError, unknown_key_message
from async_rl.rewards import REWARDS

# The tag of the weighted sum: a reward of this name would overwrite it in TensorBoard.
TOTAL = "total"


@dataclass(frozen=True)
class RewardSpec:
    """One reward of a run: a built-in name or an import path, its weight and (built-ins) its options."""

    source: str
    weight: float = 1.0
    options: tuple = ()  # sorted (key, value) pairs: hashable, so that a process loads each reward once
    search_dir: Optional[str] = None  # the folder an import path's module was found under, in the driver
    name: str = field(default="", compare=False)  # how it is logged: the built-in's name or the function's

    def load(self) -> Callable[..., Any]:
        return _load(self.source, self.options, self.search_dir)


def split_reward_item(item: str) -> tuple[str, str]:
    """``NAME_OR_PATH[=WEIGHT]`` -> (the reward's source, its weight as written; '' for none)."""
    source, _, weight = item.strip().partition("=")
    return source.strip(), weight


def written_name(source: str) -> str:
    """How a config names a reward it chose (``success_reward``): a built-in by its name, an import path by its
    function's."""
    return source.strip().rpartition(":")[2]


def parse_reward_specs(rewards: Any, options: Optional[Mapping[str, Mapping[str, Any]]] = None,
                       flag: str = "--reward") -> list[RewardSpec]:
    """``rewards`` (a name or a list of ``NAME_OR_PATH[=WEIGHT]``) as checked specs: each built-in known,
    each import path imported, each logged name unique. ``options``: ``{built-in name: {option: value}}``."""
    items = [rewards] if isinstance(rewards, str) else list(rewards or [])
    if not items:
        raise ConfigError(f"no reward given; pass {flag} NAME_OR_PATH (built-ins: {', '.join(REWARDS.names())}, "
                          "or module:function)")
    options = dict(options or {})
    specs: list[RewardSpec] = []
    names: dict[str, str] = {}
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise ConfigError(f"{flag} {item!r}: expected NAME_OR_PATH[=WEIGHT] (e.g. math, math=0.5, my_rewards:exact)")
        source, weight_text = split_reward_item(item)
        weight = _weight(weight_text, item, flag) if weight_text else 1.0
        spec = _check(source, weight, options.pop(source, {}), flag)
        if spec.name in names or spec.name == TOTAL:
            why = "is the weighted sum's tag" if spec.name == TOTAL else f"is also the name of {names[spec.name]}"
            raise ConfigError(f"{flag} {item}: its logged name reward/{spec.name} {why}; rename the function")
        names[spec.name] = item
        specs.append(spec)
    if options:
        raise ConfigError(f"reward_options names {', '.join(sorted(options))}, which is not among the rewards "
                          f"({', '.join(names)})")
    return specs


def _weight(text: str, item: str, flag: str) -> float:
    try:
        weight = float(text)
    except ValueError:
        raise ConfigError(f"{flag} {item}: the weight after '=' must be a number") from None
    if not math.isfinite(weight):
        raise ConfigError(f"{flag} {item}: the weight must be finite")
    return weight


def _check(source: str, weight: float, options: Any, flag: str) -> RewardSpec:
    if not isinstance(options, Mapping):
        raise ConfigError(f"reward_options of {source} must be a mapping of option: value, got {options!r}")
    frozen = tuple(sorted(options.items()))
    if ":" not in source:
        if source not in REWARDS:
            raise ConfigError(unknown_key_message(source, REWARDS.names(), "reward") +
                              " (or a function of your own as module:function)")
        try:
            _load(source, frozen, None)
        except TypeError as exc:  # an option the built-in does not take
            raise ConfigError(f"reward_options of {source}: {exc}") from None
        return RewardSpec(source, weight, frozen, None, source)
    if options:
        raise ConfigError(f"reward_options of {source}: only built-in rewards take options; "
                          "give your function its settings in its own module")
    module_name, _, function_name = source.partition(":")
    if not module_name or not function_name:
        raise ConfigError(f"{flag} {source}: an import path is module:function (e.g. my_rewards:exact)")
    search_dir = _import_root(module_name, flag, source)
    fn = _load(source, (), search_dir)
    return RewardSpec(source, weight, (), search_dir, getattr(fn, "__name__", function_name))


def _import_root(module_name: str, flag: str, source: str) -> Optional[str]:
    """Import ``module_name`` (the working directory first, as ``python -m`` would) and return the folder
    that holds its top-level package or file, so that another process can import it the same way."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001  (any error while importing the user's module is bad input)
        raise ConfigError(f"{flag} {source}: module {module_name} does not import "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                          "run from the folder that holds it or put it on PYTHONPATH") from None
    where = getattr(module, "__file__", None)
    if where is None:
        return None
    path = Path(where).resolve().parent
    for _ in range(module_name.count(".") + (Path(where).name == "__init__.py")):
        path = path.parent
    return str(path)


@functools.lru_cache(maxsize=64)
def _load(source: str, options: tuple, search_dir: Optional[str]) -> Callable[..., Any]:
    """The callable of a spec, once per process."""
    if ":" not in source:
        return REWARDS.get(source)(**dict(options))
    module_name, _, function_name = source.partition(":")
    if search_dir is not None and search_dir not in sys.path:
        sys.path.insert(0, search_dir)
    module = importlib.import_module(module_name)
    fn = getattr(module, function_name, None)
    if fn is None or not callable(fn):
        raise ConfigError(f"--reward {source}: module {module_name} has no function {function_name}")
    return fn


# What every reward may receive besides the data's columns (TRL 1.x's GRPOTrainer passes the same).
PASSED = ("prompts", "completions", "completion_ids", "trainer_state")


def required_columns(fn: Callable[..., Any]) -> list[str]:
    """The columns a reward cannot do without: its parameters without a default other than what every reward
    is passed (``PASSED``): ``def exact(prompts, completions, answer, **kwargs)`` and TRL's
    ``def accuracy(completions, solution, **kwargs)`` need ``answer`` and ``solution``."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: nothing can be said up front
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and p.default is p.empty and p.name not in PASSED]


def accepted_arguments(fn: Callable[..., Any], arguments: Iterable[str]) -> list[str]:
    """The arguments to pass: all of them to a function with ``**kwargs`` (TRL's convention), else the ones it names."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return list(arguments)
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return list(arguments)
    names = {p.name for p in params}
    return [a for a in arguments if a in names]
