"""The experience record: one declared schema from the rollout worker to the loss, one wire format.

A **step record** (batch ``[N]``) holds the fields of ``STEP_FIELDS`` (plus the behaviour statistics
its policy declares in ``behaviour_stats``); the action is stored under the policy's ``action_key``.
A **segment** (batch ``[N]``) holds ``steps`` (step records, batch ``[N, T]``) and ``bootstrap_obs``
(the observation after the last step): the unit of estimators that run on the trainer (V-trace).
Which of the two a replay item is, is the advantage estimator's ``unit`` (async_rl/algo/estimators.py).

Between the rollout worker and the inference actor, observations and answers travel as nested
dicts of numpy arrays (``to_wire`` / ``from_wire``) in the declared dtypes: floating tensors that
declare none (observations, actions, statistics) become float32, so bf16 models ship float32
log-probs, values and actions. The records go worker -> replay -> trainer as TensorDicts, pickled by Ray.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch
from tensordict import TensorCollection, TensorDict, TensorDictBase


@dataclass(frozen=True)
class Field:
    """One field of a step record."""

    name: str
    dtype: Optional[torch.dtype]  # None: the policy's choice (floating ones travel as float32)
    shape: str  # per step
    producer: str  # env | worker | inference | advantage (the estimator)
    consumers: tuple[str, ...]
    doc: str


STEP_FIELDS: dict[str, Field] = {f.name: f for f in (
    Field("obs", None, "nested, policy-defined", "worker", ("inference", "trainer"), "the preprocessed observation"),
    Field("action", None, "[A]", "inference", ("trainer",), "what the trainer evaluates; stored under the policy's action_key (e.g. action_token)"),
    Field("logp", torch.float32, "[A] (or [1] per sequence)", "inference", ("trainer",), "behaviour log-prob"),
    Field("logp_ref", torch.float32, "[A]", "inference", ("trainer",), "the reference policy's log-prob of the action; only with reference_logp_on sampler"),
    Field("value", torch.float32, "[]", "inference", ("advantage", "trainer"), "behaviour V(s); the value clip's anchor"),
    Field("reward", torch.float32, "[]", "env", ("advantage",), "scaled; a time-limit cut adds gamma * V(next obs)"),
    Field("done", torch.bool, "[]", "env", ("advantage",), "the episode ended (terminated or truncated) here"),
    Field("policy_version", torch.int64, "[]", "inference", ("replay", "trainer"), "staleness filter, policy lag"),
    Field("advantage", torch.float32, "[]", "advantage", ("trainer",), "only from estimators that run on the worker"),
    Field("value_target", torch.float32, "[]", "advantage", ("trainer",), "only from estimators that run on the worker"),
    Field("task", torch.int64, "[]", "worker", ("advantage",), "the episode's task in the task set; only with normalize_advantages_per: task"),
    # Group rollouts only (the group estimators; async_rl/actors/groups.py):
    Field("group_id", torch.int64, "[]", "worker", ("advantage", "trainer"), "the group of episodes sharing one start"),
    Field("success", torch.bool, "[]", "worker", ("trainer",), "the episode (not the step) succeeded"),
    Field("episode_return", torch.float32, "[]", "worker", ("advantage",), "sum of the episode's (scaled) rewards"),
    Field("group_member", torch.int64, "[]", "advantage", ("trainer",), "which member of its group (stratified draws)"),
)}
SEGMENT_FIELDS: dict[str, Field] = {f.name: f for f in (
    Field("steps", None, "[T] step records", "worker", ("advantage", "trainer"), "rollout_steps consecutive steps"),
    Field("bootstrap_obs", None, "nested, policy-defined", "worker", ("advantage",), "the observation after the last step"),
)}
# In an inference answer, never stored: what the environment receives.
ENV_ACTION = Field("env_action", None, "[A]", "inference", ("worker",), "the action in the environment's units")

Wire = dict[str, Any]  # nested dict of numpy arrays (a value is an array or a Wire): what crosses Ray between actors


def inference_keys(action_key: str, behaviour_stats: Sequence[str] = ()) -> tuple[str, ...]:
    """The fields of a policy's ``act()`` answer that an inference actor ships (the rest is dropped)."""
    return (action_key, ENV_ACTION.name, "logp", "value", *behaviour_stats)


def _wire_dtype(path: tuple[str, ...], tensor: torch.Tensor) -> torch.dtype:
    field = STEP_FIELDS.get(path[-1]) if len(path) == 1 or path[:-1] == ("steps",) else None
    if field is not None and field.dtype is not None:
        return field.dtype
    return torch.float32 if tensor.is_floating_point() else tensor.dtype  # numpy has no bf16


def to_wire(td: TensorDictBase, keys: Optional[Sequence[str]] = None) -> Wire:
    """TensorDict -> nested dict of numpy arrays in the declared dtypes (pickles ~20x faster than a
    TensorDict); ``keys`` keeps only those top-level fields."""

    def convert(d: TensorCollection, path: tuple[str, ...]) -> Wire:
        out: Wire = {}
        for key, value in d.items():
            if keys is not None and not path and key not in keys:
                continue
            if isinstance(value, torch.Tensor):
                out[key] = value.detach().to("cpu", _wire_dtype((*path, key), value)).numpy()
            else:
                out[key] = convert(value, (*path, key))
        return out

    return convert(td, ())


def from_wire(wire: Wire, batch_dims: int = 1) -> TensorDict:
    """Nested dict of numpy arrays -> TensorDict with ``batch_dims`` leading batch dims.

    Zero-copy: the tensors share the arrays' memory, which for arrays Ray mapped from its object
    store is read-only, so a consumer copies before writing (``torch.cat`` / ``stack`` do). Building
    the tensors first is ~6x faster than handing TensorDict the arrays (which also copies read-only ones)."""
    with warnings.catch_warnings():  # torch warns (once per process) about read-only arrays
        warnings.simplefilter("ignore", UserWarning)
        tensors = _tensors(wire)
    return TensorDict(tensors, batch_size=_first_leaf(wire).shape[:batch_dims])


def _tensors(wire: Wire) -> dict[str, Any]:
    return {k: _tensors(v) if isinstance(v, dict) else torch.from_numpy(v) for k, v in wire.items()}


def _first_leaf(wire: Wire) -> np.ndarray:
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


def step_batch(obs: TensorDict, policy_out: TensorDict, rewards: Sequence[float],
               dones: Sequence[bool]) -> TensorDict:
    """The step records of a batch ``[K]`` of envs as one TensorDict ``[K]``: the inference answer
    (minus the env action) plus the observation and what the env returned."""
    record = policy_out.exclude(ENV_ACTION.name)
    record["obs"] = obs
    record["reward"] = torch.tensor(rewards, dtype=STEP_FIELDS["reward"].dtype)
    record["done"] = torch.tensor(dones, dtype=STEP_FIELDS["done"].dtype)
    return record


def step_records(obs: TensorDict, policy_out: TensorDict, rewards: Sequence[float],
                 dones: Sequence[bool]) -> list[TensorDict]:
    """``step_batch`` split per env (~60 % of the cost of building K records one by one)."""
    return list(step_batch(obs, policy_out, rewards, dones).unbind(0))


def segment(steps: list[TensorDict], bootstrap_obs: TensorDict) -> TensorDict:
    """A segment item of batch ``[1]``: ``steps`` [1, T] and ``bootstrap_obs`` [1]."""
    return TensorDict({"steps": TensorDict.stack(steps).unsqueeze(0), "bootstrap_obs": bootstrap_obs.unsqueeze(0)},
                      batch_size=[1])


def is_segments(batch: TensorDictBase) -> bool:
    return "steps" in batch.keys()


def policy_versions(batch: TensorDictBase) -> torch.Tensor:
    """Policy version of every step in a batch of step records or segments."""
    versions: torch.Tensor = batch["steps", "policy_version"] if is_segments(batch) else batch["policy_version"]
    return versions


def env_steps(batch: TensorDictBase) -> int:
    """How many environment steps a batch of step records or segments holds."""
    return batch["steps"].numel() if is_segments(batch) else batch.numel()
