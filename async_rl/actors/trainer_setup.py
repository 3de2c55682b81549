"""What a trainer rank trains and how: the model (LoRA, frozen critic), its optimiser groups, the
DeepSpeed ZeRO-2 config, the learning-rate schedule, and the AdamW that holds groups during a critic warm-up;
and ``TrainerSetup``, which joins the training group and builds the DeepSpeed engine from them.
"""
from __future__ import annotations

import datetime
import math
import os
from typing import TYPE_CHECKING, Any, Callable, Optional

import ray
import torch

from async_rl.policies.lora import apply_lora
from async_rl.policies.reference import ReferencePolicy, frozen_copy
from async_rl.process_setup import clear_stale_build_locks, precision_dtype, resolve_device
from async_rl.weights.rendezvous import connect_store, find_free_port, host_store, interface_of, is_loopback

if TYPE_CHECKING:
    from async_rl.algo import Objective
    from async_rl.config.schema import ObjectiveSection, PolicySection, RunConfig


def warmup_cosine(warmup: int, decay_steps: int, min_ratio: float) -> Callable[[int], float]:
    """LR multiplier: linear warm-up, then cosine decay to ``min_ratio`` at ``decay_steps``."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min((step - warmup) / max(decay_steps - warmup, 1), 1.0)
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def deepspeed_config(cfg: RunConfig, dtype: torch.dtype = torch.float32) -> dict:
    """DeepSpeed's config for training with weights in ``dtype`` (float32, bfloat16 or float16).

    float16 turns on dynamic loss scaling: the loss is multiplied by a scale that halves after
    an overflowing step (that step is skipped) and doubles after ``loss_scale_window`` clean ones.
    """
    return {
        "train_micro_batch_size_per_gpu": cfg.train_batch_size,
        "gradient_accumulation_steps": cfg.accumulation_steps,
        "gradient_clipping": cfg.max_grad_norm,
        "zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_scatter": True, "contiguous_gradients": True},
        # torch AdamW needs no compiled op; DeepSpeed's own Adams JIT-compile for ~100 s on CPU.
        "zero_allow_untested_optimizer": True,
        # A non-finite gradient norm skips the step (counted in engine.skipped_steps) in bf16 too.
        "bf16": {"enabled": dtype == torch.bfloat16, "check_grad_overflow": True},
        # loss_scale 0 = dynamic, starting at 2**initial_scale_power; hysteresis: overflows in a row
        # tolerated before the scale drops.
        "fp16": {"enabled": dtype == torch.float16, "loss_scale": 0, "initial_scale_power": 16,
                 "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


class HoldingAdamW(torch.optim.AdamW):
    """AdamW that leaves the parameter groups named in ``held`` alone: no update, no weight decay, no state
    (ZeRO-2 steps its groups one at a time, each through this ``step``). A critic warm-up holds ``policy``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held: frozenset[str] = frozenset()

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:  # type: ignore[override]  # torch's overloads say the same
        groups = self.param_groups
        self.param_groups = [g for g in groups if g.get("name") not in self.held]
        try:
            return super().step(closure)
        finally:
            self.param_groups = groups


def delayed(schedule: Callable[[int], float], steps: int) -> Callable[[int], float]:
    """``schedule`` starting ``steps`` optimiser steps late (the policy's, after a critic warm-up)."""
    return lambda step: schedule(max(step - steps, 0))


def training_model(cfg: PolicySection, policy_factory: Callable[[], Any]) -> Any:
    """The model a trainer rank trains: the policy, with LoRA adapters when ``cfg.lora_rank`` > 0,
    its critic frozen when the estimator needs none (LoRA gave the value head adapters: frozen too)."""
    model = policy_factory()
    if cfg.lora_rank > 0:
        model = apply_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target_modules,
                           cfg.lora_trainable)
    if not model.has_critic:
        model.drop_critic()
    model.sync_adapters_only = cfg.lora_rank > 0 and cfg.lora_sync == "adapters"
    model.synced_names = frozenset(n for n, p in model.named_parameters() if p.requires_grad)
    return model


def optimizer_groups(cfg: ObjectiveSection, model: Any) -> list[dict[str, Any]]:
    """The trainable parameters as optimiser groups ``policy`` and ``value`` (own learning rates);
    without a critic there is no value group."""
    value_ids = {id(p) for p in model.value_parameters()}  # asked after LoRA: the value head's adapters are in
    trainable = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in trainable if id(p) not in value_ids], "lr": cfg.lr_policy, "name": "policy"},
        {"params": [p for p in trainable if id(p) in value_ids], "lr": cfg.lr_value, "name": "value"},
    ]
    return [g for g in groups if g["params"]]


class TrainerSetup:
    """Mixin of ``TrainerRank``: its place in the training group and its engine. It reads the rank's ``rank``,
    ``world_size``, ``name``, ``cfg``, ``policy_factory``, ``objective``, ``critic_warmup_epochs`` and
    ``next_version``; ``setup`` makes ``optimizer``, ``scheduler``, ``engine``, ``device`` and ``reference``
    and publishes the first weights (``_publish``: ``trainer_sync.py``)."""

    rank: int
    world_size: int
    name: str
    cfg: RunConfig
    policy_factory: Callable[[], torch.nn.Module]
    objective: Objective
    critic_warmup_epochs: int
    next_version: int
    reference: Optional[ReferencePolicy]

    if TYPE_CHECKING:  # trainer_sync.py's, which it calls
        def _publish(self, version: int) -> None: ...

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
        import deepspeed  # noqa: PLC0415 (heavy; only trainers need it)

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
