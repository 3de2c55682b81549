"""Checkpointer: writes and restores the whole run (trainers, replay buffer, stats, counters)."""
from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import ray
from rich.console import Console

from async_rl import checkpoint as ckpt
from async_rl.orchestration.actor_group import ActorGroup

if TYPE_CHECKING:
    from async_rl.config.schema import RunConfig

console = Console(stderr=True)


class Checkpointer:
    """``save`` writes into a temporary directory and commits it by rename; ``restore`` loads one
    into the live actors before the first broadcast. ``replay_call(method, *args)`` reaches the
    replay buffer through its supervisor (it survives a buffer restart)."""

    def __init__(self, cfg: RunConfig, trainers: ActorGroup, replay_call: Callable[..., Any], stats: Any) -> None:
        self.cfg, self.trainers, self.replay_call, self.stats = cfg, trainers, replay_call, stats
        self.root = ckpt.checkpoint_root(cfg.log_dir)
        self.last: Optional[Path] = None
        self.epoch = -1  # epoch of the last save (or of the checkpoint resumed from)

    def save(self, epoch: int, policy_version: int, extra: dict[str, Any]) -> Path:
        """Write a checkpoint of ``epoch``; nothing partial stays if any part fails."""
        cfg, timeout = self.cfg, self.cfg.actor_timeout_s
        staging = ckpt.staging_dir(self.root, epoch)
        try:
            # Trainers stop fetching, so the replay buffer and their untrained batches match.
            self.trainers.call("hold_prefetch", what="hold_prefetch")
            self.replay_call("save", str(staging / "replay.safetensors"))
            self.trainers.call("save_checkpoint", str(staging), what="save_checkpoint")
            stats = ray.get(self.stats.state_dict.remote(), timeout=timeout)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        meta = {"format": ckpt.FORMAT, "epoch": epoch, "policy_version": policy_version,
                "config": cfg.model_dump(mode="json"), "stats": stats, **extra,
                "written": time.strftime("%Y-%m-%dT%H:%M:%S")}
        self.last = ckpt.commit(staging, meta, cfg.keep_checkpoints)
        self.replay_call("checkpoint_committed", str(self.last / "replay.safetensors"))  # trims its log
        self.epoch = epoch
        console.print(f"checkpoint (epoch {epoch}, policy v{policy_version}): {self.last}", markup=False, soft_wrap=True)
        return self.last

    def restore(self, path: Path) -> tuple[int, int]:
        """Load ``path`` into the trainers, replay buffer and stats; returns (epoch, policy version)."""
        meta = ckpt.read_meta(path)
        loaded = self.trainers.call("load_checkpoint", str(path), what="load_checkpoint")
        size = self.replay_call("load", str(path / "replay.safetensors"))
        ray.get(self.stats.load_state_dict.remote(meta["stats"]), timeout=self.cfg.actor_timeout_s)
        epoch, version = int(meta["epoch"]), int(meta["policy_version"])
        self.epoch = epoch
        pending = sum(r["pending"] for r in loaded.values())
        console.print(f"resumed from {path}: epoch {epoch}, policy v{version}, global step "
                      f"{loaded['trainer-0']['global_step']}, replay {size} items, {pending} untrained super-batch(es)")
        return epoch, version

    def latest(self) -> Optional[Path]:
        """The newest complete checkpoint of this run's log dir (this run's or a resumed one's)."""
        return ckpt.latest_checkpoint(self.cfg.log_dir)
