"""The weight-sync transport: NCCL only between members on GPUs of their own, gloo over host memory
otherwise (two members on one GPU, a CPU member beside GPU ones), chosen by rank 0 and said why.

The co-located and the CPU-receiver cases are forced on CPU: the members report GPU devices they
do not have, rank 0 must pick gloo, and a real broadcast between Ray actors must arrive."""
from __future__ import annotations

import pytest
import ray
import torch
from conftest import assert_broadcast_delivered, released

from async_rl.errors import ConfigError
from async_rl.weights.group import WeightSyncGroup
from async_rl.weights.rendezvous import find_free_port
from async_rl.weights.transport import choose_transport

CPU = {"device": "cpu"}


def _gpu(uuid: str, nccl: bool = True) -> dict:
    return {"device": "cuda", "gpu": uuid, "nccl": nccl}


def test_nccl_only_between_members_on_gpus_of_their_own():
    names = ["trainer-0", "inference-0", "inference-1"]
    assert choose_transport([_gpu("GPU-a"), _gpu("GPU-b"), _gpu("GPU-c")], names)[0] == "nccl"

    backend, why = choose_transport([_gpu("GPU-a"), _gpu("GPU-b"), _gpu("GPU-a")], names)
    assert backend == "gloo" and "trainer-0 and inference-1 share one GPU (GPU-a)" in why, why
    backend, why = choose_transport([_gpu("GPU-a"), CPU, _gpu("GPU-b")], names)
    assert backend == "gloo" and "inference-0 on the CPU" in why, why
    backend, why = choose_transport([_gpu("GPU-a"), _gpu("GPU-b", nccl=False), _gpu("GPU-c")], names)
    assert backend == "gloo" and "inference-0" in why and "NCCL" in why, why
    backend, why = choose_transport([CPU, CPU, CPU], names)
    assert backend == "gloo" and "every member" in why and "CPU" in why, why
    assert choose_transport([_gpu("GPU-a"), _gpu("GPU-b"), _gpu("GPU-c")], names, "gloo")[0] == "gloo"

    # Asking for NCCL where it cannot work is a one-line error naming who is in the way.
    with pytest.raises(ConfigError, match=r"'nccl' cannot serve .*trainer-0 and inference-0 share one GPU"):
        choose_transport([_gpu("GPU-a"), _gpu("GPU-a"), _gpu("GPU-c")], names, "nccl")


@ray.remote(num_cpus=0)
class ForcedDeviceMember:
    """A weight-sync member whose device report is forced (this process has no GPU)."""

    def __init__(self, rank: int, report: dict):
        import async_rl.weights.group as weight_sync

        torch.set_num_threads(1)
        weight_sync.device_report = lambda device: dict(report)  # what a member on that device would say
        self.rank, self.group = rank, None

    async def join(self, world_size: int, port: int, names: list[str]) -> tuple[str, str, str]:
        self.group = await WeightSyncGroup.create_async(self.rank, world_size, "127.0.0.1", port, timeout_s=30.0,
                                                        member_names=names)
        return self.group.backend, self.group.transport, str(self.group.device)

    async def sync(self, seed: int) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        sent = [torch.randn(64, 8, generator=g).to(torch.bfloat16), torch.randn(1000, generator=g),
                torch.arange(12).reshape(3, 4)]
        tensors = sent if self.rank == 0 else [torch.zeros_like(t) for t in sent]
        await self.group.broadcast_async(tensors)
        return tensors

    async def close(self) -> None:
        if self.group is not None:
            self.group.close()


@pytest.mark.parametrize("reports, expected", [
    ([_gpu("GPU-shared"), _gpu("GPU-shared")], "trainer-0 and inference-0 share one GPU (GPU-shared)"),
    ([_gpu("GPU-trainer"), CPU], "inference-0 on the CPU"),
], ids=["co-located-on-one-gpu", "cpu-receiver-gpu-sender"])
def test_forced_layout_falls_back_to_gloo_and_broadcasts(ray_local, reports, expected):
    names = ["trainer-0", "inference-0"]
    with released([ForcedDeviceMember.remote(rank, report) for rank, report in enumerate(reports)]) as members:
        port = find_free_port("127.0.0.1")
        joined = ray.get([m.join.remote(2, port, names) for m in members], timeout=90)
        for backend, transport, device in joined:  # every member agrees, and stages through host memory
            assert backend == "gloo" and device == "cpu", joined
            assert transport.startswith(f"gloo over host memory: {expected}"), transport
        assert_broadcast_delivered(members, seed=3, timeout_s=90)
