"""TrainerRank (TrainerActor is its Ray face): one data-parallel rank under DeepSpeed ZeRO-2.

A background coroutine prefetches the next super-batch from the replay buffer while the
current one trains (``prefetch_batches``, default 1); the epoch itself runs in a thread so the
actor's event loop keeps serving the prefetch and the weight broadcast.
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterator, Optional

import ray
import torch
from tensordict import TensorDict

from async_rl.algo import LossInputs, Objective, TrainModel, advantage_estimator, draws_whole_groups
from async_rl.algo.functional import StepCounts, optimiser_step_counts
from async_rl import checkpoint as ckpt
from async_rl.actors.groups import group_minibatch_order, keep_whole_groups
from async_rl.actors.prefetch import Prefetcher, RequestIds, poll, sample_once
from async_rl.actors.trainer_setup import (HoldingAdamW, deepspeed_config, delayed, optimizer_groups, training_model,
                                           warmup_cosine)
from async_rl.experience import policy_versions
from async_rl.logger import mean_metrics
from async_rl.policies.initial_weights import export_policy
from async_rl.policies.reference import ReferencePolicy, frozen_copy
from async_rl.process_setup import clear_stale_build_locks, configure_torch, precision_dtype, resolve_device
from async_rl.weights.rendezvous import connect_store, find_free_port, host_store, interface_of, is_loopback
from async_rl.weights.signature import tensor_signature
from async_rl.weights.group import WeightSyncGroup

if TYPE_CHECKING:
    from async_rl.config.schema import RunConfig


# An epoch "waited for data" when its super-batch was not ready: a prefetched one is handed over in
# microseconds, one fetched at the epoch's start (sync mode) in a few milliseconds.
DATA_WAIT_S = 0.01


class TrainerRank:
    def __init__(self, rank: int, world_size: int, master_addr: Optional[str], master_port: Optional[int], cfg: RunConfig,
                 policy_factory: Callable[[], torch.nn.Module], replay: Any, gpu_id: Optional[int] = None) -> None:
        """``master_addr``/``master_port`` may be None and given to ``setup`` instead (rank 0's
        ``rendezvous_endpoint`` chooses them on its node). ``gpu_id`` pins a GPU by hand (explicit
        ids); None keeps the CUDA_VISIBLE_DEVICES Ray gave this actor for its ``num_gpus``."""
        # LOCAL_RANK 0: every rank sees only its own GPU(s) as cuda:0.
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK="0")
        self._set_master(master_addr, master_port)
        if gpu_id is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu_id)
        configure_torch(cfg.seed + rank, cfg.torch_threads)
        self.rank, self.world_size, self.cfg = rank, world_size, cfg
        self.name = f"trainer-{rank}"
        self.policy_factory, self.replay = policy_factory, replay
        self.objective = Objective.from_config(cfg)  # clip params resolved here, once
        self.whole_groups = draws_whole_groups(cfg.clip_mode, cfg.clip_params, cfg.group_size)  # PACS's batches
        self.estimator = advantage_estimator(cfg.advantage)
        # No critic, nothing to warm up: a config with a warm-up for PPO serves a GRPO comparison unchanged.
        self.critic_warmup_epochs = cfg.critic_warmup_epochs if self.estimator.needs_critic else 0
        self.skipped_minibatches = 0  # this rank's minibatches left out (ratio guard, non-finite loss)
        self._window_useful = 0  # minibatches of the current accumulation window that this rank used
        self.engine = None
        self.reference: Optional[ReferencePolicy] = None  # only when the objective reads one (setup)
        self._prefetch: Optional[Prefetcher] = None  # created on the actor's event loop
        # Two streams of asks that may be in flight together (the prefetch, and the refill of stale
        # rows during an epoch); each asks one at a time, so each has its own request ids.
        self._request_ids = {"prefetch": RequestIds(f"{self.name}/prefetch"), "refill": RequestIds(f"{self.name}/refill")}
        self._sync: Optional[WeightSyncGroup] = None
        # Rank 0: (version, copy of the inference tensors) of the last completed version, what every
        # broadcast sends. A broadcast may come mid-epoch (heal() re-sends to a restarted inference
        # actor while this rank trains): the live parameters are then between two versions and an
        # optimiser step may rewrite them while they are on the wire.
        self._published: Optional[tuple[int, list[torch.Tensor]]] = None
        self.global_step = 0
        self.skipped_updates = 0
        self.next_version = 0  # the policy version the next train_epoch will be called with
        self.data_waits, self.data_wait_seconds = 0, 0.0  # epochs that waited for their super-batch, and how long
        self._restored: list[TensorDict] = []  # super-batches from a checkpoint, trained on first
        self._ready: Optional[TensorDict] = None  # the super-batch ready_batch took, trained on next

    # ---- set-up -------------------------------------------------------------------------
    @staticmethod
    def _set_master(addr: Optional[str], port: Optional[int]) -> None:
        if addr is not None and port is not None:
            os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port))

    def rendezvous_endpoint(self, loopback: bool) -> tuple[str, int]:
        """(address, port) for a store this actor will host: 127.0.0.1 for a run on one host,
        else this node's IP as Ray knows it; the port is free on that address of this node."""
        addr = "127.0.0.1" if loopback else ray.util.get_node_ip_address()
        return addr, find_free_port(addr)

    def where(self) -> dict[str, Any]:
        """Node, process and devices of this rank (placement checks and error messages)."""
        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
                "pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

    def setup(self, master_addr: Optional[str] = None, master_port: Optional[int] = None) -> dict[str, int]:
        """Initialise torch.distributed (training group) and the DeepSpeed engine; the master
        address/port (rank 0's, from its ``rendezvous_endpoint``) if not given at construction."""
        import deepspeed  # heavy; only trainers need it

        self._set_master(master_addr, master_port)
        if "MASTER_ADDR" not in os.environ:
            raise ValueError(f"{self.name}: no training-group master address; pass rank 0's rendezvous_endpoint()")
        device = resolve_device(self.cfg.device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        self._init_training_group(backend)
        for lock in clear_stale_build_locks():
            print(f"{self.name}: removed a stale JIT build lock {lock} (a build killed midway; torch would wait forever)")
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)  # adopts the group made above
        dtype = precision_dtype(self.cfg.precision, device)
        model = training_model(self.cfg, self.policy_factory)
        # The reference policy (KL to it, PACS): with LoRA this model with its adapters off, else a frozen
        # copy taken here, before DeepSpeed hooks the model.
        frozen = frozen_copy(model) if self.objective.needs_reference else None
        groups = optimizer_groups(self.cfg, model)
        trainable = [p for g in groups for p in g["params"]]
        self.optimizer = optimizer = HoldingAdamW(groups, weight_decay=self.cfg.weight_decay)
        schedule = warmup_cosine(self.cfg.warmup_steps, self.cfg.lr_decay_steps, self.cfg.min_lr_ratio)
        # The policy's schedule starts when the critic warm-up's optimiser steps are over.
        warmup_optimizer_steps = self.critic_warmup_epochs * self.cfg.updates_per_epoch * self.cfg.optimizer_steps_per_update
        policy_schedule = delayed(schedule, warmup_optimizer_steps)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, [policy_schedule if g["name"] == "policy" else schedule for g in groups])
        self.engine, _, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=deepspeed_config(self.cfg, dtype)
        )
        self.device = self.engine.device
        if self.objective.needs_reference:
            self.reference = ReferencePolicy(self.engine.module, frozen)
        self._publish(self.next_version)
        return {"params": sum(p.numel() for p in model.parameters()), "trainable": sum(p.numel() for p in trainable)}

    def _init_training_group(self, backend: str) -> None:
        """The training group on rank 0's store at MASTER_ADDR:MASTER_PORT. The store listens on that
        address only and gloo's pairs on this node's own (loopback on one host, the node IP Ray
        reports on a cluster); torch's defaults listen on every interface and resolve the
        hostname, which another node may not reach. Waits at most ``collective_timeout_s``."""
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        local = addr if is_loopback(addr) else ray.util.get_node_ip_address()
        if is_loopback(addr):
            os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        else:  # a user's choice of interface on a cluster wins
            os.environ.setdefault("GLOO_SOCKET_IFNAME", interface_of(local))
        timeout_s = self.cfg.collective_timeout_s
        timeout = datetime.timedelta(seconds=timeout_s)
        if self.rank == 0:
            store = host_store(addr, port, self.world_size, timeout)
        else:
            store = connect_store(addr, port, self.world_size, timeout_s, self.name,
                                  f"trainer-0 (training-group master; this rank is on {local})")
        torch.distributed.init_process_group(backend, store=store, rank=self.rank, world_size=self.world_size,
                                             timeout=timeout)

    # ---- data ---------------------------------------------------------------------------
    def _min_version(self) -> Optional[int]:
        """Oldest behaviour version the next epoch may train on (``max_policy_lag``)."""
        lag = self.cfg.max_policy_lag
        return None if lag is None else self.next_version - lag

    def _ask(self, n: Optional[int] = None, stream: str = "prefetch") -> Awaitable[Optional[TensorDict]]:
        """One ask of the replay buffer for a super-batch (or ``n`` items): None while it holds too few."""
        cfg = self.cfg
        # max_sample_reuse counts training passes per collected item; the buffer counts draws.
        draws = None if cfg.max_sample_reuse is None or cfg.sync else cfg.max_sample_reuse / cfg.updates_per_epoch
        return sample_once(self.replay, n or cfg.super_batch_size, cfg.replay_sampling == "consume", self._min_version(),
                           cfg.actor_timeout_s, self.name, draws, self._request_ids[stream])

    async def _refill(self, n: int) -> TensorDict:
        """``n`` items in place of stale rows, polling while the buffer holds too little;
        ActorTimeoutError naming the buffer after ``actor_timeout_s``."""
        return await poll(functools.partial(self._ask, n, "refill"), n, self.cfg.actor_timeout_s, self.name)

    def _prefetcher(self) -> Prefetcher:
        if self._prefetch is None:  # needs the actor's running event loop
            depth = 0 if self.cfg.sync else self.cfg.prefetch_batches  # sync: what was collected after the broadcast
            self._prefetch = Prefetcher(self._ask, self.cfg.super_batch_size, depth, self.cfg.actor_timeout_s, self.name)
        return self._prefetch

    async def _next_super_batch(self) -> TensorDict:
        if self._restored:
            return self._restored.pop(0)
        return await self._prefetcher().next()

    async def _drop_stale(self, batch: TensorDict) -> TensorDict:
        """A prefetched batch may have aged past ``max_policy_lag`` while it waited: replace
        its too-old items by fresh ones (the dropped ones count in replay/dropped_stale)."""
        min_version = self._min_version()
        if min_version is None:
            return batch
        versions = policy_versions(batch)
        oldest = versions.reshape(batch.batch_size[0], -1).min(dim=1).values
        keep = oldest >= min_version
        if self.whole_groups and "group_id" in batch.keys():  # refill by whole groups (PACS's minibatches)
            keep = keep_whole_groups(keep, batch["group_id"])
        stale = int((~keep).sum())
        if stale == 0:
            return batch
        self.replay.count_dropped_stale.remote(stale)
        return torch.cat([batch[keep], await self._refill(stale)])

    # ---- training -----------------------------------------------------------------------
    async def ready_batch(self, policy_version: int) -> float:
        """Take this epoch's super-batch (waiting for the buffer, up to ``actor_timeout_s``) and hold it
        for ``train_epoch``; returns the seconds waited. Called on every rank before any rank trains
        (``epoch_on_every_rank``): this wait is bounded by ``actor_timeout_s``, the epoch's collectives by the
        shorter ``collective_timeout_s``."""
        self.next_version = policy_version
        asked = time.perf_counter()
        batch = await self._drop_stale(await self._next_super_batch())
        waited = time.perf_counter() - asked
        self.data_waits += waited > DATA_WAIT_S
        self.data_wait_seconds += waited
        self.next_version = policy_version + 1  # what a prefetch from now on is for
        self._ready = batch
        return waited

    async def train_epoch(self, policy_version: int) -> dict[str, float]:
        """One epoch on the super-batch ``ready_batch`` took (taken now if none is held); returns mean
        metrics of this rank."""
        if self._ready is None:
            await self.ready_batch(policy_version)
        batch, self._ready = self._ready, None
        metrics = await asyncio.to_thread(self._train_on, batch, policy_version)
        metrics.update(data_waits=self.data_waits, data_wait_seconds=self.data_wait_seconds)
        return metrics

    def _train_on(self, batch: TensorDict, policy_version: int) -> dict[str, float]:
        start = time.perf_counter()
        lag = (policy_version - policy_versions(batch)).float()
        batch = self.estimator.prepare(batch.to(self.device), self.cfg)
        recompute_metrics: dict[str, float] = {}
        if self.cfg.recompute_logp:
            batch, recompute_metrics = self._recompute_behaviour_logp(batch)
        module = self.engine.module
        model = TrainModel(evaluate=self.engine, value=module.value, action_key=module.action_key,
                           reference=self.reference, action_mask=module.action_mask)
        mb = self.cfg.train_batch_size
        rows = []
        self._window_useful = 0
        # Critic warm-up: the value loss alone, and the policy's weights and optimiser state left as they are.
        critic_only = policy_version < self.critic_warmup_epochs
        self.optimizer.held = frozenset({"policy"} if critic_only else ())
        for _ in range(self.cfg.updates_per_epoch):
            order = self._minibatch_order(batch)
            step_counts = self._step_counts(batch, order) if self.objective.loss_agg == "global-token-mean" else None
            for k, i in enumerate(range(0, len(order), mb)):
                inputs = self.estimator.loss_inputs(batch[order[i : i + mb]], model, self.cfg)
                if step_counts is not None:
                    inputs.step_counts = step_counts[k // self.cfg.accumulation_steps]
                rows.append(self._loss_and_step(inputs, critic_only))
        self._publish(policy_version + 1)  # the weights are now this version, whole
        metrics = mean_metrics(rows)
        self.skipped_updates = self.engine.skipped_steps
        metrics.update({
            "policy_lag_values": lag.long().tolist(),
            "policy_lag_mean": float(lag.mean()),
            "policy_lag_max": float(lag.max()),
            "lr_policy": self.scheduler.get_last_lr()[0],
            **({"lr_value": self.scheduler.get_last_lr()[1]} if len(self.scheduler.get_last_lr()) > 1 else {}),
            "global_step": self.global_step,
            "skipped_updates": self.skipped_updates,
            "skipped_minibatches": self.skipped_minibatches,
            "epoch_seconds": time.perf_counter() - start,
            "critic_warmup": float(critic_only),
            **recompute_metrics,
        })
        return metrics

    def _actions(self, batch: TensorDict) -> torch.Tensor:
        """The batch's actions ``[N, ...]``: per step record, or per segment of steps (``[N, T, ...]``)."""
        key = self.engine.module.action_key
        return batch[key] if key in batch.keys() else batch["steps"][key]

    def _step_counts(self, batch: TensorDict, order: torch.Tensor) -> Optional[list[StepCounts]]:
        """``global-token-mean``: each optimiser step's counts of this pass (``StepCounts``), from the super-batch
        before any micro-batch runs (one all-reduce, which every rank makes); None for fixed-size actions."""
        real = self.engine.module.action_mask(self._actions(batch))
        if real is None:
            return None
        return optimiser_step_counts(real, order, self.cfg.train_batch_size, self.cfg.accumulation_steps, self.world_size)

    @torch.no_grad()
    def _recompute_behaviour_logp(self, batch: TensorDict) -> tuple[TensorDict, dict[str, float]]:
        """``recompute_logp``: the batch's behaviour log-probs replaced by this rank's weights' (verl's
        ``recompute_log_prob``), one forward per ``train_batch_size`` rows, in the mode training runs in. Reports how
        far the sampler's were (``recompute_logp_abs_diff_*``, real elements only) and the time taken."""
        start = time.perf_counter()
        module, mb = self.engine.module, self.cfg.train_batch_size
        actions = batch[module.action_key]
        fresh = torch.cat([self.engine(batch["obs"][i:i + mb], actions[i:i + mb])[0]
                           for i in range(0, batch.batch_size[0], mb)])
        fresh = fresh.to(batch["logp"].dtype).reshape(batch["logp"].shape)
        real = module.action_mask(actions)
        real = torch.ones_like(fresh, dtype=torch.bool) if real is None else real.reshape(fresh.shape)
        diff = (fresh - batch["logp"]).abs()[real].double()
        batch = batch.copy()
        batch["logp"] = fresh
        return batch, {"recompute_logp_seconds": time.perf_counter() - start,
                       "recompute_logp_abs_diff_mean": float(diff.mean()) if diff.numel() else 0.0,
                       "recompute_logp_abs_diff_max": float(diff.max()) if diff.numel() else 0.0}

    def _minibatch_order(self, batch: TensorDict) -> torch.Tensor:
        """Rows in random order; for a loss comparing a group's members whole groups stay together, members
        taking turns (a minibatch of a multiple of group_size rows then holds every member of its groups)."""
        if self.whole_groups and "group_member" in batch.keys():
            return group_minibatch_order(batch["group_id"], batch["group_member"]).to(self.device)
        return torch.randperm(batch.batch_size[0], device=self.device)

    def _loss_and_step(self, inputs: LossInputs, critic_only: bool = False) -> dict[str, float]:
        """Backward and step one minibatch. ZeRO-2's backward and step hold collectives, so every rank
        makes the same calls: a skipped minibatch backs its own loss with every parameter's gradient
        replaced by 0 (this rank adds nothing to the update), and at the end of an accumulation window
        that no rank used, by NaN, so that DeepSpeed's overflow check skips the optimiser step on every
        rank (no weight decay, no momentum step, no scheduler step; counted in skipped_updates).
        Its own loss, not a stand-in over the parameters: ZeRO-2 packs gradients into its reduction
        buckets in the order backward makes them ready and all-reduces them element by element, so
        a skipping rank must make them ready in the same order as a training rank (another graph put
        one parameter's gradient on another's, or gave the ranks collectives of different sizes)."""
        out = self.objective(inputs, critic_only)
        self._window_useful += out.skip is None
        step_wanted = True
        if self.engine.is_gradient_accumulation_boundary():
            step_wanted = self._any_rank(self._window_useful > 0)
            self._window_useful = 0
        if out.skip is not None:
            self.skipped_minibatches += 1
            with self._gradients_replaced(0.0 if step_wanted else float("nan")):
                self.engine.backward(out.loss)
        else:
            self.engine.backward(out.loss)
        self.engine.step()
        self.global_step = self.engine.global_steps
        return out.terms

    @contextlib.contextmanager
    def _gradients_replaced(self, value: float) -> Iterator[None]:
        """Every trainable parameter's gradient from a backward inside the block is ``value`` (a leaf
        hook runs before the gradient is accumulated, hence before ZeRO-2's own hook reads it; NaN or
        inf inside a skipped minibatch's graph never reaches it)."""
        handles = [p.register_hook(functools.partial(torch.full_like, fill_value=value))
                   for p in self.engine.module.parameters() if p.requires_grad]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _any_rank(self, flag: bool) -> bool:
        """``flag`` OR-ed over the training group (one small all-reduce)."""
        t = torch.tensor([float(flag)], device=self.device)
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return bool(t.item())

    # ---- supervised fine-tuning (launch/sft.py) ---------------------------------------------
    def train_supervised(self, batch: TensorDict) -> dict[str, float]:
        """One pass of behaviour cloning over this rank's shard of demonstration frames (``obs``,
        ``env_action``), in minibatches of ``train_batch_size``, with the engine RL trains. Every
        rank gets a shard of one size: ZeRO-2's backward and step are collectives."""
        batch = batch.to(self.device)
        module, mb, rows = self.engine.module, self.cfg.train_batch_size, []
        for first in range(0, batch.batch_size[0], mb):
            part = batch[first:first + mb]
            loss, terms = module.imitation_loss(part["obs"], part["env_action"])
            self.engine.backward(loss)
            self.engine.step()
            rows.append(terms)
        self.global_step = self.engine.global_steps
        return {**mean_metrics(rows), "lr_policy": self.scheduler.get_last_lr()[0], "global_step": self.global_step}

    def export_policy(self, directory: str, meta: dict[str, Any], probe: TensorDict) -> list[list[float]]:
        """Rank 0 writes the trained policy (LoRA merged) where an RL run's ``init_from`` reads it;
        returns its deterministic env actions on ``probe`` observations (what the export must reproduce)."""
        export_policy(self.engine.module, Path(directory), meta)
        module = self.engine.module
        with torch.inference_mode():
            training = module.training
            actions = module.eval().act(probe.to(self.device), True)["env_action"].float().cpu().tolist()
            module.train(training)
        return actions

    # ---- weights ------------------------------------------------------------------------
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

    # ---- checkpoints --------------------------------------------------------------------
    async def hold_prefetch(self) -> int:
        """Freeze the prefetch (a sample in flight lands first) until ``save_checkpoint``;
        returns how many fetched super-batches wait untrained."""
        await self._prefetcher().hold()
        return len(self._pending())

    def _pending(self) -> list[TensorDict]:
        held = [self._ready] if self._ready is not None else []
        return [*held, *self._restored, *(self._prefetch.pending() if self._prefetch is not None else [])]

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
        self._publish(self.next_version)  # the loaded weights are the version the next epoch starts from
        pending = sorted(directory.glob(f"pending-trainer-{self.rank}-*.safetensors"),
                         key=lambda p: int(p.stem.rsplit("-", 1)[1]))
        self._restored = [ckpt.load_tensordict(p) for p in pending]
        return {"global_step": self.global_step, "pending": len(self._restored)}

    async def pid(self) -> int:
        return os.getpid()

    def status(self) -> dict[str, int]:
        return {"rank": self.rank, "global_step": self.global_step, "skipped_updates": self.skipped_updates,
                "skipped_minibatches": self.skipped_minibatches}

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.engine.module.inference_tensors()}

    def shutdown(self) -> None:
        if self._prefetch is not None:
            self._prefetch.close()
        if self._sync is not None:
            self._sync.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


@ray.remote
class TrainerActor(TrainerRank):
    """The Ray face of TrainerRank (one ZeRO-2 rank): an actor of its methods; tests may use TrainerRank in process."""
