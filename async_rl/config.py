"""Typed run configuration: defaults < ``--config`` YAML < command-line flags.

Everything is validated before Ray starts; a bad value is one line naming the key and the fix.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Literal, Optional, Union

import pydantic
import yaml

from async_rl.algo import load_clip_config, resolve_policy_loss_params
from async_rl.errors import ConfigError, unknown_key_message
from async_rl.validation import validate_model

Positive = pydantic.PositiveInt
Fraction = pydantic.confloat(ge=0.0, le=1.0)


class RunConfig(pydantic.BaseModel):
    """Every knob of a run. Sizes count steps (PPO) or segments of ``rollout_local_buf`` steps (V-trace)."""

    model_config = pydantic.ConfigDict(extra="forbid", validate_assignment=True)

    # What to train.
    env: str = "metaworld"
    env_kwargs: dict[str, Any] = pydantic.Field(default_factory=lambda: {"benchmark": "MT1", "task": "reach-v3"})
    policy: str = "mlp"
    policy_kwargs: dict[str, Any] = pydantic.Field(default_factory=dict)
    model_path: Optional[str] = None  # local model directory for policies that load one (vla); None = their default
    # LoRA (peft) on the trainers' copy; the inference actors receive merged weights.
    lora_rank: pydantic.NonNegativeInt = 0  # 0 = train every parameter
    lora_alpha: pydantic.PositiveFloat = 16.0
    lora_dropout: Fraction = 0.0
    lora_target_modules: Optional[Union[str, list[str]]] = None  # None = every nn.Linear; a string is a peft regex
    lora_trainable: list[str] = pydantic.Field(default_factory=list)  # name prefixes kept fully trainable
    advantage: Literal["gae", "vtrace"] = "gae"
    clip_mode: str = "clip"
    clip_params: dict[str, Any] = pydantic.Field(default_factory=dict)

    # Scale (seed 004 section 2.1); defaults fit a 2-core machine.
    num_trainers: Positive = 2
    num_inference_actors: Positive = 1
    num_rollout_workers: Positive = 2
    num_eval_workers: pydantic.NonNegativeInt = 1
    envs_per_worker: Positive = 4
    rollout_local_buf: Positive = 64
    inference_batch: Positive = 2
    inference_timeout_ms: pydantic.PositiveFloat = 2.0
    # Run the inference forward in a thread (true) or on the actor's event loop (false);
    # None = a thread for GPU models and CPU models over 20 M parameters.
    inference_forward_thread: Optional[bool] = None
    replay_capacity: Positive = 4096
    train_batch_size: Positive = 256
    accumulation_steps: Positive = 2
    super_batch_size: Positive = 512
    updates_per_epoch: Positive = 4
    # consume: sampled experience leaves the buffer (each step trains in one epoch);
    # reuse: it stays and may be drawn again (seed 004), so trainers never wait for data.
    replay_sampling: Literal["consume", "reuse"] = "consume"
    # Experience made by a policy more than this many versions older than the one training on it
    # is dropped when a trainer samples (counted in replay/dropped_stale); None = keep all.
    max_policy_lag: Optional[pydantic.NonNegativeInt] = None
    log_interval_seconds: pydantic.PositiveFloat = 10.0

    # Optimisation.
    lr_policy: pydantic.PositiveFloat = 3e-4
    lr_value: pydantic.PositiveFloat = 1e-3
    warmup_steps: pydantic.NonNegativeInt = 10
    lr_decay_steps: Positive = 10_000
    min_lr_ratio: Fraction = 0.1
    weight_decay: pydantic.NonNegativeFloat = 0.0
    max_grad_norm: pydantic.PositiveFloat = 1.0
    gamma: Fraction = 0.99
    gae_lambda: Fraction = 0.95
    reward_scale: pydantic.PositiveFloat = 0.1
    value_coef: pydantic.NonNegativeFloat = 0.5
    value_clip_eps: Optional[pydantic.PositiveFloat] = None
    entropy_coef: pydantic.NonNegativeFloat = 0.0
    kl_coef: pydantic.NonNegativeFloat = 0.0
    ratio_threshold: Optional[pydantic.PositiveFloat] = None
    normalize_advantages: bool = True
    vtrace_clip_rho: Optional[pydantic.PositiveFloat] = 1.0
    vtrace_clip_c: Optional[pydantic.PositiveFloat] = 1.0
    vtrace_clip_pg_rho: Optional[pydantic.PositiveFloat] = 1.0
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    task_failure_window: Positive = 10

    # Resources and placement.
    device: Literal["auto", "cpu", "cuda"] = "auto"
    trainer_num_cpus: pydantic.NonNegativeFloat = 0.5
    inference_num_cpus: pydantic.NonNegativeFloat = 0.25
    worker_num_cpus: pydantic.NonNegativeFloat = 0.25
    torch_threads: Positive = 1
    trainer_gpu_ids: Optional[list[int]] = None
    inference_gpu_ids: Optional[list[int]] = None

    # Timeouts: every cross-actor wait has one.
    actor_timeout_s: pydantic.PositiveFloat = 120.0
    collective_timeout_s: pydantic.PositiveFloat = 120.0
    startup_timeout_s: pydantic.PositiveFloat = 600.0

    # Evaluation and logging.
    eval_interval_epochs: Positive = 5
    eval_episodes: Positive = 2
    eval_deterministic: bool = True
    swanlab_mode: Literal["offline", "disabled", "local", "cloud"] = "offline"

    # Run control.
    sync: bool = False  # no overlap: collect -> train -> broadcast -> collect (baseline, debugging)
    seed: int = 0
    log_dir: str = "runs/default"
    max_epochs: Optional[Positive] = None
    max_minutes: Optional[pydantic.PositiveFloat] = None
    ray_address: Optional[str] = None
    # Checkpoints under <log_dir>/checkpoints every N epochs (None = only at the end) and at the end.
    checkpoint_interval_epochs: Optional[Positive] = 10
    keep_checkpoints: Positive = 3
    resume: Optional[str] = None  # a checkpoint dir (or a dir of them: the newest) to continue from
    # Ray restarts a killed rollout worker or inference actor up to this many times.
    actor_max_restarts: pydantic.NonNegativeInt = 3

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> "RunConfig":
        if self.super_batch_size != self.train_batch_size * self.accumulation_steps:
            raise ValueError(
                f"super_batch_size ({self.super_batch_size}) must equal train_batch_size x accumulation_steps "
                f"({self.train_batch_size} x {self.accumulation_steps} = {self.train_batch_size * self.accumulation_steps})"
            )
        if self.super_batch_size > self.replay_capacity:
            raise ValueError(
                f"super_batch_size ({self.super_batch_size}) exceeds replay_capacity ({self.replay_capacity}); "
                "raise replay_capacity"
            )
        resolve_policy_loss_params(self.clip_mode, self.clip_params)
        return self


# Flags every launch script has, besides one flag per scalar config key.
_FILE_FLAGS = ("config", "clip_config")


def build_arg_parser(description: str) -> argparse.ArgumentParser:
    """Parser with ``--config``, ``--clip-config`` and one ``--flag`` per config key (values are YAML)."""
    parser = argparse.ArgumentParser(
        description=description, argument_default=argparse.SUPPRESS, allow_abbrev=False
    )
    parser.add_argument("--config", help="YAML file of config keys (CLI flags override it)")
    parser.add_argument("--clip-config", help="YAML/JSON file of clip params for --clip-mode")
    for name, field in RunConfig.model_fields.items():
        flag = "--" + name.replace("_", "-")
        if field.annotation is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction)
        else:
            parser.add_argument(flag, dest=name, type=str, metavar=name.upper(), help=f"(default: {field.default})")
    return parser


def _load_yaml(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--config {path}: no such file; pass a YAML file from configs/")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping of config keys, got {type(data).__name__}")
    return data


def _parse_cli_value(value: str) -> Any:
    """CLI strings become YAML scalars ("3" -> 3, "null" -> None, "true" -> True)."""
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


def load_config(argv: Optional[list[str]] = None, default_config: Optional[str] = None, description: str = "") -> RunConfig:
    """Parse the command line into a validated RunConfig (raises ConfigError on bad input).

    ``default_config`` is the launch script's own YAML, below ``--config`` and the flags.
    """
    parser = build_arg_parser(description)
    namespace, unknown = parser.parse_known_args(argv)
    flags = [a for a in unknown if a.startswith("--")]
    if flags or unknown:
        valid = [opt for action in parser._actions for opt in action.option_strings if opt.startswith("--")]
        raise ConfigError(unknown_key_message((flags or unknown)[0].split("=")[0], valid, "flag"))
    args = vars(namespace)
    merged: dict[str, Any] = _load_yaml(default_config) if default_config else {}
    if "config" in args:
        merged.update(_load_yaml(args.pop("config")))
    if "clip_config" in args:
        merged["clip_params"] = {**merged.get("clip_params", {}), **load_clip_config(args.pop("clip_config"))}
    for key, value in args.items():
        if key not in _FILE_FLAGS:
            merged[key] = value if isinstance(value, bool) else _parse_cli_value(value)
    cfg = validate_model(RunConfig, merged, "config key")
    _check_paths(cfg)
    return cfg


def _check_paths(cfg: RunConfig) -> None:
    if cfg.resume is not None:
        from async_rl.checkpoint import check_resumable, resolve_resume

        cfg.resume = str(resolve_resume(cfg.resume))  # pinned: a newer checkpoint written later does not change it
        check_resumable(Path(cfg.resume), cfg)
    log_dir = Path(cfg.log_dir)
    if log_dir.exists() and not log_dir.is_dir():
        raise ConfigError(f"--log-dir {cfg.log_dir} is a file; pass a directory")
    parent = next((p for p in [log_dir, *log_dir.parents] if p.exists()), Path("."))
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"--log-dir {cfg.log_dir}: {parent} is not writable; pass a writable directory")
