"""One decoder pass per distinct prompt in training: the shared-prefix forward of Prefix Grouper (Liu et al., 2025).

GRPO-style estimators sample G responses to one prompt, and a minibatch holds several members of each group. A
plain forward over prompt + response computes every prompt G times, and on short answers the prompt is most of
the tokens (arithmetic: ~46 prompt tokens, ~17 response tokens a row). Here the decoder runs once over the
distinct prompts with a KV cache, the cache's rows are gathered to the minibatch's rows, and a second pass runs the
responses against it. The result is the same function of the weights: each response attends to the same keys and
values at the same positions, and autograd sums every member's gradient into its prompt's one computation (the
gather's backward), which is what the repeated forward's gradients sum to.

Used only where that identity is plain: a dense attention mask (sdpa or eager), full attention in every layer (a
sliding-window cache drops keys), no gradient checkpointing while gradients are on (transformers turns the cache
off there), and fewer distinct prompts than rows. Otherwise ``shared_prompt_hidden`` answers None and the caller
makes its one pass over prompt + response.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from async_rl.policies.lm_attention import positions_of, self_attending_pad_mask

SHARING_IMPLEMENTATIONS = ("sdpa", "eager")


def sharing_unsupported_reason(lm: Any) -> Optional[str]:
    """Why ``lm`` (a transformers causal LM) cannot share its prompts' forward, or None when it can."""
    config = lm.config
    if config._attn_implementation not in SHARING_IMPLEMENTATIONS:
        return f"attention implementation {config._attn_implementation}"
    if not set(getattr(config, "layer_types", None) or ("full_attention",)) <= {"full_attention"}:
        return "layers other than full attention"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "a sliding window"
    if getattr(lm, "is_activation_checkpointing", False) and torch.is_grad_enabled():
        return "gradient checkpointing"
    return None


def shared_prompt_hidden(lm: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response: torch.Tensor,
                         response_real: torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """The decoder's outputs for a left-padded batch of prompts ``[B, P]`` followed by responses ``[B, R]`` (pad
    ids where ``response_real`` is False), computed once per distinct prompt: ``(prompt_last, response_hidden)``,
    the last prompt position's output ``[B, H]`` and the response positions' ``[B, R, H]``. None when ``lm`` cannot
    share (``sharing_unsupported_reason``) or every prompt is distinct (nothing to share)."""
    if sharing_unsupported_reason(lm) is not None:
        return None
    rows_key = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)
    distinct, row_of = torch.unique(rows_key, dim=0, return_inverse=True)
    if len(distinct) == len(rows_key):
        return None
    from transformers import DynamicCache

    width = prompt_ids.shape[1]
    ids_once, mask_once = distinct[:, :width], distinct[:, width:].to(prompt_mask.dtype)
    decoder = getattr(lm, lm.base_model_prefix)
    dtype = lm.get_input_embeddings().weight.dtype
    cache = DynamicCache(config=lm.config)
    prompt_out = decoder(input_ids=ids_once, attention_mask=self_attending_pad_mask(lm.config, mask_once, dtype),
                         position_ids=positions_of(mask_once), cache=cache, use_cache=True).last_hidden_state
    if cache.get_seq_length() != width:  # a decoder that took no cache under this name: share nothing
        return None
    cache.batch_select_indices(row_of)  # each row's prompt keys and values; the gather's backward sums the members
    # The 2D mask over prompt + response: every response position sees its prompt's real tokens, so no row is empty.
    mask = torch.cat([prompt_mask, response_real.to(prompt_mask.dtype)], dim=1)
    response_out = decoder(input_ids=response, attention_mask=mask, position_ids=positions_of(mask)[:, width:],
                           cache=cache, use_cache=True).last_hidden_state
    return prompt_out[row_of, -1], response_out
