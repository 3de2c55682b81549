"""TrainerRank (TrainerActor is its Ray face): one data-parallel rank under DeepSpeed ZeRO-2.

This module is the training step: an epoch over the super-batch, minibatch by minibatch, with the
objective's loss and the optimiser step that every rank makes together. The rank's other jobs are
mixins beside it: joining the training group and building the engine (``trainer_setup.py``), data
intake (``trainer_intake.py``: a background coroutine prefetches the next super-batch from the replay
buffer while the current one trains, ``prefetch_batches``, default 1), the weight sync
(``trainer_sync.py``), checkpoints (``trainer_checkpoints.py``) and supervised fine-tuning with its
export (``trainer_supervised.py``). The epoch itself runs in a thread so the actor's event loop keeps
serving the prefetch and the weight broadcast.
"""
from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

import ray
import torch
from tensordict import TensorDict

from async_rl.actors.groups import group_contiguous_order, group_minibatch_order
from async_rl.actors.step_health import StepHealth, gradients_replaced
from async_rl.actors.trainer_checkpoints import TrainerCheckpoints
from async_rl.actors.trainer_intake import SuperBatchIntake
from async_rl.actors.trainer_setup import TrainerSetup
from async_rl.actors.trainer_supervised import SupervisedTraining
from async_rl.actors.trainer_sync import WeightPublisher
from async_rl.algo import LossInputs, Objective, TrainModel, advantage_estimator, draws_whole_groups
from async_rl.algo.functional import StepCounts, optimiser_step_counts
from async_rl.experience import policy_versions
from async_rl.logger import mean_metrics
from async_rl.process_setup import configure_torch, pin_gpu, trainer_rank_env

if TYPE_CHECKING:
    from async_rl.config.schema import RunConfig
    from async_rl.policies.reference import ReferencePolicy


class TrainerRank(TrainerSetup, SuperBatchIntake, WeightPublisher, TrainerCheckpoints, SupervisedTraining):
    """One ZeRO-2 rank. Here: its state and the training step (``train_epoch``). From the mixins, one job each:
    ``setup`` and placement, ``ready_batch`` (intake), ``join_weight_sync`` / ``broadcast_weights``,
    ``hold_prefetch`` / ``save_checkpoint`` / ``load_checkpoint``, ``train_supervised`` / ``export_policy``."""

    def __init__(self, rank: int, world_size: int, master_addr: Optional[str], master_port: Optional[int], cfg: RunConfig,
                 policy_factory: Callable[[], torch.nn.Module], replay: Any, gpu_id: Optional[str] = None) -> None:
        """``master_addr``/``master_port`` may be None and given to ``setup`` instead (rank 0's
        ``rendezvous_endpoint`` chooses them on its node). ``gpu_id`` pins a GPU by hand (explicit
        ids); None keeps the CUDA_VISIBLE_DEVICES Ray gave this actor for its ``num_gpus``."""
        pin_gpu(gpu_id, f"trainer-{rank}")  # first: CUDA reads the variable once
        os.environ.update(trainer_rank_env(rank, world_size, cfg.device))
        self._set_master(master_addr, master_port)
        configure_torch(cfg.seed + rank, cfg.torch_threads)
        self.rank, self.world_size, self.cfg = rank, world_size, cfg
        self.name = f"trainer-{rank}"
        self.policy_factory, self.replay = policy_factory, replay
        self.objective = Objective.from_config(cfg)
        self.whole_groups = draws_whole_groups(cfg.clip, cfg.group_size)  # PACS's batches
        self.estimator = advantage_estimator(cfg.advantage)
        # No critic, nothing to warm up: a config with a warm-up for PPO serves a GRPO comparison unchanged.
        self.critic_warmup_epochs = cfg.critic_warmup_epochs if self.estimator.needs_critic else 0
        self.skipped_minibatches = 0  # this rank's minibatches left out (ratio guard, non-finite loss)
        self.health = StepHealth()  # optimiser steps applied and skipped, and why
        self.engine = None
        self.reference: Optional[ReferencePolicy] = None  # only when the objective reads one (setup)
        self._init_intake()
        self._init_sync()
        self.global_step = 0
        self.skipped_updates = 0
        self.next_version = 0  # the policy version the next train_epoch will be called with

    # ---- training -----------------------------------------------------------------------
    async def train_epoch(self, policy_version: int) -> dict[str, Any]:
        """One epoch on the super-batch ``ready_batch`` took (taken now if none is held); returns mean
        metrics of this rank."""
        if self._ready is None:
            await self.ready_batch(policy_version)
        batch, self._ready = self._ready, None
        metrics = await asyncio.to_thread(self._train_on, batch, policy_version)
        metrics.update(data_waits=self.data_waits, data_wait_seconds=self.data_wait_seconds)
        return metrics

    def _train_on(self, batch: TensorDict, policy_version: int) -> dict[str, Any]:
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
        self.health.new_epoch()
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
        metrics: dict[str, Any] = mean_metrics(rows)  # and the lags of every item, a list
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
            **self.health.metrics(),
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
        taking turns (a minibatch of a multiple of group_size rows then holds every member of its groups); for a
        policy that shares its prompts' forward (``share_prompts``), each group's rows stay together."""
        if self.whole_groups and "group_member" in batch.keys():
            return group_minibatch_order(batch["group_id"], batch["group_member"]).to(self.device)
        if self.engine.module.share_prompts and "group_id" in batch.keys():
            return group_contiguous_order(batch["group_id"]).to(self.device)
        return torch.randperm(batch.batch_size[0], device=self.device)

    def _loss_and_step(self, inputs: LossInputs, critic_only: bool = False) -> dict[str, float]:
        """Backward and step one minibatch. ZeRO-2's backward and step hold collectives, so every rank
        makes the same calls: a skipped minibatch backs its own loss with every parameter's gradient
        replaced by 0 (this rank adds nothing to the update), and at the end of an accumulation window
        that no rank used, by NaN, so that DeepSpeed's overflow check skips the optimiser step on every
        rank (no weight decay, no momentum step, no scheduler step; counted in skipped_updates, and by origin
        in ``health``).
        Its own loss, not a stand-in over the parameters: ZeRO-2 packs gradients into its reduction
        buckets in the order backward makes them ready and all-reduces them element by element, so
        a skipping rank must make them ready in the same order as a training rank (another graph put
        one parameter's gradient on another's, or gave the ranks collectives of different sizes)."""
        out = self.objective(inputs, critic_only)
        self.health.minibatch(out.skip)
        boundary = self.engine.is_gradient_accumulation_boundary()
        step_wanted = self._any_rank(self.health.window_used()) if boundary else True
        if out.skip is not None:
            self.skipped_minibatches += 1
            with gradients_replaced(self.engine.module, 0.0 if step_wanted else float("nan")):
                self.engine.backward(out.loss)
        else:
            self.engine.backward(out.loss)
        self.engine.step()
        if boundary:
            self.health.step_done(self.engine.was_step_applied(), step_wanted, self.engine.fp16_enabled())
        self.global_step = self.engine.global_steps
        return out.terms

    def _any_rank(self, flag: bool) -> bool:
        """``flag`` OR-ed over the training group (one small all-reduce)."""
        t = torch.tensor([float(flag)], device=self.device)
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return bool(t.item())

    # ---- the actor's own ---------------------------------------------------------------------
    async def pid(self) -> int:
        return os.getpid()

    def status(self) -> dict[str, int]:
        return {"rank": self.rank, "global_step": self.global_step, "skipped_updates": self.skipped_updates,
                "skipped_minibatches": self.skipped_minibatches}

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
