"""The two loop strategies: asynchronous (workers never wait; trainers take what is there) and
synchronous (collect a fresh super-batch per trainer, pause the workers, train, broadcast)."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import ray

from async_rl.algo import advantage_estimator
from async_rl.errors import ActorTimeoutError

if TYPE_CHECKING:
    from async_rl.config.schema import ObjectiveSection, RunConfig, RunSection


def items_are_segments(cfg: ObjectiveSection) -> bool:
    """Whether a replay item is a segment of ``rollout_steps`` steps (else one step)."""
    return advantage_estimator(cfg.advantage).unit == "segment"


def worker_share(cfg: RunConfig, items: int) -> int:
    """Env steps each rollout worker takes in synchronous mode so that together they push at least
    ``items`` replay items (steps, or whole segments of ``rollout_steps`` steps in each of a
    worker's lock-stepped envs)."""
    per_worker = -(-max(items, 1) // cfg.num_rollout_workers)
    rounds = -(-per_worker // cfg.envs_per_worker)  # lock-step: every env steps each round
    if items_are_segments(cfg):
        return rounds * cfg.rollout_steps * cfg.envs_per_worker
    # Per step: a pause holds back each env's last step (it bootstraps the cut), hence one more round.
    return (rounds + 1) * cfg.envs_per_worker


class AsyncSchedule:
    """Workers collect all the time; an epoch starts whenever the trainers are free."""

    def before_epoch(self, runtime: Any, deadline: float) -> bool:
        return True


class SyncSchedule:
    """Before each epoch every worker collects its share of a fresh super-batch per trainer and pauses."""

    def before_epoch(self, runtime: Any, deadline: float) -> bool:
        """False if the deadline came before the data."""
        cfg, replay = runtime.cfg, runtime.replay_supervisor
        needed = cfg.num_trainers * cfg.super_batch_size
        # Leftovers of the last collection were made by an older policy: not "collect, then train".
        replay.call("drop_older_than", runtime.policy_version)
        counters = replay.counters()
        start, collected = counters["added"], False
        while not collected and time.monotonic() < deadline:
            steps = worker_share(cfg, needed - (counters["added"] - start))
            runtime.workers.call("resume", steps, what="resume")
            self._wait_until_paused(runtime, steps, deadline)
            counters = replay.counters()
            collected = counters["added"] - start >= needed and counters["size"] >= needed
        runtime.workers.call("pause", what="pause")
        return collected

    @staticmethod
    def _wait_until_paused(runtime: Any, steps: int, deadline: float) -> None:
        """Wait (until ``deadline``) for every worker to pause after its ``steps``; raises naming the
        workers still collecting after ``actor_timeout_s``."""
        paused = runtime.workers.submit("wait_paused")
        give_up = time.monotonic() + runtime.cfg.actor_timeout_s
        while time.monotonic() < deadline:
            if len(ray.wait(list(paused.values()), num_returns=len(paused), timeout=0.2)[0]) == len(paused):
                return
            runtime.check_workers()  # a restarted worker is collecting again: wait for it too
            if time.monotonic() > give_up:
                late = [n for n, ref in paused.items() if not ray.wait([ref], timeout=0)[0]]
                raise ActorTimeoutError(f"{', '.join(late)} did not collect {steps} env steps and pause within "
                                        f"actor_timeout_s={runtime.cfg.actor_timeout_s:g} s")


def schedule_for(cfg: RunSection) -> Any:
    return SyncSchedule() if cfg.sync else AsyncSchedule()
