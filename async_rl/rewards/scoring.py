"""Calling a run's rewards on a batch of completions: each function once per batch, with what TRL 1.x's
GRPOTrainer passes (``prompts``, ``completions``, ``completion_ids``, ``trainer_state`` and every data column
as a list), what it returns checked, the weighted sum as the reward.

A value may be a float, an int, a bool, a numpy scalar or a 0-d tensor; ``None`` means "does not apply to
this row" and is left out of the weighted sum (TRL's nansum); a row every reward skips is an error. An
``async def`` reward is awaited. A function that names a column the data lacks, raises, or returns anything
but one finite number (or None) per completion is a ``RewardFunctionError`` naming the function and the data
row (a raising batch is retried row by row to find the row). ``dry_run`` does this on the first rows before a
run starts, so that a broken reward stops it before any update.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import math
import numbers
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from async_rl.errors import ConfigError
from async_rl.rewards import completion_text
from async_rl.rewards.functions import RewardSpec, accepted_arguments, required_columns


class RewardFunctionError(ConfigError):
    """A reward function raised or returned the wrong shape; the message names it and the row."""


@dataclass(frozen=True)
class TrainerState:
    """What a reward's ``trainer_state`` holds (TRL passes its ``TrainerState``): ``global_step``, the number of
    optimiser updates behind the weights that wrote the completions (their policy version), and ``epoch``, the
    same count as a float (one ``--max-epochs`` epoch is one update here)."""

    global_step: int = 0
    epoch: float = 0.0

    @classmethod
    def at(cls, policy_version: int) -> "TrainerState":
        return cls(global_step=int(policy_version), epoch=float(policy_version))


def missing_column_message(name: str, missing: Sequence[str], where: str, columns: Sequence[str]) -> str:
    """The one line of a reward that needs a column the data lacks (every signature gets this, not a TypeError)."""
    return (f"reward {name} needs column(s) {', '.join(missing)}, which {where} lacks "
            f"(its columns: {', '.join(columns) or 'none'})")


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
              where: Sequence[str], completion_ids: Optional[Sequence[Any]] = None,
              trainer_state: Optional[TrainerState] = None) -> tuple[list[float], dict[str, list[Optional[float]]]]:
        """(weighted total per completion, {name: that reward's values, None where it skipped the row}).
        ``rows[i]`` is the data row of completion ``i`` (its columns go to the rewards); ``where[i]`` names that
        row for error messages; ``completion_ids[i]`` its token ids (None: not known)."""
        columns = sorted({key for row in rows for key in row if key != "prompt"})
        for k, row in enumerate(rows):
            missing = self.missing_columns(list(row))
            if missing:
                name, lacking = next(iter(missing.items()))
                raise RewardFunctionError(missing_column_message(name, lacking, where[k],
                                                                 [c for c in row if c != "prompt"]))
        passed = {"prompts": list(prompts), "completions": list(completions),
                  "completion_ids": list(completion_ids) if completion_ids is not None else [None] * len(completions),
                  "trainer_state": trainer_state if trainer_state is not None else TrainerState(),
                  **{c: [row.get(c) for row in rows] for c in columns}}
        per_reward: dict[str, list[Optional[float]]] = {}
        for spec, fn in zip(self.specs, self.functions):
            per_reward[spec.name] = self._call(spec.name, fn, {k: passed[k] for k in accepted_arguments(fn, passed)}, where)
        totals = []
        for i in range(len(completions)):
            scored = [spec.weight * per_reward[spec.name][i] for spec in self.specs if per_reward[spec.name][i] is not None]
            if not scored:
                raise RewardFunctionError(f"every reward ({', '.join(self.names)}) returned None on {where[i]}; "
                                          "at least one must score each row")
            totals.append(sum(scored))
        return totals, per_reward

    @staticmethod
    def _call(name: str, fn: Any, arguments: dict[str, Any], where: Sequence[str]) -> list[Optional[float]]:
        count = len(arguments.get("completions", where))
        try:
            values = call_reward(fn, arguments)
        except Exception as exc:  # noqa: BLE001  (a user's function: any error is reported with its row)
            row = _raising_row(fn, arguments, count)
            at = where[row] if row is not None else f"{where[0]} (and the {len(where) - 1} rows after it)"
            raise RewardFunctionError(f"reward {name} raised {type(exc).__name__}: {_first_line(exc)} on {at}") from None
        try:
            values = list(values)
        except TypeError:
            raise RewardFunctionError(f"reward {name} returned {type(values).__name__}, not a list of "
                                      f"{count} floats, on {where[0]}") from None
        if len(values) != count:
            raise RewardFunctionError(f"reward {name} returned {len(values)} values for {count} completions "
                                      f"(one float each) on {where[0]}")
        numbers_ = [as_number(v) for v in values]
        for i, (value, number) in enumerate(zip(values, numbers_)):
            if number is _NOT_A_NUMBER:
                raise RewardFunctionError(f"reward {name} returned {value!r} (not a finite float or None) on {where[i]}")
        return numbers_


_NOT_A_NUMBER = object()


def as_number(value: Any) -> Any:
    """A reward's value as a float: bools, numpy scalars and 0-d arrays or tensors too; None stays None (the row
    is skipped); anything else (or a non-finite number) is ``_NOT_A_NUMBER``."""
    if value is None:
        return None
    if getattr(value, "shape", None) == () and hasattr(value, "item"):  # numpy scalars, 0-d arrays and tensors
        value = value.item()
    if not isinstance(value, numbers.Real):
        return _NOT_A_NUMBER
    number = float(value)
    return number if math.isfinite(number) else _NOT_A_NUMBER


def call_reward(fn: Any, arguments: dict[str, Any]) -> Any:
    """``fn(**arguments)``; an ``async def`` reward's result awaited (in its own loop: from a thread that runs
    one, in a helper thread)."""
    values = fn(**arguments)
    if not inspect.isawaitable(values):
        return values

    async def wait() -> Any:
        return await values

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, wait()).result()


def _raising_row(fn: Any, arguments: dict[str, Any], count: int) -> Optional[int]:
    """The first completion on which ``fn`` raises when called on it alone (None: only the batch raises)."""
    for i in range(count):
        try:
            call_reward(fn, {k: v if k == "trainer_state" else [v[i]] for k, v in arguments.items()})
        except Exception:  # noqa: BLE001 (any error of the user's function marks the row)
            return i
    return None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else "(no message)"


def dry_run(rewards: RewardSet, rows: Sequence[Mapping[str, Any]], where: Sequence[str],
            completions: Optional[Sequence[Any]] = None, tokenize: Optional[Any] = None) -> None:
    """Call every reward once on ``rows`` (the first rows of the training data) with stand-in completions
    (an empty one and, where the row has an answer, the answer itself): a function that raises or returns
    the wrong shape is a RewardFunctionError now, before Ray starts, rather than after the first rollout.
    ``tokenize(text) -> ids`` gives the stand-ins' ``completion_ids`` (None: their UTF-8 bytes stand in)."""
    prompts, fakes, batch_rows, batch_where = [], [], [], []
    for row, label in zip(rows, where):
        for fake in ("", str(row.get("answer", ""))):
            prompts.append(row["prompt"])
            fakes.append(fake if isinstance(row["prompt"], str) else [{"role": "assistant", "content": fake}])
            batch_rows.append(row)
            batch_where.append(label)
    completions = list(completions) if completions is not None else fakes
    encode = tokenize or (lambda text: list(text.encode()))
    ids = [encode(completion_text(c)) for c in completions]
    rewards.score(prompts, completions, batch_rows, batch_where, completion_ids=ids, trainer_state=TrainerState())
