"""Errors with one-line messages meant for the person running the job."""
from __future__ import annotations

import argparse
import difflib
from typing import Iterable, NoReturn


class ConfigError(ValueError):
    """Bad user input: the message names the problem and the fix, on one line."""


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose refusal of a command line is one line on stderr, as every other bad input of the
    project is, and exit code 2: ``error: <what argparse found>; see <prog> --help`` (argparse's own prints its
    whole usage block first, which buries the line that names the problem). Subparsers inherit it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}; see {self.prog} --help\n")


class ActorTimeoutError(TimeoutError):
    """A wait on another actor or a collective ran past its timeout; the message names who."""


class ActorFailedError(RuntimeError):
    """An actor died or raised while the run waited on it; the message names it."""

    def __init__(self, actor_name: str, what: str, cause: BaseException) -> None:
        self.actor_name = actor_name
        inner = getattr(cause, "cause", None) or cause  # a RayTaskError wraps the actor's own exception
        lines = str(inner).strip().splitlines()
        detail = type(inner).__name__ + (f": {lines[0][:300]}" if lines else "")
        super().__init__(f"{actor_name} failed during {what} ({detail})")


def unknown_key_message(key: str, valid: Iterable[str], what: str) -> str:
    valid = sorted(valid)
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    if len(valid) > 20:
        return f"unknown {what} '{key}'{hint}; run with --help to list the valid ones"
    return f"unknown {what} '{key}'{hint}; valid keys: {', '.join(valid)}"
