"""What a trainer rank trains and how: the model (LoRA, frozen critic), its optimiser groups, the
DeepSpeed ZeRO-2 config, the learning-rate schedule, and the AdamW that holds groups during a critic warm-up.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from async_rl.policies.lora import apply_lora

if TYPE_CHECKING:
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

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
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
