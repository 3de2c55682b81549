"""TrainerActor: one data-parallel rank under DeepSpeed ZeRO-2.

A background coroutine prefetches the next super-batch from the replay buffer while the
current one trains (double buffering); the epoch itself runs in a thread so the actor's event
loop keeps serving the prefetch and the weight broadcast.
"""
from __future__ import annotations

import asyncio
import datetime
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Optional

import ray
import torch
from tensordict import TensorDict

from async_rl.algo import (
    compute_policy_loss,
    distributed_normalize,
    kl_penalty,
    ratio_guard,
    resolve_policy_loss_params,
    value_loss,
    vtrace,
)
from async_rl import checkpoint as ckpt
from async_rl.errors import ActorTimeoutError
from async_rl.experience import policy_versions
from async_rl.logger import mean_metrics
from async_rl.policies.lora import apply_lora
from async_rl.runtime import configure_torch, resolve_device, use_bf16, wait_for
from async_rl.weight_sync import WeightSyncGroup, host_loopback_store, is_loopback, tensor_signature


def warmup_cosine(warmup: int, decay_steps: int, min_ratio: float) -> Callable[[int], float]:
    """LR multiplier: linear warm-up, then cosine decay to ``min_ratio`` at ``decay_steps``."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min((step - warmup) / max(decay_steps - warmup, 1), 1.0)
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def deepspeed_config(cfg: Any, bf16: bool) -> dict:
    return {
        "train_micro_batch_size_per_gpu": cfg.train_batch_size,
        "gradient_accumulation_steps": cfg.accumulation_steps,
        "gradient_clipping": cfg.max_grad_norm,
        "zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_scatter": True, "contiguous_gradients": True},
        # torch AdamW needs no compiled op; DeepSpeed's own Adams JIT-compile for ~100 s on CPU.
        "zero_allow_untested_optimizer": True,
        # A non-finite gradient norm skips the step (counted in engine.skipped_steps) in bf16 too.
        "bf16": {"enabled": bf16, "check_grad_overflow": True},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


@ray.remote
class TrainerActor:
    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int, cfg: Any,
                 policy_factory: Callable[[], torch.nn.Module], replay: Any, gpu_id: Optional[int] = None) -> None:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK="0",
                          MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
        if gpu_id is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu_id)
        configure_torch(cfg.seed + rank, cfg.torch_threads)
        self.rank, self.world_size, self.cfg = rank, world_size, cfg
        self.name = f"trainer-{rank}"
        self.policy_factory, self.replay = policy_factory, replay
        self.loss_params = resolve_policy_loss_params(cfg.clip_mode, cfg.clip_params)
        self.engine = None
        self._ready: Optional[asyncio.Queue] = None
        self._prefetch: Optional[asyncio.Task] = None
        self._sync: Optional[WeightSyncGroup] = None
        self.global_step = 0
        self.skipped_updates = 0
        self.next_version = 0  # the policy version the next train_epoch will be called with
        self._restored: list[TensorDict] = []  # super-batches from a checkpoint, trained on first
        self._held: Optional[TensorDict] = None  # sampled, waiting for room in the prefetch queue
        self._fetching: Optional[asyncio.Lock] = None  # held while a sample is in flight

    # ---- set-up -------------------------------------------------------------------------
    def setup(self) -> dict[str, int]:
        """Initialise torch.distributed (training group) and the DeepSpeed engine."""
        import deepspeed  # heavy; only trainers need it

        device = resolve_device(self.cfg.device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        if backend == "gloo" and is_loopback(os.environ["MASTER_ADDR"]):
            self._init_loopback_training_group()
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)  # adopts a group made above
        bf16 = use_bf16(self.cfg.precision, device)
        model = self.policy_factory()
        if self.cfg.lora_rank > 0:
            model = apply_lora(model, self.cfg.lora_rank, self.cfg.lora_alpha, self.cfg.lora_dropout,
                               self.cfg.lora_target_modules, self.cfg.lora_trainable)
        value_ids = {id(p) for p in model.value_parameters()}
        trainable = [p for p in model.parameters() if p.requires_grad]
        # value_parameters() is asked after LoRA injection, so the value head's adapters are in it.
        groups = [
            {"params": [p for p in trainable if id(p) not in value_ids], "lr": self.cfg.lr_policy, "name": "policy"},
            {"params": [p for p in trainable if id(p) in value_ids], "lr": self.cfg.lr_value, "name": "value"},
        ]
        optimizer = torch.optim.AdamW(groups, weight_decay=self.cfg.weight_decay)
        schedule = warmup_cosine(self.cfg.warmup_steps, self.cfg.lr_decay_steps, self.cfg.min_lr_ratio)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, [schedule, schedule])
        self.engine, _, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=deepspeed_config(self.cfg, bf16)
        )
        self.device = self.engine.device
        return {"params": sum(p.numel() for p in model.parameters()), "trainable": sum(p.numel() for p in trainable)}

    def _init_loopback_training_group(self) -> None:
        """Every rank on this host: the training group's store and gloo pairs listen on loopback only
        (torch's defaults listen on every interface)."""
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        timeout = datetime.timedelta(seconds=self.cfg.collective_timeout_s)
        if self.rank == 0:
            store = host_loopback_store(addr, port, self.world_size, timeout)
        else:
            store = torch.distributed.TCPStore(addr, port, self.world_size, False, timeout)
        torch.distributed.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size,
                                             timeout=timeout)

    # ---- data ---------------------------------------------------------------------------
    def _min_version(self) -> Optional[int]:
        """Oldest behaviour version the next epoch may train on (``max_policy_lag``)."""
        lag = self.cfg.max_policy_lag
        return None if lag is None else self.next_version - lag

    async def _sample(self, n: Optional[int] = None) -> TensorDict:
        """A super-batch (or ``n`` items) from the replay buffer, polling while it holds too little."""
        while True:
            batch = await wait_for(self.replay.sample.remote(n or self.cfg.super_batch_size, self.cfg.replay_sampling == "consume",
                                                             self._min_version()),
                                   self.cfg.actor_timeout_s, "replay buffer", f"sample for {self.name}")
            if batch is not None:
                return batch
            await asyncio.sleep(0.2)

    def _lock(self) -> asyncio.Lock:
        if self._fetching is None:  # created on the actor's event loop
            self._fetching = asyncio.Lock()
        return self._fetching

    async def _prefetch_loop(self) -> None:
        while True:
            async with self._lock():  # a checkpoint waits for a sample in flight to land
                self._held = await self._sample()
            await self._ready.put(self._held)  # put blocks while the previous one is unconsumed
            self._held = None

    async def _next_super_batch(self) -> TensorDict:
        if self._restored:
            return self._restored.pop(0)
        if self.cfg.sync:  # no prefetch: train on what was collected after the last broadcast
            return await asyncio.wait_for(self._sample(), self.cfg.actor_timeout_s)
        if self._ready is None:
            self._ready = asyncio.Queue(maxsize=1)
            self._prefetch = asyncio.get_running_loop().create_task(self._prefetch_loop())
        get = asyncio.ensure_future(self._ready.get())
        done, _ = await asyncio.wait([get, self._prefetch], timeout=self.cfg.actor_timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if get not in done:
            get.cancel()
            if self._prefetch.done():
                raise self._prefetch.exception()
            raise ActorTimeoutError(f"{self.name}: no super-batch from the replay buffer within {self.cfg.actor_timeout_s:g} s")
        return get.result()

    async def _drop_stale(self, batch: TensorDict) -> TensorDict:
        """A prefetched batch may have aged past ``max_policy_lag`` while it waited: replace
        its too-old items by fresh ones (the dropped ones count in replay/dropped_stale)."""
        min_version = self._min_version()
        if min_version is None:
            return batch
        versions = policy_versions(batch)
        oldest = versions.reshape(batch.batch_size[0], -1).min(dim=1).values
        keep = oldest >= min_version
        stale = int((~keep).sum())
        if stale == 0:
            return batch
        self.replay.count_dropped_stale.remote(stale)
        return torch.cat([batch[keep], await self._sample(stale)])

    # ---- training -----------------------------------------------------------------------
    async def train_epoch(self, policy_version: int) -> dict[str, float]:
        """One epoch on a fresh super-batch; returns mean metrics of this rank."""
        self.next_version = policy_version
        batch = await self._drop_stale(await self._next_super_batch())
        self.next_version = policy_version + 1  # what a prefetch from now on is for
        return await asyncio.to_thread(self._train_on, batch, policy_version)

    def _train_on(self, batch: TensorDict, policy_version: int) -> dict[str, float]:
        start = time.perf_counter()
        lag = (policy_version - policy_versions(batch)).float()
        batch = batch.to(self.device)
        mb = self.cfg.train_batch_size
        rows = []
        for _ in range(self.cfg.updates_per_epoch):
            order = torch.randperm(batch.batch_size[0], device=self.device)
            if self.cfg.advantage == "gae":
                adv_all = batch["advantage"]
                if self.cfg.normalize_advantages:
                    adv_all = distributed_normalize(adv_all)
            for i in range(0, len(order), mb):
                idx = order[i : i + mb]
                if self.cfg.advantage == "gae":
                    rows.append(self._gae_step(batch[idx], adv_all[idx]))
                else:
                    rows.append(self._vtrace_step(batch[idx]))
        metrics = mean_metrics(rows)
        self.skipped_updates = self.engine.skipped_steps
        metrics.update({
            "policy_lag_values": lag.long().tolist(),
            "policy_lag_mean": float(lag.mean()),
            "policy_lag_max": float(lag.max()),
            "lr_policy": self.scheduler.get_last_lr()[0],
            "lr_value": self.scheduler.get_last_lr()[1],
            "global_step": self.global_step,
            "skipped_updates": self.skipped_updates,
            "epoch_seconds": time.perf_counter() - start,
        })
        return metrics

    def _loss_and_step(self, logp, logp_old, entropy, value, value_old, value_target, adv) -> dict[str, float]:
        cfg = self.cfg
        policy_loss, metrics = compute_policy_loss(cfg.clip_mode, logp, logp_old, adv.unsqueeze(-1), params=self.loss_params)
        v_loss = value_loss(value, value_old, value_target, cfg.value_clip_eps)
        entropy_mean = entropy.sum(-1).mean()
        loss = policy_loss + cfg.value_coef * v_loss - cfg.entropy_coef * entropy_mean
        if cfg.kl_coef > 0:
            loss = loss + cfg.kl_coef * kl_penalty(logp, logp_old.detach(), "k3").mean()
        loss, guarded = ratio_guard(loss, metrics["ratio_mean"], cfg.ratio_threshold)
        self.engine.backward(loss)
        self.engine.step()
        self.global_step = self.engine.global_steps
        metrics.update(policy_loss=policy_loss.item(), value_loss=v_loss.item(), entropy=entropy_mean.item(),
                       loss=loss.item(), ratio_guard_skipped=float(guarded))
        return metrics

    def _gae_step(self, mb: TensorDict, adv: torch.Tensor) -> dict[str, float]:
        logp, entropy, value = self.engine(mb["obs"], mb[self.engine.module.action_key])
        return self._loss_and_step(logp, mb["logp"], entropy, value, mb["value"], mb["value_target"], adv)

    def _vtrace_step(self, mb: TensorDict) -> dict[str, float]:
        cfg, steps = self.cfg, mb["steps"]
        b, t = steps.batch_size
        flat = steps.reshape(b * t)
        logp, entropy, value = self.engine(flat["obs"], flat[self.engine.module.action_key])
        with torch.no_grad():
            bootstrap = self.engine.module.value(mb["bootstrap_obs"])
        time_major = lambda x: x.reshape(b, t).transpose(0, 1)  # noqa: E731
        log_rhos = time_major((logp.detach() - flat["logp"]).sum(-1))
        discounts = cfg.gamma * (1.0 - time_major(flat["done"].to(value.dtype)))
        vs, pg_adv = vtrace(log_rhos, discounts, time_major(flat["reward"]), time_major(value.detach()), bootstrap,
                            cfg.vtrace_clip_rho, cfg.vtrace_clip_c, cfg.vtrace_clip_pg_rho)
        flat_major = lambda x: x.transpose(0, 1).reshape(b * t)  # noqa: E731
        adv = flat_major(pg_adv)
        if cfg.normalize_advantages:
            adv = distributed_normalize(adv)
        return self._loss_and_step(logp, flat["logp"], entropy, value, flat["value"], flat_major(vs), adv)

    # ---- weights ------------------------------------------------------------------------
    def weight_signature(self) -> list[tuple[str, tuple[int, ...], str]]:
        return tensor_signature(self.engine.module.inference_tensors())

    async def join_weight_sync(self, world_size: int, addr: str, port: int, timeout_s: float, member_names: list[str]) -> None:
        if self._sync is not None:  # rebuilding the group after a member failed
            self._sync.close()
        self._sync = await asyncio.to_thread(
            WeightSyncGroup, 0, world_size, addr, port, timeout_s=timeout_s, member_names=member_names
        )

    async def broadcast_weights(self) -> float:
        """Rank 0 sends the inference tensors to every inference actor; returns seconds taken."""
        start = time.perf_counter()
        tensors = [t.detach() for _, t in self.engine.module.inference_tensors()]
        await self._sync.broadcast_async(tensors)
        return time.perf_counter() - start

    # ---- checkpoints --------------------------------------------------------------------
    async def hold_prefetch(self) -> int:
        """Freeze the prefetch (a sample in flight lands first) until ``save_checkpoint``;
        returns how many fetched super-batches wait untrained."""
        try:  # the prefetch holds the lock while it waits for a short buffer to fill
            await asyncio.wait_for(self._lock().acquire(), self.cfg.actor_timeout_s)
        except asyncio.TimeoutError:
            raise ActorTimeoutError(f"{self.name}: the prefetch did not let go within actor_timeout_s="
                               f"{self.cfg.actor_timeout_s:g} s (replay buffer short of a super-batch?)") from None
        return len(self._pending())

    def _pending(self) -> list[TensorDict]:
        queued = list(self._ready._queue) if self._ready is not None else []  # noqa: SLF001 (a snapshot, not a get)
        return [*self._restored, *queued, *([self._held] if self._held is not None else [])]

    async def save_checkpoint(self, directory: str) -> None:
        """Write this rank's part of a checkpoint (rank 0 also the weights); releases the hold."""
        try:
            await asyncio.to_thread(self._write_checkpoint, Path(directory))
        finally:
            if self._fetching is not None and self._fetching.locked():
                self._fetching.release()

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

    def load_checkpoint(self, directory: str) -> dict[str, int]:
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
        pending = sorted(directory.glob(f"pending-trainer-{self.rank}-*.safetensors"),
                         key=lambda p: int(p.stem.rsplit("-", 1)[1]))
        self._restored = [ckpt.load_tensordict(p) for p in pending]
        return {"global_step": self.global_step, "pending": len(self._restored)}

    async def pid(self) -> int:
        return os.getpid()

    def status(self) -> dict[str, int]:
        return {"rank": self.rank, "global_step": self.global_step, "skipped_updates": self.skipped_updates}

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.engine.module.inference_tensors()}

    def shutdown(self) -> None:
        if self._prefetch is not None:
            self._prefetch.cancel()
        if self._sync is not None:
            self._sync.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
