"""The distribution a causal LM policy samples from, declared in one place so that training can use the same one.

Hugging Face ``generate`` builds its logits processors from a ``GenerationConfig`` whose unset fields it
fills from the model's own ``generation_config.json``. Released instruct models often ship sampling values
there (``repetition_penalty``, ``top_k``, ``min_p``, ``temperature`` ...): left to ``generate``, they would
change the sampling distribution without the trainer knowing (a tiny Llama whose file says
``repetition_penalty: 1.3`` gave |log-prob(train) - log-prob(sampled)| up to 6.9 before any update). So:

* the model's generation config is replaced by a neutral one that keeps only its token ids
  (``neutral_generation_config``): there is nothing left to inherit;
* every field that makes a processor is set explicitly (``explicit_generation_config``), off except
  what the policy asks for;
* the warpers the policy asks for are our own, in ``generate``'s order, and the log-prob recorder is
  the last processor (``sampling_processors``), so the recorded log-prob is the one the token was
  drawn from.

Policy kwargs and their defaults (``SamplingParams``): ``temperature`` 1.0, ``top_k`` 0 (off), ``top_p``
1.0 (off), ``min_p`` 0.0 (off). No repetition penalty, no n-gram ban, no typical / epsilon / eta
sampling, no token suppression or bias: training computes ``log_softmax(logits / temperature)`` of the
model's own forward, and these would make the sampled distribution something else.
The truncating warpers (top-k, top-p, min-p) are allowed: the recorded log-prob is then that of the
truncated distribution, and the importance ratio corrects for it as for any off-policy sample.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

PAD_ACTION = -1  # response slots after the end of the response, whichever engine generated it
# GenerationConfig fields that hold token ids: the only ones a neutral config keeps from the model's.
TOKEN_ID_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


@dataclass(frozen=True)
class SamplingParams:
    """What the sampling distribution is, beside the model: all a policy kwarg can change (their ranges are
    checked by ``lm_options.CausalLMOptions``)."""

    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    min_p: float = 0.0  # 0.0: off


def neutral_generation_config(model_config: Any) -> Any:
    """A ``GenerationConfig`` with only the token ids of ``model_config`` (the model's own generation
    config): what ``generate`` may fill an unset field from, so that it fills nothing else."""
    from transformers import GenerationConfig

    return GenerationConfig(**{name: getattr(model_config, name, None) for name in TOKEN_ID_FIELDS})


def explicit_generation_config(greedy: bool, max_new_tokens: int, min_new_tokens: int, pad_id: int,
                               stop_ids: list[int]) -> Any:
    """Every field that makes a logits processor, set: off (the warpers we want are passed as processors,
    ahead of the recorder), so nothing runs after the recorder and nothing comes from the model's files."""
    from transformers import GenerationConfig

    # Sampling-only fields only when sampling (greedy decoding warns about them at every call); either way the
    # neutral model config leaves nothing else to fill them from.
    warpers_off = {} if greedy else dict(temperature=1.0, top_k=0, top_p=1.0, typical_p=1.0, epsilon_cutoff=0.0,
                                         eta_cutoff=0.0)
    return GenerationConfig(
        do_sample=not greedy, max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens,
        pad_token_id=pad_id, eos_token_id=stop_ids, use_cache=True, num_beams=1, num_return_sequences=1,
        repetition_penalty=1.0, encoder_repetition_penalty=1.0, no_repeat_ngram_size=0,
        encoder_no_repeat_ngram_size=0, renormalize_logits=False, remove_invalid_values=False,
        guidance_scale=1.0, output_scores=False, return_dict_in_generate=False, **warpers_off)


class SampledLogProbs:
    """The last logits processor of ``generate``: it sees the scores after every warper, and at the next
    step the token drawn from them, so it records log pi_behaviour(token) without keeping a [B, vocab]
    tensor per step."""

    def __init__(self) -> None:
        self.previous: Optional[torch.Tensor] = None
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.previous is not None:
            self.steps.append(self.previous.gather(1, input_ids[:, -1:]).squeeze(1))
        self.previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, response: torch.Tensor) -> torch.Tensor:
        """``[B, n]`` log-probs of the ``n`` generated tokens ``response``."""
        if self.previous is not None:
            self.steps.append(self.previous.gather(1, response[:, -1:]).squeeze(1))
        self.previous = None
        return torch.stack(self.steps, dim=1) if self.steps else response.new_zeros(response.shape, dtype=torch.float32)


def sampling_processors(params: SamplingParams, greedy: bool, recorder: SampledLogProbs) -> Any:
    """The processors of one ``generate`` call: temperature, then (sampling only) top-k, top-p, min-p
    (``generate``'s own order), then the recorder."""
    from transformers import (
        LogitsProcessorList,
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    processors = LogitsProcessorList()
    if params.temperature != 1.0:
        processors.append(TemperatureLogitsWarper(params.temperature))
    if not greedy:
        if params.top_k > 0:
            processors.append(TopKLogitsWarper(params.top_k))
        if params.top_p < 1.0:
            processors.append(TopPLogitsWarper(params.top_p))
        if params.min_p > 0.0:
            processors.append(MinPLogitsWarper(params.min_p))
    processors.append(recorder)
    return processors


def zero_dropout_config(config: Any) -> Any:
    """``config`` (and its sub-configs) with every dropout probability set to 0, before the model is built:
    attention modules read theirs from the config (a float, not an ``nn.Dropout``), so switching modules
    alone would miss them. TRL's ``disable_dropout`` does the same for its policy and reference."""
    for name, value in list(vars(config).items()):
        if isinstance(value, float) and ("dropout" in name or name.endswith("_pdrop")):
            setattr(config, name, 0.0)
        elif hasattr(value, "to_dict") and hasattr(value, "model_type"):  # a sub-config (text_config, ...)
            zero_dropout_config(value)
    return config


def zero_dropout_modules(model: torch.nn.Module) -> None:
    """Every ``nn.Dropout`` of ``model`` with probability 0 (those a config does not name)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
