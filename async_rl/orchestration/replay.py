"""ReplaySupervisor: the replay buffer actor, and what keeps a run going when it dies.

Ray restarts the buffer (``max_restarts``); its constructor then rebuilds by itself the state it
died in (the newest checkpoint or log snapshot, then its write-ahead log: actors/replay_log.py), so
no caller sees an empty buffer for long and nothing it answered for is lost or handed out twice.
The supervisor retries the driver's calls across the restart and counts restarts and any items
the restore could not bring back (``added`` it read before the death minus ``added`` restored:
0 while the log works)."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Optional

import ray
from rich.console import Console

from async_rl import checkpoint as ckpt
from async_rl.actors.replay_buffer import GroupSpec, ReplayBufferActor
from async_rl.algo import advantage_estimator, draws_whole_groups
from async_rl.errors import ActorFailedError
from async_rl.orchestration.placement import on_driver_node

if TYPE_CHECKING:
    from async_rl.config.schema import RunConfig

console = Console(stderr=True)


class ReplaySupervisor:
    def __init__(self, cfg: RunConfig, name: str, record_health: Callable[[str, int], None],
                 stats_name: Optional[str] = None) -> None:
        self.cfg, self.record_health = cfg, record_health
        groups = GroupSpec(cfg.advantage, cfg.group_size, cfg.max_group_version_spread, cfg.num_rollout_workers,
                           stats_name, cfg, draws_whole_groups(cfg.clip, cfg.group_size)) \
            if advantage_estimator(cfg.advantage).needs_group_rollouts else None
        self.actor = ReplayBufferActor.options(num_cpus=0, name=name, max_restarts=cfg.actor_max_restarts,  # type: ignore[attr-defined]  # an ActorClass: mypy ignores decorators
                                               max_task_retries=0, **on_driver_node()).remote(
            cfg.replay_capacity, cfg.seed, str(ckpt.checkpoint_root(cfg.log_dir)), groups)
        self.restarts = 0
        self.pid: Optional[int] = None
        self.last_counters: dict[str, int] = {}

    def call(self, method: str, *args: Any) -> Any:
        """``actor.method(*args)``; if the buffer died meanwhile, once more after its restart."""
        timeout = self.cfg.actor_timeout_s
        try:
            return ray.get(getattr(self.actor, method).remote(*args), timeout=timeout)
        except ray.exceptions.RayActorError as exc:
            self._wait_until_back(exc)
            self.counters()  # accounts for the restart
            try:
                return ray.get(getattr(self.actor, method).remote(*args), timeout=timeout)
            except ray.exceptions.RayActorError as again:
                raise ActorFailedError("replay-buffer", method, again) from again

    def counters(self) -> dict[str, int]:
        """The buffer's counters; notices (and accounts for) a restart since the last call."""
        try:
            status = ray.get(self.actor.status.remote(), timeout=self.cfg.actor_timeout_s)
        except ray.exceptions.RayActorError as exc:  # died or restarting (snapshot between two calls): wait, ask again
            self._wait_until_back(exc)
            status = ray.get(self.actor.status.remote(), timeout=self.cfg.actor_timeout_s)
        if self.pid is not None and status["pid"] != self.pid:
            self._account_restart(status)
        self.pid, self.last_counters = status["pid"], status["counters"]
        return self.last_counters

    def _wait_until_back(self, exc: BaseException) -> None:
        """Wait (at most actor_timeout_s) while Ray restarts the buffer and its constructor reloads the checkpoint."""
        deadline = time.monotonic() + self.cfg.actor_timeout_s
        while True:
            try:
                ray.get(self.actor.pid.remote(), timeout=max(deadline - time.monotonic(), 0.1))
                return
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as again:
                if time.monotonic() >= deadline:
                    raise ActorFailedError("replay-buffer", "its restart", again) from exc
                time.sleep(0.5)

    def _account_restart(self, status: dict[str, Any]) -> None:
        """Count a restart and the acknowledged items the restore could not bring back."""
        self.restarts += 1
        if self.restarts > self.cfg.actor_max_restarts:
            raise ActorFailedError("replay-buffer", "the run", RuntimeError(
                f"it died {self.restarts} times (actor_max_restarts={self.cfg.actor_max_restarts})"))
        restored = status["counters"]
        lost = max(self.last_counters.get("added", 0) - restored.get("restored_added", 0), 0)
        console.print(f"replay-buffer died and was restarted with {restored.get('restored_items', 0)} items from "
                      f"{status['restored_from'] or 'no checkpoint'}; {lost} acknowledged items lost",
                      style="yellow", markup=False, soft_wrap=True)
        self.record_health("replay_restarts", 1)
        self.record_health("replay_items_lost", lost)
