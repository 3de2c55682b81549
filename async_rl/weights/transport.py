"""Which backend a weight-sync group uses: every member reports where its tensors live
(``device_report``) and rank 0 picks NCCL or gloo from the reports (``choose_transport``)."""
from __future__ import annotations

import contextlib
from typing import Any, Mapping, Sequence

import torch

from async_rl.errors import ConfigError

try:  # the CPU build of torch has no NCCL backend
    from torch.distributed import ProcessGroupNCCL
except ImportError:  # pragma: no cover - depends on the torch build
    ProcessGroupNCCL = None  # type: ignore[misc, assignment]  # None: this torch has no NCCL (nccl_available)


def nccl_available() -> bool:
    return ProcessGroupNCCL is not None and torch.cuda.is_available()


def member_device(device: torch.device | str | None) -> torch.device:
    """The device a member's tensors live on; by default the current GPU where NCCL can be used."""
    if device is not None:
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return device
    return torch.device("cuda", torch.cuda.current_device()) if nccl_available() else torch.device("cpu")


def on_device(device: torch.device) -> Any:
    """A context in which CUDA work goes to ``device`` (its calling thread's current device is per thread:
    a group's broadcast runs in worker threads, whose current device is cuda:0 whatever the actor set)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def nccl_options() -> Any:
    """A ``ProcessGroupNCCL.Options`` (only where ``nccl_available``)."""
    return ProcessGroupNCCL.Options()


def bound_nccl_group(store: Any, rank: int, world_size: int, options: Any, device: torch.device) -> Any:
    """A ``ProcessGroupNCCL`` bound to ``device``: the device is made current first (NCCL builds its
    communicator on the current device) and the communicator is built at once on that device, not lazily
    on whichever device the first collective's thread happens to have."""
    torch.cuda.set_device(device)
    group = ProcessGroupNCCL(store, rank, world_size, options)
    group.eager_connect_single_device(device)
    return group


def device_report(device: torch.device | str | None) -> dict[str, Any]:
    """What a member tells rank 0 about where its tensors live: ``{"device": "cpu"}``, or
    ``{"device": "cuda", "gpu": <the GPU's UUID>, "nccl": <this torch has NCCL>}``."""
    device = member_device(device)
    if device.type != "cuda":
        return {"device": device.type}
    return {"device": "cuda", "gpu": str(torch.cuda.get_device_properties(device).uuid),
            "nccl": ProcessGroupNCCL is not None}


def choose_transport(reports: Sequence[Mapping[str, Any]], names: Sequence[str], requested: str = "auto") -> tuple[str, str]:
    """(backend, the reason in words) for members reporting ``reports`` (``device_report``, rank order).

    NCCL only where every member holds its tensors on a GPU of its own and has NCCL: NCCL refuses
    two ranks on one device and cannot reach a CPU. Anything else goes over gloo through host
    memory (GPU tensors staged through CPU buffers). ``requested`` "nccl" that cannot work is a
    ConfigError naming the members in the way.
    """
    on_cpu = [n for n, r in zip(names, reports) if r["device"] != "cuda"]
    by_gpu: dict[str, list[str]] = {}
    for name, report in zip(names, reports):
        if report["device"] == "cuda":
            by_gpu.setdefault(str(report["gpu"]), []).append(name)
    shared = next(((gpu, members) for gpu, members in by_gpu.items() if len(members) > 1), None)
    no_nccl = [n for n, r in zip(names, reports) if r["device"] == "cuda" and not r.get("nccl")]
    if len(on_cpu) == len(names):
        problem = "every member holds its weights on the CPU"
    elif on_cpu:
        problem = f"{', '.join(on_cpu)} on the CPU, the others on GPUs"
    elif shared is not None:
        problem = f"{' and '.join(shared[1])} share one GPU ({shared[0]}); NCCL needs one GPU per rank"
    elif no_nccl:
        problem = f"no NCCL in the torch build of {', '.join(no_nccl)}"
    else:
        problem = None
    if requested == "gloo":
        return "gloo", "gloo over host memory (requested)"
    if problem is None:
        return "nccl", "nccl: every member on a GPU of its own"
    if requested == "nccl":
        raise ConfigError(f"backend 'nccl' cannot serve this group: {problem}; use backend 'gloo' or 'auto'")
    return "gloo", f"gloo over host memory: {problem}"
