"""A trainer rank's supervised fine-tuning (``launch/sft.py``, driven by ``orchestration/supervised.py``):
behaviour cloning on demonstration frames with the engine RL trains, and the export of the trained policy.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDict

from async_rl.logger import mean_metrics
from async_rl.policies.initial_weights import export_policy

if TYPE_CHECKING:
    from async_rl.config.schema import RunConfig


class SupervisedTraining:
    """Mixin of ``TrainerRank``: its supervised passes and export. It reads the rank's ``cfg``, ``engine``,
    ``scheduler`` and ``device``, and advances ``global_step``."""

    cfg: RunConfig
    engine: Any
    scheduler: Any
    device: torch.device
    global_step: int

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
