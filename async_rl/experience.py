"""The one record type that flows from workers through the replay buffer to the trainers.

An experience is a ``TensorDict``. A step record (batch ``[N]``) holds:

``obs`` (nested, policy-specific), ``action`` (normalised), ``logp`` (behaviour log-prob per
action dimension), the behaviour statistics the policy returned (``mu``/``log_std`` or
``logits``), ``value``, ``reward``, ``done``, ``policy_version``, ``task_id`` and, once the
worker has run GAE, ``advantage`` and ``value_target``.

A V-trace segment (batch ``[N]``) holds ``steps`` (step records, batch ``[N, T]``) and
``bootstrap_obs`` (the observation after the last step, batch ``[N]``): the trainer recomputes
log-probs and values on them with its current weights.
"""
from __future__ import annotations

from typing import Optional

import torch
from tensordict import TensorDict

from async_rl.algo import gae

STEP_KEYS = ("obs", "action", "logp", "value", "reward", "done", "policy_version", "task_id")


Wire = dict  # nested dict of numpy arrays: what crosses Ray between workers and inference


def to_wire(td: TensorDict) -> Wire:
    """TensorDict -> nested dict of numpy arrays (pickles ~20x faster than a TensorDict)."""
    return td.numpy()


def from_wire(wire: Wire, batch_dims: int = 1) -> TensorDict:
    """Nested dict of numpy arrays -> TensorDict with ``batch_dims`` leading batch dims."""
    return TensorDict(wire, batch_size=_first_leaf(wire).shape[:batch_dims])


def _first_leaf(wire: Wire):
    value = next(iter(wire.values()))
    return _first_leaf(value) if isinstance(value, dict) else value


def split_wire(wire: Wire, sizes: list[int]) -> list[Wire]:
    """A batched wire dict -> consecutive slices of ``sizes`` rows."""

    def piece(d: Wire, a: int, b: int) -> Wire:
        return {k: piece(v, a, b) if isinstance(v, dict) else v[a:b] for k, v in d.items()}

    bounds = [0]
    for n in sizes:
        bounds.append(bounds[-1] + n)
    return [piece(wire, a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def step_record(
    obs: TensorDict, policy_out: TensorDict, reward: float, done: bool, task_id: int
) -> TensorDict:
    """One step: the inference answer (minus the env action) plus what the env returned."""
    record = policy_out.exclude("env_action")
    record["obs"] = obs
    record["reward"] = torch.tensor(reward, dtype=torch.float32)
    record["done"] = torch.tensor(done, dtype=torch.bool)
    record["task_id"] = torch.tensor(task_id, dtype=torch.int64)
    return record


def with_gae(steps: list[TensorDict], bootstrap_value: float, gamma: float, lam: float) -> TensorDict:
    """Stack a trajectory piece and add ``advantage`` and ``value_target`` (GAE, worker side)."""
    traj = torch.stack(steps)
    advantages, returns = gae(
        traj["reward"], traj["value"], traj["done"], torch.tensor(bootstrap_value, dtype=traj["value"].dtype), gamma, lam
    )
    traj["advantage"] = advantages
    traj["value_target"] = returns
    return traj


def vtrace_segment(steps: list[TensorDict], bootstrap_obs: TensorDict) -> TensorDict:
    """A fixed-length segment for V-trace: ``steps`` [1, T] and ``bootstrap_obs`` [1]."""
    traj = torch.stack(steps).unsqueeze(0)
    return TensorDict({"steps": traj, "bootstrap_obs": bootstrap_obs.unsqueeze(0)}, batch_size=[1])


class GaeSegmenter:
    """Cuts a worker's stream of steps into GAE-processed pieces.

    A terminal step closes a piece with bootstrap 0. When ``local_buf + 1`` steps wait, the
    first ``local_buf`` go out bootstrapped from the value of the last one, which starts the
    next piece (its value is the estimate of the state the cut-off piece leads to).
    """

    def __init__(self, local_buf: int, gamma: float, lam: float) -> None:
        self.local_buf, self.gamma, self.lam = local_buf, gamma, lam
        self.steps: list[TensorDict] = []

    def add(self, record: TensorDict, next_obs: TensorDict) -> Optional[TensorDict]:
        self.steps.append(record)
        if bool(record["done"]):
            piece, self.steps = with_gae(self.steps, 0.0, self.gamma, self.lam), []
            return piece
        if len(self.steps) == self.local_buf + 1:
            return self.flush()
        return None

    def flush(self) -> Optional[TensorDict]:
        """Cut now: all steps but the last go out, bootstrapped from the last one's value."""
        if len(self.steps) < 2:
            return None
        piece = with_gae(self.steps[:-1], float(self.steps[-1]["value"]), self.gamma, self.lam)
        self.steps = self.steps[-1:]
        return piece


class VtraceSegmenter:
    """Cuts the stream into fixed-length segments (crossing episode ends) for V-trace."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.steps: list[TensorDict] = []

    def add(self, record: TensorDict, next_obs: TensorDict) -> Optional[TensorDict]:
        self.steps.append(record)
        if len(self.steps) < self.length:
            return None
        segment, self.steps = vtrace_segment(self.steps, next_obs), []
        return segment

    def flush(self) -> Optional[TensorDict]:
        return None  # segments have a fixed length; a partial one waits


def policy_versions(batch: TensorDict) -> torch.Tensor:
    """Policy version of every step in a batch of step records or segments."""
    return batch["steps", "policy_version"] if "steps" in batch.keys() else batch["policy_version"]
