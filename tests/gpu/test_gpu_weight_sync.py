"""Weight sync on GPUs (skipped without CUDA): NCCL between members on GPUs of their own, and the
gloo fallback over host memory where two members share a GPU or the receiver is on the CPU."""
from __future__ import annotations

import os
from typing import Optional

import pytest
import ray
import torch
from conftest import assert_broadcast_delivered, released

from async_rl.weights.group import WeightSyncGroup
from async_rl.weights.rendezvous import find_free_port

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (tests/gpu)")
NAMES = ["trainer-0", "inference-0"]


@ray.remote(num_cpus=0)
class GpuMember:
    """One member of a weight-sync group, its tensors on GPU ``gpu`` (None: the CPU)."""

    def __init__(self, rank: int, gpu: Optional[int]):
        if gpu is not None:  # before CUDA initialises in this process, as the inference actor does
            os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
        self.rank, self.group = rank, None
        self.device = torch.device("cuda", 0) if gpu is not None else torch.device("cpu")

    async def join(self, port: int) -> tuple[str, str]:
        self.group = await WeightSyncGroup.create_async(self.rank, len(NAMES), "127.0.0.1", port, timeout_s=120.0,
                                                        member_names=NAMES, device=self.device)
        return self.group.backend, self.group.transport

    async def sync(self, seed: int) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        sent = [torch.randn(512, 256, generator=g).to(torch.bfloat16), torch.randn(100_000, generator=g),
                torch.arange(12).reshape(3, 4).t()]  # bf16, float32, a non-contiguous int64 view
        tensors = [t.to(self.device) for t in sent] if self.rank == 0 else \
            [torch.zeros_like(t, device=self.device) for t in sent]
        await self.group.broadcast_async(tensors)
        return [t.cpu() for t in tensors]

    async def close(self) -> None:
        if self.group is not None:
            self.group.close()


@pytest.mark.parametrize("gpus, backend, why", [
    ((0, 1), "nccl", "every member on a GPU of its own"),
    ((0, 0), "gloo", "trainer-0 and inference-0 share one GPU"),
    ((0, None), "gloo", "inference-0 on the CPU"),
], ids=["separate-gpus", "co-located", "cpu-receiver"])
def test_transport_by_layout(ray_local, gpus, backend, why):
    needed = 1 + max(g for g in gpus if g is not None)
    if needed > torch.cuda.device_count():
        pytest.skip(f"needs {needed} GPUs, {torch.cuda.device_count()} visible")
    with released([GpuMember.remote(rank, gpu) for rank, gpu in enumerate(gpus)], timeout_s=60) as members:
        port = find_free_port("127.0.0.1")
        for got_backend, transport in ray.get([m.join.remote(port) for m in members], timeout=180):
            assert got_backend == backend and why in transport, transport
        assert_broadcast_delivered(members, seed=5, timeout_s=180)
