"""A trainer rank's side of the weight sync: rank 0 keeps a copy of the inference tensors of the last completed
policy version and broadcasts it to the inference actors over its own process group (``weights/group.py``).
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Optional

import ray
import torch

from async_rl.weights.group import WeightSyncGroup
from async_rl.weights.rendezvous import is_loopback
from async_rl.weights.signature import tensor_signature


class WeightPublisher:
    """Mixin of ``TrainerRank``: the weights it hands to inference. It reads the rank's ``rank``, ``engine``
    and ``device``; ``_init_sync`` makes its state."""

    rank: int
    engine: Any
    device: torch.device

    def _init_sync(self) -> None:
        self._sync: Optional[WeightSyncGroup] = None
        # Rank 0: (version, copy of the inference tensors) of the last completed version, what every
        # broadcast sends. A broadcast may come mid-epoch (heal() re-sends to a restarted inference
        # actor while this rank trains): the live parameters are then between two versions and an
        # optimiser step may rewrite them while they are on the wire.
        self._published: Optional[tuple[int, list[torch.Tensor]]] = None

    def weight_signature(self) -> list[tuple[str, tuple[int, ...], str]]:
        return tensor_signature(self.engine.module.inference_tensors())

    async def join_weight_sync(self, world_size: int, addr: str, port: int, timeout_s: float, member_names: list[str]) -> str:
        """Form the weight-sync group as its rank 0; returns the transport chosen and why (for the log)."""
        if self._sync is not None:  # rebuilding the group after a member failed
            self._sync.close()
        self._sync = await asyncio.to_thread(
            WeightSyncGroup, 0, world_size, addr, port, timeout_s=timeout_s, member_names=member_names,
            local_addr=None if is_loopback(addr) else ray.util.get_node_ip_address(), device=self.device,
        )
        return self._sync.transport

    def _publish(self, version: int) -> None:
        """Rank 0 keeps a copy of the inference tensors as ``version`` (called where no step runs:
        after set-up, a checkpoint's load, or in the training thread at the end of an epoch). A new
        list each time: a broadcast still sending the previous one keeps it intact."""
        if self.rank == 0:
            tensors = [t.detach().clone() for _, t in self.engine.module.inference_tensors()]
            self._published = (version, tensors)

    async def broadcast_weights(self) -> tuple[float, int]:
        """Rank 0 sends the last completed version's inference tensors, followed by that version
        (one int64), to every inference actor; returns (seconds taken, version sent)."""
        start = time.perf_counter()
        version, tensors = self._published
        label = torch.tensor([version], dtype=torch.int64, device=tensors[0].device if tensors else self.device)
        await self._sync.broadcast_async([*tensors, label])
        return time.perf_counter() - start, version

    def weights(self) -> dict[str, torch.Tensor]:
        """The live inference tensors, copied to the CPU (checks and evaluation)."""
        return {k: v.detach().cpu().clone() for k, v in self.engine.module.inference_tensors()}
