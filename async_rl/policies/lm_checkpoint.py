"""A causal-LM policy outside a run: the base model, or the weights of a run's checkpoint (its frozen
base rebuilt from the saved config, LoRA adapters and trained tensors loaded on top), for evaluation
commands and benchmarks that answer questions in one process without Ray."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch
from tensordict import TensorDict

from async_rl import checkpoint as ckpt
from async_rl.algo import advantage_estimator
from async_rl.errors import ConfigError
from async_rl.policies.causal_lm import CausalLMActorCritic, ChatPreprocessor, prepare_causal_lm
from async_rl.policies.initial_weights import (
    check_export_made_for,
    load_initial_weights,
    read_export_meta,
    resolve_export,
)
from async_rl.policies.lora import apply_lora

TEXT_SPEC = {"text": True}


def run_config(checkpoint: Path) -> dict[str, Any]:
    """The config a checkpoint was trained with; ConfigError unless it trained a causal LM."""
    return ckpt.trained_config(checkpoint, "policy", "causal_lm")


def load_lm_policy(checkpoint: Optional[str] = None, model_path: Optional[str] = None,
                   overrides: Optional[dict[str, Any]] = None,
                   init_from: Optional[str] = None) -> tuple[CausalLMActorCritic, ChatPreprocessor, str]:
    """(policy in eval mode, its preprocessor, a description): a run's newest weights with ``checkpoint``,
    a supervised export's with ``init_from`` (``launch/sft.py``), else the model at ``model_path`` (None:
    the default model). ``overrides`` replace policy kwargs (e.g. ``max_new_tokens``). Bad paths are
    ConfigErrors, raised before any weights load. At most one source: the commands' flags are mutually exclusive."""
    if sum(x is not None for x in (checkpoint, model_path, init_from)) > 1:  # a caller's bug, not the user's input
        raise ValueError("load_lm_policy takes one of checkpoint, model_path or init_from")
    if init_from is not None:
        return _export_policy(init_from, overrides)
    config: dict[str, Any] = {}
    kwargs: dict[str, Any] = {}
    directory = None
    if checkpoint is not None:
        directory = ckpt.resolve_checkpoint(checkpoint)
        config = run_config(directory)
        kwargs = dict(config.get("policy_kwargs") or {})
        saved = kwargs.pop("model_path", None)
        # The saved path is this machine's converted folder; elsewhere, the config's own model path.
        model_path = saved if saved and Path(saved).is_dir() else config.get("model_path")
    kwargs.update(overrides or {})
    kwargs = prepare_causal_lm(TEXT_SPEC, 1, model_path, kwargs)
    policy = CausalLMActorCritic(TEXT_SPEC, 1, **kwargs)
    description = f"model {kwargs['model_path']}"
    if directory is not None:
        # Built as the trainers built it (actors/trainer_setup.py training_model), so the saved names fit.
        critic = advantage_estimator(config.get("advantage", "gae")).needs_critic
        if not critic:
            policy.drop_critic()
        if config.get("lora_rank", 0) > 0:
            policy = apply_lora(policy, config["lora_rank"], config["lora_alpha"], config.get("lora_dropout", 0.0),
                                config.get("lora_target_modules"), config.get("lora_trainable", []))
        if not critic:
            policy.drop_critic()
        try:
            ckpt.load_model(policy, directory)
        except ValueError as exc:  # the trained tensors do not fit the rebuilt model
            raise ConfigError(f"--checkpoint {directory}: {exc}") from None
        description = f"checkpoint {directory} (base {kwargs['model_path']})"
    return policy.eval().requires_grad_(False), ChatPreprocessor(TEXT_SPEC, **kwargs), description


def _export_policy(path: str, overrides: Optional[dict[str, Any]]) -> tuple[CausalLMActorCritic, ChatPreprocessor, str]:
    """The causal-LM policy of a supervised export (LoRA already merged into its weights)."""
    meta = read_export_meta(resolve_export(path))
    check_export_made_for(meta, f"--init-from {path}", policy="causal_lm")
    kwargs = dict(meta.get("policy_kwargs") or {})
    saved = kwargs.pop("model_path", None)  # the exporting machine's converted folder; else the default model
    kwargs.update(overrides or {})
    kwargs = prepare_causal_lm(TEXT_SPEC, 1, saved if saved and Path(saved).is_dir() else None, kwargs)
    policy = load_initial_weights(CausalLMActorCritic(TEXT_SPEC, 1, **kwargs), resolve_export(path))
    policy.eval().requires_grad_(False)
    return policy, ChatPreprocessor(TEXT_SPEC, **kwargs), f"export {path}"


@torch.inference_mode()
def answer(policy: CausalLMActorCritic, preprocess: ChatPreprocessor, prompts: list[Any], greedy: bool,
           batch_size: int = 16) -> list[list[int]]:
    """The policy's response (token ids, padding dropped) to every prompt (text or chat messages), in batches."""
    out: list[list[int]] = []
    for first in range(0, len(prompts), batch_size):
        chunk = prompts[first:first + batch_size]
        obs = TensorDict.stack([preprocess({"prompt": p}) for p in chunk])
        response = policy.act(obs, torch.full((len(chunk),), greedy))["response"]
        out.extend([[int(t) for t in row if t >= 0] for row in response])
    return out
