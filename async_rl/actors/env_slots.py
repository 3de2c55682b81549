"""A rollout worker's environments: the env pools, the thread that steps them, the slots (one env and
its episode each), the groups of slots that step in lock-step, and the failure-weighted task sampler."""
from __future__ import annotations

import asyncio
import functools
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np
import torch
from tensordict import TensorDict

from async_rl.actors.columnar_gae import ColumnarGae
from async_rl.actors.groups import Ticket

if TYPE_CHECKING:
    from envs.base import TaskEnv, TaskSet


def finite_rows(obs: TensorDict) -> list[bool]:
    """Per row of a batch ``[K]`` of preprocessed observations: no NaN or inf in its floating-point
    leaves (images and tokens are integers and always finite). One check per leaf for all K rows, and
    per row only when a leaf has a non-finite value (the common all-finite case is one op per leaf)."""
    leaves: list[torch.Tensor] = [v for v in obs.values(True, True) if v.is_floating_point()]  # type: ignore[misc]  # leaves only: Tensors
    if all(_all_finite(v) for v in leaves):
        return [True] * obs.batch_size[0]
    ok = torch.ones(obs.batch_size[0], dtype=torch.bool)
    for v in leaves:
        ok &= torch.isfinite(v).reshape(v.shape[0], -1).all(dim=1)
    return ok.tolist()


def _all_finite(v: torch.Tensor) -> bool:
    # numpy's check is ~3x cheaper than torch's for a worker's small CPU batches; bf16 has no numpy dtype
    if v.device.type == "cpu" and v.dtype in (torch.float32, torch.float64, torch.float16):
        return bool(np.isfinite(v.numpy()).all())
    return bool(torch.isfinite(v).all())


class FailureWeightedTaskSampler:
    """Failure-weighted task sampling: P(task) proportional to (failures in its recent episodes + 1)."""

    def __init__(self, num_tasks: int, window: int, rng: np.random.Generator) -> None:
        self.outcomes: list[deque[int]] = [deque(maxlen=window) for _ in range(num_tasks)]
        self.rng = rng

    def probabilities(self) -> np.ndarray:
        weights = np.array([sum(h) for h in self.outcomes], dtype=np.float64) + 1.0
        return weights / weights.sum()

    def sample(self) -> int:
        return int(self.rng.choice(len(self.outcomes), p=self.probabilities()))

    def record(self, task: int, success: bool) -> None:
        self.outcomes[task].append(0 if success else 1)

    def state_dict(self) -> dict[str, Any]:
        """Recent outcomes per task and the RNG state (what a checkpoint keeps of the curriculum)."""
        return {"outcomes": [list(h) for h in self.outcomes], "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for history, saved in zip(self.outcomes, state["outcomes"], strict=True):
            history.clear()
            history.extend(saved)
        self.rng.bit_generator.state = state["rng"]


class EnvPool:
    """One env per task index, created on first use and kept (no rebuild between episodes)."""

    def __init__(self, task_set: TaskSet, seed: int) -> None:
        self.task_set, self.seed = task_set, seed
        self._envs: dict[int, TaskEnv] = {}

    def get(self, task: int) -> TaskEnv:
        if task not in self._envs:
            self._envs[task] = self.task_set.make_env(task, seed=self.seed + 7919 * task)
        return self._envs[task]

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs.clear()


class EnvThread:
    """The one thread that makes, resets, steps and closes an actor's environments (and runs the
    preprocessing): off the event loop, so health pings and weight-sync calls are answered during
    a slow step, and always the same thread, since MuJoCo/EGL render contexts belong to the thread
    that made them.

    ``inline``: every call runs on the event loop itself (then the loop's thread is the envs' one).
    For envs whose round takes a few milliseconds (MetaWorld: ~3 ms for 16) the two hand-offs per
    call cost more than the blocked loop does: pings and pause calls wait at most one round."""

    def __init__(self, name: str, inline: bool = False) -> None:
        self.name, self.inline = name, inline
        self._pool: Optional[ThreadPoolExecutor] = None

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self.inline:
            return fn(*args)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=self.name)
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))

    def close(self) -> None:
        """End the thread once its last call returned (the envs it made must be closed first)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


@dataclass
class EnvSlot:
    """One of a worker's environments and the episode it is in."""

    envs: EnvPool
    segmenter: Any
    task: int = 0
    env: Any = None
    obs: Optional[TensorDict] = None
    episode_return: float = 0.0
    episode_length: int = 0
    success: bool = False
    started: float = 0.0
    ticket: Optional[Ticket] = None  # group rollouts: the group member this episode is (None: none)


@dataclass
class EnvGroup:
    """Slots that step in lock-step: one inference request per round of them. A worker with several
    groups keeps one group's request in flight while it steps another (``env_groups``)."""

    slots: list[EnvSlot]
    columns: Optional[ColumnarGae]  # GAE's step store of these slots (None: the slots' segmenters)
    obs: Optional[TensorDict] = None  # the stacked observations of the request in flight
    request: Optional[asyncio.Future] = None  # its answer

    async def drop_request(self) -> None:
        """Forget the request in flight (its actions came from the policy before a pause); its
        answer or error is awaited so that no slot of the slab stays taken."""
        request, self.request, self.obs = self.request, None, None
        if request is not None:
            try:
                await request
            except Exception:  # noqa: BLE001 (nothing uses this answer; a failure shows on the next request)
                pass

    def cancel_request(self) -> None:
        """Forget the request in flight without waiting (the run is ending on an error)."""
        if self.request is not None:
            if self.request.done() and not self.request.cancelled():
                self.request.exception()  # retrieved: asyncio would log it as never retrieved
            self.request.cancel()
        self.request = self.obs = None
