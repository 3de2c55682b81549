"""The options of the causal LM policy (``policy_kwargs`` of ``--policy causal_lm``): what the model is, how long
prompts and responses may be, and the sampling distribution (``lm_sampling``)."""
from __future__ import annotations

from typing import Literal, Optional

import pydantic

from async_rl.plugin_options import model_path_option
from async_rl.validation import ConfigSection


class CausalLMOptions(ConfigSection):
    """The causal LM policy's options."""

    model_path: Optional[str] = model_path_option("a Hugging Face folder or a .gguf file", "the default small model")
    max_prompt_tokens: pydantic.PositiveInt = 256
    """prompts are left-padded to this many tokens; a longer prompt of the env is refused before the run"""
    max_new_tokens: pydantic.PositiveInt = 64
    """longest response"""
    min_new_tokens: pydantic.NonNegativeInt = 0
    """eos is suppressed before this many tokens (benchmarks set max_new_tokens to compare equal lengths)"""
    temperature: pydantic.PositiveFloat = 1.0
    """the sampling distribution is softmax(logits / temperature)"""
    top_k: pydantic.NonNegativeInt = 0
    """sample from the k likeliest tokens; 0 = off"""
    top_p: float = pydantic.Field(1.0, gt=0.0, le=1.0)
    """nucleus sampling; 1 = off"""
    min_p: float = pydantic.Field(0.0, ge=0.0, lt=1.0)
    """drop tokens below min_p x the likeliest one's probability; 0 = off"""
    system_prompt: Optional[str] = None
    """a system message before every prompt"""
    gradient_checkpointing: bool = False
    """training recomputes each decoder layer in backward (less memory, ~1.35x the time)"""
    disable_dropout: bool = True
    """every dropout of the model off, so that the trainer computes what the sampler computed"""
    generation_engine: Literal["auto", "vllm", "hf"] = "auto"
    """what generates responses: vllm (its own process, fed the policy's merged weights as they change), hf
    (transformers' generate); auto = hf on CPU until held-out figures over several seeds favour vLLM
    (benchmarks/results/lm_peers.md)"""
    share_prompt_forward: bool = True
    """training's forward runs once per distinct prompt of a minibatch, its responses against that prompt's KV cache
    (Prefix Grouper: the same log-probs and gradients, with less work when a minibatch holds a group's members);
    false: one forward per row over prompt + response"""

    @pydantic.model_validator(mode="after")
    def _lengths_ordered(self) -> "CausalLMOptions":
        if self.min_new_tokens > self.max_new_tokens:  # eos could never be sampled: every response hits the cap
            raise ValueError(f"min_new_tokens {self.min_new_tokens} > max_new_tokens {self.max_new_tokens}; "
                             "set min_new_tokens at most max_new_tokens")
        return self


def check_generation_engine(policy_kwargs: dict) -> None:
    """``generation_engine: vllm`` in a training run, before Ray starts: the engine must be installed. One
    ConfigError naming the fix; ``auto`` needs no check (it takes hf where vLLM cannot serve)."""
    from async_rl.errors import ConfigError  # noqa: PLC0415
    from async_rl.policies.vllm_client import vllm_unavailable_reason  # noqa: PLC0415

    if policy_kwargs.get("generation_engine") != "vllm":
        return
    reason = vllm_unavailable_reason()
    if reason:
        raise ConfigError(f"generation_engine vllm: {reason}, or --policy.generation-engine hf")
