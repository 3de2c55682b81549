"""Process-level set-up shared by the driver and the actors: devices, threads, resources, Ray."""
from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path
from typing import Any, Awaitable, Optional, Protocol, TypeVar

import numpy as np
import torch

from async_rl.errors import ActorTimeoutError, ConfigError

T = TypeVar("T")
# torch's JIT extension builds (DeepSpeed's CPU comm op, ~1 min; several on a busy machine) hold a `lock`
# file in their build folder; older than this, its builder is gone.
STALE_BUILD_LOCK_S = 900.0


def pythonpath_with(*paths: Any) -> str:
    """``paths`` ahead of the current PYTHONPATH: child processes (Ray workers, launches) import
    this checkout's packages even when it is not installed."""
    return os.pathsep.join([*map(str, paths), *filter(None, [os.environ.get("PYTHONPATH")])])


def clear_stale_build_locks(root: Optional[str | Path] = None, older_than_s: float = STALE_BUILD_LOCK_S) -> list[Path]:
    """Remove JIT build locks left by a process killed mid-build; returns those removed. torch waits on
    such a lock without a timeout, so every later trainer would hang in set-up (DeepSpeed builds its
    shared-memory comm op on first use). ``root``: ``TORCH_EXTENSIONS_DIR`` or torch's default."""
    base = Path(root or os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    removed = []
    for lock in [*base.glob("*/lock"), *base.glob("*/*/lock")]:
        try:
            if time.time() - lock.stat().st_mtime > older_than_s:
                lock.unlink()
                removed.append(lock)
        except FileNotFoundError:  # its builder finished meanwhile
            continue
    return removed


def configure_torch(seed: int, threads: int) -> None:
    """Seed every RNG and cap intra-op threads (actors share few cores)."""
    torch.set_num_threads(threads)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def resolve_device(device: str) -> torch.device:
    """``auto`` -> the first visible CUDA device if there is one, else CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' requested but no CUDA device is visible; use --device cpu")
    return torch.device(device)


def precision_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The weights' dtype: bf16 or fp16 when asked, bf16 on ``auto`` where the device supports
    it (CUDA with bf16; not CPU), else float32."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)


def deepspeed_cpu_supports_fp16() -> bool:
    """DeepSpeed's own answer whether its CPU accelerator trains in fp16: yes where oneDNN has fp16
    kernels (Intel CPUs with AVX-512 FP16 / AMX), no elsewhere; its engine refuses fp16 where it says no."""
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator  # noqa: PLC0415  (only an fp16 config asks)

    return bool(CPU_Accelerator().is_fp16_supported())


# CUDA_VISIBLE_DEVICES entries that name a device: an index, a GPU's UUID, a MIG instance (both spellings).
_DEVICE_ID_PREFIXES = ("GPU-", "MIG-")


def is_device_id(entry: str) -> bool:
    """``entry`` names a CUDA device: an index ("0"), a GPU UUID ("GPU-8f2c..."), a MIG id ("MIG-<uuid>", or the
    older "MIG-GPU-<uuid>/<gi>/<ci>")."""
    return entry.isdigit() or (entry.startswith(_DEVICE_ID_PREFIXES) and len(entry) > 4)


def parse_visible_devices(value: str) -> list[str]:
    """The devices a ``CUDA_VISIBLE_DEVICES`` value lets a process see, as the CUDA runtime reads it: its
    entries (whitespace around them ignored) up to the first one that names no device ("-1", any negative
    index, "NoDevFiles" that batch schedulers set, an empty entry): "" and "-1" hide every GPU."""
    devices = []
    for entry in value.split(","):
        entry = entry.strip()
        if not is_device_id(entry):
            break
        devices.append(entry)
    return devices


def visible_gpu_ids() -> list[str]:
    """GPU ids this process may use, in ``CUDA_VISIBLE_DEVICES`` order (indices, UUIDs or MIG ids as written
    there); without the variable, the indices of every GPU torch sees."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return parse_visible_devices(env)
    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def pin_gpu(gpu_id: Optional[str], who: str) -> None:
    """Make ``gpu_id`` the one GPU this process sees (a GPU named by hand; None keeps what Ray set for the
    actor's ``num_gpus``). CUDA reads ``CUDA_VISIBLE_DEVICES`` once, when it initialises: call this first
    thing in an actor. Once CUDA is up the variable changes nothing, so that is an error, not a silent no-op."""
    if gpu_id is None:
        return
    if torch.cuda.is_initialized() and parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES", "")) != [gpu_id]:
        raise RuntimeError(f"{who}: CUDA was initialised in this process before GPU {gpu_id} was pinned, so "
                           "CUDA_VISIBLE_DEVICES would be ignored; build the actor before anything touches CUDA")
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu_id


def trainer_rank_env(rank: int, world_size: int, device: str) -> dict[str, str]:
    """RANK, WORLD_SIZE and LOCAL_RANK of a trainer rank whose GPU (if any) is already pinned.

    DeepSpeed reads LOCAL_RANK as the index of the rank's device (``set_device(LOCAL_RANK)``, the engine on
    ``cuda:LOCAL_RANK``, the NCCL group bound to it). Every trainer actor sees exactly its own GPU (Ray's
    ``num_gpus`` or ``pin_gpu``) as ``cuda:0``, so the consistent pair is LOCAL_RANK 0 and cuda:0 on every
    rank, whichever node it shares. A rank that saw several GPUs would put every rank of its node on cuda:0:
    refused here."""
    if device != "cpu" and torch.cuda.is_available():
        seen = visible_gpu_ids()
        if len(seen) > 1:
            raise ConfigError(f"trainer-{rank} sees {len(seen)} GPUs ({', '.join(seen)}); a trainer rank uses one: "
                              "let Ray give it one (no trainer_gpu_ids) or name one per rank in trainer_gpu_ids")
    return {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": "0"}


class ProcessPlan(Protocol):
    """The run options that say how many actors there are and what each reserves. This module sits below the config
    layer, so it names the keys it reads: the RunConfig is one such object."""

    num_trainers: int
    num_inference_actors: int
    num_rollout_workers: int
    num_eval_workers: int
    trainer_num_cpus: float
    inference_num_cpus: float
    worker_num_cpus: float
    trainer_gpu_ids: Optional[list[str]]
    inference_gpu_ids: Optional[list[str]]

    @property  # read-only, so that the config's Literal type of these strings is one
    def device(self) -> str: ...


def plan_gpus(cfg: ProcessPlan) -> tuple[list[Optional[str]], list[Optional[str]]]:
    """GPU id per trainer and per inference actor (None = CPU).

    Default split: the first ``num_trainers`` visible GPUs train, the rest serve inference
    (inference actors share them round-robin); ``trainer_gpu_ids``/``inference_gpu_ids`` override.
    """
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and visible_gpu_ids())
    if not use_cuda:
        return [None] * cfg.num_trainers, [None] * cfg.num_inference_actors
    gpus = visible_gpu_ids()
    trainer_ids = cfg.trainer_gpu_ids or gpus[: cfg.num_trainers]
    inference_pool = cfg.inference_gpu_ids or gpus[cfg.num_trainers :] or gpus[-1:]
    shown = ", ".join(gpus) or "none"
    if len(trainer_ids) < cfg.num_trainers:
        raise ConfigError(f"num_trainers={cfg.num_trainers} but only {len(gpus)} GPU(s) visible ({shown}); "
                          "lower --num-trainers or set CUDA_VISIBLE_DEVICES")
    missing = [g for g in [*trainer_ids, *inference_pool] if g not in gpus]
    if missing:
        raise ConfigError(f"GPU id(s) {', '.join(missing)} are not visible (visible: {shown}); fix "
                          "trainer_gpu_ids/inference_gpu_ids (ids as CUDA_VISIBLE_DEVICES writes them)")
    if len(set(trainer_ids)) < len(trainer_ids):  # NCCL refuses two ranks on one device
        raise ConfigError(f"trainer_gpu_ids {', '.join(trainer_ids)} name a GPU twice; each trainer rank needs a GPU "
                          "of its own")
    inference_ids = [inference_pool[i % len(inference_pool)] for i in range(cfg.num_inference_actors)]
    return list(trainer_ids), inference_ids


def required_cpus(cfg: ProcessPlan) -> float:
    """CPUs the actors reserve (light actors reserve none)."""
    return (
        cfg.num_trainers * cfg.trainer_num_cpus
        + cfg.num_inference_actors * cfg.inference_num_cpus
        + (cfg.num_rollout_workers + cfg.num_eval_workers) * cfg.worker_num_cpus
    )


def check_resources(cfg: ProcessPlan, available_cpus: float) -> None:
    """Refuse a plan Ray could not place (it would leave an actor pending forever)."""
    need = required_cpus(cfg)
    if need > available_cpus + 1e-9:
        raise ConfigError(
            f"the actors need {need:g} CPUs (trainers {cfg.num_trainers}x{cfg.trainer_num_cpus:g}, inference "
            f"{cfg.num_inference_actors}x{cfg.inference_num_cpus:g}, workers {cfg.num_rollout_workers + cfg.num_eval_workers}"
            f"x{cfg.worker_num_cpus:g}) but {available_cpus:g} are available; lower the counts or the *_num_cpus keys"
        )
    if not getattr(cfg, "ray_address", None):  # a cluster's GPUs are not this host's: placement checks them
        plan_gpus(cfg)


async def wait_for(awaitable: Awaitable[T], timeout_s: float, who: str, what: str) -> T:
    """Await with a timeout; on expiry raise ActorTimeoutError naming who did not answer."""
    try:
        return await asyncio.wait_for(awaitable, timeout_s)
    except asyncio.TimeoutError:
        raise ActorTimeoutError(f"{who} did not answer {what} within {timeout_s:g} s") from None
