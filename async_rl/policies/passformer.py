"""Passformer (Passformer RL training, after CompilerDream): a seq2seq policy that writes a whole pass sequence.

A transformers BART (built from a tiny configuration, or loaded from ``model_path``) with one
vocabulary: ids ``[0, P)`` are the env's pass tokens (``obs_spec["action_vocab"]``: specials,
then one token per pass flag), ids ``[P, P + ir_vocab_size)`` are IR tokens. The encoder reads
[Autophase token, IR tokens]; the Autophase token is a linear projection of the normalised
features. The decoder generates up to ``seq_len`` pass tokens from <bos>; only pass tokens and
<eos> may be emitted. The action is the padded id sequence ``[B, seq_len]``; its log-prob is
the masked sum of token log-probs up to and including the first <eos> (``logp`` ``[B, 1]``).
Tokens are sampled from softmax(logits / ``temperature``), and that tempered distribution is the
policy: ``act`` records its log-prob and ``evaluate`` recomputes it (and its entropy), so
importance ratios compare the distribution actually sampled from with the trained one.
The value head reads the mean of the encoder states.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import pydantic
import torch
from tensordict import TensorDict
from torch import nn

from async_rl.algo import categorical_entropy
from async_rl.errors import ConfigError
from async_rl.plugin_options import model_path_option
from async_rl.policies import register_policy
from async_rl.policies.base import ActorCritic, ObsSpec
from async_rl.policies.features import compiler_features, feature_dim
from async_rl.policies.nets import cast_inputs
from async_rl.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from async_rl.validation import ConfigSection, checked_folder

SAVED_BART_HINT = ("pass a BartForConditionalGeneration save_pretrained folder, or leave it out for the tiny default "
                   "Passformer")


class PassformerOptions(ConfigSection):
    """The Passformer policy's options (the tiny BART's shape applies when no model is given)."""

    model_path: Optional[str] = model_path_option("a BartForConditionalGeneration save_pretrained folder",
                                                  "a tiny BART from scratch")
    d_model: pydantic.PositiveInt = 64
    """the tiny BART's width"""
    layers: pydantic.PositiveInt = 2
    """encoder and decoder layers each"""
    heads: pydantic.PositiveInt = 4
    """attention heads per layer"""
    ffn_dim: pydantic.PositiveInt = 128
    """the feed-forward layers' width"""
    temperature: pydantic.PositiveFloat = 1.0
    """pass tokens are sampled from softmax(logits / temperature), and that is the policy trained"""

    @pydantic.model_validator(mode="after")
    def _heads_divide_width(self) -> "PassformerOptions":
        if self.model_path is None and self.d_model % self.heads:  # else BART refuses it inside an actor, after Ray
            raise ValueError(f"d_model {self.d_model} is not a multiple of heads {self.heads}; each attention head "
                             "takes d_model / heads dimensions: pick a multiple (e.g. d_model 64, heads 4)")
        return self


class PassformerPreprocessor:
    """CompilerGym observation -> ``{"features": float32 [F], "ir_tokens": int64 [L]}``."""

    def __init__(self, obs_spec: ObsSpec, **_policy_kwargs: Any) -> None:
        self.obs_spec = dict(obs_spec)
        if not int(self.obs_spec.get("ir_tokens", 0)):
            raise ConfigError("the passformer policy reads IR: set env_kwargs ir_tokens > 0 (e.g. 256)")

    def __call__(self, obs: Any, task_name: str) -> TensorDict:
        return TensorDict({"features": compiler_features(obs, self.obs_spec),
                           "ir_tokens": torch.as_tensor(obs["ir_tokens"], dtype=torch.int64)}, batch_size=[])


def tiny_bart_config(vocab_size: int, max_positions: int, d_model: int = 64, layers: int = 2, heads: int = 4,
                     ffn_dim: int = 128) -> Any:
    from transformers import BartConfig  # heavy; only where a Passformer is built

    return BartConfig(
        vocab_size=vocab_size, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn_dim,
        decoder_ffn_dim=ffn_dim, max_position_embeddings=max_positions,
        # No dropout: act() and evaluate() must give the same log-probs for the same weights.
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID, decoder_start_token_id=BOS_ID,
        forced_eos_token_id=None,
        # Untied output layer: with LoRA, a tied lm_head's delta would not reach the merged weights.
        tie_word_embeddings=False,
    )


def sequence_mask(action: torch.Tensor) -> torch.Tensor:
    """True for the tokens of each sequence up to and including its first <eos> ``[B, T]``."""
    is_end = (action == EOS_ID) | (action == PAD_ID)
    ended_before = (is_end.long().cumsum(-1) - is_end.long()) > 0
    return ~ended_before & (action != PAD_ID)


class PassformerActorCritic(ActorCritic):
    """BART encoder-decoder over [Autophase, IR] -> pass tokens, with a value head."""
    hf_model_attr = "seq2seq"

    def __init__(self, obs_spec: ObsSpec, action_dim: int, model_path: Optional[str] = None, d_model: int = 64,
                 layers: int = 2, heads: int = 4, ffn_dim: int = 128, temperature: float = 1.0) -> None:
        super().__init__()
        from transformers import BartForConditionalGeneration

        self.num_pass_tokens = len(obs_spec["action_vocab"])
        self.seq_len = int(action_dim)
        self.ir_tokens = int(obs_spec["ir_tokens"])
        vocab = self.num_pass_tokens + int(obs_spec["ir_vocab_size"])
        if model_path is not None:
            checked_folder(model_path, f"passformer model_path {model_path}", SAVED_BART_HINT, holds=("config.json",))
            self.seq2seq = BartForConditionalGeneration.from_pretrained(model_path)
            if self.seq2seq.config.vocab_size < vocab:
                raise ConfigError(f"passformer model_path {model_path}: vocabulary of {self.seq2seq.config.vocab_size} "
                                  f"tokens, the env needs {vocab} (pass tokens + IR vocabulary)")
        else:
            config = tiny_bart_config(vocab, max(self.ir_tokens + 1, self.seq_len + 1), d_model, layers, heads, ffn_dim)
            self.seq2seq = BartForConditionalGeneration(config)
        d = self.seq2seq.config.d_model
        self.feature_proj = nn.Linear(feature_dim(obs_spec), d)
        self.value_head = nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, 1))
        self.temperature = float(temperature)
        # Only pass tokens and <eos> may be generated.
        allowed = torch.zeros(self.seq2seq.config.vocab_size, dtype=torch.bool)
        allowed[UNK_ID + 1 : self.num_pass_tokens] = True
        allowed[EOS_ID] = True
        self.allowed = allowed  # a plain tensor, not a buffer: nothing to train or broadcast

    # -- encoder --
    def encode(self, obs: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoder states ``[B, 1 + L, d]`` and their attention mask."""
        ir = obs["ir_tokens"]
        embed = self.seq2seq.get_encoder().embed_tokens
        ir_embeds = embed(torch.where(ir > 0, ir + self.num_pass_tokens, torch.full_like(ir, PAD_ID)))
        feat = self.feature_proj(cast_inputs(obs["features"], self.feature_proj)).unsqueeze(1)
        mask = torch.cat([torch.ones_like(ir[:, :1]), (ir > 0).long()], dim=1)
        states = self.seq2seq.get_encoder()(inputs_embeds=torch.cat([feat, ir_embeds], 1), attention_mask=mask)
        return states.last_hidden_state, mask

    def _pooled_value(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.unsqueeze(-1).to(states.dtype)
        return self.value_head((states * m).sum(1) / m.sum(1)).squeeze(-1).float()

    def _decode(self, states: torch.Tensor, mask: torch.Tensor, decoder_ids: torch.Tensor,
                cache: Any = None, use_cache: bool = False) -> tuple[torch.Tensor, Any]:
        """Tempered float32 logits ``[B, T, V]`` (divided by ``temperature``) over the allowed
        tokens for ``decoder_ids``; with ``use_cache`` also the decoder's key/value cache, so the
        next call feeds only the new token."""
        out = self.seq2seq(encoder_outputs=(states,), attention_mask=mask, decoder_input_ids=decoder_ids,
                           cache=cache, use_cache=use_cache)
        if self.allowed.device != out.logits.device:
            self.allowed = self.allowed.to(out.logits.device)
        logits = out.logits.float() / self.temperature
        return logits.masked_fill(~self.allowed, float("-inf")), out.cache

    # -- policy --
    @torch.no_grad()
    def act(self, obs: TensorDict, deterministic: bool | torch.Tensor = False) -> TensorDict:
        states, mask = self.encode(obs)
        b = states.shape[0]
        greedy = torch.as_tensor(deterministic, device=states.device).reshape(-1).expand(b)
        token = torch.full((b,), BOS_ID, dtype=torch.long, device=states.device)
        done = torch.zeros(b, dtype=torch.bool, device=states.device)
        tokens, logps, cache = [], [], None
        for _ in range(self.seq_len):  # one new token per step; earlier ones are in the cache
            logits, cache = self._decode(states, mask, token.unsqueeze(-1), cache, use_cache=True)
            logits = logits[:, -1]
            logp_all = torch.log_softmax(logits, -1)  # of the tempered distribution sampled from
            sample = torch.distributions.Categorical(logits=logits).sample()
            token = torch.where(greedy, logits.argmax(-1), sample)
            token = torch.where(done, torch.full_like(token, PAD_ID), token)
            logps.append(torch.where(done, torch.zeros_like(token, dtype=logp_all.dtype),
                                     logp_all.gather(-1, token.unsqueeze(-1)).squeeze(-1)))
            tokens.append(token)
            done = done | (token == EOS_ID)
        action = torch.stack(tokens, 1)
        return TensorDict({"action": action, "env_action": action,
                           "logp": torch.stack(logps, 1).sum(1, keepdim=True),
                           "value": self._pooled_value(states, mask)}, batch_size=[b])

    def evaluate(self, obs: TensorDict, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        action = action.long()
        states, mask = self.encode(obs)
        decoder_ids = torch.cat([torch.full_like(action[:, :1], BOS_ID), action[:, :-1]], 1)
        logits = self._decode(states, mask, decoder_ids)[0]
        token_logp = torch.log_softmax(logits, -1).gather(-1, action.unsqueeze(-1)).squeeze(-1)
        seq_mask = sequence_mask(action)
        # where, not a product: padding is a disallowed token, its log-prob is -inf.
        logp = torch.where(seq_mask, token_logp, 0.0).sum(1, keepdim=True)
        entropy = torch.where(seq_mask, categorical_entropy(logits), 0.0).sum(1, keepdim=True)
        return logp, entropy, self._pooled_value(states, mask)

    def value(self, obs: TensorDict) -> torch.Tensor:
        return self._pooled_value(*self.encode(obs))

    def value_parameters(self) -> list[nn.Parameter]:
        return list(self.value_head.parameters())


def prepare_passformer(obs_spec: ObsSpec, action_dim: int, model_path: Optional[str], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Driver-side check before Ray starts (the kwargs are checked against ``PassformerOptions``):
    ``--model-path`` must be a save_pretrained folder."""
    kwargs = dict(kwargs)
    model_path = model_path or kwargs.get("model_path")
    if model_path is not None:
        checked_folder(model_path, f"--model-path {model_path}", SAVED_BART_HINT, holds=("config.json",))
        kwargs["model_path"] = str(Path(model_path).resolve())
    return kwargs


register_policy("passformer", preprocessor=PassformerPreprocessor, options=PassformerOptions, prepare=prepare_passformer)(
    PassformerActorCritic)
