"""Calling a run's rewards on a batch of completions: each function once per batch (TRL's convention),
what it returns checked, the weighted sum as the reward.

A reward that raises, or returns anything but one finite number per completion, is a ``RewardFunctionError``
naming the function and the data row (a raising batch is retried row by row to find the row). ``dry_run``
does this on the first rows before a run starts, so that a broken reward stops it before any update.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Mapping, Optional, Sequence

from async_rl.errors import ConfigError
from async_rl.rewards.functions import RewardSpec, accepted_columns, required_columns


class RewardFunctionError(ConfigError):
    """A reward function raised or returned the wrong shape; the message names it and the row."""


class RewardSet:
    """The rewards of a run, loaded in this process: ``score`` a batch, ``names`` to log them by."""

    def __init__(self, specs: Sequence[RewardSpec]) -> None:
        self.specs = list(specs)
        self.functions = [spec.load() for spec in self.specs]
        self.names = [spec.name for spec in self.specs]
        self.required = [required_columns(fn) for fn in self.functions]  # read once: data sets are checked row by row

    def missing_columns(self, columns: Sequence[str]) -> dict[str, list[str]]:
        """``{reward name: [columns it needs that are not in columns]}`` for the rewards that lack some."""
        have = set(columns)
        out = {}
        for name, required in zip(self.names, self.required):
            missing = [c for c in required if c not in have]
            if missing:
                out[name] = missing
        return out

    def score(self, prompts: Sequence[Any], completions: Sequence[Any], rows: Sequence[Mapping[str, Any]],
              where: Sequence[str]) -> tuple[list[float], dict[str, list[float]]]:
        """(weighted total per completion, {name: that reward's values}). ``rows[i]`` is the data row of
        completion ``i`` (its columns go to the rewards); ``where[i]`` names that row for error messages."""
        columns = sorted({key for row in rows for key in row if key != "prompt"})
        per_reward: dict[str, list[float]] = {}
        for spec, fn in zip(self.specs, self.functions):
            passed = {c: [row.get(c) for row in rows] for c in accepted_columns(fn, columns)}
            per_reward[spec.name] = self._call(spec.name, fn, prompts, completions, passed, where)
        totals = [sum(spec.weight * per_reward[spec.name][i] for spec in self.specs) for i in range(len(completions))]
        return totals, per_reward

    @staticmethod
    def _call(name: str, fn: Any, prompts: Sequence[Any], completions: Sequence[Any], columns: dict[str, list],
              where: Sequence[str]) -> list[float]:
        try:
            values = fn(prompts=list(prompts), completions=list(completions), **columns)
        except Exception as exc:  # noqa: BLE001  (a user's function: any error is reported with its row)
            row = _raising_row(fn, prompts, completions, columns)
            at = where[row] if row is not None else f"{where[0]} (and the {len(where) - 1} rows after it)"
            raise RewardFunctionError(f"reward {name} raised {type(exc).__name__}: {_first_line(exc)} on {at}") from None
        try:
            values = list(values)
        except TypeError:
            raise RewardFunctionError(f"reward {name} returned {type(values).__name__}, not a list of "
                                      f"{len(completions)} floats, on {where[0]}") from None
        if len(values) != len(completions):
            raise RewardFunctionError(f"reward {name} returned {len(values)} values for {len(completions)} completions "
                                      f"(one float each) on {where[0]}")
        for i, value in enumerate(values):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
                raise RewardFunctionError(f"reward {name} returned {value!r} (not a finite float) on {where[i]}")
        return [float(v) for v in values]


def _raising_row(fn: Any, prompts: Sequence[Any], completions: Sequence[Any], columns: dict[str, list]) -> Optional[int]:
    """The first completion on which ``fn`` raises when called on it alone (None: only the batch raises)."""
    for i in range(len(completions)):
        try:
            fn(prompts=[prompts[i]], completions=[completions[i]], **{c: [v[i]] for c, v in columns.items()})
        except Exception:  # noqa: BLE001
            return i
    return None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else "(no message)"


def dry_run(rewards: RewardSet, rows: Sequence[Mapping[str, Any]], where: Sequence[str],
            completions: Optional[Sequence[Any]] = None) -> None:
    """Call every reward once on ``rows`` (the first rows of the training data) with stand-in completions
    (an empty one and, where the row has an answer, the answer itself): a function that raises or returns
    the wrong shape is a RewardFunctionError now, before Ray starts, rather than after the first rollout."""
    prompts, fakes, batch_rows, batch_where = [], [], [], []
    for row, label in zip(rows, where):
        for fake in ("", str(row.get("answer", ""))):
            prompts.append(row["prompt"])
            fakes.append(fake if isinstance(row["prompt"], str) else [{"role": "assistant", "content": fake}])
            batch_rows.append(row)
            batch_where.append(label)
    rewards.score(prompts, completions if completions is not None else fakes, batch_rows, batch_where)
