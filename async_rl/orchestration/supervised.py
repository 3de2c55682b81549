"""Supervised fine-tuning (behaviour cloning) on recorded demonstrations, with the RL run's trainer
ranks: the same config, DeepSpeed ZeRO-2 engine, LoRA and precision. The trained policy is exported
(LoRA merged) for an RL run's ``init_from``.

The demonstration frames are preprocessed once in the driver exactly as a rollout worker
preprocesses observations, so the policy learns from the inputs it will later act on.
"""
from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import ray
import torch
from rich.console import Console
from tensordict import TensorDict

from async_rl.actors.trainer import TrainerActor
from async_rl.errors import ActorFailedError, ActorTimeoutError, ConfigError
from async_rl.logger import MetricsLogger, mean_metrics
from async_rl.orchestration.actor_group import ActorGroup, get_named
from async_rl.orchestration.placement import rendezvous
from async_rl.orchestration.runtime import obs_spec_of
from async_rl.policies import build_policy, build_preprocessor
from async_rl.policies.initial_weights import model_identity, with_initial_weights

if TYPE_CHECKING:
    from async_rl.config.schema import PolicySection, RunConfig
    from envs.base import TaskSet


# The first frames of the demonstrations: the trained policy's deterministic actions on them go in the
# summary, so that a loaded export can be checked to act as the trained policy did.
PROBE_FRAMES = 8
CALL_MINIBATCHES = 8  # minibatches per train_supervised call
PROGRESS_EVERY_S = 60.0  # a line within an epoch this often (a language model's epoch runs for many minutes on CPU)


def check_demos(cfg: RunConfig) -> Any:
    """The demonstrations of ``cfg.demos`` (driver-side, before Ray): a recording for this env that
    holds every camera the policy reads, or a JSONL file of text demonstrations (``demos.text``)."""
    if not cfg.demos:
        raise ConfigError("no demonstrations: pass --demos DIR (recorded with python -m async_rl.demos record) "
                          "or --demos FILE.jsonl (text)")
    from async_rl.demos import load_demos  # noqa: PLC0415 (launch/sft.py's --help answers without the demos package)
    from async_rl.demos.text import is_text_demos, load_text_demos  # noqa: PLC0415 (as above)

    if is_text_demos(cfg.demos):
        return load_text_demos(cfg.demos)

    try:
        demos = load_demos(cfg.demos)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"--demos {cfg.demos}: {exc}; record them with python -m async_rl.demos record") from None
    if demos.manifest.get("env") != cfg.env:
        raise ConfigError(f"--demos {cfg.demos} were recorded on env '{demos.manifest.get('env')}', this config trains "
                          f"'{cfg.env}'; pass demonstrations of {cfg.env}")
    if not demos.episodes:
        raise ConfigError(f"--demos {cfg.demos} holds no episodes; record some")
    recorded = set(demos.episodes[0].obs)
    wanted = [c for c in cfg.policy_kwargs.get("cameras", []) if c not in recorded]
    if wanted:
        raise ConfigError(f"the policy reads camera(s) {wanted}, the demonstrations hold {sorted(recorded)}; record them "
                          f"with --cameras {' '.join(cfg.policy_kwargs.get('cameras', []))}")
    return demos


def supervised_frames(cfg: PolicySection, task_set: TaskSet, demos: Any) -> TensorDict:
    """The demonstrations as the trainers learn from them (driver-side, before Ray: a demonstration the
    policy cannot take is one ConfigError)."""
    from async_rl.demos.text import TextDemos  # noqa: PLC0415 (as in check_demos)

    preprocess = build_preprocessor(cfg.policy, obs_spec_of(task_set), **cfg.policy_kwargs)
    if isinstance(demos, TextDemos):
        if not hasattr(preprocess, "encode_response"):
            raise ConfigError(f"--demos {demos.path} holds text; policy '{cfg.policy}' does not answer in text "
                              f"(pass --policy causal_lm, or recorded env demonstrations)")
        return text_frames(demos, preprocess)
    return demonstration_frames(demos, preprocess)


def text_frames(demos: Any, preprocess: Any) -> TensorDict:
    """Every pair as ``{"obs": <the prompt as a worker sends it>, "env_action": <the response's ids>}``."""
    obs, labels = [], []
    for number, pair in enumerate(demos.pairs, 1):
        try:
            obs.append(preprocess({"prompt": pair["prompt"]}))
            labels.append(preprocess.encode_response(pair["response"]))
        except ValueError as exc:  # a prompt or response longer than the policy's limits
            raise ConfigError(f"--demos {demos.path} line {number}: {exc}; raise it with --policy-kwargs or drop the line") from None
    return TensorDict({"obs": torch.stack(obs), "env_action": torch.stack(labels)}, batch_size=[len(obs)])


def demonstration_frames(demos: Any, preprocess: Any) -> TensorDict:
    """Every frame as ``{"obs": <preprocessed observation>, "env_action": <the expert's label>}``."""
    rows = []
    for episode in demos.episodes:
        steps = len(episode.expert_action)
        for t in range(steps):
            raw = {key: value[t] for key, value in episode.obs.items()}
            raw["instruction"] = episode.instruction
            rows.append(preprocess(raw, episode.task_name))
    obs = torch.stack(rows)
    labels = torch.as_tensor(np.concatenate([e.expert_action for e in demos.episodes]), dtype=torch.float32)
    return TensorDict({"obs": obs, "env_action": labels}, batch_size=[len(rows)])


def _shards(frames: TensorDict, ranks: int, minibatch: int, generator: torch.Generator) -> list[TensorDict]:
    """A shuffled epoch split into one equal shard per rank, each a whole number of minibatches
    (the remainder of the shuffle is dropped this epoch; a new shuffle drops other frames)."""
    order = torch.randperm(frames.batch_size[0], generator=generator)
    per_rank = (len(order) // (ranks * minibatch)) * minibatch
    if per_rank == 0:
        raise ConfigError(f"{len(order)} demonstration frames are fewer than num_trainers x train_batch_size "
                          f"({ranks} x {minibatch}); record more or lower train_batch_size")
    return [frames[order[r * per_rank:(r + 1) * per_rank]] for r in range(ranks)]


def supervised_trainer_config(cfg: RunConfig) -> Any:
    """``cfg`` without what only RL reads, for the trainers of a supervised run. A config made for RL (the
    SFT configs take the RL run's as their base) would otherwise delay the policy's learning-rate schedule by
    its critic warm-up (at warm-up's first factor, e.g. 1/20 of the rate, for 200 steps) and build a frozen
    reference for a KL that behaviour cloning never computes."""
    return cfg.model_copy(update={"critic_warmup_epochs": 0, "kl_ref_coef": 0.0, "kl_coef": 0.0})


def run_supervised(cfg: RunConfig, task_set: TaskSet, frames: TensorDict, console: Console) -> dict[str, Any]:
    """Behaviour cloning on ``frames`` (``supervised_frames``) for ``cfg.sft_epochs`` passes (or
    ``max_minutes``); exports the policy and returns a summary (also written to
    <log_dir>/sft_summary.json). Ray must be initialised."""
    started = time.monotonic()
    obs_spec = obs_spec_of(task_set)
    console.print(f"demonstrations: {frames.batch_size[0]} frames from {cfg.demos}")
    factory = with_initial_weights(
        functools.partial(build_policy, cfg.policy, obs_spec, task_set.action_dim, **cfg.policy_kwargs), cfg.init_from)
    trainer_cfg = supervised_trainer_config(cfg)
    trainers = ActorGroup("trainer", {
        f"trainer-{r}": TrainerActor.options(num_cpus=cfg.trainer_num_cpus).remote(  # type: ignore[attr-defined]  # an ActorClass: mypy ignores decorators
            r, cfg.num_trainers, None, None, trainer_cfg, factory, None)
        for r in range(cfg.num_trainers)}, cfg.actor_timeout_s)
    master = rendezvous(cfg, trainers["trainer-0"])
    info = trainers.call("setup", *master, timeout_s=cfg.startup_timeout_s, what="DeepSpeed set-up")["trainer-0"]
    console.print(f"[bold]policy[/] {cfg.policy}: {info['params']:,} parameters, {info['trainable']:,} trainable; "
                  f"{cfg.num_trainers} trainer rank(s) under ZeRO-2")
    logger = MetricsLogger(cfg.log_dir, cfg.swanlab_mode, cfg.model_dump(mode="json"), project="async_rl_sft")
    generator = torch.Generator().manual_seed(cfg.seed)
    deadline = started + 60 * cfg.max_minutes if cfg.max_minutes else float("inf")
    epochs = min(cfg.sft_epochs, cfg.max_epochs or cfg.sft_epochs)
    history: list[dict[str, float]] = []
    failed = True
    try:
        for epoch in range(1, epochs + 1):
            shards = _shards(frames, cfg.num_trainers, cfg.train_batch_size, generator)
            rows = []
            # A few minibatches per call, not the whole shard: each call answers within actor_timeout_s
            # however large the epoch (an epoch of a language model's demonstrations takes many minutes).
            step, shard_rows = CALL_MINIBATCHES * cfg.train_batch_size, shards[0].batch_size[0]
            noted = time.monotonic()
            for first in range(0, shard_rows, step):
                refs = {name: actor.train_supervised.remote(shard[first:first + step])
                        for (name, actor), shard in zip(trainers.items(), shards)}
                rows += list(get_named(refs, cfg.actor_timeout_s, f"supervised epoch {epoch}").values())
                if time.monotonic() - noted >= PROGRESS_EVERY_S and first + step < shard_rows:
                    noted = time.monotonic()
                    console.print(f"sft epoch {epoch}/{epochs}: {first + step}/{shard_rows} frames per rank, loss so far "
                                  f"{mean_metrics(rows)['bc/loss']:.4f}, {noted - started:.0f} s")
            metrics = {**mean_metrics(rows), "global_step": rows[-1]["global_step"], "lr_policy": rows[-1]["lr_policy"],
                       "epoch_seconds": time.monotonic() - started}
            logger.log(metrics, epoch)
            history.append(metrics)
            console.print(f"sft epoch {epoch}/{epochs}: loss {metrics['bc/loss']:.4f}, step {int(metrics['global_step'])}, "
                          f"{metrics['epoch_seconds']:.0f} s")
            if time.monotonic() > deadline:
                console.print(f"max_minutes reached after {epoch} epoch(s)")
                break
        export = Path(cfg.sft_export or Path(cfg.log_dir) / "policy")
        meta = {"policy": cfg.policy, "policy_kwargs": cfg.policy_kwargs, "env": cfg.env, "env_kwargs": cfg.env_kwargs,
                "model": model_identity(cfg.policy_kwargs.get("model_path")),
                "made_by": "launch/sft.py", "demos": str(cfg.demos), "frames": int(frames.batch_size[0]),
                "epochs": len(history), "final_loss": history[-1]["bc/loss"], "seed": cfg.seed}
        probe = frames["obs"][:PROBE_FRAMES]
        probe_actions = ray.get(trainers["trainer-0"].export_policy.remote(str(export), meta, probe),
                                timeout=cfg.actor_timeout_s)
        failed = False
    finally:
        logger.close()
        try:
            trainers.call("shutdown", timeout_s=cfg.actor_timeout_s)
        except (ActorFailedError, ActorTimeoutError):
            if not failed:  # after a failure, that first error is the one to report (a busy rank cannot shut down)
                raise
    summary = {"export": str(export), "epochs": len(history), "frames": int(frames.batch_size[0]),
               "loss_first": history[0]["bc/loss"], "loss_last": history[-1]["bc/loss"],
               "wall_seconds": time.monotonic() - started, "probe_env_actions": probe_actions}
    Path(cfg.log_dir, "sft_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    console.print(f"policy exported to {export} (an RL run starts from it with --init-from {export})")
    return summary
