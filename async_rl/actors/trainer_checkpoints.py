"""A trainer rank's part of a checkpoint: the prefetch held while the run saves, this rank's optimiser
partition, scheduler, counters, RNG and untrained super-batches written (rank 0 also the weights), and read back.
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from tensordict import TensorDict

from async_rl import checkpoint as ckpt
from async_rl.actors.prefetch import Prefetcher


class TrainerCheckpoints:
    """Mixin of ``TrainerRank``: its checkpoints. It reads and restores the rank's ``engine``, ``scheduler``,
    ``global_step``, ``skipped_updates`` and ``next_version``, the intake's prefetch and pending super-batches
    (``_prefetcher``, ``_pending``: ``trainer_intake.py``), and publishes the loaded weights (``_publish``:
    ``trainer_sync.py``)."""

    rank: int
    engine: Any
    scheduler: Any
    global_step: int
    skipped_updates: int
    next_version: int
    _prefetch: Optional[Prefetcher]
    _restored: list[TensorDict]

    if TYPE_CHECKING:  # the other mixins' methods it calls
        def _prefetcher(self) -> Prefetcher: ...

        def _pending(self) -> list[TensorDict]: ...

        def _publish(self, version: int) -> None: ...

    async def hold_prefetch(self) -> int:
        """Freeze the prefetch (a sample in flight lands first) until ``save_checkpoint``;
        returns how many fetched super-batches wait untrained."""
        await self._prefetcher().hold()
        return len(self._pending())

    async def save_checkpoint(self, directory: str) -> None:
        """Write this rank's part of a checkpoint (rank 0 also the weights); releases the hold."""
        try:
            await asyncio.to_thread(self._write_checkpoint, Path(directory))
        finally:
            if self._prefetch is not None:
                self._prefetch.release()

    def _write_checkpoint(self, directory: Path) -> None:
        zero = self.engine.optimizer
        if self.rank == 0:
            ckpt.save_model(self.engine.module, directory)
        state = {
            "optimizer": zero.optimizer.state_dict(),  # AdamW over this rank's flat fp32 partitions
            "fp32_partitions": [t.detach().cpu() for t in zero.single_partition_of_fp32_groups],
            "scheduler": self.scheduler.state_dict(),
            "global_steps": self.engine.global_steps,
            "global_samples": self.engine.global_samples,
            "skipped_steps": self.engine.skipped_steps,
            "next_version": self.next_version,
            "rng": ckpt.rng_state(),
        }
        ckpt.save_weights_only(state, directory / f"trainer-{self.rank}.pt")
        for i, batch in enumerate(self._pending()):
            ckpt.save_tensordict(batch, directory / f"pending-trainer-{self.rank}-{i}.safetensors")

    def load_checkpoint(self, directory: str | Path) -> dict[str, int]:
        """Restore weights, optimizer partition, scheduler, counters, RNG and untrained super-batches."""
        directory = Path(directory)
        ckpt.load_model(self.engine.module, directory)
        state = ckpt.load_weights_only(directory / f"trainer-{self.rank}.pt")
        zero = self.engine.optimizer
        zero.optimizer.load_state_dict(state["optimizer"])
        for current, saved in zip(zero.single_partition_of_fp32_groups, state["fp32_partitions"], strict=True):
            current.data.copy_(saved)
        self.scheduler.load_state_dict(state["scheduler"])
        self.engine.global_steps = self.global_step = state["global_steps"]
        self.engine.global_samples = state["global_samples"]
        self.engine.skipped_steps = self.skipped_updates = state["skipped_steps"]
        self.next_version = state["next_version"]
        ckpt.set_rng_state(state["rng"])
        self._publish(self.next_version)  # the loaded weights are the version the next epoch starts from
        pending = sorted(directory.glob(f"pending-trainer-{self.rank}-*.safetensors"),
                         key=lambda p: int(p.stem.rsplit("-", 1)[1]))
        self._restored = [ckpt.load_tensordict(p) for p in pending]
        return {"global_step": self.global_step, "pending": len(self._restored)}

