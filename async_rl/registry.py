"""One discovery scheme for everything chosen by name: environments, policies, clip modes,
advantage estimators.

A ``Registry`` maps a name to an object plus optional metadata. Objects register themselves with
``@REGISTRY.register("name", **meta)`` in the module that defines them. A registry may name a
``package``: on the first lookup of an unknown name every submodule of that package (except those
starting with ``_`` and those in ``skip``) is imported once, so a new environment or policy is one
new file. ``plugins`` names further modules, outside ``package``, imported in the same discovery: a
domain package above the registry's layer (CTRL's env, ``async_rl/ctrl/env.py``) registers there
without the registry's package importing any of its code. Such modules import their heavy dependencies
inside functions, never at module level, so that discovery stays cheap and never fails because another
module's package is missing.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterable, Mapping, Optional, TypeVar

from async_rl.errors import ConfigError, unknown_key_message

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    """A registered object and the metadata it was registered with."""

    name: str
    obj: T
    meta: dict[str, Any] = field(default_factory=dict)


class Registry(Generic[T]):
    """Name -> object, discovered from ``package`` on the first miss; unknown names are one-line ConfigErrors."""

    def __init__(self, kind: str, package: Optional[str] = None, skip: Iterable[str] = (),
                 plugins: Iterable[str] = (), renamed: Optional[Mapping[str, str]] = None) -> None:
        self.kind = kind  # what the names are, for error messages ("environment", "policy", ...)
        self.package, self.skip, self.plugins = package, set(skip), tuple(plugins)
        self._entries: dict[str, Entry[T]] = {}
        self._discovered = package is None
        self.broken_modules: dict[str, str] = {}  # module's file -> import error, reported with unknown names
        self.renamed = dict(renamed or {})  # old name -> today's, refused with today's spelling

    def register(self, name: str, **meta: Any) -> Callable[[T], T]:
        """Decorator: register the decorated object under ``name`` with ``meta``."""

        def deco(obj: T) -> T:
            self.add(name, obj, **meta)
            return obj

        return deco

    def add(self, name: str, obj: T, **meta: Any) -> None:
        existing = self._entries.get(name)
        if existing is not None and existing.obj is not obj:
            raise ValueError(f"{self.kind} '{name}' is registered twice")
        self._entries[name] = Entry(name, obj, dict(meta))

    def discover(self) -> None:
        """Import every module of ``package`` and every module of ``plugins`` once, so that each registers
        what it defines."""
        if self._discovered:
            return
        self._discovered = True
        package = importlib.import_module(self.package)
        names = [f"{self.package}.{info.name}" for info in pkgutil.iter_modules(package.__path__)
                 if not (info.name.startswith("_") or info.name in self.skip)]
        for name in [*names, *self.plugins]:
            try:
                importlib.import_module(name)
            except ImportError as exc:  # a module that breaks the lazy-import rule; keep the others usable
                self.broken_modules[name.replace(".", "/") + ".py"] = f"{exc.__class__.__name__}: {exc}"

    def entry(self, name: str) -> Entry[T]:
        """The entry of ``name``; ConfigError naming the valid names if there is none."""
        if name not in self._entries:
            self.discover()
        if name not in self._entries and name in self.renamed:
            raise ConfigError(f"{self.kind} '{name}' is now '{self.renamed[name]}' (the same {self.kind}); "
                              f"write '{self.renamed[name]}'")
        if name not in self._entries:
            msg = unknown_key_message(name, self._entries, self.kind)
            if self.broken_modules:
                broken = "; ".join(f"{m}: {err}" for m, err in sorted(self.broken_modules.items()))
                msg += f" ({self.kind} modules that failed to import: {broken})"
            raise ConfigError(msg)
        return self._entries[name]

    def get(self, name: str) -> T:
        return self.entry(name).obj

    def names(self) -> list[str]:
        """Sorted registered names (after discovery)."""
        self.discover()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        self.discover()
        return name in self._entries
