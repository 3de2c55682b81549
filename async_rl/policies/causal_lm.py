"""A causal language model as a policy: a prompt is the observation, a whole response is the action.

The worker-side preprocessor applies the model's chat template to the env's prompt and left-pads
it to ``max_prompt_tokens`` (every request of a batch then has the same width and rows of several
callers concatenate). ``act`` samples a response with Hugging Face ``generate`` (KV cache, stop at
eos), or in vLLM's engine (``generation_engine``, ``lm_vllm``: same contracts), and records, for
every sampled token, its log-probability under the distribution it was actually drawn from. That
distribution is declared in ``lm_sampling``: every sampling field is set explicitly from the policy
kwargs (``temperature``, ``top_k``, ``top_p``, ``min_p``) and nothing is inherited from the model's
``generation_config.json``. A response is ``max_new_tokens`` ids, ``-1`` after its end;
``action_mask`` marks the real tokens, eos included, so every loss term is masked.

``evaluate`` recomputes the same log-probs for training in one decoder pass over prompt + response,
with position ids counted from the first real token (left padding shifts nothing) and pad positions
attending to themselves only (``lm_attention``: no attention row with every key masked, here as in
generation's prefill, and a real token's attention exactly the 2D mask's); the vocabulary
logits come from the model's own forward on the decoder's output (``_head_logits``), a few positions
at a time, so that whatever the model does after its decoder (Gemma-2/3's final-logit soft-capping,
Cohere's and Granite's logit scaling) applies in training as it does in sampling. Truncation (top-k,
top-p, min-p) is not applied there: the behaviour policy is then the truncated distribution the
recorded log-probs describe and the importance ratio corrects for the difference, as for any
off-policy sample. The value head (PPO) reads the prompt's last hidden state: an action is the whole
response, so V is the value of the prompt.

Dropout is off by default (``disable_dropout``, as TRL's): in the trainer as in the sampler, so that
the trainer's log-probs before an update are the sampler's.
"""
from __future__ import annotations

import functools
import sys
import threading
from typing import Any, Mapping, Optional, Sequence, Union

import torch
from tensordict import TensorDict
from torch import nn
from torch.utils.checkpoint import checkpoint

from async_rl.algo.behaviour_cloning import token_cloning_loss
from async_rl.errors import ConfigError
from async_rl.policies import register_policy
from async_rl.policies.base import ActorCritic, ObsSpec, check_env_prompts_fit
from async_rl.policies.lm_attention import positions_of, self_attending_pad_mask
from async_rl.policies.lm_loading import resolve_lm_path
from async_rl.policies.lm_options import CausalLMOptions
from async_rl.policies.lm_sampling import (
    PAD_ACTION,
    SampledLogProbs,
    SamplingParams,
    explicit_generation_config,
    neutral_generation_config,
    sampling_processors,
    zero_dropout_config,
    zero_dropout_modules,
)
from async_rl.policies.lm_shared_prompt import shared_prompt_hidden
from async_rl.policies.lm_vllm import START_TIMEOUT_S, VLLMGeneration, engine_unsupported_reason
from async_rl.policies.vllm_client import VLLMEngineError, as_engine_error

TOKEN_CHUNK = 32  # response positions whose vocabulary logits exist at once in training


@functools.lru_cache(maxsize=4)
def load_tokenizer(model_path: str) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token_id is None:  # many causal LMs ship none; eos is masked out anyway
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def stop_token_ids(model_path: str, generation_config: Any = None) -> list[int]:
    """Every id that ends a response: the tokenizer's eos (``<|im_end|>`` for chat models) and the
    generation config's (which may name another, e.g. ``<|endoftext|>``)."""
    ids = {load_tokenizer(model_path).eos_token_id}
    configured = getattr(generation_config, "eos_token_id", None)
    ids.update(configured if isinstance(configured, (list, tuple)) else [configured])
    return sorted(i for i in ids if i is not None)


class ChatPreprocessor:
    """Worker side: ``{"prompt": str or chat messages}`` -> ``input_ids`` / ``attention_mask``
    ``[max_prompt_tokens]``, the chat template applied, left-padded. A text prompt is the user message after
    ``system_prompt``; a chat prompt's messages go to the template whole, its own system message in place of
    ``system_prompt``."""

    def __init__(self, obs_spec: ObsSpec, model_path: str, max_prompt_tokens: int = 256,
                 system_prompt: Optional[str] = None, max_new_tokens: int = 64, **_: Any) -> None:
        self.model_path, self.max_prompt_tokens, self.system_prompt = model_path, max_prompt_tokens, system_prompt
        self.max_new_tokens = max_new_tokens

    def messages(self, prompt: Union[str, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
        """What the chat template receives for ``prompt`` (see the class docstring)."""
        chat = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        if self.system_prompt and chat[0].get("role") != "system":
            chat.insert(0, {"role": "system", "content": self.system_prompt})
        return chat

    def prompt_ids(self, prompt: Union[str, Sequence[Mapping[str, Any]]]) -> list[int]:
        tokenizer = load_tokenizer(self.model_path)
        messages = self.messages(prompt)
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > self.max_prompt_tokens:
            raise ValueError(f"a prompt of {len(ids)} tokens does not fit max_prompt_tokens {self.max_prompt_tokens}; "
                             f"raise it (--policy-kwargs \"{{max_prompt_tokens: {len(ids)}}}\")")
        return ids

    def __call__(self, obs: Mapping[str, Any], task_name: str = "") -> TensorDict:
        prompt = obs["prompt"]
        ids = self.prompt_ids(prompt if isinstance(prompt, (list, tuple)) else str(prompt))
        pad = self.max_prompt_tokens - len(ids)
        pad_id = load_tokenizer(self.model_path).pad_token_id
        input_ids = torch.tensor([pad_id] * pad + ids, dtype=torch.int64)
        mask = torch.tensor([0] * pad + [1] * len(ids), dtype=torch.int64)
        return TensorDict({"input_ids": input_ids, "attention_mask": mask}, batch_size=[])

    def encode_response(self, text: str) -> torch.Tensor:
        """A demonstrated response as the policy's action: its ids and the end-of-text token,
        ``PAD_ACTION`` after them, ``[max_new_tokens]`` (supervised fine-tuning's label)."""
        tokenizer = load_tokenizer(self.model_path)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [int(tokenizer.eos_token_id)]
        if len(ids) > self.max_new_tokens:
            raise ValueError(f"a response of {len(ids)} tokens does not fit max_new_tokens {self.max_new_tokens}")
        return torch.tensor(ids + [PAD_ACTION] * (self.max_new_tokens - len(ids)), dtype=torch.int64)


def trim_left_padding(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``ids`` / ``mask`` without the leading columns that are padding in every row. Prompts are left-padded to
    ``max_prompt_tokens`` (arithmetic's average 46 of 64): those columns cost prefill and training time and change
    nothing, since positions count from each row's first real token and padding is masked."""
    real_columns = mask.bool().any(dim=0).nonzero()
    start = int(real_columns[0]) if len(real_columns) else mask.shape[1] - 1
    return ids[:, start:], mask[:, start:]


def _DecoderOutput(inputs_embeds: torch.Tensor, **_: Any) -> Any:  # stands in for a decoder's forward
    """What a decoder returns, holding the hidden states it is handed (``CausalLMActorCritic._head_logits``)."""
    from transformers.modeling_outputs import BaseModelOutputWithPast

    return BaseModelOutputWithPast(last_hidden_state=inputs_embeds)


ENGINE_LOGP_GAP = 1e-3  # the log-prob gap between generation and training that a run is told of (fp32 measured 5e-5)
AUTO_ON_CPU = ("on CPU, auto takes transformers' generate until held-out figures over several seeds favour vLLM "
               "(benchmarks/results/lm_peers.md); --policy.generation-engine vllm asks for it")


class CausalLMActorCritic(ActorCritic):
    action_key = "response"
    logp_free_prefixes = ("value_head",)  # V(prompt) only; the log-probs are the language model's
    hf_model_attr = "lm"
    lm: Any  # a Hugging Face model: its parts are attributes torch's Module type cannot name

    def __init__(self, obs_spec: ObsSpec, action_dim: int, model_path: str, max_prompt_tokens: int = 256,
                 max_new_tokens: int = 64, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 min_p: float = 0.0, system_prompt: Optional[str] = None, min_new_tokens: int = 0,
                 gradient_checkpointing: bool = False, disable_dropout: bool = True,
                 generation_engine: str = "auto", share_prompt_forward: bool = True) -> None:
        """``temperature``, ``top_k`` (0: off), ``top_p`` (1: off), ``min_p`` (0: off): the sampling
        distribution (``lm_sampling``; nothing else of the model's generation config applies).
        ``min_new_tokens``: eos is suppressed before that many tokens (0: a response may end at once;
        benchmarks set it to ``max_new_tokens`` to compare generation at equal lengths; training does not
        know of it).
        ``gradient_checkpointing``: training keeps each decoder layer's input only and recomputes the
        rest in backward (a HumanEval minibatch of 4 x 624 tokens grew the process by ~4.1 GB without it,
        ~3.3 GB with it, at ~1.35x the time); generation is unaffected.
        ``disable_dropout``: every dropout probability of the model is 0 (its config's and its
        ``nn.Dropout`` modules'), so a trainer in train mode computes what the sampler computes.
        ``generation_engine``: ``vllm`` generates in vLLM's engine (``lm_vllm``), ``hf`` with ``generate``, ``auto``
        with ``generate`` for now (``AUTO_ON_CPU``: the installed vLLM is its CPU build), said on the first batch.
        ``share_prompt_forward``: ``evaluate`` runs the decoder once per distinct prompt of a batch and the responses
        against its cache (``lm_shared_prompt``; the same log-probs and gradients, less work for groups)."""
        super().__init__()
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(model_path)
        if disable_dropout:
            zero_dropout_config(config)
        self.lm = AutoModelForCausalLM.from_pretrained(model_path, config=config, dtype=torch.float32)
        if disable_dropout:
            zero_dropout_modules(self.lm)
        if gradient_checkpointing:
            self.lm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        self.sampling = SamplingParams(float(temperature), int(top_k), float(top_p), float(min_p))
        self.max_prompt_tokens, self.max_new_tokens, self.temperature = max_prompt_tokens, max_new_tokens, self.sampling.temperature
        self.generation_engine = generation_engine
        self.share_prompts = share_prompt_forward
        self._vllm: Optional[VLLMGeneration] = None
        # The engine's start in prepare_sampling's thread, which the first batch joins (no lock kept: a policy that
        # started nothing stays copyable with copy.deepcopy).
        self._engine_error: Optional[VLLMEngineError] = None  # a start that failed under `vllm`, raised again
        self._engine_starter: Optional[threading.Thread] = None
        self.min_new_tokens = min(min_new_tokens, max_new_tokens)
        tokenizer = load_tokenizer(model_path)
        self.pad_id = int(tokenizer.pad_token_id)
        # A plain list, not a buffer: buffers are weights the weight sync would send.
        self.stop_ids = stop_token_ids(model_path, self.lm.generation_config)
        # generate fills every field its config leaves unset from the model's generation config: keep only its
        # token ids there, so that a sampling value shipped with the model cannot slip in (lm_sampling).
        self.lm.generation_config = neutral_generation_config(self.lm.generation_config)
        # Zero-initialised: PPO starts from V = 0 rather than a random guess of the return.
        self.value_head = nn.Linear(self.lm.config.hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    # ---- sampling (inference actor) -----------------------------------------------------
    def act(self, obs: TensorDict, deterministic: bool | torch.Tensor = False) -> TensorDict:
        ids, mask = obs["input_ids"], obs["attention_mask"]
        rows = ids.shape[0]
        greedy = deterministic if isinstance(deterministic, torch.Tensor) else torch.full((rows,), bool(deterministic))
        greedy = greedy.to(torch.bool).reshape(rows).cpu()
        if self._uses_vllm():
            response, logp = self._vllm.generate(ids, mask, greedy)
            if self._vllm.logp_gap is None and not bool(greedy.all()):
                self._vllm.logp_gap = self._engine_logp_gap(obs, response, logp, greedy)
        else:
            response, logp = self._hf_generate(ids, mask, greedy)
        value = self.value(obs) if self.has_critic else torch.zeros(rows, device=ids.device)
        return TensorDict({self.action_key: response, "env_action": response.clone(), "logp": logp,
                           "value": value.float()}, batch_size=[rows])

    def _hf_generate(self, ids: torch.Tensor, mask: torch.Tensor, greedy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        response = torch.full((ids.shape[0], self.max_new_tokens), PAD_ACTION, dtype=torch.int64, device=ids.device)
        logp = torch.zeros((ids.shape[0], self.max_new_tokens), dtype=torch.float32, device=ids.device)
        for flag in (False, True):  # generate cannot mix greedy and sampled rows: one call per kind
            picked = (greedy == flag).nonzero().flatten().to(ids.device)
            if len(picked):
                response[picked], logp[picked] = self._generate(ids[picked], mask[picked], greedy=flag)
        return response, logp

    # ---- the vLLM engine (lm_vllm) -----------------------------------------------------------
    def prepare_sampling(self) -> None:
        """Start the vLLM engine now, in a thread, rather than on the first batch: its start (imports, weights;
        ~25 s on these CPUs) then overlaps the trainers' and workers' own start. The first batch waits for it."""
        if self.generation_engine != "hf" and self._vllm is None and self._engine_starter is None:
            self._engine_starter = threading.Thread(target=self._start_engine, name="vllm-engine-start", daemon=True)
            self._engine_starter.start()

    def _start_engine(self) -> None:
        try:
            self._uses_vllm()
        except Exception as exc:  # noqa: BLE001 (`vllm` asked for and the engine did not start, any cause: the first batch says it)
            self._engine_error = as_engine_error(exc)

    def _uses_vllm(self) -> bool:
        """Whether this batch goes to vLLM; on the first batch under ``auto``, whether it can (said once)."""
        self._await_engine_start()
        if self._engine_error is not None:
            raise self._engine_error
        if self.generation_engine == "hf" or self._vllm is not None:
            return self.generation_engine != "hf"
        reason = engine_unsupported_reason(self.lm)
        if reason is None and self.generation_engine == "auto":
            # Measured (benchmarks/results/lm_peers.md): vLLM's runs make more updates in the same minutes; their
            # held-out accuracy was higher on the two seeds run so far, too few yet to change the default.
            reason = AUTO_ON_CPU
        if reason is None:
            try:
                self._vllm = VLLMGeneration(self, threads=torch.get_num_threads())
                return True
            except Exception as exc:  # noqa: BLE001 (an engine that did not start, any cause: auto falls back, vllm says it)
                reason = str(as_engine_error(exc))
        self._engine_unavailable(reason)
        return False

    def _await_engine_start(self) -> None:
        """Wait for prepare_sampling's start, unless this is its thread."""
        starter = self._engine_starter
        if starter is not None and starter is not threading.current_thread():
            # The start's own calls time out (START_TIMEOUT_S); the margin covers the interpreter and imports.
            starter.join(timeout=START_TIMEOUT_S + 60)
            if starter.is_alive():
                raise VLLMEngineError(f"the vLLM engine's start did not end within {START_TIMEOUT_S + 60:g} s")

    def _engine_logp_gap(self, obs: TensorDict, response: torch.Tensor, logp: torch.Tensor, greedy: torch.Tensor) -> float:
        """The engine's first sampled log-probs against this policy's recomputation on the same tokens (what the
        trainer computes before an update), said once: beyond ``ENGINE_LOGP_GAP`` the loss's importance ratio starts
        off 1 by as much, which ``--recompute-logp`` corrects (the trainer then reports the gap every epoch)."""
        with torch.no_grad():
            recomputed, _, _ = self.evaluate(obs, response)
        real = self.action_mask(response) & ~greedy.to(response.device)[:, None]
        gap = (recomputed.float() - logp)[real].abs()
        worst = float(gap.max()) if gap.numel() else 0.0
        advice = (f"; above {ENGINE_LOGP_GAP:g}: pass --recompute-logp so that the loss's ratio starts from the trainer's "
                  "own log-probs" if worst > ENGINE_LOGP_GAP else "")
        print(f"causal_lm: vLLM's sampled log-probs against this policy's recomputation on its first batch: max "
              f"|diff| {worst:.2e}, mean {float(gap.mean()) if gap.numel() else 0.0:.2e} over {gap.numel()} tokens"
              f"{advice}", file=sys.stderr, flush=True)
        return worst

    def _engine_unavailable(self, reason: str) -> None:
        """``vllm`` asked for: the reason as an error. ``auto``: generate's from now on, said once."""
        if self.generation_engine == "vllm":
            raise VLLMEngineError(f"generation_engine vllm: {reason}")
        print(f"causal_lm: generating with transformers' generate, not vLLM: {reason}", file=sys.stderr, flush=True)
        self.generation_engine = "hf"

    def close_engine(self) -> None:
        """Stop the vLLM engine's process, if one runs (it also ends by itself with this process); one still
        starting is waited for first."""
        self._await_engine_start()
        if self._vllm is not None:
            self._vllm.close()
            self._vllm = None

    def close(self) -> None:
        self.close_engine()

    def _generate(self, ids: torch.Tensor, mask: torch.Tensor, greedy: bool) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask = trim_left_padding(ids, mask)
        recorder = SampledLogProbs()
        processors = sampling_processors(self.sampling, greedy, recorder)
        config = explicit_generation_config(greedy, self.max_new_tokens, self.min_new_tokens, self.pad_id, self.stop_ids)
        sequences = self.lm.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                     logits_processor=processors, **self._prefilled(ids, mask))
        response = sequences[:, ids.shape[1]:]
        logp = recorder.finish(response)
        # Slots after the first stop token are generate's padding, not part of the response.
        is_stop = torch.isin(response, torch.tensor(self.stop_ids, device=response.device))
        after_end = (torch.cumsum(is_stop.long(), dim=1) - is_stop.long()) > 0
        response = response.masked_fill(after_end, PAD_ACTION)
        logp = logp.masked_fill(after_end, 0.0)
        width = self.max_new_tokens - response.shape[1]  # generate stops early when every row ended
        if width > 0:
            response = torch.nn.functional.pad(response, (0, width), value=PAD_ACTION)
            logp = torch.nn.functional.pad(logp, (0, width), value=0.0)
        return response, logp

    def _prefilled(self, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
        """``generate``'s extra arguments: a KV cache of every prompt column but the last, computed here with pad
        positions attending to themselves (``lm_attention``), when the prompts are padded; ``generate`` then
        runs the last column (real in every row: prompts are left-padded) and the new tokens, none of them a pad
        query. Its own prefill would give each pad position an attention row with every key masked. Nothing when
        no column is padding (or the attention implementation takes the 2D mask)."""
        head = mask[:, :-1]
        attention = self_attending_pad_mask(self.lm.config, head, self._compute_dtype())
        if attention is head:
            return {}
        prefill = self.lm(input_ids=ids[:, :-1], attention_mask=attention, position_ids=positions_of(head),
                          use_cache=True, logits_to_keep=1)
        return {"cache": prefill.cache}

    def _compute_dtype(self) -> torch.dtype:
        return self.lm.get_input_embeddings().weight.dtype

    # ---- training (trainer) ---------------------------------------------------------------
    def action_mask(self, action: torch.Tensor) -> torch.Tensor:
        return action >= 0

    def _hidden(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The decoder's output over a left-padded batch: positions counted from each row's first real token, pad
        positions attending to themselves only (no query row without a visible key: ``lm_attention``)."""
        decoder = getattr(self.lm, self.lm.base_model_prefix)
        attention = self_attending_pad_mask(self.lm.config, mask, self._compute_dtype())
        return decoder(input_ids=ids, attention_mask=attention, position_ids=positions_of(mask),
                       use_cache=False).last_hidden_state

    def evaluate(self, obs: TensorDict, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-token log-probs and entropies ``[B, max_new_tokens]`` (0 outside the response) and V(prompt)."""
        ids, prompt_mask = trim_left_padding(obs["input_ids"], obs["attention_mask"])
        # Columns after the batch's longest response are padding in every row: not computed (their log-probs
        # and entropies are 0 anyway), put back as zeros at the end.
        full_width = action.shape[1]
        used_columns = self.action_mask(action).any(dim=0).nonzero()
        response = action[:, :int(used_columns[-1]) + 1 if len(used_columns) else 1].long()
        real = self.action_mask(response)
        targets = response.masked_fill(~real, self.pad_id)
        shared = shared_prompt_hidden(self.lm, ids, prompt_mask, targets, real) if self.share_prompts else None
        if shared is not None:  # each distinct prompt's forward once (lm_shared_prompt)
            prompt_last, response_hidden = shared
        else:
            hidden = self._hidden(torch.cat([ids, targets], dim=1),
                                  torch.cat([prompt_mask, real.to(prompt_mask.dtype)], dim=1))
            prompt_last, response_hidden = hidden[:, ids.shape[1] - 1], hidden[:, ids.shape[1]:]
        # The logits at position t predict token t + 1: the response's come from the last prompt
        # position up to the one before the last response slot.
        logp, entropy = self._token_stats(torch.cat([prompt_last.unsqueeze(1), response_hidden[:, :-1]], dim=1), targets)
        zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
        value = self.value_head(prompt_last).squeeze(-1)
        restore = (0, full_width - response.shape[1])
        return (torch.nn.functional.pad(torch.where(real, logp, zero), restore),
                torch.nn.functional.pad(torch.where(real, entropy, zero), restore), value)

    def _head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's vocabulary logits of decoder outputs ``hidden`` ``[B, n, H]``, computed by the model's own
        forward with its decoder standing aside (it hands back ``hidden`` as its output): whatever the model does
        after its decoder (the head, Gemma-2/3's final-logit soft-capping, Cohere's and Granite's logit scaling, a
        future model's own) applies exactly as it does when ``generate`` samples. The decoder runs once per
        evaluation (``_hidden``); this runs per chunk of positions."""
        decoder = getattr(self.lm, self.lm.base_model_prefix)
        decoder.forward = _DecoderOutput  # an instance attribute: the module tree and its parameters stay as they are
        try:
            return self.lm(inputs_embeds=hidden, use_cache=False, logits_to_keep=0).logits
        finally:
            del decoder.forward

    def _token_stats(self, hidden: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """log pi(target) and the entropy at each position, ``TOKEN_CHUNK`` positions at a time. Each
        chunk's [B, chunk, vocab] fp32 logits are recomputed in backward rather than kept for it (with a
        49 k vocabulary, 31 MB per response of 160 tokens for the logits alone, several copies kept)."""
        def chunk_stats(h: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            # float32 then the temperature, as generate does with the logits before its processors.
            log_probs = torch.log_softmax(self._head_logits(h).float() / self.temperature, dim=-1)
            return log_probs.gather(-1, t.unsqueeze(-1)).squeeze(-1), -(log_probs.exp() * log_probs).sum(-1)

        grad = torch.is_grad_enabled()
        pieces = [checkpoint(chunk_stats, hidden[:, i:i + TOKEN_CHUNK], targets[:, i:i + TOKEN_CHUNK], use_reentrant=False)
                  if grad else chunk_stats(hidden[:, i:i + TOKEN_CHUNK], targets[:, i:i + TOKEN_CHUNK])
                  for i in range(0, hidden.shape[1], TOKEN_CHUNK)]
        return torch.cat([p[0] for p in pieces], dim=1), torch.cat([p[1] for p in pieces], dim=1)

    def imitation_loss(self, obs: TensorDict, env_action: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """Supervised fine-tuning on demonstrated responses (``ChatPreprocessor.encode_response``):
        their tokens' mean negative log-likelihood (``algo.behaviour_cloning``)."""
        response = env_action.long()
        return token_cloning_loss(self.evaluate, obs, response, self.action_mask(response))

    def value(self, obs: TensorDict) -> torch.Tensor:
        hidden = self._hidden(*trim_left_padding(obs["input_ids"], obs["attention_mask"]))
        return self.value_head(hidden[:, -1]).squeeze(-1)

    def value_parameters(self) -> list[nn.Parameter]:
        return list(self.value_head.parameters())


# ---- registration ----------------------------------------------------------------------------
def prepare_causal_lm(obs_spec: ObsSpec, action_dim: int, model_path: Optional[str],
                      policy_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Driver side, before Ray starts, on kwargs checked against ``CausalLMOptions``: the env must give text
    prompts; a bad model is a ConfigError; a GGUF file (or the default model) is converted once to a Hugging
    Face folder; the env's example prompts must fit ``max_prompt_tokens``."""
    kwargs = dict(policy_kwargs)
    if "text" not in obs_spec:
        raise ConfigError("policy causal_lm needs an environment with text prompts (e.g. --env arithmetic or humaneval)")
    kwargs["model_path"] = str(resolve_lm_path(model_path or kwargs.get("model_path")))
    check_env_prompts_fit(ChatPreprocessor(obs_spec, **kwargs).prompt_ids, obs_spec.get("example_prompts", ()))
    return kwargs


def lm_target_modules() -> Sequence[str]:
    """The attention and MLP projections of Llama-style decoders (LoRA's usual targets)."""
    return ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


register_policy("causal_lm", preprocessor=ChatPreprocessor, options=CausalLMOptions, prepare=prepare_causal_lm)(
    CausalLMActorCritic)
