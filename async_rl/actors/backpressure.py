"""Backpressure from the replay buffer to the rollout workers: generation waits while the buffer
holds ``max_untrained_items`` items no trainer has drawn yet, so that nothing is generated only to
be evicted untrained, and a generator that would outrun the trainer leaves it the CPU instead.

A worker asks the buffer nothing while the size its last push reported is below the bound (a bounded
MetaWorld / LIBERO run pays no extra call per round; by default they are not bounded: ``untrained_bound``).
Only at the bound does it wait, in slices, on the buffer's ``wait_for_room``; a trainer drawing (the buffer's ``sampled`` count rising)
restarts the wait's clock, so a slow trainer is waited for and a dead one ends the wait with an error.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Awaitable, Callable, Optional

from async_rl.algo import advantage_estimator
from async_rl.errors import ActorTimeoutError

if TYPE_CHECKING:
    from async_rl.config.schema import RunConfig, TimeoutsSection

WAIT_SLICE_S = 5.0  # longest single wait on the buffer (a stop or a restart is noticed within it)


def untrained_bound(cfg: RunConfig) -> Optional[int]:
    """The bound in force (None: none). Only consuming draws leave the buffer, so only then does its
    size count untrained items; synchronous mode pauses the workers itself. ``max_untrained_items``
    null: for group estimators (an item is a whole sampled episode: a language model's response), the
    capacity less two pushes of every worker in flight (a worker learns the size one push late), never
    under one super-batch per trainer (the trainers must be able to draw); for step and segment
    estimators (PPO / V-trace on MetaWorld, LIBERO) none: their workers run ahead by design, FIFO eviction
    keeps the newest steps, and replay/evicted_untrained shows what it costs."""
    if cfg.sync or cfg.replay_sampling != "consume" or cfg.max_untrained_items == 0:
        return None
    if cfg.max_untrained_items is not None:
        return cfg.max_untrained_items
    if not advantage_estimator(cfg.advantage).needs_group_rollouts:
        return None
    slack = 2 * cfg.num_rollout_workers * push_items(cfg)
    return min(max(cfg.replay_capacity - slack, cfg.num_trainers * cfg.super_batch_size), cfg.replay_capacity)


def push_items(cfg: RunConfig) -> int:
    """The most replay items one push of a worker can add: a segment per env; GAE's pieces of up to
    ``rollout_steps`` rounds of every env; with groups, the whole groups its episodes complete."""
    estimator = advantage_estimator(cfg.advantage)
    if estimator.unit == "segment":
        return cfg.envs_per_worker
    if estimator.needs_group_rollouts:
        return cfg.envs_per_worker * cfg.group_size
    return cfg.envs_per_worker * cfg.rollout_steps


def wait_limit_s(cfg: TimeoutsSection) -> float:
    """How long generation waits without any trainer drawing: a live trainer draws at least once per
    epoch, whose wait for data and whose collectives are each bounded by these two timeouts."""
    return cfg.actor_timeout_s + cfg.collective_timeout_s


class GenerationGate:
    """A worker's side of the backpressure: ``before_generation`` returns at once below the bound,
    else once the buffer has room; raises ``ActorTimeoutError`` if no trainer drew for ``limit_s``.
    Counts its waits (``waits``, ``wait_seconds``) for the stats."""

    def __init__(self, bound: Optional[int], limit_s: float, slice_s: float = WAIT_SLICE_S) -> None:
        self.bound, self.limit_s, self.slice_s = bound, limit_s, slice_s
        self.held: Optional[int] = 0  # untrained items the buffer last reported (None: unknown, ask it)
        self.waits, self.wait_seconds = 0, 0.0

    def reported(self, held: Optional[int]) -> None:
        """What a push's answer said the buffer holds (None when the answer does not say)."""
        self.held = held

    async def before_generation(self, wait_for_room: Callable[[int, float], Awaitable[dict[str, int]]],
                                stopped: Callable[[], bool] = lambda: False) -> None:
        """``wait_for_room(bound, timeout_s)``: the buffer's method (answers {"size", "sampled"} once its
        size is below ``bound`` or after ``timeout_s``). Returns early once ``stopped()``."""
        if self.bound is None or (self.held is not None and self.held < self.bound):
            return
        began = time.monotonic()
        progress_at, sampled = began, None
        while True:
            answer = await wait_for_room(self.bound, self.slice_s)
            now = time.monotonic()
            self.held = answer["size"]
            if answer["size"] < self.bound or stopped():
                break
            if sampled is not None and answer["sampled"] != sampled:
                progress_at = now  # a trainer drew: it is alive, keep waiting for it
            sampled = answer["sampled"]
            if now - progress_at >= self.limit_s:
                raise ActorTimeoutError(
                    f"the replay buffer has held {answer['size']} untrained items (max_untrained_items bound "
                    f"{self.bound}) for {now - progress_at:.0f} s without any trainer drawing: is a trainer dead or "
                    "stuck? (raise actor_timeout_s for longer epochs, or max_untrained_items 0 to evict instead)")
        if now - began > 0.001:
            self.waits += 1
            self.wait_seconds += now - began

    def take_counts(self) -> tuple[int, float]:
        """Waits and seconds waited since the last call (reported to the stats actor)."""
        counts, self.waits, self.wait_seconds = (self.waits, self.wait_seconds), 0, 0.0
        return counts
